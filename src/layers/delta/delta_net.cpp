// DeltaNet / Gated DeltaNet: the raw entry points, the CPU forward and backward kernels of both forms
// side by side, the autograd node and the registry entry. Equations in delta_net.h; derivations in
// docs/variants/delta_net.md.
//
// How the CPU kernels work:
// - One task per (batch, head), OpenMP over the B·H tasks; a task owns its rows of every output and
//   gradient, so there are no races. Inside a parallel region the GEMM slot runs on the calling thread.
// - Row vectors are the rows of the [B, T, H, ·] tensors: a head's rows are H·d elements apart, so
//   chunk-level products are GEMMs on strided row-major matrices with no copies.
// - Chunkwise forward: per chunk of n ≤ C tokens, K Kᵀ, K S_0, Q S_0, Q Kᵀ, P δ and Kᵀ (r ⊙ δ) are
//   GEMMs; the decay masks and the unit lower-triangular solve for δ are short loops.
// - Chunkwise backward: a first pass recomputes the state entering every chunk (the forward saves
//   nothing but its inputs); a reverse pass over chunks recomputes the chunk's intermediates and
//   propagates dS from the chunk's exit to its entry, with a back substitution for the solve.
// - Recurrent forward: rank-1 updates of the dk × dv state per token. Recurrent backward: states are
//   checkpointed every `chunk` steps in a forward pass, then each segment is replayed (its states
//   kept) and walked in reverse.
// - Sums accumulate in the input type, except the cumulative log-gates and the gate-gradient sums
//   (double: docs/variants/delta_net.md, "The gate gradient without cancellation").
#include "layers/delta/delta_net.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "tensor/blas_rows.h"
#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {

const FormNames<DeltaNetForm>& delta_net_forms() {
  static const FormNames<DeltaNetForm> forms{
      "delta_net", {{"chunkwise", DeltaNetForm::chunkwise}, {"recurrent", DeltaNetForm::recurrent}}};
  return forms;
}

}  // namespace

const char* delta_net_form_name(DeltaNetForm form) { return delta_net_forms().name(form); }
DeltaNetForm parse_delta_net_form(const std::string& name) { return delta_net_forms().parse(name); }

namespace kernel {

namespace {

using Dims = HeadDims;

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                  const Tensor& s0) {
  const VariantInputs in("delta_net",
                         {{"q", q}, {"k", k}, {"v", v}, {"beta", beta}, {"g", g}, {"initial_state", s0}},
                         "q, k [B, T, H, dk], v [B, T, H, dv], beta [B, T, H], g [B, T, H] or none, "
                         "initial_state [B, H, dk, dv] or none");
  in.given({"q", "k", "v", "beta"});
  const Dims d = in.qkv();
  in.shaped("beta", {d.B, d.T, d.H}, "[B, T, H]");
  in.shaped("g", {d.B, d.T, d.H}, "[B, T, H]");
  in.shaped("initial_state", {d.B, d.H, d.dk, d.dv}, "[B, H, dk, dv]");
  in.same_dtype_and_device();
  return d;
}

DeltaNetParams resolve(const DeltaNetOptions& opts, int64_t dk) {
  if (opts.chunk <= 0)
    throw std::invalid_argument("delta_net: chunk must be positive, got " + std::to_string(opts.chunk));
  return {opts.form, opts.chunk, opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(dk))};
}

Tensor maybe_contiguous(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype) {
    throw std::invalid_argument(std::string("delta_net backward: ") + what + " is " +
                                (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "undefined") +
                                ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

DeltaNetOutput delta_net_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                                 const Tensor& initial_state, const DeltaNetOptions& opts) {
  const Dims d = check_inputs(q, k, v, beta, g, initial_state);
  const DeltaNetParams p = resolve(opts, d.dk);
  DeltaNetOutput out{Tensor::empty({d.B, d.T, d.H, d.dv}, q.dtype(), q.device()),
                     Tensor::empty({d.B, d.H, d.dk, d.dv}, q.dtype(), q.device())};
  delta_net_forward_kernel(q.device(), kernel::contiguous(q), kernel::contiguous(k), kernel::contiguous(v),
                           kernel::contiguous(beta), maybe_contiguous(g), maybe_contiguous(initial_state), p, out.o,
                           out.final_state);
  return out;
}

DeltaNetGrads delta_net_backward(const Tensor& dout, const Tensor& dfinal_state, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& beta, const Tensor& g, const Tensor& initial_state,
                                 const DeltaNetOptions& opts) {
  const Dims d = check_inputs(q, k, v, beta, g, initial_state);
  const DeltaNetParams p = resolve(opts, d.dk);
  const Shape state_shape{d.B, d.H, d.dk, d.dv};
  check_like(dout, {d.B, d.T, d.H, d.dv}, q.dtype(), "dout");
  if (dfinal_state.defined()) check_like(dfinal_state, state_shape, q.dtype(), "dfinal_state");
  DeltaNetGrads gr;
  gr.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  gr.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  gr.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  gr.dbeta = Tensor::empty(beta.shape(), beta.dtype(), beta.device());
  if (g.defined()) gr.dg = Tensor::empty(g.shape(), g.dtype(), g.device());
  if (initial_state.defined()) gr.dinitial_state = Tensor::empty(state_shape, q.dtype(), q.device());
  const Tensor dfin =
      dfinal_state.defined() ? kernel::contiguous(dfinal_state) : Tensor::zeros(state_shape, q.dtype(), q.device());
  delta_net_backward_kernel(q.device(), kernel::contiguous(dout), dfin, kernel::contiguous(q), kernel::contiguous(k),
                            kernel::contiguous(v), kernel::contiguous(beta), maybe_contiguous(g),
                            maybe_contiguous(initial_state), p, gr);
  return gr;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::DeltaNetGrads;
using kernel::DeltaNetParams;

// One (batch, head), number `task` = b·H + h: token t is row row(t) of the [B, T, H, ·] tensors, so
// row t of q is q + t·ldk, of v and o is v + t·ldv, β_t = beta[t·H]. g is null for DeltaNet (every
// log-gate 0).
template <class T>
struct Seq {
  int64_t task, row0;
  const T *q, *k, *v, *beta, *g;
  int64_t H, dk, dv, ldk, ldv;
  int64_t row(int64_t t) const { return row0 + t * H; }
  T gate(int64_t t) const { return g ? g[t * H] : T(0); }
};

struct Geometry {
  int64_t B, T, H, dk, dv;
  int64_t row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
  int64_t tasks() const { return B * H; }
  int64_t state_size() const { return dk * dv; }
  // Tokens per chunk (chunkwise form) or steps per checkpointed segment (recurrent backward): the
  // option's chunk clamped to [1, T].
  int64_t span(int64_t chunk) const { return std::max<int64_t>(1, std::min(chunk, T)); }
  bool parallel() const { return tasks() > 1 && tasks() * T * dk * dv > kParallelGrain; }
};

Geometry geometry(const Tensor& q, const Tensor& v) { return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)}; }

template <class T>
Seq<T> seq_of(const Geometry& G, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
              int64_t task) {
  const int64_t b = task / G.H, h = task % G.H, r = G.row(b, 0, h);
  return {task,
          r,
          q.data<T>() + r * G.dk,
          k.data<T>() + r * G.dk,
          v.data<T>() + r * G.dv,
          beta.data<T>() + r,
          g.defined() ? g.data<T>() + r : nullptr,
          G.H,
          G.dk,
          G.dv,
          G.H * G.dk,
          G.H * G.dv};
}

// The loop of every kernel below: one task per (batch, head), OpenMP over the B·H tasks when the work
// is large enough. make_scratch() builds one thread's scratch once; body(seq, scratch) runs each task
// of that thread and owns the sequence's rows of every output, so there are no races.
template <class T, class MakeScratch, class Body>
void for_each_sequence(const Geometry& G, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                       const Tensor& g, MakeScratch&& make_scratch, Body&& body) {
#pragma omp parallel if (G.parallel())
  {
    auto scratch = make_scratch();
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < G.tasks(); ++task) {
      body(seq_of<T>(G, q, k, v, beta, g, task), scratch);
    }
  }
}

// S (dk × dv) = sequence `task`'s state in a [B, H, dk, dv] tensor, or 0 where the tensor is absent
// (no initial state).
template <class T>
void load_state(const Tensor& states, int64_t task, int64_t ss, T* S) {
  if (states.defined()) {
    std::copy_n(states.data<T>() + task * ss, ss, S);
  } else {
    std::fill_n(S, ss, T(0));
  }
}

// Sequence `task`'s state in a [B, H, dk, dv] tensor = S (dk × dv), where the tensor is wanted.
template <class T>
void store_state(const T* S, int64_t task, int64_t ss, const Tensor& states) {
  if (states.defined()) std::copy_n(S, ss, states.data<T>() + task * ss);
}

// ---------------------------------------------------------------- chunkwise form
// e^x for x a difference of cumulative log-gates (≤ 0). The cumulative gates are kept in double: in
// f32 a sum near −3000 (a chunk of 128 tokens at −25) is only known to 2e-4, and so would be every
// factor e^{b_i − b_j} taken from it; the difference itself is exact to rounding in double.
template <class T>
T decay(double x) {
  return std::exp(static_cast<T>(x));
}

// One thread's scratch for the chunkwise form: the quantities of one chunk of n ≤ C tokens starting
// at t0 (n × n matrices with leading dimension n) and the dk × dv states of the sequence.
template <class T>
struct ChunkWork {
  int64_t C, dk, dv;
  std::vector<double> b;    // [C]: b_i = Σ_{j≤i} g_{t0+j}, in double (see decay())
  std::vector<T> gam, r;    // [C]: γ_i = e^{b_i}, r_i = e^{b_{n−1} − b_i}
  std::vector<T> Hm, A, P;  // [C, C]: Hm_ij = e^{b_i−b_j} k_i·k_j, A_ij = β_i Hm_ij (j < i, else 0), P = (Q Kᵀ) ⊙ M
  std::vector<T> Y, R, D, RD;  // [C, dv]: Y = K S_0, R = V − diag(γ) Y, D = δ, RD = diag(r) δ
  std::vector<T> S;            // [nstates, dk, dv]: the state entering a chunk (backward: every chunk)
  // backward only
  std::vector<T> dP, dA, Z, E, dD, dY, dSn, dS;
  // The gate terms of one chunk (double): gu [C], u_i of token i (the loss through the factors e^{b_i},
  // times them: it enters dg_t for t ≤ i); gx [C, C], X_ij of a pair j < i (through the factors
  // e^{b_i − b_j}: it enters dg_t for j < t ≤ i); gsum [C], the pair terms' sums per t.
  std::vector<double> gu, gx, gsum;
  ChunkWork(int64_t C_, int64_t dk_, int64_t dv_, int64_t nstates, bool backward)
      : C(C_),
        dk(dk_),
        dv(dv_),
        b(C),
        gam(C),
        r(C),
        Hm(C * C),
        A(C * C),
        P(C * C),
        Y(C * dv),
        R(C * dv),
        D(C * dv),
        RD(C * dv),
        S(static_cast<size_t>(std::max<int64_t>(1, nstates) * dk * dv)) {
    if (backward) {
      dP.resize(C * C);
      dA.resize(C * C);
      for (auto* x : {&Z, &E, &dD, &dY}) x->resize(C * dv);
      gu.resize(C);
      gx.resize(C * C);
      gsum.resize(C);
      dSn.resize(dk * dv);
      dS.resize(dk * dv);
    }
  }
};

// The UT representation of chunk [t0, t0 + n) entering with state S0 (dk × dv):
//   b, γ, r as above;  Hm_ij = e^{b_i − b_j} (K Kᵀ)_ij, A_ij = β_i Hm_ij for j < i;
//   Y = K S_0, R = V − diag(γ) Y;  δ = (I + A)⁻¹ diag(β) R by forward substitution
//     δ_i = β_i R_i − Σ_{j<i} A_ij δ_j;   RD = diag(r) δ.
// Memory: reads the chunk's k, v, β, g rows and S0; writes the scratch.
template <class T>
void chunk_prepare(const Seq<T>& s, int64_t t0, int64_t n, const T* S0, ChunkWork<T>& w) {
  const int64_t dk = s.dk, dv = s.dv;
  const T* K0 = s.k + t0 * s.ldk;
  const T* V0 = s.v + t0 * s.ldv;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += s.gate(t0 + i);
    w.b[i] = acc;
    w.gam[i] = s.g ? decay<T>(acc) : T(1);
  }
  for (int64_t i = 0; i < n; ++i) w.r[i] = s.g ? decay<T>(w.b[n - 1] - w.b[i]) : T(1);
  gemm<T>(false, true, n, n, dk, 1.0, K0, s.ldk, K0, s.ldk, 0.0, w.Hm.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const T beta_i = s.beta[(t0 + i) * s.H];
    T* hi = w.Hm.data() + i * n;
    T* ai = w.A.data() + i * n;
    for (int64_t j = 0; j < i; ++j) {
      if (s.g) hi[j] *= decay<T>(w.b[i] - w.b[j]);
      ai[j] = beta_i * hi[j];
    }
    for (int64_t j = i; j < n; ++j) hi[j] = ai[j] = 0;
  }
  gemm<T>(false, false, n, dv, dk, 1.0, K0, s.ldk, S0, dv, 0.0, w.Y.data(), dv);
  for (int64_t i = 0; i < n; ++i) {
    const T beta_i = s.beta[(t0 + i) * s.H], gam_i = w.gam[i];
    const T *vi = V0 + i * s.ldv, *yi = w.Y.data() + i * dv;
    T *ri = w.R.data() + i * dv, *di = w.D.data() + i * dv;
    for (int64_t c = 0; c < dv; ++c) {
      ri[c] = vi[c] - gam_i * yi[c];
      di[c] = beta_i * ri[c];
    }
    const T* ai = w.A.data() + i * n;
    for (int64_t j = 0; j < i; ++j) axpy(-ai[j], w.D.data() + j * dv, di, dv);
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < dv; ++c) w.RD[i * dv + c] = w.r[i] * w.D[i * dv + c];
  }
}

// P = (Q Kᵀ) ⊙ M over the chunk, M_ij = e^{b_i − b_j} for j ≤ i and 0 above the diagonal.
template <class T>
void chunk_scores(const Seq<T>& s, int64_t t0, int64_t n, ChunkWork<T>& w) {
  gemm<T>(false, true, n, n, s.dk, 1.0, s.q + t0 * s.ldk, s.ldk, s.k + t0 * s.ldk, s.ldk, 0.0, w.P.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    T* pi = w.P.data() + i * n;
    if (s.g) {
      for (int64_t j = 0; j < i; ++j) pi[j] *= decay<T>(w.b[i] - w.b[j]);
    }
    for (int64_t j = i + 1; j < n; ++j) pi[j] = 0;
  }
}

// The state after the chunk: S ← γ_{n−1} S + Kᵀ RD (in place, S is dk × dv).
template <class T>
void chunk_advance(const Seq<T>& s, int64_t t0, int64_t n, const ChunkWork<T>& w, T* S) {
  scal(w.gam[n - 1], S, s.dk * s.dv);
  gemm<T>(true, false, s.dk, s.dv, n, 1.0, s.k + t0 * s.ldk, s.ldk, w.RD.data(), s.dv, 1.0, S, s.dv);
}

// Per (b, h), chunk by chunk with the state S entering the chunk:
//   O = c diag(γ) Q S + c P δ,  then S ← γ_{n−1} S + Kᵀ diag(r) δ.
// Memory: reads q, k, v, β, g, initial_state; writes o and final_state; scratch per thread: one
// ChunkWork (a few C × C and C × dv matrices and one dk × dv state).
template <class T>
void chunkwise_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                       const Tensor& s0, const DeltaNetParams& p, const Tensor& o, const Tensor& fin) {
  const Geometry G = geometry(q, v);
  const int64_t C = G.span(p.chunk), ss = G.state_size();
  const T scale = static_cast<T>(p.scale);
  auto scratch = [&] { return ChunkWork<T>(C, G.dk, G.dv, 1, false); };
  for_each_sequence<T>(G, q, k, v, beta, g, scratch, [&](const Seq<T>& s, ChunkWork<T>& w) {
    T* S = w.S.data();
    load_state(s0, s.task, ss, S);
    for (int64_t t0 = 0; t0 < G.T; t0 += C) {
      const int64_t n = std::min(C, G.T - t0);
      chunk_prepare(s, t0, n, S, w);
      chunk_scores(s, t0, n, w);
      T* O0 = o.data<T>() + s.row(t0) * G.dv;
      gemm<T>(false, false, n, G.dv, G.dk, scale, s.q + t0 * s.ldk, s.ldk, S, G.dv, 0.0, O0, s.ldv);
      for (int64_t i = 0; i < n; ++i) scal(w.gam[i], O0 + i * s.ldv, G.dv);
      gemm<T>(false, false, n, G.dv, n, scale, w.P.data(), n, w.D.data(), G.dv, 1.0, O0, s.ldv);
      chunk_advance(s, t0, n, w, S);
    }
    store_state(S, s.task, ss, fin);
  });
}

// Reverse pass over chunks. With S_0 the state entering the chunk (recomputed by a first forward pass
// over the chunks, states only) and dS the gradient of the state leaving it; the gate terms are token
// terms u_i (through a factor e^{b_i}) and pair terms X_ij, j < i (through e^{b_i − b_j}):
//   E = K dS,  dδ = c Pᵀ dO + diag(r) E
//   state:  dS_0 = γ_{n−1} dS + …,  u_{n−1} += γ_{n−1}⟨dS, S_0⟩,  X_{n−1,j} += ρ_j = r_j E_j·δ_j (j < n−1),
//           dK = diag(r) δ dSᵀ
//   output: dP = c dO δᵀ (j ≤ i);  X_ij += dP_ij P_ij (j < i);  dQK = dP ⊙ M,
//           dQ = dQK K,  dK += dQKᵀ Q;  dZ = c diag(γ) dO:  dQ += dZ S_0ᵀ,  dS_0 += Qᵀ dZ,
//           u_i += c γ_i dO_i·(Q S_0)_i
//   solve:  dF = (I + A)⁻ᵀ dδ (back substitution),  dA = −dF δᵀ (j < i)
//           dβ_i = dF_i·R_i + Σ_{j<i} dA_ij Hm_ij,  dV = diag(β) dF,  dY = −diag(γ β) dF,  u_i += dY_i·Y_i
//           dK += dY S_0ᵀ,  dS_0 += Kᵀ dY
//   A:      X_ij += dA_ij A_ij,  dG_ij = dA_ij β_i e^{b_i − b_j} (j < i),  dK += (dG + dGᵀ) K
//   gates:  dg_{t0+t} = Σ_{i ≥ t} u_i + Σ_{j < t ≤ i} X_ij
// Memory: reads dO, dfinal, q, k, v, β, g, initial_state; writes dq, dk, dv, dβ, dg, dinitial_state;
// scratch per thread: the entering state of every chunk of one sequence (⌈T/C⌉ · dk · dv) and one
// ChunkWork.
template <class T>
void chunkwise_backward(const Tensor& dout, const Tensor& dfin, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& beta, const Tensor& g, const Tensor& s0, const DeltaNetParams& p,
                        const DeltaNetGrads& gr) {
  const Geometry G = geometry(q, v);
  const int64_t C = G.span(p.chunk), ss = G.state_size();
  const int64_t nchunks = (G.T + C - 1) / C, dk = G.dk, dv = G.dv;
  const T scale = static_cast<T>(p.scale);
  auto scratch = [&] { return ChunkWork<T>(C, dk, dv, nchunks, true); };
  for_each_sequence<T>(G, q, k, v, beta, g, scratch, [&](const Seq<T>& s, ChunkWork<T>& w) {
    T* states = w.S.data();
    std::vector<T>& dS = w.dS;
    // Pass 1: the state entering each chunk.
    load_state(s0, s.task, ss, states);
    for (int64_t c = 0; c + 1 < nchunks; ++c) {
      const int64_t t0 = c * C, n = std::min(C, G.T - t0);
      chunk_prepare(s, t0, n, states + c * ss, w);
      std::copy_n(states + c * ss, ss, states + (c + 1) * ss);
      chunk_advance(s, t0, n, w, states + (c + 1) * ss);
    }
    // Pass 2: chunks in reverse, dS from exit to entry.
    load_state(dfin, s.task, ss, dS.data());
    for (int64_t c = nchunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, n = std::min(C, G.T - t0);
      const T* S0 = states + c * ss;
      const T *Q0 = s.q + t0 * s.ldk, *K0 = s.k + t0 * s.ldk;
      const T* dO0 = dout.data<T>() + s.row(t0) * dv;
      T* dQ0 = gr.dq.data<T>() + s.row(t0) * dk;
      T* dK0 = gr.dk.data<T>() + s.row(t0) * dk;
      T* dV0 = gr.dv.data<T>() + s.row(t0) * dv;
      T* dB0 = gr.dbeta.data<T>() + s.row(t0);
      chunk_prepare(s, t0, n, S0, w);
      chunk_scores(s, t0, n, w);
      double *gu = w.gu.data(), *gx = w.gx.data();
      if (s.g) {
        std::fill_n(gu, n, 0.0);
        std::fill_n(gx, n * n, 0.0);
      }

      // The exit state S_n = γ_{n−1} S_0 + Kᵀ diag(r) δ.
      gemm<T>(false, false, n, dv, dk, 1.0, K0, s.ldk, dS.data(), dv, 0.0, w.E.data(), dv);  // E = K dS
      for (int64_t i = 0; i < n; ++i) {
        const T* ei = w.E.data() + i * dv;
        T* ddi = w.dD.data() + i * dv;
        for (int64_t x = 0; x < dv; ++x) ddi[x] = w.r[i] * ei[x];
        if (s.g && i < n - 1) gx[(n - 1) * n + i] += w.r[i] * dot(ei, w.D.data() + i * dv, dv);
      }
      if (s.g) gu[n - 1] += w.gam[n - 1] * dot(dS.data(), S0, ss);
      gemm<T>(false, true, n, dk, dv, 1.0, w.RD.data(), dv, dS.data(), dv, 0.0, dK0, s.ldk);  // dK = RD dSᵀ
      for (int64_t x = 0; x < ss; ++x) w.dSn[x] = w.gam[n - 1] * dS[x];

      // The output O = c diag(γ) Q S_0 + c P δ.
      gemm<T>(true, false, n, dv, n, scale, w.P.data(), n, dO0, s.ldv, 1.0, w.dD.data(), dv);  // dδ += c Pᵀ dO
      gemm<T>(false, true, n, n, dv, scale, dO0, s.ldv, w.D.data(), dv, 0.0, w.dP.data(), n);  // dP = c dO δᵀ
      for (int64_t i = 0; i < n; ++i) {
        T* dpi = w.dP.data() + i * n;
        const T* pi = w.P.data() + i * n;
        for (int64_t j = 0; j <= i; ++j) {
          if (s.g) {
            if (j < i) gx[i * n + j] += dpi[j] * pi[j];
            dpi[j] *= decay<T>(w.b[i] - w.b[j]);
          }
        }
        for (int64_t j = i + 1; j < n; ++j) dpi[j] = 0;
      }
      gemm<T>(false, false, n, dk, n, 1.0, w.dP.data(), n, K0, s.ldk, 0.0, dQ0, s.ldk);  // dQ = dQK K
      gemm<T>(true, false, n, dk, n, 1.0, w.dP.data(), n, Q0, s.ldk, 1.0, dK0, s.ldk);   // dK += dQKᵀ Q
      gemm<T>(false, false, n, dv, dk, 1.0, Q0, s.ldk, S0, dv, 0.0, w.Z.data(), dv);     // Z = Q S_0
      for (int64_t i = 0; i < n; ++i) {  // dZ = c diag(γ) dO, kept in E (E is no longer needed)
        const T f = scale * w.gam[i];
        const T* doi = dO0 + i * s.ldv;
        T* ei = w.E.data() + i * dv;
        for (int64_t x = 0; x < dv; ++x) ei[x] = f * doi[x];
        if (s.g) gu[i] += dot(ei, w.Z.data() + i * dv, dv);
      }
      gemm<T>(false, true, n, dk, dv, 1.0, w.E.data(), dv, S0, dv, 1.0, dQ0, s.ldk);           // dQ += dZ S_0ᵀ
      gemm<T>(true, false, dk, dv, n, 1.0, Q0, s.ldk, w.E.data(), dv, 1.0, w.dSn.data(), dv);  // dS_0 += Qᵀ dZ

      // The solve δ = (I + A)⁻¹ F, F = diag(β) R: dF = (I + A)⁻ᵀ dδ, in place in dD.
      for (int64_t j = n - 1; j > 0; --j) {
        const T* dfj = w.dD.data() + j * dv;
        const T* aj = w.A.data() + j * n;
        for (int64_t i = 0; i < j; ++i) axpy(-aj[i], dfj, w.dD.data() + i * dv, dv);
      }
      gemm<T>(false, true, n, n, dv, -1.0, w.dD.data(), dv, w.D.data(), dv, 0.0, w.dA.data(), n);  // dA = −dF δᵀ
      for (int64_t i = 0; i < n; ++i) {
        const T beta_i = s.beta[(t0 + i) * s.H], gam_i = w.gam[i];
        const T* dfi = w.dD.data() + i * dv;
        T dbeta = dot(dfi, w.R.data() + i * dv, dv);
        const T* dai = w.dA.data() + i * n;
        const T* hi = w.Hm.data() + i * n;
        for (int64_t j = 0; j < i; ++j) dbeta += dai[j] * hi[j];
        dB0[i * s.H] = dbeta;
        T* dvi = dV0 + i * s.ldv;
        T* dyi = w.dY.data() + i * dv;
        for (int64_t x = 0; x < dv; ++x) {
          dvi[x] = beta_i * dfi[x];
          dyi[x] = -gam_i * beta_i * dfi[x];
        }
        if (s.g) gu[i] += dot(dyi, w.Y.data() + i * dv, dv);
      }
      gemm<T>(false, true, n, dk, dv, 1.0, w.dY.data(), dv, S0, dv, 1.0, dK0, s.ldk);           // dK += dY S_0ᵀ
      gemm<T>(true, false, dk, dv, n, 1.0, K0, s.ldk, w.dY.data(), dv, 1.0, w.dSn.data(), dv);  // dS_0 += Kᵀ dY

      // A_ij = β_i e^{b_i − b_j} (K Kᵀ)_ij: dG symmetrised in place in dA, then dK += (dG + dGᵀ) K.
      for (int64_t i = 0; i < n; ++i) {
        const T beta_i = s.beta[(t0 + i) * s.H];
        T* dai = w.dA.data() + i * n;
        const T* ai = w.A.data() + i * n;
        for (int64_t j = 0; j < i; ++j) {
          if (s.g) gx[i * n + j] += dai[j] * ai[j];
          dai[j] *= beta_i * (s.g ? decay<T>(w.b[i] - w.b[j]) : T(1));
        }
        dai[i] = 0;
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j) w.dA[i * n + j] = w.dA[j * n + i];
      }
      gemm<T>(false, false, n, dk, n, 1.0, w.dA.data(), n, K0, s.ldk, 1.0, dK0, s.ldk);

      // Gates: g_t enters b_i for every i ≥ t, so a token term counts for t ≤ i and a pair term
      // (factor e^{b_i − b_j}) for j < t ≤ i: dg_t = Σ_{i ≥ t} u_i + Σ_{j < t ≤ i} X_ij (gu, gx).
      // Summed over the pairs that straddle t only, never as a difference of sums (docs/variants/delta_net.md).
      if (s.g) {
        T* dG0 = gr.dg.data<T>() + s.row(t0);
        double* gsum = w.gsum.data();
        std::fill_n(gsum, n, 0.0);
        for (int64_t i = 1; i < n; ++i) {  // pair (j, i) into gsum_t, j < t ≤ i: running sums over j
          double run = 0;
          for (int64_t j = 0; j < i; ++j) {
            run += gx[i * n + j];
            gsum[j + 1] += run;
          }
        }
        double tail = 0;
        for (int64_t i = n - 1; i >= 0; --i) {
          tail += gu[i];
          dG0[i * s.H] = static_cast<T>(tail + gsum[i]);
        }
      }
      std::copy_n(w.dSn.data(), ss, dS.data());
    }
    store_state(dS.data(), s.task, ss, gr.dinitial_state);
  });
}

// ---------------------------------------------------------------- recurrent form
// One step on the dk × dv state S (u is dv scratch): S ← α S;  u = v − k S;  S ← S + β kᵀ u.
template <class T>
void recurrent_step(const Seq<T>& s, int64_t t, T* S, T* u) {
  const int64_t dk = s.dk, dv = s.dv;
  const T *kt = s.k + t * s.ldk, *vt = s.v + t * s.ldv;
  const T beta_t = s.beta[t * s.H];
  if (s.g) scal(std::exp(s.gate(t)), S, dk * dv);
  std::copy_n(vt, dv, u);
  for (int64_t a = 0; a < dk; ++a) axpy(-kt[a], S + a * dv, u, dv);
  for (int64_t a = 0; a < dk; ++a) axpy(beta_t * kt[a], u, S + a * dv, dv);
}

// Per (b, h), token by token: the step above, then o_t = c q_t S_t.
// Memory: reads q, k, v, β, g, initial_state; writes o and final_state; scratch: the state and u.
template <class T>
void recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                       const Tensor& s0, const DeltaNetParams& p, const Tensor& o, const Tensor& fin) {
  const Geometry G = geometry(q, v);
  const int64_t ss = G.state_size();
  const T scale = static_cast<T>(p.scale);
  auto scratch = [&] { return std::make_pair(std::vector<T>(ss), std::vector<T>(G.dv)); };
  for_each_sequence<T>(G, q, k, v, beta, g, scratch, [&](const Seq<T>& s, auto& w) {
    auto& [S, u] = w;
    load_state(s0, s.task, ss, S.data());
    for (int64_t t = 0; t < G.T; ++t) {
      recurrent_step(s, t, S.data(), u.data());
      const T* qt = s.q + t * s.ldk;
      T* ot = o.data<T>() + s.row(t) * G.dv;
      std::fill_n(ot, G.dv, T(0));
      for (int64_t a = 0; a < G.dk; ++a) axpy(scale * qt[a], S.data() + a * G.dv, ot, G.dv);
    }
    store_state(S.data(), s.task, ss, fin);
  });
}

// Reverse over time with dS the gradient of S_t (starting from dfinal); S' = α_t S_{t−1}, u = v_t − k_t S':
//   dS += c q_tᵀ dO_t;  dq_t = c dO_t S_tᵀ
//   e = k_t dS;  dβ_t = e·u;  du = β_t e;  dv_t = du;  dk_t = β_t u dSᵀ − du S'ᵀ
//   dS' = dS − k_tᵀ du;  dg_t = ⟨dS', S'⟩;  dS_{t−1} = α_t dS'
// The states S_{t−1} come from checkpoints: a forward pass keeps the state entering every segment of
// `chunk` steps; each segment, last first, is replayed keeping its states, then walked in reverse.
// Memory: reads dO, dfinal and the inputs; writes dq, dk, dv, dβ, dg, dinitial_state; scratch per
// thread: ⌈T/chunk⌉ + chunk + 1 states of dk × dv.
template <class T>
void recurrent_backward(const Tensor& dout, const Tensor& dfin, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& beta, const Tensor& g, const Tensor& s0, const DeltaNetParams& p,
                        const DeltaNetGrads& gr) {
  const Geometry G = geometry(q, v);
  const int64_t dk = G.dk, dv = G.dv, ss = G.state_size();
  const int64_t seg = G.span(p.chunk), nseg = (G.T + seg - 1) / seg;
  const T scale = static_cast<T>(p.scale);
  auto scratch = [&] {
    auto vec = [](int64_t n) { return std::vector<T>(static_cast<size_t>(n)); };
    return std::make_tuple(vec(std::max<int64_t>(1, nseg) * ss), vec((seg + 1) * ss), vec(ss), vec(ss), vec(dv),
                           vec(dv), vec(dv));
  };
  for_each_sequence<T>(G, q, k, v, beta, g, scratch, [&](const Seq<T>& s, auto& w) {
    auto& [ckpt, st, dS, Sp, u, e, du] = w;
    load_state(s0, s.task, ss, ckpt.data());
    for (int64_t c = 0; c + 1 < nseg; ++c) {
      T* next = ckpt.data() + (c + 1) * ss;
      std::copy_n(ckpt.data() + c * ss, ss, next);
      for (int64_t t = c * seg; t < (c + 1) * seg; ++t) recurrent_step(s, t, next, u.data());
    }
    load_state(dfin, s.task, ss, dS.data());
    for (int64_t c = nseg - 1; c >= 0; --c) {
      const int64_t t0 = c * seg, len = std::min(seg, G.T - t0);
      std::copy_n(ckpt.data() + c * ss, ss, st.data());
      for (int64_t i = 0; i < len; ++i) {
        std::copy_n(st.data() + i * ss, ss, st.data() + (i + 1) * ss);
        recurrent_step(s, t0 + i, st.data() + (i + 1) * ss, u.data());
      }
      for (int64_t i = len - 1; i >= 0; --i) {
        const int64_t t = t0 + i, r = s.row(t);
        const T *qt = s.q + t * s.ldk, *kt = s.k + t * s.ldk, *vt = s.v + t * s.ldv, *dot_ = dout.data<T>() + r * dv;
        const T *Sprev = st.data() + i * ss, *St = st.data() + (i + 1) * ss;
        const T beta_t = s.beta[t * s.H], alpha = s.g ? std::exp(s.gate(t)) : T(1);
        T *dq = gr.dq.data<T>() + r * dk, *dkt = gr.dk.data<T>() + r * dk, *dvt = gr.dv.data<T>() + r * dv;
        for (int64_t a = 0; a < dk; ++a) {
          axpy(scale * qt[a], dot_, dS.data() + a * dv, dv);  // dS += c q_tᵀ dO_t
          dq[a] = scale * dot(St + a * dv, dot_, dv);         // dq_t = c dO_t S_tᵀ
        }
        for (int64_t x = 0; x < ss; ++x) Sp[x] = alpha * Sprev[x];
        std::copy_n(vt, dv, u.data());
        std::fill_n(e.data(), dv, T(0));
        for (int64_t a = 0; a < dk; ++a) {
          axpy(-kt[a], Sp.data() + a * dv, u.data(), dv);  // u = v − k S'
          axpy(kt[a], dS.data() + a * dv, e.data(), dv);   // e = k dS
        }
        gr.dbeta.data<T>()[r] = dot(e.data(), u.data(), dv);
        for (int64_t x = 0; x < dv; ++x) dvt[x] = du[x] = beta_t * e[x];
        for (int64_t a = 0; a < dk; ++a) {
          dkt[a] = beta_t * dot(dS.data() + a * dv, u.data(), dv) - dot(Sp.data() + a * dv, du.data(), dv);
          axpy(-kt[a], du.data(), dS.data() + a * dv, dv);  // dS' = dS − kᵀ du
        }
        if (s.g) {
          gr.dg.data<T>()[r] = dot(dS.data(), Sp.data(), ss);
          scal(alpha, dS.data(), ss);
        }
      }
    }
    store_state(dS.data(), s.task, ss, gr.dinitial_state);
  });
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                 const Tensor& s0, const DeltaNetParams& p, const Tensor& o, const Tensor& fin) {
  dispatch_float(q.dtype(), "delta_net", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == DeltaNetForm::recurrent) {
      recurrent_forward<T>(q, k, v, beta, g, s0, p, o, fin);
    } else {
      chunkwise_forward<T>(q, k, v, beta, g, s0, p, o, fin);
    }
  });
}

void backward_cpu(const Tensor& dout, const Tensor& dfin, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& beta, const Tensor& g, const Tensor& s0, const DeltaNetParams& p,
                  const DeltaNetGrads& gr) {
  dispatch_float(q.dtype(), "delta_net backward", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == DeltaNetForm::recurrent) {
      recurrent_backward<T>(dout, dfin, q, k, v, beta, g, s0, p, gr);
    } else {
      chunkwise_backward<T>(dout, dfin, q, k, v, beta, g, s0, p, gr);
    }
  });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(delta_net_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(delta_net_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the (contiguous) inputs only; the backward recomputes the states.
DeltaNetOutput delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                         const Tensor& initial_state, const DeltaNetOptions& opts) {
  kernel::check_inputs(q, k, v, beta, g, initial_state);
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v),
               bc = kernel::contiguous(beta), gc = kernel::maybe_contiguous(g),
               sc = kernel::maybe_contiguous(initial_state);
  DeltaNetOutput out = kernel::delta_net_forward(qc, kc, vc, bc, gc, sc, opts);
  record("delta_net", {q, k, v, beta, g, initial_state}, {&out.o, &out.final_state}, {qc, kc, vc, bc, gc, sc},
         [opts](const std::vector<Tensor>& grads, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::DeltaNetGrads d =
               kernel::delta_net_backward(grads[0], grads[1], s[0], s[1], s[2], s[3], s[4], s[5], opts);
           std::vector<Tensor> out{d.dq, d.dk, d.dv, d.dbeta, d.dg, d.dinitial_state};
           for (size_t i = 0; i < out.size(); ++i) {
             if (!need[i]) out[i] = Tensor();
           }
           return out;
         });
  return out;
}

namespace {

// Keys of unit L2 norm over dk, as the DeltaNet layer feeds them.
Tensor unit_keys(const Shape& shape, Generator& gen, DType dtype) {
  std::vector<double> x = Tensor::randn(shape, gen, DType::f64).to_doubles();
  const int64_t dk = shape.back();
  for (size_t r = 0; r < x.size(); r += static_cast<size_t>(dk)) {
    double n2 = 0;
    for (int64_t i = 0; i < dk; ++i) n2 += x[r + i] * x[r + i];
    for (int64_t i = 0; i < dk; ++i) x[r + i] /= std::sqrt(n2);
  }
  return Tensor::from_vector(x, shape, dtype);
}

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "delta_net";
  s.summary =
      "S_t = α_t (I − β_t k_tᵀ k_t) S_{t−1} + β_t k_tᵀ v_t, o_t = scale q_t S_t, α_t = exp(g_t) (1 without g); "
      "q, k [B, T, H, dk], v [B, T, H, dv], beta, g [B, T, H], states [B, H, dk, dv]";
  s.inputs = {{"q"},
              {"k"},
              {"v"},
              {"beta"},
              {"g", OpInputKind::floating, true},
              {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"o", "final_state"};
  s.attrs = {{"form", AttrType::string, "chunkwise", "chunkwise (UT representation) or recurrent"},
             {"chunk", AttrType::integer, "64", "tokens per chunk (recurrent: steps per backward checkpoint)"},
             {"scale", AttrType::number, "0", "scale of q; ≤ 0 means 1/√dk"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    DeltaNetOptions o{parse_delta_net_form(a.get_string("form")), a.get_int("chunk"), a.get_number("scale")};
    DeltaNetOutput out = delta_net(in[0], in[1], in[2], in[3], in[4], in[5], o);
    return std::vector<Tensor>{out.o, out.final_state};
  };
  // T = 5 over chunks of 2 (a partial last chunk), dk = 3 ≠ dv = 4, unit keys, β in (0.1, 0.9),
  // log-gates in (−1, −0.05), a random initial state.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{
        Tensor::randn({2, 5, 2, 3}, gen, dtype),          unit_keys({2, 5, 2, 3}, gen, dtype),
        Tensor::randn({2, 5, 2, 4}, gen, dtype),          Tensor::rand({2, 5, 2}, gen, dtype, 0.1, 0.9),
        Tensor::rand({2, 5, 2}, gen, dtype, -1.0, -0.05), Tensor::randn({2, 2, 3, 4}, gen, dtype, 0.5)};
  };
  s.example_attrs = {{"chunk", "2"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
