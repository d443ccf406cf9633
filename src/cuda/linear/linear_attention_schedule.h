// The per-thread work of the linear attention and Performer feature CUDA kernels
// (src/cuda/linear/linear_attention.cu), as __host__ __device__ functions over plain pointers with the thread's
// index as an argument, so that tests/linear_attention_emulation_test.cc runs exactly this schedule
// on the CPU (each phase for every thread, in the order the barriers impose) against the CPU kernels.
// No CUDA intrinsic appears here.
//
// Linear attention (src/layers/linear/linear_attention.h), per (b, h), fq = φ(q), fk = φ(k) given:
//   S_t = S_{t−1} + fk_tᵀ v_t,  z_t = z_{t−1} + fk_t,  num_t = fq_t S_t,  den_t = fq_t·z_t + eps,
//   o_t = num_t / den_t (normalize) or num_t;  non-causal: S_t, z_t → S_T, z_T for every t.
// Column j of S evolves on its own (S[:, j] += fk_t v_t[j]) and den_t needs only z, so the forward is
// one thread per (b, h, j) carrying its column and its own copy of z (every thread forms den_t with the
// same operations, hence the same value); the non-causal form first sums S_T[:, j] and z_T, then reads.
// All three forms are the same function of the inputs, so the same kernels serve every form the slot
// is asked for, with the causal/non-causal switch only.
//
// Backward, with u_t = dO_t / den_t and δ_t = −(dO_t·num_t)/den_t² (u = dO, δ = 0 without normalize),
// G the gradient of the state and gz of the normaliser (from dS_T, dz_T):
//   dfq_t = S_t u_t + δ_t z_t,   G_t = dS_T + Σ_{t'≥t} fq_t'ᵀ u_t',   gz_t = dz_T + Σ_{t'≥t} δ_t' fq_t'
//   dfk_t = G_t v_t + gz_t,      dv_t = fk_t G_t,   dS_0 = G_1,  dz_0 = gz_1
// (non-causal: S_t, z_t, G_t, gz_t → S_T, z_T, G_1, gz_1). The recurrences of S[:, j] and G[:, j] are
// column-local; δ_t, dfq_t, gz and dfk_t sum over columns. One block per (b, h) walks tiles of kTile
// steps forwards (column threads: the states and num_t[j]; then all threads: δ_t, then dfq_t) and then
// backwards (column threads: G and dv_t[j]; then row threads a < dk: gz[a] and dfk_t[a]), with
// barriers between the phases; each output element is summed by one thread in a fixed order
// (deterministic, no atomics).
//
// Performer features, rows x_n [d] of x viewed as [N, d], ω [m, d]:
//   y_ni = exp(x_n·ω_i − r_n) / √m,   r_n = ‖x_n‖²/2 + s_n,   s_n = max_i x_n·ω_i (stabilize) or 0;
//   with e_ni = dy_ni y_ni, Σ_n = Σ_i e_ni and i*_n the first arg-max (stabilize):
//   dx_n = Σ_i e_ni ω_i − Σ_n x_n − Σ_n ω_{i*_n},   dω_i = Σ_n e_ni x_n − Σ_{n: i*_n = i} Σ_n x_n.
// Forward: one thread per row for r_n, then one per element y_ni. Backward: one thread per row for Σ_n
// and i*_n, one per element of dx, and dω in two deterministic stages (partial sums over fixed blocks of
// kRowBlock rows, then their sum in block order).
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/elementwise_math.h"  // SEQLAB_HD: __host__ __device__ under nvcc, inline elsewhere

namespace seqlab::linear_attention_cuda {

#ifndef __CUDACC__
using std::exp;
#endif

constexpr int kMaxHeadDim = 128;     // dk and dv (local arrays of one column; threads of one block)
constexpr int64_t kTile = 32;        // steps per tile of the backward
constexpr int kBackwardThreads = 128;  // ≥ dv column threads and ≥ dk row threads

struct Dims {
  int64_t B, T, H, dk, dv;
  bool causal, normalize;
  SEQLAB_HD int64_t row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
  SEQLAB_HD int64_t tiles() const { return (T + kTile - 1) / kTile; }
};

// Inputs, contiguous, element type T: fq, fk [B, T, H, dk], v [B, T, H, dv], s0 [B, H, dk, dv], z0 [B, H, dk].
template <class T>
struct Inputs {
  const T *fq, *fk, *v, *s0, *z0;
};

template <class T, class A>
SEQLAB_HD A dot_row(const T* x, const A* y, int64_t n) {
  A acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<A>(x[i]) * y[i];
  return acc;
}

// S[:, j] ← S[:, j] + fk_t v_t[j] over all t and (when z is not null) z ← z + fk_t: the non-causal
// form's S_T column and z_T, s and z holding S_0[:, j] and z_0 on entry.
template <class T, class A>
SEQLAB_HD void sum_sequence(const Dims& d, const Inputs<T>& in, int64_t b, int64_t h, int64_t j, A* s, A* z) {
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    const T* fkt = in.fk + r * d.dk;
    const A vj = static_cast<A>(in.v[r * d.dv + j]);
    for (int64_t a = 0; a < d.dk; ++a) {
      s[a] += static_cast<A>(fkt[a]) * vj;
      if (z) z[a] += static_cast<A>(fkt[a]);
    }
  }
}

template <class T, class A>
SEQLAB_HD void load_state(const Dims& d, const Inputs<T>& in, int64_t bh, int64_t j, A* s, A* z) {
  for (int64_t a = 0; a < d.dk; ++a) {
    s[a] = static_cast<A>(in.s0[(bh * d.dk + a) * d.dv + j]);
    if (z) z[a] = static_cast<A>(in.z0[bh * d.dk + a]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Forward. Thread idx < B·H·dv owns column j = idx mod dv of bh = idx / dv:
//   causal: per t, s += fk_t v_t[j], z += fk_t, o_t[j] = (fq_t·s) / (fq_t·z + eps) (or fq_t·s);
//   non-causal: s, z = S_T[:, j], z_T first, then o_t[j] the same with them.
// Reads fq, fk rows of the head, v_t[j], s0[:, j], z0; writes o_t[j], s[bh][:, j], and (thread j = 0)
// z[bh]. Local arrays: the column and z (compute type).
template <class T, class A>
SEQLAB_HD void forward_column(int64_t idx, const Dims& d, const Inputs<T>& in, A eps, T* o, T* s_out, T* z_out) {
  const int64_t j = idx % d.dv, bh = idx / d.dv, b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv;
  A s[kMaxHeadDim], z[kMaxHeadDim];
  load_state(d, in, bh, j, s, z);
  if (!d.causal) sum_sequence(d, in, b, h, j, s, z);
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    const T *fqt = in.fq + r * dk, *fkt = in.fk + r * dk;
    if (d.causal) {
      const A vj = static_cast<A>(in.v[r * dv + j]);
      for (int64_t a = 0; a < dk; ++a) {
        s[a] += static_cast<A>(fkt[a]) * vj;
        z[a] += static_cast<A>(fkt[a]);
      }
    }
    A num = dot_row(fqt, s, dk);
    if (d.normalize) num *= A(1) / (dot_row(fqt, z, dk) + eps);
    o[r * dv + j] = static_cast<T>(num);
  }
  for (int64_t a = 0; a < dk; ++a) s_out[(bh * dk + a) * dv + j] = static_cast<T>(s[a]);
  if (j == 0) {
    for (int64_t a = 0; a < dk; ++a) z_out[bh * dk + a] = static_cast<T>(z[a]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward scratch of one (b, h), compute type A ([dk][dv] matrices row-major; non-causal forms keep
// one state and one G, read at every step, so their per-step stride is 0):
//   st  [kTile][dk][dv]  S_t of the tile's steps (non-causal: S_T in slot 0)
//   zst [kTile][dk]      z_t (non-causal: z_T in slot 0)
//   gst [kTile][dk][dv]  G_t of the tile's steps (non-causal: G_1 in slot 0)
//   num [kTile][dv]      num_t[j]
//   den [T], delta [T]   den_t and δ_t of every step (the reverse sweep reads them)
template <class A>
struct Scratch {
  A *st, *zst, *gst, *num, *den, *delta;
  int64_t step_ss, step_z;  // per-step strides of st/gst and zst: dk·dv and dk, or 0 (non-causal)
  SEQLAB_HD A* state(int64_t i) const { return st + i * step_ss; }
  SEQLAB_HD A* zstate(int64_t i) const { return zst + i * step_z; }
  SEQLAB_HD A* grad(int64_t i) const { return gst + i * step_ss; }
};

SEQLAB_HD int64_t scratch_per_head(const Dims& d) {
  return 2 * kTile * d.dk * d.dv + kTile * d.dk + kTile * d.dv + 2 * d.T;
}

template <class A>
SEQLAB_HD Scratch<A> scratch_of(A* base, const Dims& d, int64_t bh) {
  Scratch<A> w;
  w.st = base + bh * scratch_per_head(d);
  w.gst = w.st + kTile * d.dk * d.dv;
  w.zst = w.gst + kTile * d.dk * d.dv;
  w.num = w.zst + kTile * d.dk;
  w.den = w.num + kTile * d.dv;
  w.delta = w.den + d.T;
  w.step_ss = d.causal ? d.dk * d.dv : 0;
  w.step_z = d.causal ? d.dk : 0;
  return w;
}

// u_t[j] (the gradient reaching num_t[j]) from dO_t[j] and den_t.
template <class A>
SEQLAB_HD A u_of(const Dims& d, A dO, A den) {
  return d.normalize ? dO * (A(1) / den) : dO;
}

// Phase 0, column thread j (the state threads): s = S_0[:, j] and (thread 0, which owns z) z = z_0;
// g = dS_T[:, j]. Non-causal: s = S_T[:, j], z = z_T for every thread (each needs den_t), g = G_1[:, j]
// = dS_T[:, j] + Σ_t fq_t u_t[j]; S_T, z_T (thread 0) and G_1 go to their scratch slots 0.
template <class T, class A>
SEQLAB_HD void backward_begin(int64_t bh, int64_t j, const Dims& d, const Inputs<T>& in, const T* dout,
                              const T* dS, A eps, const Scratch<A>& w, A* s, A* z, A* g) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv;
  const bool has_z = j == 0 || !d.causal;
  load_state(d, in, bh, j, s, has_z ? z : nullptr);
  for (int64_t a = 0; a < dk; ++a) g[a] = static_cast<A>(dS[(bh * dk + a) * dv + j]);
  if (d.causal) return;
  sum_sequence(d, in, b, h, j, s, z);
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    const T* fqt = in.fq + r * dk;
    const A u = u_of(d, static_cast<A>(dout[r * dv + j]), dot_row(fqt, z, dk) + eps);
    for (int64_t a = 0; a < dk; ++a) g[a] += static_cast<A>(fqt[a]) * u;
  }
  for (int64_t a = 0; a < dk; ++a) {
    w.st[a * dv + j] = s[a];
    w.gst[a * dv + j] = g[a];
    if (j == 0) w.zst[a] = z[a];
  }
}

// Phase F1 of tile c, column thread j: per step t (causal: s += fk_t v_t[j], thread 0: z += fk_t),
// num[i][j] = fq_t·s; st[i][:, j] = s, thread 0: zst[i] = z and den[t] = fq_t·z + eps.
template <class T, class A>
SEQLAB_HD void forward_tile_column(int64_t bh, int64_t j, int64_t c, const Dims& d, const Inputs<T>& in, A eps,
                                   const Scratch<A>& w, A* s, A* z) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, t0 = c * kTile;
  const int64_t len = d.T - t0 < kTile ? d.T - t0 : kTile;
  for (int64_t i = 0; i < len; ++i) {
    const int64_t r = d.row(b, t0 + i, h);
    const T *fqt = in.fq + r * dk, *fkt = in.fk + r * dk;
    if (d.causal) {
      const A vj = static_cast<A>(in.v[r * dv + j]);
      for (int64_t a = 0; a < dk; ++a) {
        s[a] += static_cast<A>(fkt[a]) * vj;
        if (j == 0) z[a] += static_cast<A>(fkt[a]);
      }
      A* st = w.state(i);
      for (int64_t a = 0; a < dk; ++a) st[a * dv + j] = s[a];
      if (j == 0) {
        for (int64_t a = 0; a < dk; ++a) w.zstate(i)[a] = z[a];
      }
    }
    w.num[i * dv + j] = dot_row(fqt, s, dk);
    if (j == 0) w.den[t0 + i] = dot_row(fqt, z, dk) + eps;
  }
}

// Phase F2 of tile c, every thread: items i < len write δ_t = −(Σ_j dO_t[j] num[i][j]) / den_t² (0
// without normalize) into delta[t]. (A barrier follows: F3 reads δ.)
template <class T, class A>
SEQLAB_HD void forward_tile_delta(int64_t bh, int tid, int nthreads, int64_t c, const Dims& d, const T* dout,
                                  const Scratch<A>& w) {
  const int64_t b = bh / d.H, h = bh % d.H, t0 = c * kTile;
  const int64_t len = d.T - t0 < kTile ? d.T - t0 : kTile;
  for (int64_t i = tid; i < len; i += nthreads) {
    const int64_t r = d.row(b, t0 + i, h);
    A delta = 0;
    if (d.normalize) {
      const A inv = A(1) / w.den[t0 + i];
      delta = -dot_row(dout + r * d.dv, w.num + i * d.dv, d.dv) * inv * inv;
    }
    w.delta[t0 + i] = delta;
  }
}

// Phase F3 of tile c, every thread: items (i, a) write dfq_t[a] = Σ_j S_t[a, j] u_t[j] + δ_t z_t[a].
template <class T, class A>
SEQLAB_HD void forward_tile_dfq(int64_t bh, int tid, int nthreads, int64_t c, const Dims& d, const T* dout,
                                const Scratch<A>& w, T* dfq) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, t0 = c * kTile;
  const int64_t len = d.T - t0 < kTile ? d.T - t0 : kTile;
  for (int64_t n = tid; n < len * dk; n += nthreads) {
    const int64_t i = n / dk, a = n % dk, t = t0 + i, r = d.row(b, t, h);
    const A* sa = w.state(i) + a * dv;
    const T* dO = dout + r * dv;
    A acc = 0;
    for (int64_t j = 0; j < dv; ++j) acc += sa[j] * u_of(d, static_cast<A>(dO[j]), w.den[t]);
    dfq[r * dk + a] = static_cast<T>(acc + w.delta[t] * w.zstate(i)[a]);
  }
}

// Before the reverse sweep, row thread a < dk: gz[a] = dz_T[a], non-causal plus Σ_t δ_t fq_t[a] (gz_1).
template <class T, class A>
SEQLAB_HD A reverse_begin_row(int64_t bh, int64_t a, const Dims& d, const Inputs<T>& in, const T* dz,
                              const Scratch<A>& w) {
  const int64_t b = bh / d.H, h = bh % d.H;
  A gz = static_cast<A>(dz[bh * d.dk + a]);
  if (!d.causal) {
    for (int64_t t = 0; t < d.T; ++t) gz += w.delta[t] * static_cast<A>(in.fq[d.row(b, t, h) * d.dk + a]);
  }
  return gz;
}

// Phase R1 of tile c, column thread j, steps in reverse: causal: g += fq_t u_t[j], gst[i][:, j] = g;
// dv_t[j] = fk_t·g (non-causal: g is G_1 throughout).
template <class T, class A>
SEQLAB_HD void reverse_tile_column(int64_t bh, int64_t j, int64_t c, const Dims& d, const Inputs<T>& in,
                                   const T* dout, const Scratch<A>& w, A* g, T* dv_out) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, t0 = c * kTile;
  const int64_t len = d.T - t0 < kTile ? d.T - t0 : kTile;
  for (int64_t i = len - 1; i >= 0; --i) {
    const int64_t t = t0 + i, r = d.row(b, t, h);
    if (d.causal) {
      const T* fqt = in.fq + r * dk;
      const A u = u_of(d, static_cast<A>(dout[r * dv + j]), w.den[t]);
      A* gs = w.grad(i);
      for (int64_t a = 0; a < dk; ++a) {
        g[a] += static_cast<A>(fqt[a]) * u;
        gs[a * dv + j] = g[a];
      }
    }
    dv_out[r * dv + j] = static_cast<T>(dot_row(in.fk + r * dk, g, dk));
  }
}

// Phase R2 of tile c, row thread a < dk, steps in reverse: causal: gz += δ_t fq_t[a];
// dfk_t[a] = Σ_j G_t[a, j] v_t[j] + gz.
template <class T, class A>
SEQLAB_HD void reverse_tile_row(int64_t bh, int64_t a, int64_t c, const Dims& d, const Inputs<T>& in,
                                const Scratch<A>& w, A& gz, T* dfk) {
  const int64_t b = bh / d.H, h = bh % d.H, dk = d.dk, dv = d.dv, t0 = c * kTile;
  const int64_t len = d.T - t0 < kTile ? d.T - t0 : kTile;
  for (int64_t i = len - 1; i >= 0; --i) {
    const int64_t t = t0 + i, r = d.row(b, t, h);
    if (d.causal) gz += w.delta[t] * static_cast<A>(in.fq[r * dk + a]);
    const A* ga = w.grad(i) + a * dv;
    const T* vt = in.v + r * dv;
    A acc = 0;
    for (int64_t j = 0; j < dv; ++j) acc += ga[j] * static_cast<A>(vt[j]);
    dfk[r * dk + a] = static_cast<T>(acc + gz);
  }
}

// After the last (first in time) tile: column thread j writes dS_0[:, j] = g, row thread a writes
// dz_0[a] = gz.
template <class T, class A>
SEQLAB_HD void backward_end_column(int64_t bh, int64_t j, const Dims& d, const A* g, T* ds0) {
  for (int64_t a = 0; a < d.dk; ++a) ds0[(bh * d.dk + a) * d.dv + j] = static_cast<T>(g[a]);
}
template <class T, class A>
SEQLAB_HD void backward_end_row(int64_t bh, int64_t a, const Dims& d, A gz, T* dz0) {
  dz0[bh * d.dk + a] = static_cast<T>(gz);
}

// ---------------------------------------------------------------------------------------------------
// Performer. x [N, d] rows, ω [m, d].
struct PerformerDims {
  int64_t N, d, m;
  bool stabilize;
};

constexpr int64_t kRowBlock = 256;  // rows per partial sum of dω

// x_n·ω_i and, through *arg, the first i reaching the maximum (stabilize).
template <class T, class A>
SEQLAB_HD A max_projection(const PerformerDims& p, const T* x, const T* omega, int64_t n, int64_t* arg) {
  A best = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    A proj = 0;
    for (int64_t c = 0; c < p.d; ++c) proj += static_cast<A>(x[n * p.d + c]) * static_cast<A>(omega[i * p.d + c]);
    if (i == 0 || proj > best) {
      best = proj;
      *arg = i;
    }
  }
  return best;
}

// Forward stage 1, thread per row n: shift[n] = ‖x_n‖²/2 + (stabilize ? max_i x_n·ω_i : 0).
template <class T, class A>
SEQLAB_HD void performer_row_shift(int64_t n, const PerformerDims& p, const T* x, const T* omega, A* shift) {
  A sq = 0;
  for (int64_t c = 0; c < p.d; ++c) sq += static_cast<A>(x[n * p.d + c]) * static_cast<A>(x[n * p.d + c]);
  A s = sq / A(2);
  if (p.stabilize) {
    int64_t arg = 0;
    s += max_projection<T, A>(p, x, omega, n, &arg);
  }
  shift[n] = s;
}

// Forward stage 2, thread per element e = n·m + i: y_ni = exp(x_n·ω_i − shift[n]) · (1/√m).
template <class T, class A>
SEQLAB_HD void performer_element(int64_t e, const PerformerDims& p, const T* x, const T* omega, const A* shift,
                                 A inv_sqrt_m, T* y) {
  const int64_t n = e / p.m, i = e % p.m;
  A proj = 0;
  for (int64_t c = 0; c < p.d; ++c) proj += static_cast<A>(x[n * p.d + c]) * static_cast<A>(omega[i * p.d + c]);
  y[e] = static_cast<T>(exp(proj - shift[n]) * inv_sqrt_m);
}

// Backward stage 1, thread per row n: rowsum[n] = Σ_i dy_ni y_ni, arg[n] = i*_n (stabilize; else 0).
template <class T, class A>
SEQLAB_HD void performer_backward_row(int64_t n, const PerformerDims& p, const T* dy, const T* x, const T* omega,
                                      const T* y, A* rowsum, int64_t* arg) {
  A s = 0;
  for (int64_t i = 0; i < p.m; ++i) s += static_cast<A>(dy[n * p.m + i]) * static_cast<A>(y[n * p.m + i]);
  rowsum[n] = s;
  arg[n] = 0;
  if (p.stabilize) max_projection<T, A>(p, x, omega, n, &arg[n]);
}

// Backward stage 2a, thread per element e = n·d + c of dx:
//   dx_nc = Σ_i dy_ni y_ni ω_ic − rowsum[n] x_nc − [stabilize] rowsum[n] ω_{arg[n], c}.
template <class T, class A>
SEQLAB_HD void performer_dx(int64_t e, const PerformerDims& p, const T* dy, const T* x, const T* omega, const T* y,
                            const A* rowsum, const int64_t* arg, T* dx) {
  const int64_t n = e / p.d, c = e % p.d;
  A acc = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    acc += static_cast<A>(dy[n * p.m + i]) * static_cast<A>(y[n * p.m + i]) * static_cast<A>(omega[i * p.d + c]);
  }
  acc -= rowsum[n] * static_cast<A>(x[e]);
  if (p.stabilize) acc -= rowsum[n] * static_cast<A>(omega[arg[n] * p.d + c]);
  dx[e] = static_cast<T>(acc);
}

// Backward stage 2b, thread per (row block k, element e = i·d + c of dω): the partial sum over rows
// n ∈ [k·kRowBlock, (k+1)·kRowBlock) of dy_ni y_ni x_nc − [stabilize, arg[n] = i] rowsum[n] x_nc,
// into partial[k·m·d + e].
template <class T, class A>
SEQLAB_HD void performer_domega_partial(int64_t k, int64_t e, const PerformerDims& p, const T* dy, const T* x,
                                        const T* y, const A* rowsum, const int64_t* arg, A* partial) {
  const int64_t i = e / p.d, c = e % p.d, n1 = (k + 1) * kRowBlock < p.N ? (k + 1) * kRowBlock : p.N;
  A acc = 0;
  for (int64_t n = k * kRowBlock; n < n1; ++n) {
    const A xnc = static_cast<A>(x[n * p.d + c]);
    acc += static_cast<A>(dy[n * p.m + i]) * static_cast<A>(y[n * p.m + i]) * xnc;
    if (p.stabilize && arg[n] == i) acc -= rowsum[n] * xnc;
  }
  partial[k * p.m * p.d + e] = acc;
}

// Backward stage 3, thread per element e of dω: the partial sums in block order.
template <class T, class A>
SEQLAB_HD void performer_domega_final(int64_t e, const PerformerDims& p, const A* partial, T* domega) {
  const int64_t blocks = (p.N + kRowBlock - 1) / kRowBlock;
  A acc = 0;
  for (int64_t k = 0; k < blocks; ++k) acc += partial[k * p.m * p.d + e];
  domega[e] = static_cast<T>(acc);
}

}  // namespace seqlab::linear_attention_cuda
