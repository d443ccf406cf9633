// Fused softmax attention: the raw entry points, the CPU forward and backward kernels side by side,
// the autograd node, the naive materialised reference, and the registry entry.
//
// How the CPU kernels work (equations in docs/variants/attention.md):
// - A task owns up to `block` query rows of one (batch, head). It walks the key blocks its rows can
//   see and, inside each, its rows, so one K/V tile serves every row while it is in cache. Only one
//   row × key-block tile of scores exists at a time (`block` values of scratch); a key block that
//   no row of the task sees (beyond the causal limit) is never visited, and a row stops at its own
//   limit inside the block.
// - Forward: online softmax. Each row keeps a running max m and sum ℓ; its output row is the
//   accumulator, rescaled by exp(m_old − m_new) whenever a block raises the max, divided by ℓ at
//   the end. Saves lse = m + log ℓ.
// - Backward: P is recomputed from lse, never stored. Two race-free passes: dQ over query tiles
//   (a task writes only its own dQ rows) and dK/dV over (batch, kv head, key tile), where a task
//   sums over every query head that shares its kv head, so no two tasks write the same row.
// - Innermost loops run over the head dimension, contiguous in every tensor, as `omp simd` dots
//   and axpys. Sums accumulate in the input type (f32 like flash attention, or f64).
#include "layers/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/cpu/parallel.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace kernel {

SEQLAB_DEFINE_KERNEL(attention_forward_kernel);
SEQLAB_DEFINE_KERNEL(attention_backward_kernel);

namespace {

struct Dims {
  int64_t B, T, S, H, Hk, Dk, Dv;
};

std::string shapes_str(const Tensor& q, const Tensor& k, const Tensor& v) {
  auto one = [](const Tensor& t) { return t.defined() ? shape_str(t.shape()) : std::string("undefined"); };
  return "q " + one(q) + ", k " + one(k) + ", v " + one(v);
}

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("attention: " + why + " (got " + shapes_str(q, k, v) +
                                "; expected q [B, T, H, Dk], k [B, S, Hk, Dk], v [B, S, Hk, Dv])");
  };
  if (!q.defined() || !k.defined() || !v.defined()) fail("q, k and v must all be given");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k and v must have 4 dimensions");
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  if (k.size(0) != d.B || v.size(0) != d.B) fail("batch sizes differ");
  if (v.size(1) != d.S || v.size(2) != d.Hk) fail("k and v differ in length or heads");
  if (k.size(3) != d.Dk) fail("q and k head dims differ");
  if (d.Dk == 0) fail("the head dim is 0");
  if (d.Hk == 0 || d.H % d.Hk != 0) fail("query heads H must be a multiple of kv heads Hk");
  if (d.S == 0) fail("no keys to attend to");
  if (causal && d.T > d.S) {
    fail(
        "causal attention needs T ≤ S: query i sits at key position i + S − T, so T > S puts queries before the "
        "first key");
  }
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || (q.dtype() != DType::f32 && q.dtype() != DType::f64)) {
    fail(std::string("q, k and v must share dtype f32 or f64, got ") + dtype_name(q.dtype()) + ", " +
         dtype_name(k.dtype()) + ", " + dtype_name(v.dtype()));
  }
  if (q.device() != k.device() || q.device() != v.device()) fail("q, k and v are on different devices");
  return d;
}

AttentionParams resolve(const AttentionOptions& opts, int64_t Dk) {
  if (opts.block <= 0)
    throw std::invalid_argument("attention: block must be positive, got " + std::to_string(opts.block));
  return {opts.causal, opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(Dk)), opts.block};
}

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype) {
    throw std::invalid_argument(std::string("attention backward: ") + what + " is " +
                                (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "undefined") +
                                ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  const Dims d = check_inputs(q, k, v, opts.causal);
  const AttentionParams p = resolve(opts, d.Dk);
  AttentionOutput out{Tensor::empty({d.B, d.T, d.H, d.Dv}, q.dtype(), q.device()),
                      Tensor::empty({d.B, d.T, d.H}, q.dtype(), q.device())};
  attention_forward_kernel(q.device(), kernel::contiguous(q), kernel::contiguous(k), kernel::contiguous(v), p, out.o,
                           out.lse);
  return out;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionOptions& opts,
                                  bool need_dq, bool need_dk, bool need_dv) {
  const Dims d = check_inputs(q, k, v, opts.causal);
  const AttentionParams p = resolve(opts, d.Dk);
  const Shape o_shape{d.B, d.T, d.H, d.Dv}, lse_shape{d.B, d.T, d.H};
  check_like(dout, o_shape, q.dtype(), "dout");
  check_like(out, o_shape, q.dtype(), "o");
  check_like(lse, lse_shape, q.dtype(), "lse");
  if (dlse.defined()) check_like(dlse, lse_shape, q.dtype(), "dlse");
  AttentionGrads g;
  if (need_dq) g.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  if (need_dk) g.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  if (need_dv) g.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (!need_dq && !need_dk && !need_dv) return g;
  Tensor dl = dlse.defined() ? kernel::contiguous(dlse) : Tensor::zeros(lse_shape, q.dtype(), q.device());
  attention_backward_kernel(q.device(), kernel::contiguous(dout), dl, kernel::contiguous(q), kernel::contiguous(k),
                            kernel::contiguous(v), kernel::contiguous(out), kernel::contiguous(lse), p, g);
  return g;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::AttentionGrads;
using kernel::AttentionParams;

// Eight independent partial sums, so the compiler vectorises the reduction over d without
// reassociating it (no -ffast-math needed) and the adds do not wait on each other.
template <class T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[d + u] * b[d + u];
  }
  for (; d < n; ++d) acc[0] += a[d] * b[d];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y += a x
template <class T>
inline void axpy(T a, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

template <class T>
inline void scal(T a, T* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] *= a;
}

// Geometry of one call: row numbers in the [B, T, H, ·] and [B, S, Hk, ·] layouts (times the head
// dim gives the element offset) and the causal limits.
struct Geometry {
  int64_t B, T, S, H, Hk, Dk, Dv, group, block;
  bool causal;

  int64_t q_row(int64_t b, int64_t i, int64_t h) const { return (b * T + i) * H + h; }
  int64_t kv_row(int64_t b, int64_t j, int64_t hk) const { return (b * S + j) * Hk + hk; }
  // Query i sees keys [0, key_end(i)); key j is seen by queries [query_begin(j), T).
  int64_t key_end(int64_t i) const { return causal ? i + S - T + 1 : S; }
  int64_t query_begin(int64_t j) const { return causal ? std::max<int64_t>(0, j - (S - T)) : 0; }
  int64_t tiles(int64_t n) const { return (n + block - 1) / block; }
  // Whether the T×S work is worth a thread team.
  bool parallel(int64_t tasks) const { return tasks > 1 && T * S * (Dk + Dv) > kParallelGrain; }
};

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  Geometry g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 1, p.block, p.causal};
  g.group = g.H / g.Hk;
  return g;
}

// Per (b, h) and query row i, over the visible keys j < key_end(i):
//   s_ij = scale q_i·k_j,  m_i = max_j s_ij,  ℓ_i = Σ_j exp(s_ij − m_i),
//   o_i = Σ_j exp(s_ij − m_i) v_j / ℓ_i,  lse_i = m_i + log ℓ_i,
// with m, ℓ and o_i built key block by key block (online softmax).
// Memory: reads q, k, v; writes o [B, T, H, Dv] and lse [B, T, H]; scratch per thread: `block`
// scores and (m, ℓ) for `block` rows.
template <class T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& o,
             const Tensor& lse) {
  const Geometry g = geometry(q, k, v, p);
  const T *Q = q.data<T>(), *K = k.data<T>(), *V = v.data<T>();
  T *O = o.data<T>(), *LSE = lse.data<T>();
  const T scale = static_cast<T>(p.scale);
  const int64_t qtiles = g.tiles(g.T), tasks = g.B * g.H * qtiles;
#pragma omp parallel if (g.parallel(tasks))
  {
    std::vector<T> s(g.block), m(g.block), l(g.block);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (g.H * qtiles), h = task / qtiles % g.H, hk = h / g.group;
      const int64_t i0 = task % qtiles * g.block, i1 = std::min(g.T, i0 + g.block);
      for (int64_t i = i0; i < i1; ++i) {
        m[i - i0] = -std::numeric_limits<T>::infinity();
        l[i - i0] = 0;
        std::fill_n(O + g.q_row(b, i, h) * g.Dv, g.Dv, T(0));
      }
      const int64_t tile_key_end = g.key_end(i1 - 1);  // the tile's last row sees the most keys
      for (int64_t j0 = 0; j0 < tile_key_end; j0 += g.block) {
        const int64_t j1 = std::min(j0 + g.block, tile_key_end);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t jn = std::min(j1, g.key_end(i));
          if (jn <= j0) continue;  // the whole block is in this row's future
          const T* qi = Q + g.q_row(b, i, h) * g.Dk;
          T* oi = O + g.q_row(b, i, h) * g.Dv;
          T block_max = -std::numeric_limits<T>::infinity();
          for (int64_t j = j0; j < jn; ++j) {
            s[j - j0] = scale * dot(qi, K + g.kv_row(b, j, hk) * g.Dk, g.Dk);
            block_max = std::max(block_max, s[j - j0]);
          }
          T &mi = m[i - i0], &li = l[i - i0];
          if (block_max > mi) {  // rescale what was summed against the old max (0 on the first block)
            const T r = std::exp(mi - block_max);
            li *= r;
            scal(r, oi, g.Dv);
            mi = block_max;
          }
          for (int64_t j = j0; j < jn; ++j) {
            const T pij = std::exp(s[j - j0] - mi);
            li += pij;
            axpy(pij, V + g.kv_row(b, j, hk) * g.Dv, oi, g.Dv);
          }
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        scal(T(1) / l[i - i0], O + g.q_row(b, i, h) * g.Dv, g.Dv);
        LSE[g.q_row(b, i, h)] = m[i - i0] + std::log(l[i - i0]);
      }
    }
  }
}

// With P_ij = exp(s_ij − lse_i) recomputed from the saved lse and the output gradients dO, dlse:
//   δ_i = Σ_d dO_id O_id − dlse_i,  dP_ij = dO_i·v_j,  dS_ij = P_ij (dP_ij − δ_i)
//   dQ_i = scale Σ_j dS_ij k_j,  dK_j = scale Σ_{h,i} dS_ij q_i,  dV_j = Σ_{h,i} P_ij dO_i
// (sums over h run over the query heads sharing the kv head). Derivation: o_i = Σ_j P_ij v_j gives
// dP_ij = dO_i·v_j; the softmax Jacobian gives ∂L/∂s_ij = P_ij (dP_ij − Σ_j' P_ij' dP_ij') and
// Σ_j' P_ij' dP_ij' = dO_i·o_i; ∂lse_i/∂s_ij = P_ij adds P_ij dlse_i.
// Memory: reads dO, dlse, q, k, v, o, lse; writes the requested dq, dk, dv; scratch: δ [B, T, H].
template <class T>
void backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& o, const Tensor& lse, const AttentionParams& p, const AttentionGrads& grads) {
  const Geometry g = geometry(q, k, v, p);
  const T *dO = dout.data<T>(), *dL = dlse.data<T>(), *Q = q.data<T>(), *K = k.data<T>(), *V = v.data<T>();
  const T *O = o.data<T>(), *LSE = lse.data<T>();
  const T scale = static_cast<T>(p.scale);

  const int64_t rows = g.B * g.T * g.H;
  std::vector<T> delta(static_cast<size_t>(rows));
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.Dv));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) delta[r] = dot(dO + r * g.Dv, O + r * g.Dv, g.Dv) - dL[r];
  });

  // Pass 1, dQ: a task owns `block` query rows of one (b, h), like the forward.
  if (grads.dq.defined()) {
    T* dQ = grads.dq.data<T>();
    const int64_t qtiles = g.tiles(g.T), tasks = g.B * g.H * qtiles;
#pragma omp parallel for schedule(dynamic) if (g.parallel(tasks))
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (g.H * qtiles), h = task / qtiles % g.H, hk = h / g.group;
      const int64_t i0 = task % qtiles * g.block, i1 = std::min(g.T, i0 + g.block);
      for (int64_t i = i0; i < i1; ++i) std::fill_n(dQ + g.q_row(b, i, h) * g.Dk, g.Dk, T(0));
      const int64_t tile_key_end = g.key_end(i1 - 1);
      for (int64_t j0 = 0; j0 < tile_key_end; j0 += g.block) {
        const int64_t j1 = std::min(j0 + g.block, tile_key_end);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r = g.q_row(b, i, h), jn = std::min(j1, g.key_end(i));
          const T *qi = Q + r * g.Dk, *doi = dO + r * g.Dv;
          T* dqi = dQ + r * g.Dk;
          for (int64_t j = j0; j < jn; ++j) {
            const T* kj = K + g.kv_row(b, j, hk) * g.Dk;
            const T pij = std::exp(scale * dot(qi, kj, g.Dk) - LSE[r]);
            const T dsij = pij * (dot(doi, V + g.kv_row(b, j, hk) * g.Dv, g.Dv) - delta[r]);
            axpy(dsij, kj, dqi, g.Dk);
          }
        }
      }
      for (int64_t i = i0; i < i1; ++i) scal(scale, dQ + g.q_row(b, i, h) * g.Dk, g.Dk);
    }
  }

  // Pass 2, dK and dV: a task owns `block` key rows of one (b, kv head) and every query row of every
  // query head in its group that sees them, so it alone writes those dK/dV rows.
  if (grads.dk.defined() || grads.dv.defined()) {
    T* dK = grads.dk.defined() ? grads.dk.data<T>() : nullptr;
    T* dV = grads.dv.defined() ? grads.dv.data<T>() : nullptr;
    const int64_t ktiles = g.tiles(g.S), tasks = g.B * g.Hk * ktiles;
#pragma omp parallel for schedule(dynamic) if (g.parallel(tasks))
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (g.Hk * ktiles), hk = task / ktiles % g.Hk;
      const int64_t j0 = task % ktiles * g.block, j1 = std::min(g.S, j0 + g.block);
      for (int64_t j = j0; j < j1; ++j) {
        if (dK) std::fill_n(dK + g.kv_row(b, j, hk) * g.Dk, g.Dk, T(0));
        if (dV) std::fill_n(dV + g.kv_row(b, j, hk) * g.Dv, g.Dv, T(0));
      }
      for (int64_t h = hk * g.group; h < (hk + 1) * g.group; ++h) {
        for (int64_t i = g.query_begin(j0); i < g.T; ++i) {  // earlier queries see none of the tile
          const int64_t r = g.q_row(b, i, h), jn = std::min(j1, g.key_end(i));
          const T *qi = Q + r * g.Dk, *doi = dO + r * g.Dv;
          for (int64_t j = j0; j < jn; ++j) {
            const int64_t c = g.kv_row(b, j, hk);
            const T pij = std::exp(scale * dot(qi, K + c * g.Dk, g.Dk) - LSE[r]);
            if (dV) axpy(pij, doi, dV + c * g.Dv, g.Dv);
            if (dK) axpy(pij * (dot(doi, V + c * g.Dv, g.Dv) - delta[r]), qi, dK + c * g.Dk, g.Dk);
          }
        }
      }
      if (dK) {
        for (int64_t j = j0; j < j1; ++j) scal(scale, dK + g.kv_row(b, j, hk) * g.Dk, g.Dk);
      }
    }
  }
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& o,
                 const Tensor& lse) {
  dispatch_float(q.dtype(), "attention", [&](auto tag) { forward<decltype(tag)>(q, k, v, p, o, lse); });
}

void backward_cpu(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& o, const Tensor& lse, const AttentionParams& p, const AttentionGrads& grads) {
  dispatch_float(q.dtype(), "attention backward",
                 [&](auto tag) { backward<decltype(tag)>(dout, dlse, q, k, v, o, lse, p, grads); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(attention_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(attention_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves q, k, v (contiguous), o and lse; the backward is the kernel above.
AttentionOutput attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  kernel::check_inputs(q, k, v, opts.causal);
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v);
  AttentionOutput out = kernel::attention_forward(qc, kc, vc, opts);
  record("attention", {q, k, v}, {&out.o, &out.lse}, {qc, kc, vc, out.o, out.lse},
         [opts](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::AttentionGrads d =
               kernel::attention_backward(g[0], g[1], s[0], s[1], s[2], s[3], s[4], opts, need[0], need[1], need[2]);
           return std::vector<Tensor>{d.dq, d.dk, d.dv};
         });
  return out;
}

// scores = Q Kᵀ · scale over [B, H, T, S] (kv heads repeated for their query groups), masked to
// −∞ above the causal limit; lse = m + log Σ_j exp(scores − m) with the row max m held constant
// (it cancels); o = exp(scores − lse) V.
AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const kernel::Dims d = kernel::check_inputs(q, k, v, causal);
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d.Dk));
  const int64_t group = d.H / d.Hk;
  auto heads_first = [](const Tensor& x) { return permute(x, {0, 2, 1, 3}); };
  auto repeat_kv = [&](const Tensor& x) {  // [B, S, Hk, D] → [B, H, S, D]
    Tensor t = unsqueeze(heads_first(x), 2);
    t = expand(t, {d.B, d.Hk, group, d.S, x.size(3)});
    return reshape(t, {d.B, d.H, d.S, x.size(3)});
  };
  Tensor scores = matmul(heads_first(q), transpose(repeat_kv(k), 2, 3)) * sc;
  if (causal) {
    std::vector<int64_t> future(static_cast<size_t>(d.T * d.S));
    for (int64_t i = 0; i < d.T; ++i) {
      for (int64_t j = 0; j < d.S; ++j) future[i * d.S + j] = j > i + d.S - d.T;
    }
    scores = masked_fill(scores, Tensor::from_indices(future, {d.T, d.S}), -std::numeric_limits<double>::infinity());
  }
  Tensor m = max(scores, {3}, true).detach();
  Tensor lse = m + log(sum(exp(scores - m), {3}, true));
  Tensor o = matmul(exp(scores - lse), repeat_kv(v));
  return {heads_first(o), permute(squeeze(lse, 3), {0, 2, 1})};
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "attention";
  s.summary =
      "o = softmax(q kᵀ · scale + mask) v, lse = log Σ_j exp(q kᵀ · scale + mask); q [B, T, H, Dk], "
      "k [B, S, Hk, Dk], v [B, S, Hk, Dv], query i at key position i + S − T";
  s.inputs = {{"q"}, {"k"}, {"v"}};
  s.outputs = {"o", "lse"};
  s.attrs = {{"causal", AttrType::boolean, "true", "query i sees keys j ≤ i + S − T (else every key)"},
             {"scale", AttrType::number, "0", "score scale; ≤ 0 means 1/√Dk"},
             {"block", AttrType::integer, "64", "keys (and query rows) per tile"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    AttentionOutput out =
        attention_with_lse(in[0], in[1], in[2], {a.get_bool("causal"), a.get_number("scale"), a.get_int("block")});
    return std::vector<Tensor>{out.o, out.lse};
  };
  // T = 5 and S = 7 are not multiples of the block, GQA with 2 query heads per kv head, Dk ≠ Dv.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 5, 4, 3}, gen, dtype), Tensor::randn({2, 7, 2, 3}, gen, dtype),
                               Tensor::randn({2, 7, 2, 4}, gen, dtype)};
  };
  s.example_attrs = {{"block", "2"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
