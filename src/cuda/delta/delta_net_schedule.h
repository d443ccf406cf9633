// The per-thread work of the DeltaNet / Gated DeltaNet CUDA kernels (src/cuda/delta/delta_net.cu), written as
// __host__ __device__ functions over plain pointers with the thread's index as an argument, so that
// tests/delta_net_emulation_test.cc runs exactly this schedule on the CPU (each phase for every
// thread, in the order the barriers impose) and checks it against the CPU kernels. No CUDA intrinsic
// appears here; under nvcc the functions are compiled for both sides, elsewhere they are plain inline.
//
// The math (src/layers/delta/delta_net.h), per batch entry b and head h, with the state S (dk × dv),
// α_t = e^{g_t} (1 without g), c = scale:
//   S_t = α_t S_{t−1} + β_t k_tᵀ u_t,   u_t = v_t − α_t k_t S_{t−1},   o_t = c q_t S_t.
// Column j of the state evolves on its own: with s = S[:, j] (a dk-vector),
//   u_t[j] = v_t[j] − α_t (k_t · s),   s ← α_t s + β_t u_t[j] k_tᵀ,   o_t[j] = c q_t · s,
// so one thread per (b, h, j) runs the whole recurrence without talking to any other thread. The
// chunkwise (UT) form is the same function of the inputs, so one kernel serves both forms.
//
// Backward (reverse time, dS = ∂L/∂S_t starting from dfinal; S' = α_t S_{t−1}):
//   dS += c q_tᵀ dO_t                    (column j: dS[:, j] += c q_t dO_t[j])
//   e[j] = k_t · dS[:, j],  du[j] = β_t e[j],  dv_t[j] = du[j]
//   dS'[:, j] = dS[:, j] − k_tᵀ du[j],   dS_{t−1}[:, j] = α_t dS'[:, j]
// are column-local too; what sums over the columns is
//   dq_t[a] = c Σ_j dO_t[j] S_t[a, j]
//   dk_t[a] = β_t Σ_j (u_t[j] dS[a, j] − α_t e[j] S_{t−1}[a, j])
//   dβ_t    = Σ_j e[j] u_t[j]
//   dg_t    = Σ_j ⟨dS'[:, j], S'[:, j]⟩    (each column's term is summed by its own thread first)
// Those reductions do not feed back into the recurrence, so the backward kernel (one block per (b, h))
// alternates: column threads walk a segment of kSegment steps backwards, storing per step what the
// reductions read; a barrier; every thread of the block computes the reductions of the segment, each
// output element by one thread, summing over j in increasing order (deterministic, no atomics); a
// barrier; the next segment. S_{t−1} is never obtained by dividing by a gate: the state entering every
// segment is checkpointed by a first forward sweep, and each segment is replayed from its checkpoint,
// storing its kSegment + 1 states (bitwise the states of the forward: the same operations in the same
// order).
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/elementwise_math.h"  // SEQLAB_HD: __host__ __device__ under nvcc, inline elsewhere

namespace seqlab::delta_net_cuda {

#ifndef __CUDACC__
using std::exp;  // host code picks the float overload from std; nvcc provides it for both sides
#endif

constexpr int kMaxHeadDim = 128;   // dk and dv: a column of the state lives in one thread's local array
constexpr int64_t kSegment = 32;   // steps between the backward's checkpoints (and states kept per replay)
constexpr int kBackwardThreads = 128;  // threads per backward block: ≥ dv column threads, all reduce

struct Dims {
  int64_t B, T, H, dk, dv;
  // Row of token t of head h of batch b in the [B, T, H, ·] tensors.
  SEQLAB_HD int64_t row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
  SEQLAB_HD int64_t segment() const { return T < kSegment ? (T > 0 ? T : 1) : kSegment; }
  SEQLAB_HD int64_t segments() const { return (T + segment() - 1) / segment(); }
};

// The inputs, contiguous, in the element type T (float, double or bf16); g and s0 may be null.
template <class T>
struct Inputs {
  const T *q, *k, *v, *beta, *g, *s0;
};

// ---------------------------------------------------------------------------------------------------
// Forward. Thread `idx` < B·H·dv owns column j = idx mod dv of head (b, h), bh = idx / dv = b·H + h.
// Reads q_t, k_t (all dk), v_t[j], β_t, g_t for every t and s0[bh][:, j]; writes o_t[j] for every t
// and fin[bh][:, j]. The column s lives in the thread's local array (compute type A).
// ---------------------------------------------------------------------------------------------------
// Backward scratch of one (b, h), compute type A, every matrix [dk][dv] row-major (column j of a state
// is elements a·dv + j, so the column threads of a warp touch consecutive addresses):
//   ckpt [segments][dk][dv]  the state entering each segment
//   st   [kSegment + 1][dk][dv]  the replayed states S_{t0−1+i} of the current segment, i = 0..len
//   dst  [kSegment][dk][dv]  dS at step t0 + i after adding c q_tᵀ dO_t (what dk_t reads)
//   u, e, pdg  [kSegment][dv]  u_t[j], e[j] = k_t · dS[:, j], and column j's term of dg_t
template <class A>
struct Scratch {
  A *ckpt, *st, *dst, *u, *e, *pdg;
};

// Elements of scratch per (b, h).
SEQLAB_HD int64_t scratch_per_head(const Dims& d) {
  const int64_t ss = d.dk * d.dv, nseg = d.segments() > 0 ? d.segments() : 1;
  return nseg * ss + (2 * kSegment + 1) * ss + 3 * kSegment * d.dv;
}

template <class A>
SEQLAB_HD Scratch<A> scratch_of(A* base, const Dims& d, int64_t bh) {
  const int64_t ss = d.dk * d.dv, nseg = d.segments() > 0 ? d.segments() : 1;
  A* p = base + bh * scratch_per_head(d);
  Scratch<A> w;
  w.ckpt = p;
  w.st = w.ckpt + nseg * ss;
  w.dst = w.st + (kSegment + 1) * ss;
  w.u = w.dst + kSegment * ss;
  w.e = w.u + kSegment * d.dv;
  w.pdg = w.e + kSegment * d.dv;
  return w;
}

// One step of column j at row r (token t of (b, h)) on s = S_{t−1}[:, j] (dk elements):
//   u = v_t[j] − α_t (k_t · s),  s ← α_t s + β_t u k_tᵀ;  returns u.
template <class T, class A>
SEQLAB_HD A step_column(const Dims& d, const Inputs<T>& in, int64_t r, int64_t j, A* s) {
  const T* kt = in.k + r * d.dk;
  const A alpha = in.g ? static_cast<A>(exp(static_cast<A>(in.g[r]))) : A(1);
  A pred = 0;
  for (int64_t a = 0; a < d.dk; ++a) pred += static_cast<A>(kt[a]) * s[a];
  const A u = static_cast<A>(in.v[r * d.dv + j]) - alpha * pred;
  const A bu = static_cast<A>(in.beta[r]) * u;
  for (int64_t a = 0; a < d.dk; ++a) s[a] = alpha * s[a] + bu * static_cast<A>(kt[a]);
  return u;
}

// Forward. Thread `idx` < B·H·dv owns column j = idx mod dv of head (b, h), bh = idx / dv = b·H + h:
//   s = s0[bh][:, j] (or 0);  per t: the step above, o_t[j] = c q_t · s;  finally fin[bh][:, j] = s.
// Reads q_t, k_t (all dk), v_t[j], β_t, g_t for every t and its column of s0; writes o_t[j] for every t
// and its column of fin. The column lives in the thread's local array, in the compute type A.
template <class T, class A>
SEQLAB_HD void forward_column(int64_t idx, const Dims& d, const Inputs<T>& in, A scale, T* o, T* fin) {
  const int64_t j = idx % d.dv, bh = idx / d.dv, b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv;
  A s[kMaxHeadDim];
  for (int64_t a = 0; a < dk; ++a) s[a] = in.s0 ? static_cast<A>(in.s0[(bh * dk + a) * dv + j]) : A(0);
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    step_column(d, in, r, j, s);
    const T* qt = in.q + r * dk;
    A acc = 0;
    for (int64_t a = 0; a < dk; ++a) acc += static_cast<A>(qt[a]) * s[a];
    o[r * dv + j] = static_cast<T>(scale * acc);
  }
  for (int64_t a = 0; a < dk; ++a) fin[(bh * dk + a) * dv + j] = static_cast<T>(s[a]);
}

// Phase 0, column thread j of block bh (before the segment loop): checkpoints the state entering
// every segment (ckpt[0] = s0 or 0) and sets the thread's running gradient ds = dfinal[bh][:, j].
// s and ds are the thread's dk-element local arrays.
template <class T, class A>
SEQLAB_HD void backward_begin(int64_t bh, int64_t j, const Dims& d, const Inputs<T>& in, const T* dfinal,
                              const Scratch<A>& w, A* s, A* ds) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, seg = d.segment();
  for (int64_t a = 0; a < dk; ++a) {
    s[a] = in.s0 ? static_cast<A>(in.s0[(bh * dk + a) * dv + j]) : A(0);
    ds[a] = static_cast<A>(dfinal[(bh * dk + a) * dv + j]);
    w.ckpt[a * dv + j] = s[a];
  }
  for (int64_t c = 0; c + 1 < d.segments(); ++c) {
    for (int64_t t = c * seg; t < (c + 1) * seg; ++t) step_column(d, in, d.row(b, t, h), j, s);
    for (int64_t a = 0; a < dk; ++a) w.ckpt[((c + 1) * dk + a) * dv + j] = s[a];
  }
}

// Phase 1, column thread j, segment c (steps t0 .. t0 + len − 1): replays the segment from its
// checkpoint, storing st[i] = S_{t0+i−1}[:, j] (i = 0..len) and u[i][j]; then walks it backwards:
//   ds += c q_tᵀ dO_t[j];  dst[i] = ds;  e = k_t · ds;  du = β_t e;  dv_t[j] = du
//   ds' = ds − k_tᵀ du;  pdg[i][j] = ⟨ds', α_t S_{t−1}[:, j]⟩;  ds ← α_t ds'
// Reads the inputs' rows of the segment, dO_t[j], its own column of the scratch; writes dv_t[j],
// its column of st, dst, u, e, pdg.
template <class T, class A>
SEQLAB_HD void backward_segment_column(int64_t bh, int64_t j, int64_t c, const Dims& d, const Inputs<T>& in,
                                       const T* dout, A scale, const Scratch<A>& w, A* s, A* ds, T* dv_out) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, seg = d.segment();
  const int64_t t0 = c * seg, len = (d.T - t0) < seg ? (d.T - t0) : seg;
  for (int64_t a = 0; a < dk; ++a) {
    s[a] = w.ckpt[(c * dk + a) * dv + j];
    w.st[a * dv + j] = s[a];
  }
  for (int64_t i = 0; i < len; ++i) {
    w.u[i * dv + j] = step_column(d, in, d.row(b, t0 + i, h), j, s);
    for (int64_t a = 0; a < dk; ++a) w.st[((i + 1) * dk + a) * dv + j] = s[a];
  }
  for (int64_t i = len - 1; i >= 0; --i) {
    const int64_t r = d.row(b, t0 + i, h);
    const T *qt = in.q + r * dk, *kt = in.k + r * dk;
    const A cdo = scale * static_cast<A>(dout[r * dv + j]);
    A e = 0;
    for (int64_t a = 0; a < dk; ++a) {
      ds[a] += static_cast<A>(qt[a]) * cdo;
      w.dst[(i * dk + a) * dv + j] = ds[a];
      e += static_cast<A>(kt[a]) * ds[a];
    }
    const A du = static_cast<A>(in.beta[r]) * e;
    dv_out[r * dv + j] = static_cast<T>(du);
    w.e[i * dv + j] = e;
    if (in.g) {
      const A alpha = static_cast<A>(exp(static_cast<A>(in.g[r])));
      A pdg = 0;
      for (int64_t a = 0; a < dk; ++a) {
        const A dsp = ds[a] - static_cast<A>(kt[a]) * du;
        pdg += dsp * (alpha * w.st[(i * dk + a) * dv + j]);
        ds[a] = alpha * dsp;
      }
      w.pdg[i * dv + j] = pdg;
    } else {
      for (int64_t a = 0; a < dk; ++a) ds[a] -= static_cast<A>(kt[a]) * du;
    }
  }
}

// Output gradients of the reductions (dg null without g).
template <class T>
struct Grads {
  T *dq, *dk, *dv, *dbeta, *dg, *ds0;
};

// Phase 2, every thread tid < nthreads of block bh, segment c, after the column threads finished
// phase 1: items n = tid, tid + nthreads, … of len·dk + len; item (i, a) = (n / dk, n mod dk) writes
//   dq_t[a] = c Σ_j dO_t[j] st[i+1][a][j],   dk_t[a] = β_t Σ_j (u[i][j] dst[i][a][j] − α_t e[i][j] st[i][a][j])
// and item len·dk + i writes dβ_t = Σ_j e[i][j] u[i][j] and dg_t = Σ_j pdg[i][j], j increasing.
// Reads the segment's scratch (all columns) and dO rows; writes rows of dq, dk, dβ, dg.
template <class T, class A>
SEQLAB_HD void backward_segment_reduce(int64_t bh, int tid, int nthreads, int64_t c, const Dims& d,
                                       const Inputs<T>& in, const T* dout, A scale, const Scratch<A>& w,
                                       const Grads<T>& gr) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, seg = d.segment();
  const int64_t t0 = c * seg, len = (d.T - t0) < seg ? (d.T - t0) : seg;
  for (int64_t n = tid; n < len * dk + len; n += nthreads) {
    if (n < len * dk) {
      const int64_t i = n / dk, a = n % dk, r = d.row(b, t0 + i, h);
      const A alpha = in.g ? static_cast<A>(exp(static_cast<A>(in.g[r]))) : A(1);
      const A *snew = w.st + ((i + 1) * dk + a) * dv, *sold = w.st + (i * dk + a) * dv;
      const A *dsa = w.dst + (i * dk + a) * dv, *u = w.u + i * dv, *e = w.e + i * dv;
      const T* dO = dout + r * dv;
      A q_acc = 0, k_acc = 0;
      for (int64_t j = 0; j < dv; ++j) {
        q_acc += static_cast<A>(dO[j]) * snew[j];
        k_acc += u[j] * dsa[j] - alpha * e[j] * sold[j];
      }
      gr.dq[r * dk + a] = static_cast<T>(scale * q_acc);
      gr.dk[r * dk + a] = static_cast<T>(static_cast<A>(in.beta[r]) * k_acc);
    } else {
      const int64_t i = n - len * dk, r = d.row(b, t0 + i, h);
      A db = 0, dg = 0;
      for (int64_t j = 0; j < dv; ++j) {
        db += w.e[i * dv + j] * w.u[i * dv + j];
        if (in.g) dg += w.pdg[i * dv + j];
      }
      gr.dbeta[r] = static_cast<T>(db);
      if (in.g) gr.dg[r] = static_cast<T>(dg);
    }
  }
}

// Phase 3, column thread j after the last (first in time) segment: dinitial_state[bh][:, j] = ds.
template <class T, class A>
SEQLAB_HD void backward_end(int64_t bh, int64_t j, const Dims& d, const A* ds, const Grads<T>& gr) {
  if (!gr.ds0) return;
  for (int64_t a = 0; a < d.dk; ++a) gr.ds0[(bh * d.dk + a) * d.dv + j] = static_cast<T>(ds[a]);
}

}  // namespace seqlab::delta_net_cuda
