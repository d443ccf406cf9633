// RetNet retention: raw entry points, the CPU forward and backward kernels of the three forms side
// by side, the autograd node and the registry entry. Equations in retention.h; the backward
// derivations in docs/variants/retention.md.
//
// How the CPU kernels work:
// - One task per (batch, head), OpenMP over tasks; chunk-level (or, for the parallel form,
//   sequence-level) products are GEMMs through the GEMM slot, single-threaded inside the team.
// - bf16 tensors are taken as they are (layers/variant_rows.h): the kernels are templates on the tensors'
//   element type E and compute in T = compute_t<E> (f32 for bf16); a head's rows are widened when its task
//   starts and its outputs rounded once when it ends; the recurrent form, the states and the decay powers
//   stay f32, and every GEMM (the `mm` calls: Q Kᵀ, A V, the decayed q S and kᵀ v, and the backward's
//   dO Vᵀ, dA K, dAᵀ Q, Pᵀ dO and the products with S and G) runs in f32 on those rows. For
//   f32 and f64 the rows are the tensors' own and `mm` is cpu::gemm: the kernels they always were.
// - Decay powers γ^n are taken from a per-task table of std::pow(γ, n) in double for n ≥ 0 only,
//   so no ratio γ^(−n) is ever formed: γ = e^(−20) underflows harmlessly to 0, γ = 1 − 1e-6 stays
//   exact.
// - Saved for the backward: q, k, v, S_0. Recomputed: the decayed score tiles, the states entering
//   each chunk (chunkwise) or every step's state in place (recurrent, a forward sweep).
#include "layers/scan/retention.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "layers/variant_rows.h"
#include "tensor/blas_rows.h"
#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace kernel {

}  // namespace kernel

std::vector<double> retention_default_gammas(int64_t H) {
  std::vector<double> g(static_cast<size_t>(std::max<int64_t>(H, 0)));
  for (int64_t h = 0; h < H; ++h) g[static_cast<size_t>(h)] = 1.0 - std::pow(2.0, -5.0 - static_cast<double>(h));
  return g;
}

RetentionForm parse_retention_form(const std::string& name) {
  static const FormNames<RetentionForm> forms{"retention",
                                              {{"parallel", RetentionForm::parallel},
                                               {"chunkwise", RetentionForm::chunkwise},
                                               {"recurrent", RetentionForm::recurrent}}};
  return forms.parse(name);
}

namespace {

using Dims = HeadDims;

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const RetentionOptions& opts) {
  const VariantInputs in("retention", {{"q", q}, {"k", k}, {"v", v}, {"initial_state", s0}},
                         "q, k [B, T, H, dk], v [B, T, H, dv], initial_state [B, H, dk, dv] or none");
  const Dims d = in.qkv();
  in.shaped("initial_state", {d.B, d.H, d.dk, d.dv}, "[B, H, dk, dv]");
  in.same_dtype_and_device();
  if (opts.chunk <= 0) in.fail("chunk must be positive, got " + std::to_string(opts.chunk));
  if (!opts.gammas.empty()) {
    if (static_cast<int64_t>(opts.gammas.size()) != d.H) {
      in.fail("gammas has " + std::to_string(opts.gammas.size()) + " values for " + std::to_string(d.H) + " heads");
    }
    for (double g : opts.gammas) {
      if (!(g >= 0 && g <= 1)) in.fail("every gamma must lie in [0, 1], got " + std::to_string(g));
    }
  }
  return d;
}

kernel::RetentionParams resolve(const RetentionOptions& o, const Dims& d) {
  kernel::RetentionParams p;
  p.form = o.form;
  p.chunk = o.chunk;
  p.scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(d.dk));
  p.gammas = o.gammas.empty() ? retention_default_gammas(d.H) : o.gammas;
  return p;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::RetentionParams;

struct Geometry {
  int64_t B, T, H, Dk, Dv;
  int64_t tasks() const { return B * H; }
  int64_t qk_offset(int64_t task) const { return (task / H * T * H + task % H) * Dk; }
  int64_t v_offset(int64_t task) const { return (task / H * T * H + task % H) * Dv; }
  bool parallel() const { return tasks() > 1 && T * (Dk + 1) * (Dv + 1) > kParallelGrain; }
};

Geometry geometry(const Tensor& q, const Tensor& v) { return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)}; }

// pw[n] = γ^n for n ≤ n_max.
template <class T>
void powers(double gamma, int64_t n_max, std::vector<T>& pw) {
  pw.resize(static_cast<size_t>(n_max + 1));
  for (int64_t n = 0; n <= n_max; ++n)
    pw[static_cast<size_t>(n)] = static_cast<T>(std::pow(gamma, static_cast<double>(n)));
}

// dst[r, :] = α · w[r] · src[r, :] for r < rows (src at row stride lds, dst dense with ld n).
template <class T>
void scale_rows(const T* src, int64_t lds, int64_t rows, int64_t n, T alpha, const T* w, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const T f = alpha * w[r];
    for (int64_t j = 0; j < n; ++j) dst[r * n + j] = f * src[r * lds + j];
  }
}

// In place on an L × L tile of Q Kᵀ: a_rs ← α γ^(r−s) a_rs for s ≤ r, 0 above the diagonal.
template <class T>
void decay_mask(T* a, int64_t L, T alpha, const T* pw) {
  for (int64_t r = 0; r < L; ++r) {
    for (int64_t s = 0; s <= r; ++s) a[r * L + s] *= alpha * pw[r - s];
    std::fill(a + r * L + r + 1, a + (r + 1) * L, T(0));
  }
}

// ---- forward ----
// Per task (b, h), state S initialised from s0:
//   recurrent: for n: S = γ S + k_nᵀ v_n, o_n = c q_n S.
//   parallel / chunkwise: per block [t0, t0 + L) (the whole sequence for parallel):
//     A = c Q Kᵀ ⊙ D (GEMM then decay_mask), o = A V + (c γ^(r+1) q_r)_r S (two GEMMs),
//     S ← γ^L S + (γ^(L−1−s) k_s)_sᵀ V (one GEMM).
// Memory: reads q, k, v, s0; writes o, s. Scratch: A [L, L] and two [L, dk] row-scaled copies.
template <class E>
void forward(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const Tensor& s0_t, const RetentionParams& p,
             const Tensor& o_t, const Tensor& s_t) {
  using T = compute_t<E>;
  const Geometry g = geometry(q_t, v_t);
  // ld_k, ld_v: the tensors' row strides; ldk, ldv: the strides of the rows the kernel reads (TaskRows).
  const int64_t Dk = g.Dk, Dv = g.Dv, ld_k = g.H * Dk, ld_v = g.H * Dv, Tn = g.T;
  const int64_t ldk = TaskRows<E>::ld(ld_k, Dk), ldv = TaskRows<E>::ld(ld_v, Dv);
  const T c = static_cast<T>(p.scale);
  const int64_t C =
      p.form == RetentionForm::parallel ? std::max<int64_t>(1, Tn) : std::max<int64_t>(1, std::min(p.chunk, Tn));
#pragma omp parallel if (g.parallel())
  {
    std::vector<T> pw, A, Qd, Kd;
    if (p.form != RetentionForm::recurrent) {
      A.resize(static_cast<size_t>(C * C));
      Qd.resize(static_cast<size_t>(C * Dk));
      Kd.resize(Qd.size());
    }
    TaskRows<E> io;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g.tasks(); ++task) {
      const double gamma = p.gammas[static_cast<size_t>(task % g.H)];
      io.begin();
      const T* q = io.in(q_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* k = io.in(k_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* v = io.in(v_t, g.v_offset(task), Tn, Dv, ld_v);
      T* o = io.out(o_t, g.v_offset(task), Tn, Dv, ld_v);
      T* S = io.out(s_t, task * Dk * Dv, Dk, Dv, Dv);
      std::copy_n(io.in(s0_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, S);
      if (p.form == RetentionForm::recurrent) {
        const T gm = static_cast<T>(gamma);
        for (int64_t n = 0; n < Tn; ++n) {
          const T *qn = q + n * ldk, *kn = k + n * ldk, *vn = v + n * ldv;
          T* on = o + n * ldv;
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] = gm * S[i * Dv + j] + kn[i] * vn[j];
          }
          std::fill_n(on, Dv, T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            const T qi = c * qn[i];
            for (int64_t j = 0; j < Dv; ++j) on[j] += qi * S[i * Dv + j];
          }
        }
        io.store();
        continue;
      }
      powers<T>(gamma, C + 1, pw);
      for (int64_t t0 = 0; t0 < Tn; t0 += C) {
        const int64_t L = std::min(C, Tn - t0);
        const T *qc = q + t0 * ldk, *kc = k + t0 * ldk, *vc = v + t0 * ldv;
        T* oc = o + t0 * ldv;
        mm(false, true, L, L, Dk, 1.0, qc, ldk, kc, ldk, 0.0, A.data(), L);
        decay_mask(A.data(), L, c, pw.data());
        scale_rows(qc, ldk, L, Dk, c, pw.data() + 1, Qd.data());  // c γ^(r+1) q_r
        mm(false, false, L, Dv, L, 1.0, A.data(), L, vc, ldv, 0.0, oc, ldv);
        mm(false, false, L, Dv, Dk, 1.0, Qd.data(), Dk, S, Dv, 1.0, oc, ldv);
        for (int64_t s = 0; s < L; ++s) {  // γ^(L−1−s) k_s
          for (int64_t i = 0; i < Dk; ++i) Kd[s * Dk + i] = pw[L - 1 - s] * kc[s * ldk + i];
        }
        mm(true, false, Dk, Dv, L, 1.0, Kd.data(), Dk, vc, ldv, static_cast<double>(pw[L]), S, Dv);
      }
      io.store();
    }
  }
}

// ---- backward ----
// Output gradients dO and dS_T = G. With G_n = dL/dS_n = c q_nᵀ dO_n + γ G_{n+1} (G_T from dS_T):
//   dq_n = c S_n dO_n,  dk_n = G_n v_n,  dv_n = k_n G_n,  dS_0 = γ G_0.
//   recurrent: a forward sweep recomputes S_n (dq); a reverse sweep accumulates G (dk, dv, dS_0).
//   parallel / chunkwise, per block with entering state S_p and G the gradient of the state after it
//   (blocks walked in reverse; the entering states come from a forward sweep):
//     dA = c (dO Vᵀ) ⊙ D (the gradient of the raw products q_r·k_s), P = c (Q Kᵀ) ⊙ D,
//     dQ = dA K + (c γ^(r+1) dO_r)_r S_pᵀ,
//     dK = dAᵀ Q + (γ^(L−1−s) v_s)_s Gᵀ,
//     dV = Pᵀ dO + (γ^(L−1−s) k_s)_s G,
//     G ← γ^L G + (c γ^(r+1) q_r)_rᵀ dO.
// Memory: reads q, k, v, s0, dO, dS; writes dq, dk, dv, ds0. Scratch: the entering states
// [⌈T/C⌉, dk, dv] (chunkwise), P and dA [L, L], three row-scaled copies [L, max(dk, dv)].
template <class E>
void backward(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const Tensor& s0_t, const Tensor& do_t,
              const Tensor& ds_t, const RetentionParams& p, const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t,
              const Tensor& ds0_t) {
  using T = compute_t<E>;
  const Geometry g = geometry(q_t, v_t);
  const int64_t Dk = g.Dk, Dv = g.Dv, ld_k = g.H * Dk, ld_v = g.H * Dv, Tn = g.T;  // as in forward
  const int64_t ldk = TaskRows<E>::ld(ld_k, Dk), ldv = TaskRows<E>::ld(ld_v, Dv);
  const T c = static_cast<T>(p.scale);
  const int64_t C =
      p.form == RetentionForm::parallel ? std::max<int64_t>(1, Tn) : std::max<int64_t>(1, std::min(p.chunk, Tn));
  const int64_t NC = (Tn + C - 1) / C, Dm = std::max(Dk, Dv);
#pragma omp parallel if (g.parallel())
  {
    std::vector<T> pw, P, dA, X1, X2, states;
    std::vector<T> S(static_cast<size_t>(Dk * Dv));
    if (p.form != RetentionForm::recurrent) {
      P.resize(static_cast<size_t>(C * C));
      dA.resize(P.size());
      X1.resize(static_cast<size_t>(C * Dm));
      X2.resize(X1.size());
      states.resize(static_cast<size_t>(NC * Dk * Dv));
    }
    TaskRows<E> io;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g.tasks(); ++task) {
      const double gamma = p.gammas[static_cast<size_t>(task % g.H)];
      io.begin();
      const T* q = io.in(q_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* k = io.in(k_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* v = io.in(v_t, g.v_offset(task), Tn, Dv, ld_v);
      const T* dO = io.in(do_t, g.v_offset(task), Tn, Dv, ld_v);
      T* dq = io.out(dq_t, g.qk_offset(task), Tn, Dk, ld_k);
      T* dk = io.out(dk_t, g.qk_offset(task), Tn, Dk, ld_k);
      T* dv = io.out(dv_t, g.v_offset(task), Tn, Dv, ld_v);
      T* G = io.out(ds0_t, task * Dk * Dv, Dk, Dv, Dv);  // accumulates in place into dS_0
      std::copy_n(io.in(s0_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, S.data());
      std::copy_n(io.in(ds_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, G);
      if (p.form == RetentionForm::recurrent) {
        const T gm = static_cast<T>(gamma);
        for (int64_t n = 0; n < Tn; ++n) {  // forward sweep: S_n → dq_n
          const T *kn = k + n * ldk, *vn = v + n * ldv, *dOn = dO + n * ldv;
          for (int64_t i = 0; i < Dk; ++i) {
            T acc = 0;
            for (int64_t j = 0; j < Dv; ++j) {
              S[i * Dv + j] = gm * S[i * Dv + j] + kn[i] * vn[j];
              acc += S[i * Dv + j] * dOn[j];
            }
            dq[n * ldk + i] = c * acc;
          }
        }
        for (int64_t n = Tn - 1; n >= 0; --n) {  // reverse sweep: G_n → dk_n, dv_n
          const T *qn = q + n * ldk, *kn = k + n * ldk, *vn = v + n * ldv, *dOn = dO + n * ldv;
          T* dvn = dv + n * ldv;
          std::fill_n(dvn, Dv, T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            const T qi = c * qn[i];
            T acc = 0;
            for (int64_t j = 0; j < Dv; ++j) {
              T& gij = G[i * Dv + j];
              gij += qi * dOn[j];
              acc += gij * vn[j];
              dvn[j] += kn[i] * gij;
            }
            dk[n * ldk + i] = acc;
          }
          for (int64_t e = 0; e < Dk * Dv; ++e) G[e] *= gm;
        }
        io.store();
        continue;
      }
      powers<T>(gamma, C + 1, pw);
      for (int64_t b = 0; b < NC; ++b) {  // forward sweep: the state entering each block
        const int64_t t0 = b * C, L = std::min(C, Tn - t0);
        std::copy(S.begin(), S.end(), states.begin() + b * Dk * Dv);
        if (b + 1 == NC) break;
        for (int64_t s = 0; s < L; ++s) {
          for (int64_t i = 0; i < Dk; ++i) X1[s * Dk + i] = pw[L - 1 - s] * k[(t0 + s) * ldk + i];
        }
        mm(true, false, Dk, Dv, L, 1.0, X1.data(), Dk, v + t0 * ldv, ldv, static_cast<double>(pw[L]), S.data(), Dv);
      }
      for (int64_t b = NC - 1; b >= 0; --b) {
        const int64_t t0 = b * C, L = std::min(C, Tn - t0);
        const T *qc = q + t0 * ldk, *kc = k + t0 * ldk, *vc = v + t0 * ldv, *dOc = dO + t0 * ldv;
        const T* Sp = states.data() + b * Dk * Dv;
        T *dqc = dq + t0 * ldk, *dkc = dk + t0 * ldk, *dvc = dv + t0 * ldv;
        mm(false, true, L, L, Dk, 1.0, qc, ldk, kc, ldk, 0.0, P.data(), L);
        decay_mask(P.data(), L, c, pw.data());
        mm(false, true, L, L, Dv, 1.0, dOc, ldv, vc, ldv, 0.0, dA.data(), L);
        decay_mask(dA.data(), L, c, pw.data());
        // dQ = dA K + (c γ^(r+1) dO_r) S_pᵀ
        mm(false, false, L, Dk, L, 1.0, dA.data(), L, kc, ldk, 0.0, dqc, ldk);
        scale_rows(dOc, ldv, L, Dv, c, pw.data() + 1, X1.data());
        mm(false, true, L, Dk, Dv, 1.0, X1.data(), Dv, Sp, Dv, 1.0, dqc, ldk);
        // dK = dAᵀ Q + (γ^(L−1−s) v_s) Gᵀ;  dV = Pᵀ dO + (γ^(L−1−s) k_s) G
        for (int64_t s = 0; s < L; ++s) {
          for (int64_t j = 0; j < Dv; ++j) X1[s * Dv + j] = pw[L - 1 - s] * vc[s * ldv + j];
          for (int64_t i = 0; i < Dk; ++i) X2[s * Dk + i] = pw[L - 1 - s] * kc[s * ldk + i];
        }
        mm(true, false, L, Dk, L, 1.0, dA.data(), L, qc, ldk, 0.0, dkc, ldk);
        mm(false, true, L, Dk, Dv, 1.0, X1.data(), Dv, G, Dv, 1.0, dkc, ldk);
        mm(true, false, L, Dv, L, 1.0, P.data(), L, dOc, ldv, 0.0, dvc, ldv);
        mm(false, false, L, Dv, Dk, 1.0, X2.data(), Dk, G, Dv, 1.0, dvc, ldv);
        // G ← γ^L G + (c γ^(r+1) q_r)ᵀ dO
        scale_rows(qc, ldk, L, Dk, c, pw.data() + 1, X2.data());
        mm(true, false, Dk, Dv, L, 1.0, X2.data(), Dk, dOc, ldv, static_cast<double>(pw[L]), G, Dv);
      }
      io.store();
    }
  }
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const RetentionParams& p,
                 const Tensor& o, const Tensor& s) {
  dispatch_float_or_bf16(q.dtype(), "retention", [&](auto tag) { forward<decltype(tag)>(q, k, v, s0, p, o, s); });
}

void backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const Tensor& dout,
                  const Tensor& ds, const RetentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                  const Tensor& ds0) {
  dispatch_float_or_bf16(q.dtype(), "retention backward",
                 [&](auto tag) { backward<decltype(tag)>(q, k, v, s0, dout, ds, p, dq, dk, dv, ds0); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
// bf16 tensors are taken as they are (layers/variant_rows.h): rows widened per head.
SEQLAB_REGISTER_KERNEL_TAKING_BF16(retention_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(retention_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves q, k, v, S_0 (contiguous; zeros when absent).
RetentionOutput retention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state,
                          const RetentionOptions& opts) {
  const Dims d = check_inputs(q, k, v, initial_state, opts);
  const kernel::RetentionParams p = resolve(opts, d);
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v);
  const Tensor s0 = initial_state.defined() ? kernel::contiguous(initial_state)
                                            : Tensor::zeros({d.B, d.H, d.dk, d.dv}, q.dtype(), q.device());
  RetentionOutput out{Tensor::empty({d.B, d.T, d.H, d.dv}, q.dtype(), q.device()),
                      Tensor::empty({d.B, d.H, d.dk, d.dv}, q.dtype(), q.device())};
  kernel::retention_forward_kernel(q.device(), qc, kc, vc, s0, p, out.o, out.final_state);
  record("retention", {q, k, v, initial_state}, {&out.o, &out.final_state}, {qc, kc, vc, s0},
         [p](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           Tensor dq = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
           Tensor dk = Tensor::empty(s[1].shape(), s[1].dtype(), s[1].device());
           Tensor dv = Tensor::empty(s[2].shape(), s[2].dtype(), s[2].device());
           Tensor ds0 = Tensor::empty(s[3].shape(), s[3].dtype(), s[3].device());
           kernel::retention_backward_kernel(s[0].device(), s[0], s[1], s[2], s[3], kernel::contiguous(g[0]),
                                             kernel::contiguous(g[1]), p, dq, dk, dv, ds0);
           return std::vector<Tensor>{need[0] ? dq : Tensor(), need[1] ? dk : Tensor(), need[2] ? dv : Tensor(),
                                      need[3] ? ds0 : Tensor()};
         });
  return out;
}

namespace {

// "0.9,0.99" → {0.9, 0.99}; "" → {} (the default decays).
std::vector<double> parse_gammas(const std::string& text) {
  std::vector<double> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size()) {
      throw std::invalid_argument("retention: attribute gammas must be comma-separated numbers, got '" + text + "'");
    }
    out.push_back(x);
  }
  return out;
}

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "retention";
  s.summary =
      "S_n = γ_h S_{n-1} + k_nᵀ v_n, o_n = scale q_n S_n; q, k [B, T, H, dk], v [B, T, H, dv], "
      "initial_state [B, H, dk, dv], γ_h = 1 − 2^(−5−h) unless given";
  s.inputs = {{"q"}, {"k"}, {"v"}, {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"o", "final_state"};
  s.attrs = {{"form", AttrType::string, "chunkwise", "parallel, chunkwise or recurrent"},
             {"chunk", AttrType::integer, "64", "tokens per chunk of the chunkwise form"},
             {"scale", AttrType::number, "0", "scale of q; ≤ 0 means 1/√dk"},
             {"gammas", AttrType::string, "",
              "per-head decays as comma-separated numbers in [0, 1], e.g. 0.9,0.99; empty: 1 − 2^(−5−h)"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    RetentionOptions o;
    o.form = parse_retention_form(a.get_string("form"));
    o.chunk = a.get_int("chunk");
    o.scale = a.get_number("scale");
    o.gammas = parse_gammas(a.get_string("gammas"));
    RetentionOutput out = retention(in[0], in[1], in[2], in[3], o);
    return std::vector<Tensor>{out.o, out.final_state};
  };
  // T = 7 over chunks of 3, dk = 3 ≠ dv = 4, an initial state, decays far from 1 so that they matter.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 7, 2, 3}, gen, dtype), Tensor::randn({2, 7, 2, 3}, gen, dtype),
                               Tensor::randn({2, 7, 2, 4}, gen, dtype), Tensor::randn({2, 2, 3, 4}, gen, dtype)};
  };
  s.example_attrs = {{"chunk", "3"}, {"gammas", "0.6,0.9"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
