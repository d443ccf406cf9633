// Gated linear attention: the raw entry points, the CPU kernels of both forms (forward and
// backward side by side), the autograd node and the registry entry. Equations in gla.h; the
// derivations in docs/variants/gla.md.
//
// How the CPU kernels work:
// - One task per (batch, head), OpenMP over B·H; inside a task time is sequential (the state
//   carries), and every product of chunk-sized matrices is a GEMM through the GEMM slot, which runs
//   single-threaded on the calling thread inside the parallel region.
// - A head's rows of q, k, v, o are strided (H·dk or H·dv apart) in the [B, T, H, ·] layout; the
//   GEMMs read and write them in place through the leading dimension, without copies.
// - bf16 tensors are taken as they are (layers/variant_rows.h): the kernels are templates on the tensors'
//   element type E and compute in T = compute_t<E> (f32 for bf16). A head's rows are widened to f32 when
//   its task starts and its outputs rounded to bf16 once when it ends; the recurrent form, the state
//   recurrence, the gates and every GEMM of the chunkwise form (the `mm` calls: inter-chunk q̂ S, the
//   sub-chunk scores q̃ k̃ᵀ, Ã v, the state's k̂ᵀ v̂, and their backward counterparts) run in f32 on those
//   rows (layers/variant_rows.h says why the products are not bf16). For f32 and f64 the rows are the
//   tensors' own and `mm` is cpu::gemm on them: the kernels they always were.
// - Gate factors are always exp(x) with x ≤ 0 (differences of cumulative log-gates taken in the
//   direction of time), so nothing overflows for any gate strength; they may underflow to 0,
//   which is also what the exact value rounds to.
#include "layers/scan/gla.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/variant_inputs.h"
#include "layers/variant_rows.h"
#include "tensor/parallel.h"
#include "tensor/elementwise_math.h"
#include "tensor/blas_rows.h"
#include "tensor/kernels.h"
#include "tensor/lane_sum.h"

namespace seqlab {

namespace {

const FormNames<GlaForm>& gla_forms() {
  static const FormNames<GlaForm> forms{"gla", {{"chunkwise", GlaForm::chunkwise}, {"recurrent", GlaForm::recurrent}}};
  return forms;
}

}  // namespace

const char* gla_form_name(GlaForm form) { return gla_forms().name(form); }
GlaForm parse_gla_form(const std::string& s) { return gla_forms().parse(s); }

namespace kernel {

namespace {

using Dims = HeadDims;

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                  const Tensor& h0) {
  const VariantInputs in("gla", {{"q", q}, {"k", k}, {"v", v}, {"g", g}, {"gv", gv}, {"initial_state", h0}},
                         "q, k, g [B, T, H, dk], v [B, T, H, dv], gv [B, T, H, dv] or none, initial_state "
                         "[B, H, dk, dv] or none");
  in.given({"q", "k", "v", "g"});
  const Dims d = in.qkv();
  in.shaped("g", q.shape(), "[B, T, H, dk] (the same shape as q and k)");
  in.shaped("gv", v.shape(), "[B, T, H, dv] (v's shape)");
  in.shaped("initial_state", {d.B, d.H, d.dk, d.dv}, "[B, H, dk, dv]");
  in.same_dtype_and_device();
  return d;
}

// A chunk is never longer than the sequence (a longer one is the same single chunk), so an absurd chunk
// allocates nothing absurd; a sub-chunk never longer than its chunk.
GlaParams resolve(const GlaOptions& opts, const Dims& d) {
  if (opts.chunk <= 0) throw std::invalid_argument("gla: chunk must be positive, got " + std::to_string(opts.chunk));
  if (opts.sub_chunk <= 0) {
    throw std::invalid_argument("gla: sub_chunk must be positive, got " + std::to_string(opts.sub_chunk));
  }
  if (opts.scale < 0) throw std::invalid_argument("gla: scale must be ≥ 0 (0: 1/√dk), got " + std::to_string(opts.scale));
  const int64_t chunk = std::min(opts.chunk, std::max<int64_t>(1, d.T));
  return {opts.form, chunk, std::min(opts.sub_chunk, chunk),
          opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(d.dk))};
}

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (t.defined() && (t.shape() != shape || t.dtype() != dtype)) {
    throw std::invalid_argument(std::string("gla backward: ") + what + " is " + shape_str(t.shape()) + " " +
                                dtype_name(t.dtype()) + ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

GlaOutput gla_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                      const Tensor& initial_state, const GlaOptions& opts) {
  const Dims d = check_inputs(q, k, v, g, gv, initial_state);
  const GlaParams p = resolve(opts, d);
  GlaOutput out{Tensor::empty({d.B, d.T, d.H, d.dv}, q.dtype(), q.device()),
                Tensor::empty({d.B, d.H, d.dk, d.dv}, q.dtype(), q.device())};
  gla_forward_kernel(q.device(), kernel::contiguous(q), kernel::contiguous(k), kernel::contiguous(v),
                     kernel::contiguous(g), contiguous_or_none(gv), contiguous_or_none(initial_state), p, out.o,
                     out.final_state);
  return out;
}

GlaGrads gla_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& g, const Tensor& gv, const Tensor& initial_state, const GlaOptions& opts,
                      const std::vector<bool>& need) {
  const Dims d = check_inputs(q, k, v, g, gv, initial_state);
  const GlaParams p = resolve(opts, d);
  if (need.size() != 6) throw std::invalid_argument("gla backward: need one flag per input (6)");
  const Shape o_shape{d.B, d.T, d.H, d.dv}, s_shape{d.B, d.H, d.dk, d.dv};
  const DType dt = q.dtype();
  check_like(dout, o_shape, dt, "dout");
  check_like(dfinal, s_shape, dt, "dfinal");
  // The kernels compute dq, dk, dv in every case (one pass; the chunkwise gate gradients are formed
  // from their parts on the way).
  GlaGrads all;
  all.dq = Tensor::empty(q.shape(), dt, q.device());
  all.dk = Tensor::empty(k.shape(), dt, q.device());
  all.dv = Tensor::empty(v.shape(), dt, q.device());
  if (need[3]) all.dg = Tensor::empty(g.shape(), dt, q.device());
  if (need[4] && gv.defined()) all.dgv = Tensor::empty(gv.shape(), dt, q.device());
  if (need[5] && initial_state.defined()) all.dinitial_state = Tensor::empty(s_shape, dt, q.device());
  const Tensor dO = dout.defined() ? kernel::contiguous(dout) : Tensor::zeros(o_shape, dt, q.device());
  const Tensor dS = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dt, q.device());
  gla_backward_kernel(q.device(), dO, dS, kernel::contiguous(q), kernel::contiguous(k), kernel::contiguous(v),
                      kernel::contiguous(g), contiguous_or_none(gv), contiguous_or_none(initial_state), p, all);
  if (!need[0]) all.dq = Tensor();
  if (!need[1]) all.dk = Tensor();
  if (!need[2]) all.dv = Tensor();
  return all;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::GlaGrads;
using kernel::GlaParams;

template <class T>
inline T ex(T x) {
  return math::exp_vec(x);  // vectorised polynomial for f32, libm for f64
}

// e^x for the chunkwise form's gate factors, whose exponents are ≤ 0 (differences of cumulative
// log-gates in the direction of time): exp_vec_nonpositive, about 40% faster than exp_vec, which
// differs only where e^x is below the normal floats (0 there, where exp_vec keeps a subnormal).
template <class T>
inline T ex_decay(T x) {
  return math::exp_vec_nonpositive(x);  // libm for f64
}

// exp of a difference of cumulative log-gates, which are kept in double: in f32 a sum near −600
// is only known to 6e-5, so b_t − b_s taken in f32 would lose that much of every gate factor.
template <class T>
inline T eg(double x) {
  return ex_decay(static_cast<T>(x));
}

// One (batch, head): base pointers of its rows (token t of a [B, T, H, D] tensor is at
// base + t·H·D) and of its state matrix.
template <class T>
struct Head {
  const T *q, *k, *v, *g, *gv, *h0;
  int64_t ldk, ldv;  // H·dk, H·dv
};

struct Geo {
  int64_t B, T, H, dk, dv;
  bool parallel(int64_t tasks) const { return tasks > 1 && T * dk * dv > kParallelGrain; }
  int64_t row_k(int64_t b, int64_t h) const { return b * T * H * dk + h * dk; }
  int64_t row_v(int64_t b, int64_t h) const { return b * T * H * dv + h * dv; }
  int64_t state(int64_t b, int64_t h) const { return (b * H + h) * dk * dv; }
};

Geo geo_of(const Tensor& q, const Tensor& v) { return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)}; }

// The head's input rows through io (the tensors' own rows for f32 and f64, widened rows for bf16).
template <class E>
Head<compute_t<E>> head_of(const Geo& G, TaskRows<E>& io, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& gv, const Tensor& h0, int64_t b, int64_t h) {
  const int64_t rk = G.row_k(b, h), rv = G.row_v(b, h), ldk = G.H * G.dk, ldv = G.H * G.dv;
  return {io.in(q, rk, G.T, G.dk, ldk),           io.in(k, rk, G.T, G.dk, ldk),
          io.in(v, rv, G.T, G.dv, ldv),           io.in(g, rk, G.T, G.dk, ldk),
          io.in(gv, rv, G.T, G.dv, ldv),          io.in(h0, G.state(b, h), G.dk, G.dv, G.dv),
          TaskRows<E>::ld(ldk, G.dk),             TaskRows<E>::ld(ldv, G.dv)};
}

// The rows of the outputs and cotangents of one head (through io, as head_of).
template <class E>
compute_t<E>* out_k(const Geo& G, TaskRows<E>& io, const Tensor& t, int64_t b, int64_t h) {
  return io.out(t, G.row_k(b, h), G.T, G.dk, G.H * G.dk);
}
template <class E>
compute_t<E>* out_v(const Geo& G, TaskRows<E>& io, const Tensor& t, int64_t b, int64_t h) {
  return io.out(t, G.row_v(b, h), G.T, G.dv, G.H * G.dv);
}
template <class E>
compute_t<E>* out_state(const Geo& G, TaskRows<E>& io, const Tensor& t, int64_t b, int64_t h) {
  return io.out(t, G.state(b, h), G.dk, G.dv, G.dv);
}

// ---- recurrent form -----------------------------------------------------------------------------

// One step S ← (αβᵀ) ⊙ S + kᵀ v with α = exp(g_t), β = exp(gv_t) (1 without gv); when `o` is
// given also o_t = scale · q_t S (in the same pass over the rows of S). Touches S [dk, dv].
template <class T>
void recurrent_step(const Geo& G, const T* q, const T* k, const T* v, const T* g, const T* gv, T scale, T* S, T* o,
                    T* beta) {
  const int64_t dk = G.dk, dv = G.dv;
  if (gv) {
    for (int64_t j = 0; j < dv; ++j) beta[j] = ex(gv[j]);
  }
  if (o) std::fill_n(o, dv, T(0));
  for (int64_t i = 0; i < dk; ++i) {
    T* row = S + i * dv;
    const T a = ex(g[i]), ki = k[i];
    if (gv) {
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) row[j] = a * beta[j] * row[j] + ki * v[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) row[j] = a * row[j] + ki * v[j];
    }
    if (o) {
      const T qi = scale * q[i];
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) o[j] += qi * row[j];
    }
  }
}

// Forward, step by step: S₀ = initial state (or 0); for t = 0 … T−1: S ← αβᵀ ⊙ S + k_tᵀ v_t,
// o_t = scale q_t S; final_state = S. Memory: reads q, k, v, g, gv, h0; writes o, final_state;
// scratch: one [dk, dv] state and β [dv] per task.
template <class E>
void recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                       const Tensor& h0, const GlaParams& p, const Tensor& o, const Tensor& fs) {
  using T = compute_t<E>;
  const Geo G = geo_of(q, v);
  const T scale = static_cast<T>(p.scale);
  const int64_t tasks = G.B * G.H;
#pragma omp parallel for schedule(dynamic) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / G.H, h = task % G.H;
    TaskRows<E> io;
    const Head<T> X = head_of(G, io, q, k, v, g, gv, h0, b, h);
    T* S = out_state(G, io, fs, b, h);
    T* O = out_v(G, io, o, b, h);
    std::vector<T> beta(static_cast<size_t>(G.dv));
    if (X.h0) {
      std::copy_n(X.h0, G.dk * G.dv, S);
    } else {
      std::fill_n(S, G.dk * G.dv, T(0));
    }
    for (int64_t t = 0; t < G.T; ++t) {
      recurrent_step(G, X.q + t * X.ldk, X.k + t * X.ldk, X.v + t * X.ldv, X.g + t * X.ldk,
                     X.gv ? X.gv + t * X.ldv : nullptr, scale, S, O + t * X.ldv, beta.data());
    }
    io.store();
  }
}

// Backward through time. With dS the gradient of the loss w.r.t. S_t (from o_t, S_{t+1} and the
// final state), walking t = T−1 … 0:
//   dS   += scale q_tᵀ do_t                 (o_t = scale q_t S_t)
//   dq_t  = scale S_t do_t
//   dk_t  = dS v_t,   dv_t = k_t dS          (S_t ∋ k_tᵀ v_t)
//   D     = dS ⊙ αβᵀ ⊙ S_{t−1}:  dg_t = Σ_j D_ij,  dgv_t = Σ_i D_ij   (∂α_i/∂g_i = α_i)
//   dS    = αβᵀ ⊙ dS                         (now the gradient w.r.t. S_{t−1})
// and d initial_state = dS at the end. States are recomputed: a first pass keeps S every `chunk`
// steps; then each segment's states are recomputed from its checkpoint before it is walked in
// reverse. Memory per task: ⌈T/chunk⌉ + chunk states of [dk, dv]; writes dq, dk, dv, dg, dgv, dh0.
template <class E>
void recurrent_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& gv, const Tensor& h0, const GlaParams& p,
                        const GlaGrads& grads) {
  using T = compute_t<E>;
  const Geo G = geo_of(q, v);
  const T scale = static_cast<T>(p.scale);
  const int64_t tasks = G.B * G.H, dk = G.dk, dv = G.dv, SZ = dk * dv;
  const int64_t K = std::min(p.chunk, std::max<int64_t>(G.T, 1)), nseg = (G.T + K - 1) / K;
#pragma omp parallel for schedule(dynamic) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / G.H, h = task % G.H;
    TaskRows<E> io;
    const Head<T> X = head_of(G, io, q, k, v, g, gv, h0, b, h);
    const T* dO = io.in(dout, G.row_v(b, h), G.T, dv, G.H * dv);
    const T* dF = io.in(dfinal, G.state(b, h), dk, dv, dv);
    T* dQ = out_k(G, io, grads.dq, b, h);
    T* dK = out_k(G, io, grads.dk, b, h);
    T* dV = out_v(G, io, grads.dv, b, h);
    T* dG = out_k(G, io, grads.dg, b, h);
    T* dGV = out_v(G, io, grads.dgv, b, h);
    T* dH0 = out_state(G, io, grads.dinitial_state, b, h);
    std::vector<T> ckpt(static_cast<size_t>(std::max<int64_t>(nseg, 1) * SZ)), seg(static_cast<size_t>(K * SZ));
    std::vector<T> dS(dF, dF + SZ);
    std::vector<T> alpha(static_cast<size_t>(dk)), beta(static_cast<size_t>(dv), T(1)), dgv_acc(static_cast<size_t>(dv));
    std::vector<T> cur(static_cast<size_t>(SZ), T(0));
    if (X.h0) std::copy_n(X.h0, SZ, cur.begin());
    for (int64_t n = 0; n < nseg; ++n) {  // checkpoints: the state entering each segment
      std::copy(cur.begin(), cur.end(), ckpt.begin() + n * SZ);
      for (int64_t t = n * K; t < std::min(G.T, (n + 1) * K); ++t) {
        recurrent_step<T>(G, nullptr, X.k + t * X.ldk, X.v + t * X.ldv, X.g + t * X.ldk,
                          X.gv ? X.gv + t * X.ldv : nullptr, scale, cur.data(), nullptr, beta.data());
      }
    }
    for (int64_t n = nseg - 1; n >= 0; --n) {
      const int64_t t0 = n * K, t1 = std::min(G.T, t0 + K);
      std::copy_n(ckpt.begin() + n * SZ, SZ, cur.begin());
      for (int64_t t = t0; t < t1; ++t) {  // seg[t − t0] = S_t
        recurrent_step<T>(G, nullptr, X.k + t * X.ldk, X.v + t * X.ldv, X.g + t * X.ldk,
                          X.gv ? X.gv + t * X.ldv : nullptr, scale, cur.data(), nullptr, beta.data());
        std::copy(cur.begin(), cur.end(), seg.begin() + (t - t0) * SZ);
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const T *St = seg.data() + (t - t0) * SZ, *Sp = t > t0 ? seg.data() + (t - t0 - 1) * SZ : ckpt.data() + n * SZ;
        const T *qt = X.q + t * X.ldk, *kt = X.k + t * X.ldk, *vt = X.v + t * X.ldv, *gt = X.g + t * X.ldk;
        const T* dot_ = dO + t * X.ldv;
        T *dqt = dQ + t * X.ldk, *dkt = dK + t * X.ldk, *dvt = dV + t * X.ldv;
        for (int64_t i = 0; i < dk; ++i) alpha[i] = ex(gt[i]);
        if (X.gv) {
          for (int64_t j = 0; j < dv; ++j) beta[j] = ex(X.gv[t * X.ldv + j]);
        }
        std::fill_n(dvt, dv, T(0));
        std::fill(dgv_acc.begin(), dgv_acc.end(), T(0));
        for (int64_t i = 0; i < dk; ++i) {
          T* ds = dS.data() + i * dv;
          const T *st = St + i * dv, *sp = Sp + i * dv;
          const T qi = scale * qt[i], ki = kt[i], a = alpha[i];
          T dq = 0, dkk = 0, dgi = 0;
#pragma omp simd reduction(+ : dq, dkk, dgi)
          for (int64_t j = 0; j < dv; ++j) {
            ds[j] += qi * dot_[j];
            dq += st[j] * dot_[j];
            dkk += ds[j] * vt[j];
            dvt[j] += ki * ds[j];
            const T dprev = a * beta[j] * ds[j];  // gradient w.r.t. S_{t−1}
            const T dd = dprev * sp[j];           // D_ij
            dgi += dd;
            dgv_acc[j] += dd;
            ds[j] = dprev;
          }
          dqt[i] = scale * dq;
          dkt[i] = dkk;
          if (dG) dG[t * X.ldk + i] = dgi;
        }
        if (dGV) std::copy(dgv_acc.begin(), dgv_acc.end(), dGV + t * X.ldv);
      }
    }
    if (dH0) std::copy(dS.begin(), dS.end(), dH0);
    io.store();
  }
}

// ---- chunkwise form -----------------------------------------------------------------------------

// Per-task scratch of the chunkwise kernels, sized for one chunk of C tokens and sub-chunks of c.
template <class T>
struct ChunkScratch {
  std::vector<double> b, bv;          // [C, dk], [C, dv]: in-chunk cumulative log-gates (double)
  std::vector<T> qs, ks, vs, dos;     // [C, dk], [C, dk], [C, dv], [C, dv]: gate-scaled rows
  std::vector<T> A, dA;               // [c, C]: a query sub-chunk's scores against earlier keys
  std::vector<T> tq, tk, tv;          // [c, dk], [C, dk], [C, dv]: GEMM results before gate factors
  std::vector<T> e, ev;               // [dk], [dv]: pairwise factors of the diagonal sub-chunk
  std::vector<double> zero;           // [max(dk, dv)]: a reference row of zeros (factors e^{b_r})
  ChunkScratch(int64_t C, int64_t c, int64_t dk, int64_t dv)
      : b(C * dk), bv(C * dv), qs(C * dk), ks(C * dk), vs(C * dv), dos(C * dv), A(c * C), dA(c * C), tq(c * dk),
        tk(C * dk), tv(C * dv), e(dk), ev(dv), zero(std::max(dk, dv), 0.0) {}
};

// b_t = Σ_{s ≤ t in chunk} g_s for the L rows of a chunk (and bv from gv), rows of dk (dv).
template <class T>
void cumulative_gates(const Head<T>& X, int64_t t0, int64_t L, int64_t dk, int64_t dv, ChunkScratch<T>& w) {
  for (int64_t r = 0; r < L; ++r) {
    const T* g = X.g + (t0 + r) * X.ldk;
    double* br = w.b.data() + r * dk;
    for (int64_t i = 0; i < dk; ++i) br[i] = (r ? br[i - dk] : 0.0) + g[i];
    if (X.gv) {
      const T* gv = X.gv + (t0 + r) * X.ldv;
      double* bvr = w.bv.data() + r * dv;
      for (int64_t j = 0; j < dv; ++j) bvr[j] = (r ? bvr[j - dv] : 0.0) + gv[j];
    }
  }
}

// dst_r = f · src_r ⊙ exp(sign · (b_r − b_ref)) for rows r of width n; b rows are ld_b apart,
// b_ref a row (sign +1 for rows after the reference, −1 for rows before it: both exponents ≤ 0).
template <class T>
void scale_rows(int64_t rows, int64_t n, const T* src, int64_t lds, const double* b, const double* bref, double sign,
                T f, T* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * lds;
    const double* br = b + r * n;
    T* d = dst + r * ldd;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = f * s[i] * eg<T>(sign * (br[i] - bref[i]));
  }
}

// dst_r += f · src_r ⊙ exp(sign · (b_r − b_ref)), as scale_rows but adding onto dst.
template <class T>
void accumulate_rows(int64_t rows, int64_t n, const T* src, int64_t lds, const double* b, const double* bref,
                     double sign, T f, T* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * lds;
    const double* br = b + r * n;
    T* d = dst + r * ldd;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] += f * s[i] * eg<T>(sign * (br[i] - bref[i]));
  }
}

// f_i = exp(b_r,i − b_s,i) for one pair r ≥ s (so every exponent ≤ 0): the difference in double,
// then the exponential over the whole row in T, in two loops so that both vectorise.
template <class T>
inline void pair_factors(const double* br, const double* bs, int64_t n, T* f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<T>(br[i] - bs[i]);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) f[i] = ex_decay(f[i]);
}

// Forward, chunk by chunk, with S the state entering the chunk of rows t0 … t0+L−1 (local r):
//   o_r  = scale (q_r ⊙ e^{b_r}) S ⊙ e^{bv_r}                                 (inter-chunk, one GEMM)
//        + Σ_{s < i0} Ã_rs v_s [⊙ e^{bv_r − bv_ref}, v_s ⊙ e^{bv_ref − bv_s}] (earlier sub-chunks)
//        + Σ_{i0 ≤ s ≤ r} A_rs v_s [⊙ e^{bv_r − bv_s}]                         (own sub-chunk, pairwise)
//   with, for the query sub-chunk [i0, i1) and ref = i0 − 1,
//   Ã = (scale q ⊙ e^{b_r − b_ref}) (k_s ⊙ e^{b_ref − b_s})ᵀ   (one GEMM per sub-chunk, all s < i0)
//   A_rs = scale Σ_i q_ri k_si e^{b_ri − b_si}                 (exact, s ≤ r in the sub-chunk)
//   S ← e^{b_last} e^{bv_last}ᵀ ⊙ S + (k ⊙ e^{b_last − b_s})ᵀ (v ⊙ e^{bv_last − bv_s})   (one GEMM)
// Memory: reads q, k, v, g, gv, h0; writes o, final_state (the running state lives there);
// scratch per task: ChunkScratch.
template <class E>
void chunk_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                   const Tensor& h0, const GlaParams& p, const Tensor& o, const Tensor& fs) {
  using T = compute_t<E>;
  const Geo G = geo_of(q, v);
  const T scale = static_cast<T>(p.scale);
  const int64_t tasks = G.B * G.H, dk = G.dk, dv = G.dv, C = p.chunk, c = p.sub_chunk;
#pragma omp parallel if (G.parallel(tasks))
  {
    ChunkScratch<T> w(C, c, dk, dv);
    TaskRows<E> io;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bi = task / G.H, h = task % G.H;
      io.begin();
      const Head<T> X = head_of(G, io, q, k, v, g, gv, h0, bi, h);
      T* S = out_state(G, io, fs, bi, h);
      T* O = out_v(G, io, o, bi, h);
      if (X.h0) {
        std::copy_n(X.h0, dk * dv, S);
      } else {
        std::fill_n(S, dk * dv, T(0));
      }
      const bool has_gv = X.gv != nullptr;
      for (int64_t t0 = 0; t0 < G.T; t0 += C) {
        const int64_t L = std::min(C, G.T - t0);
        const T *Qc = X.q + t0 * X.ldk, *Kc = X.k + t0 * X.ldk, *Vc = X.v + t0 * X.ldv;
        T* Oc = O + t0 * X.ldv;
        cumulative_gates(X, t0, L, dk, dv, w);
        const double *bb = w.b.data(), *bvv = w.bv.data();
        // Inter-chunk: o = (scale q ⊙ e^{b}) S, then ⊙ e^{bv}. (e^{b_r − 0}: a zero reference row.)
        scale_rows<T>(L, dk, Qc, X.ldk, bb, w.zero.data(), 1.0, scale, w.qs.data(), dk);
        mm(false, false, L, dv, dk, 1.0, w.qs.data(), dk, S, dv, 0.0, Oc, X.ldv);
        if (has_gv) scale_rows<T>(L, dv, Oc, X.ldv, bvv, w.zero.data(), 1.0, T(1), Oc, X.ldv);
        // Intra-chunk, one query sub-chunk [i0, i1) at a time.
        for (int64_t i0 = 0; i0 < L; i0 += c) {
          const int64_t i1 = std::min(L, i0 + c), n = i1 - i0;
          if (i0 > 0) {  // earlier sub-chunks, relative to the reference row i0 − 1
            const double *bref = bb + (i0 - 1) * dk, *bvref = bvv + (i0 - 1) * dv;
            scale_rows<T>(n, dk, Qc + i0 * X.ldk, X.ldk, bb + i0 * dk, bref, 1.0, scale, w.qs.data(), dk);
            scale_rows<T>(i0, dk, Kc, X.ldk, bb, bref, -1.0, T(1), w.ks.data(), dk);
            mm(false, true, n, i0, dk, 1.0, w.qs.data(), dk, w.ks.data(), dk, 0.0, w.A.data(), i0);
            if (!has_gv) {
              mm(false, false, n, dv, i0, 1.0, w.A.data(), i0, Vc, X.ldv, 1.0, Oc + i0 * X.ldv, X.ldv);
            } else {
              scale_rows<T>(i0, dv, Vc, X.ldv, bvv, bvref, -1.0, T(1), w.vs.data(), dv);
              mm(false, false, n, dv, i0, 1.0, w.A.data(), i0, w.vs.data(), dv, 0.0, w.tv.data(), dv);
              accumulate_rows<T>(n, dv, w.tv.data(), dv, bvv + i0 * dv, bvref, 1.0, T(1), Oc + i0 * X.ldv, X.ldv);
            }
          }
          // Own sub-chunk: exact pairwise factors e^{b_r − b_s}, s ≤ r.
          for (int64_t r = i0; r < i1; ++r) {
            const T* qr = Qc + r * X.ldk;
            const double* br = bb + r * dk;
            T* orow = Oc + r * X.ldv;
            for (int64_t s = i0; s <= r; ++s) {
              const T *ksr = Kc + s * X.ldk, *vsr = Vc + s * X.ldv;
              const double* bs = bb + s * dk;
              T* e = w.e.data();
              pair_factors(br, bs, dk, e);
              const T a = scale * lane_sum<T>(dk, [&](int64_t i) { return qr[i] * ksr[i] * e[i]; });
              if (!has_gv) {
#pragma omp simd
                for (int64_t j = 0; j < dv; ++j) orow[j] += a * vsr[j];
              } else {
                T* ev = w.ev.data();
                pair_factors(bvv + r * dv, bvv + s * dv, dv, ev);
#pragma omp simd
                for (int64_t j = 0; j < dv; ++j) orow[j] += a * vsr[j] * ev[j];
              }
            }
          }
        }
        // State: S ← e^{b_last} e^{bv_last}ᵀ ⊙ S + (k ⊙ e^{b_last − b_s})ᵀ (v ⊙ e^{bv_last − bv_s}).
        const double *blast = bb + (L - 1) * dk, *bvlast = bvv + (L - 1) * dv;
        for (int64_t i = 0; i < dk; ++i) {
          const T a = eg<T>(blast[i]);
          T* row = S + i * dv;
          if (has_gv) {
            for (int64_t j = 0; j < dv; ++j) row[j] *= a * eg<T>(bvlast[j]);
          } else {
            for (int64_t j = 0; j < dv; ++j) row[j] *= a;
          }
        }
        // Rows before b_last: e^{b_last − b_s} = e^{−(b_s − b_last)}.
        scale_rows<T>(L, dk, Kc, X.ldk, bb, blast, -1.0, T(1), w.ks.data(), dk);
        if (has_gv) {
          scale_rows<T>(L, dv, Vc, X.ldv, bvv, bvlast, -1.0, T(1), w.vs.data(), dv);
          mm(true, false, dk, dv, L, 1.0, w.ks.data(), dk, w.vs.data(), dv, 1.0, S, dv);
        } else {
          mm(true, false, dk, dv, L, 1.0, w.ks.data(), dk, Vc, X.ldv, 1.0, S, dv);
        }
      }
      io.store();
    }
  }
}

// Gate-gradient sums of the chunkwise backward, in double (docs/variants/gla.md, "Gate gradients without
// cancellation"): acc_t += Σ_{u = t}^{n−1} x_u ⊙ y_u over rows 0 … n−1 (suffix sums, the terms whose later
// endpoint is at or after t), rows of width w; `run` is scratch of w doubles.
template <class T>
void add_suffix_sums(int64_t n, int64_t w, const T* x, int64_t ldx, const T* y, int64_t ldy, double* acc, double* run) {
  std::fill_n(run, w, 0.0);
  for (int64_t u = n - 1; u >= 0; --u) {
    const T *xu = x + u * ldx, *yu = y + u * ldy;
    double* au = acc + u * w;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) {
      run[i] += static_cast<double>(xu[i]) * yu[i];
      au[i] += run[i];
    }
  }
}

// acc_t += Σ_{u < t} x_u ⊙ y_u over rows t = 0 … n−1 (exclusive prefix sums, the terms whose earlier
// endpoint is before t).
template <class T>
void add_prefix_sums(int64_t n, int64_t w, const T* x, int64_t ldx, const T* y, int64_t ldy, double* acc, double* run) {
  std::fill_n(run, w, 0.0);
  for (int64_t u = 0; u < n; ++u) {
    const T *xu = x + u * ldx, *yu = y + u * ldy;
    double* au = acc + u * w;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) {
      au[i] += run[i];
      run[i] += static_cast<double>(xu[i]) * yu[i];
    }
  }
}

// Per-task scratch of the chunkwise gate gradients: their sums over one chunk (double) and the running
// vectors of the sums above and of the pairwise part.
struct GateScratch {
  std::vector<double> dg, dgv;              // [C, dk], [C, dv]: dg_t, dgv_t of the chunk's rows
  std::vector<double> run, pair_g, pair_v;  // [max(dk, dv)], [dk], [dv]
  std::vector<double> x_g, x_v;             // [dk], [dv]: the pairs that span the whole chunk
  std::vector<double> e_g, e_v;             // [dk], [dv]: e^{b_last}, e^{bv_last}
  GateScratch(int64_t C, int64_t dk, int64_t dv)
      : dg(C * dk), dgv(C * dv), run(std::max(dk, dv)), pair_g(dk), pair_v(dv), x_g(dk), x_v(dv), e_g(dk), e_v(dv) {}
};

// Backward of the chunkwise form. First the state entering every chunk is recomputed (the
// forward's state recurrence, one GEMM per chunk; [chunks + 1, dk, dv] per task). Then chunks in
// reverse, with dS the gradient w.r.t. the state leaving the chunk (d final_state at first), S the
// state entering it, dõ_r = do_r ⊙ e^{bv_r} and, per query sub-chunk, the same Ã as the forward:
//   dq_r  = scale e^{b_r} ⊙ (dõ_r Sᵀ)                                          (inter, one GEMM)
//   dk_s  = e^{b_last − b_s} ⊙ ((v_s ⊙ e^{bv_last − bv_s}) dSᵀ)                  (state, one GEMM)
//   dv_s  = e^{bv_last − bv_s} ⊙ ((k_s ⊙ e^{b_last − b_s}) dS)                   (state, one GEMM)
//   earlier sub-chunks (s < i0, ref = i0 − 1), dÃ = (do ⊙ e^{bv_r − bv_ref}) (v ⊙ e^{bv_ref − bv_s})ᵀ:
//     dq_r += scale e^{b_r − b_ref} ⊙ (dÃ k̃)_r,  dk_s += e^{b_ref − b_s} ⊙ (dÃᵀ q̃)_s,
//     dv_s += e^{bv_ref − bv_s} ⊙ (Ãᵀ dõ)_s                                      (five GEMMs)
//   own sub-chunk, pairwise: dA_rs = Σ_j do_rj v_sj e^{bv_rj − bv_sj};
//     dq_r += scale Σ_s dA_rs k_s ⊙ e^{b_r − b_s},  dk_s += scale Σ_r dA_rs q_r ⊙ e^{b_r − b_s},
//     dv_s += Σ_r A_rs do_r ⊙ e^{bv_r − bv_s}
//   dS ← e^{b_last} e^{bv_last}ᵀ ⊙ dS + (scale q ⊙ e^{b})ᵀ dõ                   (one GEMM)
// and d initial_state = dS. The gates, chunk by chunk from bounded terms (docs/variants/gla.md): a
// pair (s, r), s < r, of a key and a query (the entering state counting as a key before the chunk,
// the leaving state's gradient as a query after it) adds its term P_rs = scale q_r ⊙ k_s ⊙ e^{b_r − b_s}
// · dA_rs to dg_t for every s < t ≤ r. Grouped by where s and r lie, every group is a sum of such products,
// each ≤ its factors:
//   dg_t = x                                  (s before the chunk, r after it)
//        + Σ_{r ≥ t} q_r ⊙ dq_r^inter         (s before the chunk)
//        + Σ_{s < t} k_s ⊙ dk_s^state         (r after the chunk)
//        + Σ_{r ≥ t in t's sub-chunk} q̃_r ⊙ (dÃ k̃)_r       (s in an earlier sub-chunk)
//        + Σ_{later sub-chunks} Σ_{s < t} k̃_s ⊙ (dÃᵀ q̃)_s    (r in a later sub-chunk)
//        + Σ_{s < t ≤ r, both in t's sub-chunk} P_rs         (pairwise)
// with x = Σ_j (dS ⊙ e^{b_last} e^{bv_last}ᵀ ⊙ S)_ij, and dgv_t likewise from the value side (dõ for
// q, v for k, Ã for dÃ; x summed over i). Sums in double.
// Memory: reads dout, dfinal, q, k, v, g, gv, h0; writes dq, dk, dv, dg, dgv, dh0.
template <class E>
void chunk_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& g, const Tensor& gv, const Tensor& h0, const GlaParams& p, const GlaGrads& grads) {
  using T = compute_t<E>;
  const Geo G = geo_of(q, v);
  const T scale = static_cast<T>(p.scale);
  const int64_t tasks = G.B * G.H, dk = G.dk, dv = G.dv, C = p.chunk, c = p.sub_chunk, SZ = dk * dv;
  const int64_t nc = (G.T + C - 1) / C;
  const bool need_g = grads.dg.defined(), need_gv = grads.dgv.defined() && gv.defined();
#pragma omp parallel if (G.parallel(tasks))
  {
    ChunkScratch<T> w(C, c, dk, dv);
    GateScratch gw(C, dk, dv);
    TaskRows<E> io;
    std::vector<T> states, dS(static_cast<size_t>(SZ));
    std::vector<T> to(static_cast<size_t>(need_gv ? c * dv : 0));  // [c, dv]: Ã ṽ of a query sub-chunk
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bi = task / G.H, h = task % G.H;
      io.begin();
      const Head<T> X = head_of(G, io, q, k, v, g, gv, h0, bi, h);
      const bool has_gv = X.gv != nullptr;
      const T* dO = io.in(dout, G.row_v(bi, h), G.T, dv, G.H * dv);
      const T* dF = io.in(dfinal, G.state(bi, h), dk, dv, dv);
      T* dQ = out_k(G, io, grads.dq, bi, h);
      T* dK = out_k(G, io, grads.dk, bi, h);
      T* dV = out_v(G, io, grads.dv, bi, h);
      T* dG = need_g ? out_k(G, io, grads.dg, bi, h) : nullptr;
      T* dGV = need_gv ? out_v(G, io, grads.dgv, bi, h) : nullptr;
      T* dH0 = out_state(G, io, grads.dinitial_state, bi, h);
      // States entering each chunk; states[nc] = S_T.
      states.assign(static_cast<size_t>((nc + 1) * SZ), T(0));
      if (X.h0) std::copy_n(X.h0, SZ, states.begin());
      for (int64_t n = 0; n < nc; ++n) {
        const int64_t t0 = n * C, L = std::min(C, G.T - t0);
        T* S = states.data() + (n + 1) * SZ;
        std::copy_n(states.data() + n * SZ, SZ, S);
        cumulative_gates(X, t0, L, dk, dv, w);
        const double *blast = w.b.data() + (L - 1) * dk, *bvlast = w.bv.data() + (L - 1) * dv;
        for (int64_t i = 0; i < dk; ++i) {
          const T a = eg<T>(blast[i]);
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= has_gv ? a * eg<T>(bvlast[j]) : a;
        }
        scale_rows<T>(L, dk, X.k + t0 * X.ldk, X.ldk, w.b.data(), blast, -1.0, T(1), w.ks.data(), dk);
        const T* vsrc = X.v + t0 * X.ldv;
        int64_t ldvs = X.ldv;
        if (has_gv) {
          scale_rows<T>(L, dv, vsrc, X.ldv, w.bv.data(), bvlast, -1.0, T(1), w.vs.data(), dv);
          vsrc = w.vs.data();
          ldvs = dv;
        }
        mm(true, false, dk, dv, L, 1.0, w.ks.data(), dk, vsrc, ldvs, 1.0, S, dv);
      }
      std::copy_n(dF, SZ, dS.begin());
      for (int64_t n = nc - 1; n >= 0; --n) {
        const int64_t t0 = n * C, L = std::min(C, G.T - t0);
        const T* S = states.data() + n * SZ;
        const T *Qc = X.q + t0 * X.ldk, *Kc = X.k + t0 * X.ldk, *Vc = X.v + t0 * X.ldv, *dOc = dO + t0 * X.ldv;
        T *dQc = dQ + t0 * X.ldk, *dKc = dK + t0 * X.ldk, *dVc = dV + t0 * X.ldv;
        double *dgc = gw.dg.data(), *dgvc = gw.dgv.data();
        if (need_g) std::fill_n(dgc, L * dk, 0.0);
        if (need_gv) std::fill_n(dgvc, L * dv, 0.0);
        cumulative_gates(X, t0, L, dk, dv, w);
        const double *bb = w.b.data(), *bvv = w.bv.data();
        const double *blast = bb + (L - 1) * dk, *bvlast = bvv + (L - 1) * dv;
        // dõ = do ⊙ e^{bv} (do itself without gv), and q̂ = scale q ⊙ e^{b}.
        const T* dos = dOc;
        int64_t lddos = X.ldv;
        if (has_gv) {
          scale_rows<T>(L, dv, dOc, X.ldv, bvv, w.zero.data(), 1.0, T(1), w.dos.data(), dv);
          dos = w.dos.data();
          lddos = dv;
        }
        scale_rows<T>(L, dk, Qc, X.ldk, bb, w.zero.data(), 1.0, scale, w.qs.data(), dk);
        // Inter: dq = scale e^{b} ⊙ (dõ Sᵀ).
        mm(false, true, L, dk, dv, 1.0, dos, lddos, S, dv, 0.0, dQc, X.ldk);
        scale_rows<T>(L, dk, dQc, X.ldk, bb, w.zero.data(), 1.0, scale, dQc, X.ldk);
        // Gates, pairs with s before the chunk and r in it: q ⊙ dq^inter, and on the value side
        // dõ ⊙ (q̂ S) (= do ⊙ o^inter).
        if (need_g) add_suffix_sums<T>(L, dk, Qc, X.ldk, dQc, X.ldk, dgc, gw.run.data());
        if (need_gv) {
          mm(false, false, L, dv, dk, 1.0, w.qs.data(), dk, S, dv, 0.0, w.tv.data(), dv);
          add_suffix_sums<T>(L, dv, dos, lddos, w.tv.data(), dv, dgvc, gw.run.data());
        }
        // Through the leaving state: dk = e^{b_last − b} ⊙ (v̂ dSᵀ), dv = e^{bv_last − bv} ⊙ (k̂ dS).
        scale_rows<T>(L, dk, Kc, X.ldk, bb, blast, -1.0, T(1), w.ks.data(), dk);
        const T* vhat = Vc;
        int64_t ldvh = X.ldv;
        if (has_gv) {
          scale_rows<T>(L, dv, Vc, X.ldv, bvv, bvlast, -1.0, T(1), w.vs.data(), dv);
          vhat = w.vs.data();
          ldvh = dv;
        }
        mm(false, true, L, dk, dv, 1.0, vhat, ldvh, dS.data(), dv, 0.0, dKc, X.ldk);
        mm(false, false, L, dv, dk, 1.0, w.ks.data(), dk, dS.data(), dv, 0.0, dVc, X.ldv);
        scale_rows<T>(L, dk, dKc, X.ldk, bb, blast, -1.0, T(1), dKc, X.ldk);
        if (has_gv) scale_rows<T>(L, dv, dVc, X.ldv, bvv, bvlast, -1.0, T(1), dVc, X.ldv);
        // Gates, pairs with s in the chunk and r after it: k ⊙ dk^state, v ⊙ dv^state; and the pairs
        // spanning the chunk: x = row (column) sums of dS ⊙ e^{b_last} e^{bv_last}ᵀ ⊙ S, for every t.
        if (need_g) add_prefix_sums<T>(L, dk, Kc, X.ldk, dKc, X.ldk, dgc, gw.run.data());
        if (need_gv) add_prefix_sums<T>(L, dv, Vc, X.ldv, dVc, X.ldv, dgvc, gw.run.data());
        if (need_g || need_gv) {
          double *x_g = gw.x_g.data(), *x_v = gw.x_v.data(), *e_g = gw.e_g.data(), *e_v = gw.e_v.data();
          for (int64_t i = 0; i < dk; ++i) e_g[i] = std::exp(blast[i]);
          for (int64_t j = 0; j < dv; ++j) {
            e_v[j] = has_gv ? std::exp(bvlast[j]) : 1.0;
            x_v[j] = 0.0;
          }
          for (int64_t i = 0; i < dk; ++i) {
            const T *dsi = dS.data() + i * dv, *si = S + i * dv;
            double row = 0;
            for (int64_t j = 0; j < dv; ++j) {
              const double x = static_cast<double>(dsi[j]) * si[j] * e_v[j];
              row += x;
              x_v[j] += x * e_g[i];
            }
            x_g[i] = row * e_g[i];
          }
          for (int64_t t = 0; t < L; ++t) {
            if (need_g) {
              for (int64_t i = 0; i < dk; ++i) dgc[t * dk + i] += x_g[i];
            }
            if (need_gv) {
              for (int64_t j = 0; j < dv; ++j) dgvc[t * dv + j] += x_v[j];
            }
          }
        }
        // dS ← e^{b_last} e^{bv_last}ᵀ ⊙ dS + q̂ᵀ dõ (q̂ still in w.qs).
        for (int64_t i = 0; i < dk; ++i) {
          const T a = eg<T>(blast[i]);
          for (int64_t j = 0; j < dv; ++j) dS[i * dv + j] *= has_gv ? a * eg<T>(bvlast[j]) : a;
        }
        mm(true, false, dk, dv, L, 1.0, w.qs.data(), dk, dos, lddos, 1.0, dS.data(), dv);
        // Intra-chunk, per query sub-chunk.
        for (int64_t i0 = 0; i0 < L; i0 += c) {
          const int64_t i1 = std::min(L, i0 + c), n = i1 - i0;
          if (i0 > 0) {
            const double *bref = bb + (i0 - 1) * dk, *bvref = bvv + (i0 - 1) * dv;
            scale_rows<T>(n, dk, Qc + i0 * X.ldk, X.ldk, bb + i0 * dk, bref, 1.0, scale, w.qs.data(), dk);
            scale_rows<T>(i0, dk, Kc, X.ldk, bb, bref, -1.0, T(1), w.ks.data(), dk);
            mm(false, true, n, i0, dk, 1.0, w.qs.data(), dk, w.ks.data(), dk, 0.0, w.A.data(), i0);
            if (!has_gv) {
              mm(false, true, n, i0, dv, 1.0, dOc + i0 * X.ldv, X.ldv, Vc, X.ldv, 0.0, w.dA.data(), i0);
              mm(true, false, i0, dv, n, 1.0, w.A.data(), i0, dOc + i0 * X.ldv, X.ldv, 1.0, dVc, X.ldv);
            } else {
              scale_rows<T>(n, dv, dOc + i0 * X.ldv, X.ldv, bvv + i0 * dv, bvref, 1.0, T(1), w.dos.data(), dv);
              scale_rows<T>(i0, dv, Vc, X.ldv, bvv, bvref, -1.0, T(1), w.vs.data(), dv);
              mm(false, true, n, i0, dv, 1.0, w.dos.data(), dv, w.vs.data(), dv, 0.0, w.dA.data(), i0);
              mm(true, false, i0, dv, n, 1.0, w.A.data(), i0, w.dos.data(), dv, 0.0, w.tv.data(), dv);
              accumulate_rows<T>(i0, dv, w.tv.data(), dv, bvv, bvref, -1.0, T(1), dVc, X.ldv);
              if (need_gv) {
                // Value gate: r here, s earlier: dõ' ⊙ (Ã ṽ)_r; r in this sub-chunk, s < t earlier in
                // any sub-chunk before it: ṽ_s ⊙ (Ãᵀ dõ')_s.
                mm(false, false, n, dv, i0, 1.0, w.A.data(), i0, w.vs.data(), dv, 0.0, to.data(), dv);
                add_suffix_sums<T>(n, dv, w.dos.data(), dv, to.data(), dv, dgvc + i0 * dv, gw.run.data());
                add_prefix_sums<T>(i0, dv, w.vs.data(), dv, w.tv.data(), dv, dgvc, gw.run.data());
              }
            }
            mm(false, false, n, dk, i0, 1.0, w.dA.data(), i0, w.ks.data(), dk, 0.0, w.tq.data(), dk);
            mm(true, false, i0, dk, n, 1.0, w.dA.data(), i0, w.qs.data(), dk, 0.0, w.tk.data(), dk);
            accumulate_rows<T>(n, dk, w.tq.data(), dk, bb + i0 * dk, bref, 1.0, scale, dQc + i0 * X.ldk, X.ldk);
            accumulate_rows<T>(i0, dk, w.tk.data(), dk, bb, bref, -1.0, T(1), dKc, X.ldk);
            if (need_g) {  // the same two groups for the key gate: q̃ ⊙ (dÃ k̃), k̃ ⊙ (dÃᵀ q̃)
              add_suffix_sums<T>(n, dk, w.qs.data(), dk, w.tq.data(), dk, dgc + i0 * dk, gw.run.data());
              add_prefix_sums<T>(i0, dk, w.ks.data(), dk, w.tk.data(), dk, dgc, gw.run.data());
            }
          }
          // Own sub-chunk, exact pairwise factors; the gates take each pair s < r at every s < t ≤ r
          // through running sums over s (pair_g, pair_v).
          for (int64_t r = i0; r < i1; ++r) {
            const T *qr = Qc + r * X.ldk, *dor = dOc + r * X.ldv;
            const double* br = bb + r * dk;
            T* dqr = dQc + r * X.ldk;
            double *pair_g = gw.pair_g.data(), *pair_v = gw.pair_v.data();
            if (need_g) std::fill_n(pair_g, dk, 0.0);
            if (need_gv) std::fill_n(pair_v, dv, 0.0);
            for (int64_t s = i0; s <= r; ++s) {
              const T *ksr = Kc + s * X.ldk, *vsr = Vc + s * X.ldv;
              const double* bs = bb + s * dk;
              T* dks = dKc + s * X.ldk;
              T* dvs = dVc + s * X.ldv;
              T da;
              T* e = w.e.data();
              T* ev = w.ev.data();
              pair_factors(br, bs, dk, e);
              const T a = scale * lane_sum<T>(dk, [&](int64_t i) { return qr[i] * ksr[i] * e[i]; });
              if (!has_gv) {
                da = lane_sum<T>(dv, [&](int64_t j) { return dor[j] * vsr[j]; });
#pragma omp simd
                for (int64_t j = 0; j < dv; ++j) dvs[j] += a * dor[j];
              } else {
                pair_factors(bvv + r * dv, bvv + s * dv, dv, ev);
                da = lane_sum<T>(dv, [&](int64_t j) { return dor[j] * vsr[j] * ev[j]; });
#pragma omp simd
                for (int64_t j = 0; j < dv; ++j) dvs[j] += a * dor[j] * ev[j];
              }
              const T sda = scale * da;
#pragma omp simd
              for (int64_t i = 0; i < dk; ++i) {
                dqr[i] += sda * ksr[i] * e[i];
                dks[i] += sda * qr[i] * e[i];
              }
              if (s == r) continue;  // e^{b_r − b_r}: no gate between the pair
              if (need_g) {
                double* acc = dgc + (s + 1) * dk;
#pragma omp simd
                for (int64_t i = 0; i < dk; ++i) {
                  pair_g[i] += static_cast<double>(sda * qr[i]) * (ksr[i] * e[i]);
                  acc[i] += pair_g[i];
                }
              }
              if (need_gv) {
                double* acc = dgvc + (s + 1) * dv;
#pragma omp simd
                for (int64_t j = 0; j < dv; ++j) {
                  pair_v[j] += static_cast<double>(a * dor[j]) * (vsr[j] * ev[j]);
                  acc[j] += pair_v[j];
                }
              }
            }
          }
        }
        if (need_g) {
          for (int64_t t = 0; t < L; ++t) {
            for (int64_t i = 0; i < dk; ++i) dG[(t0 + t) * X.ldk + i] = static_cast<T>(dgc[t * dk + i]);
          }
        }
        if (need_gv) {
          for (int64_t t = 0; t < L; ++t) {
            for (int64_t j = 0; j < dv; ++j) dGV[(t0 + t) * X.ldv + j] = static_cast<T>(dgvc[t * dv + j]);
          }
        }
      }
      if (dH0) std::copy(dS.begin(), dS.end(), dH0);
      io.store();
    }
  }
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                 const Tensor& h0, const GlaParams& p, const Tensor& o, const Tensor& fs) {
  dispatch_float_or_bf16(q.dtype(), "gla", [&](auto tag) {
    using E = decltype(tag);
    if (p.form == GlaForm::recurrent) {
      recurrent_forward<E>(q, k, v, g, gv, h0, p, o, fs);
    } else {
      chunk_forward<E>(q, k, v, g, gv, h0, p, o, fs);
    }
  });
}

void backward_cpu(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& gv, const Tensor& h0, const GlaParams& p, const GlaGrads& grads) {
  dispatch_float_or_bf16(q.dtype(), "gla backward", [&](auto tag) {
    using E = decltype(tag);
    if (p.form == GlaForm::recurrent) {
      recurrent_backward<E>(dout, dfinal, q, k, v, g, gv, h0, p, grads);
    } else {
      chunk_backward<E>(dout, dfinal, q, k, v, g, gv, h0, p, grads);
    }
  });
}

}  // namespace
}  // namespace cpu

namespace kernel {
// bf16 tensors are taken as they are: the kernels widen a head's rows themselves (layers/variant_rows.h).
SEQLAB_REGISTER_KERNEL_TAKING_BF16(gla_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(gla_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the inputs (contiguous); the backward is the kernel of the same form.
GlaOutput gla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
              const Tensor& initial_state, const GlaOptions& opts) {
  kernel::resolve(opts, kernel::check_inputs(q, k, v, g, gv, initial_state));
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v),
               gc = kernel::contiguous(g), gvc = kernel::contiguous_or_none(gv),
               h0c = kernel::contiguous_or_none(initial_state);
  GlaOutput out = kernel::gla_forward(qc, kc, vc, gc, gvc, h0c, opts);
  record("gla", {q, k, v, g, gv, initial_state}, {&out.o, &out.final_state}, {qc, kc, vc, gc, gvc, h0c},
         [opts](const std::vector<Tensor>& gr, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::GlaGrads d = kernel::gla_backward(gr[0], gr[1], s[0], s[1], s[2], s[3], s[4], s[5], opts, need);
           return std::vector<Tensor>{d.dq, d.dk, d.dv, d.dg, d.dgv, d.dinitial_state};
         });
  return out;
}

namespace {

// Log-gates in [lo, hi] (≤ 0), for examples.
Tensor log_gates(const Shape& shape, Generator& gen, DType dtype, double lo, double hi) {
  return Tensor::rand(shape, gen, dtype, lo, hi);
}

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "gla";
  s.summary =
      "S_t = (exp(g_t)ᵀ exp(gv_t)) ⊙ S_{t−1} + k_tᵀ v_t, o_t = scale q_t S_t; q, k, g [B, T, H, dk], v, gv "
      "[B, T, H, dv] (gv optional), initial_state [B, H, dk, dv] (optional), final_state = S_T";
  s.inputs = {{"q"}, {"k"}, {"v"}, {"g"}, {"gv", OpInputKind::floating, true}, {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"o", "final_state"};
  s.attrs = {{"form", AttrType::string, "chunkwise", "chunkwise (training) or recurrent (step by step)"},
             {"chunk", AttrType::integer, "64", "tokens per chunk (recurrent: steps between backward checkpoints)"},
             {"sub_chunk", AttrType::integer, "16", "tokens per sub-chunk inside a chunk"},
             {"scale", AttrType::number, "0", "scale of q; 0 means 1/√dk"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    GlaOptions o{parse_gla_form(a.get_string("form")), a.get_int("chunk"), a.get_int("sub_chunk"),
                 a.get_number("scale")};
    GlaOutput out = gla(in[0], in[1], in[2], in[3], in[4], in[5], o);
    return std::vector<Tensor>{out.o, out.final_state};
  };
  // T = 7 with chunks of 4 (the second partial) and sub-chunks of 2 (one of 1); dk ≠ dv; both gates
  // and an initial state.
  s.example = [](Generator& gen, DType dtype) {
    const int64_t B = 2, T = 7, H = 2, dk = 3, dv = 4;
    return std::vector<Tensor>{Tensor::randn({B, T, H, dk}, gen, dtype), Tensor::randn({B, T, H, dk}, gen, dtype),
                               Tensor::randn({B, T, H, dv}, gen, dtype), log_gates({B, T, H, dk}, gen, dtype, -1.5, -0.05),
                               log_gates({B, T, H, dv}, gen, dtype, -1.0, -0.05), Tensor::randn({B, H, dk, dv}, gen, dtype)};
  };
  s.example_attrs = {{"chunk", "4"}, {"sub_chunk", "2"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
