// The per-thread work of the selective scan's CUDA kernels (src/cuda/ssm/selective_scan.cu), written as
// __host__ __device__ functions over plain pointers with the thread's index as an argument, so that
// tests/selective_scan_emulation_test.cc runs exactly this schedule on the CPU (every thread of a kernel
// one after another) and checks it against the CPU kernels. Under nvcc the functions are compiled for
// both sides; elsewhere they are plain inline functions.
//
// The math (src/layers/ssm/selective_scan.h), per batch entry b and channel d, with the state h ∈ R^N:
//   Δ_t = softplus(delta_t + bias)  (or delta_t + bias),  a_t = exp(Δ_t A[d, :])
//   h_t = a_t ⊙ h_{t−1} + Δ_t u_t B_t,   ŷ_t = C_t · h_t + D u_t,   y_t = ŷ_t silu(z_t)
// Channel d's state evolves on its own, so one thread per (b, d) runs the whole recurrence with its
// state in a local array (N ≤ kMaxState), reading u, delta, z at (b, t, d) (consecutive threads:
// consecutive addresses) and B_t, C_t (the same for every thread of b: broadcast).
//
// Forward (forward_channel): walks t = 0..T−1, writing y and, every `chunk` steps, the state entering
// the chunk into the checkpoints (when given), then the final state.
// Backward, thread (b, d), with dh = ∂L/∂h_t from dfinal:
//   ckpt: the forward's checkpoints, or (recurrent form) a forward sweep into the thread's scratch;
//   per chunk, last first: its states recomputed from the checkpoint into the thread's scratch S
//   ((rows + 1)·N: S[0] entering, S[i + 1] after step t0 + i — bitwise the forward's states, the same
//   operations in the same order), then the steps in reverse:
//     g = dy_t silu(z_t), dz_t = dy_t ŷ_t silu'(z_t);  du_t = D g + Δ_t Σ_n dh B_t;  dh += g C_t
//     dΔ_t = Σ_n dh (A a_t h_{t−1} + u_t B_t),  ddelta_t = dΔ_t σ(delta_t + bias),  dh ← a_t ⊙ dh
//   and the sums over threads: dC_t = Σ_d g h_t, dB_t = Σ_d Δ_t u_t dh, dA = Σ_b Σ_t Δ_t a_t h_{t−1} dh,
//   dD = Σ_b Σ_t g u_t, d bias = Σ_b Σ_t ddelta_t. No atomics, so the bits are the same on every run:
//   each chunk is one launch (backward_chunk_channel), the thread's running dh and its own sums over t
//   (dA, dD, d bias) carried in global scratch from one chunk's launch to the next; it writes its terms
//   of the chunk's dB_t, dC_t to per-chunk buffers [B, D, chunk, N], which reduce_chunk_element then sums
//   over d in channel order; after chunk 0 (the last walked), finish_channel_element sums the threads' dA, dD,
//   d bias over b in batch order. Every sum thus runs in a fixed order, whatever order the GPU runs the
//   blocks and threads in (tests/selective_scan_emulation_test.cc runs them shuffled and compares bits).
// Memory: the forward touches only its inputs and outputs; the backward's global scratch, bounded by the
// chunk and not by T, is per thread (rows + 1)·N of states, 2·N + 2 of carry and 2·rows·N of dB, dC
// terms (rows = min(chunk, T)), plus ⌈T/chunk⌉·N without checkpoints, in the compute type (f32 for f32
// and bf16, f64 for f64).
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/elementwise_math.h"  // SEQLAB_HD: __host__ __device__ under nvcc, inline elsewhere

namespace seqlab::selective_scan_cuda {

#ifndef __CUDACC__
using std::exp;  // host code picks the float overloads from std; nvcc provides them for both sides
using std::fabs;
using std::log1p;
#endif

constexpr int kMaxState = 64;  // N: a channel's state (and its gradient) lives in one thread's local arrays

struct Dims {
  int64_t B, T, D, N, chunk;
  bool softplus;
  SEQLAB_HD int64_t chunks() const { return (T + chunk - 1) / chunk; }
  // The element (b, t, d) of the [B, T, D] tensors, (b, t, 0) of the [B, T, N] tensors.
  SEQLAB_HD int64_t btd(int64_t b, int64_t t, int64_t d) const { return (b * T + t) * D + d; }
  SEQLAB_HD int64_t btn(int64_t b, int64_t t) const { return (b * T + t) * N; }
};

// The inputs, contiguous, in the element type T (float, double or bf16); D, z, bias, h0 may be null.
template <class T>
struct Inputs {
  const T *u, *delta, *A, *B, *C, *D, *z, *bias, *h0;
};

// The outputs of the backward: du, ddelta always; dz, dh0, dD, dbias may be null. du, ddelta, dz are
// written by backward_chunk_channel, dB and dC by reduce_chunk_element, dA, dD, dbias and dh0 by
// finish_channel_element.
template <class T>
struct Grads {
  T *du, *ddelta, *dz, *dh0, *dB, *dC, *dA, *dD, *dbias;
};

// Rows of a chunk the backward's buffers hold: the chunk, or all of T when T is shorter (a decode step
// with the default chunk of 64 then takes one row, not 64).
SEQLAB_HD int64_t chunk_rows(const Dims& d) { return d.T < d.chunk ? d.T : d.chunk; }
// The carry of a thread between chunk launches: dh [N], its partial dA [N], dD, d bias.
SEQLAB_HD int64_t carry_per_thread(const Dims& d) { return 2 * d.N + 2; }

// The backward's device scratch, all in the compute type A, uninitialised before the launches (every
// element is written before it is read). Per thread (b, d), index idx = b·D + d:
//   states [B·D, (rows + 1)·N]  the states of the chunk being walked back (S[0] entering it)
//   own    [B·D, ⌈T/chunk⌉·N]   without checkpoints: the state entering every chunk, found by the thread
//   carry  [B·D, 2N + 2]         dh, the partial dA, dD, d bias from one chunk's launch to the next
// and per chunk, rewritten by each chunk's launch:
//   dB_part, dC_part [B, D, rows, N]  every channel's term of dB_t, dC_t at the chunk's steps, which
//                                     reduce_chunk_element sums over d.
template <class A>
struct Workspace {
  A *states, *own, *carry, *dB_part, *dC_part;
};

SEQLAB_HD int64_t workspace_elements(const Dims& d, bool checkpoints) {
  const int64_t per_thread = (chunk_rows(d) + 1) * d.N + (checkpoints ? 0 : d.chunks() * d.N) + carry_per_thread(d);
  return d.B * d.D * (per_thread + 2 * chunk_rows(d) * d.N);
}

template <class A>
SEQLAB_HD Workspace<A> workspace_of(A* base, const Dims& d, bool checkpoints) {
  const int64_t n = d.B * d.D;
  Workspace<A> w;
  w.states = base;
  w.own = checkpoints ? nullptr : w.states + n * (chunk_rows(d) + 1) * d.N;
  w.carry = w.states + n * ((chunk_rows(d) + 1) * d.N + (checkpoints ? 0 : d.chunks() * d.N));
  w.dB_part = w.carry + n * carry_per_thread(d);
  w.dC_part = w.dB_part + n * chunk_rows(d) * d.N;
  return w;
}

template <class A>
SEQLAB_HD A sigmoid_of(A x) {
  const A e = exp(x >= A(0) ? -x : x);  // e^{−|x|} ≤ 1: never overflows
  return x >= A(0) ? A(1) / (A(1) + e) : e / (A(1) + e);
}

// Δ_t of channel (b, d) at element i = btd(b, t, d), and dΔ/d delta (σ of the argument, or 1).
template <class T, class A>
SEQLAB_HD A step_of(const Dims& d, const Inputs<T>& in, int64_t i, int64_t ch, A* slope) {
  const A x = static_cast<A>(in.delta[i]) + (in.bias ? static_cast<A>(in.bias[ch]) : A(0));
  if (!d.softplus) {
    *slope = A(1);
    return x;
  }
  *slope = sigmoid_of(x);
  return (x > A(0) ? x : A(0)) + log1p(exp(-fabs(x)));  // softplus, stable at both ends
}

// h ← exp(Δ A) ⊙ h + Δ u B_t over the N elements of channel ch; returns C_t · h.
template <class T, class A>
SEQLAB_HD A scan_step(const Dims& d, const Inputs<T>& in, int64_t b, int64_t t, int64_t ch, A dt, A u, A* h) {
  const T *Bt = in.B + d.btn(b, t), *Ct = in.C + d.btn(b, t), *Ad = in.A + ch * d.N;
  const A du = dt * u;
  A acc = 0;
  for (int64_t n = 0; n < d.N; ++n) {
    h[n] = exp(dt * static_cast<A>(Ad[n])) * h[n] + du * static_cast<A>(Bt[n]);
    acc += static_cast<A>(Ct[n]) * h[n];
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------------
// Forward. Thread idx < B·D owns channel ch = idx mod D of batch entry b = idx / D. Writes y (b, t, ch)
// for every t, fin[b, ch, :], and ckpt[b, c, ch, :] (the state entering chunk c) when ckpt is given.
// ---------------------------------------------------------------------------------------------------
template <class T, class A>
SEQLAB_HD void forward_channel(int64_t idx, const Dims& d, const Inputs<T>& in, T* y, T* fin, T* ckpt) {
  const int64_t b = idx / d.D, ch = idx % d.D, N = d.N;
  A h[kMaxState];
  for (int64_t n = 0; n < N; ++n) h[n] = in.h0 ? static_cast<A>(in.h0[(b * d.D + ch) * N + n]) : A(0);
  for (int64_t t = 0; t < d.T; ++t) {
    if (ckpt && t % d.chunk == 0) {
      T* at = ckpt + ((b * d.chunks() + t / d.chunk) * d.D + ch) * N;
      for (int64_t n = 0; n < N; ++n) at[n] = static_cast<T>(h[n]);
    }
    const int64_t i = d.btd(b, t, ch);
    A slope;
    const A dt = step_of<T, A>(d, in, i, ch, &slope), u = static_cast<A>(in.u[i]);
    A out = scan_step<T, A>(d, in, b, t, ch, dt, u, h) + (in.D ? static_cast<A>(in.D[ch]) : A(0)) * u;
    if (in.z) {
      const A z = static_cast<A>(in.z[i]);
      out *= z * sigmoid_of(z);
    }
    y[i] = static_cast<T>(out);
  }
  for (int64_t n = 0; n < N; ++n) fin[(b * d.D + ch) * N + n] = static_cast<T>(h[n]);
}

// ---------------------------------------------------------------------------------------------------
// Backward, as a sequence of launches (selective_scan.cu):
//   backward_begin_channel      one thread per (b, d)
//   for c = ⌈T/chunk⌉ − 1 … 0:
//     backward_chunk_channel    one thread per (b, d): chunk c walked back
//     reduce_chunk_element      one thread per (b, step of chunk c, n): dB, dC of the chunk's steps
//   finish_channel_element      one thread per (d, n) and per d: dA, dh0, dD, d bias
// Every element of every buffer has one writer per launch, and every sum runs in a fixed order, so the
// bits do not depend on how the threads are scheduled.
// ---------------------------------------------------------------------------------------------------

// Thread idx < B·D (channel ch = idx mod D of batch entry b = idx / D): its carry set to dh = dfinal and
// zero partials; without checkpoints (ckpt_given false), its own checkpoints from a forward sweep (the
// running state in its chunk-states scratch).
template <class T, class A>
SEQLAB_HD void backward_begin_channel(int64_t idx, const Dims& d, const Inputs<T>& in, const T* dfinal, bool ckpt_given,
                                      const Workspace<A>& w) {
  const int64_t b = idx / d.D, ch = idx % d.D, N = d.N, K = d.chunk;
  A* carry = w.carry + idx * carry_per_thread(d);
  for (int64_t n = 0; n < N; ++n) {
    carry[n] = static_cast<A>(dfinal[idx * N + n]);
    carry[N + n] = A(0);
  }
  carry[2 * N] = A(0);
  carry[2 * N + 1] = A(0);
  if (ckpt_given) return;
  A* S = w.states + idx * (chunk_rows(d) + 1) * N;
  A* own = w.own + idx * d.chunks() * N;
  A slope;
  for (int64_t n = 0; n < N; ++n) S[n] = in.h0 ? static_cast<A>(in.h0[(b * d.D + ch) * N + n]) : A(0);
  for (int64_t t = 0; t < d.T; ++t) {
    if (t % K == 0) {
      for (int64_t n = 0; n < N; ++n) own[(t / K) * N + n] = S[n];
    }
    const int64_t i = d.btd(b, t, ch);
    scan_step<T, A>(d, in, b, t, ch, step_of<T, A>(d, in, i, ch, &slope), static_cast<A>(in.u[i]), S);
  }
}

// Thread idx < B·D walks chunk c back: its states recomputed from the checkpoint (the forward's `ckpt`, or
// its own), then the steps in reverse from the carry's dh. Writes du, ddelta, dz at (b, t, ch) for the
// chunk's t, its terms of dB_t and dC_t into dB_part, dC_part [b, ch, t − t0, :], and its carry back.
// The arithmetic, and the order of the thread's own sums (dh, dA, dD, d bias over t from T − 1 down),
// is that of one thread walking all chunks: the carry only moves the running values through memory.
template <class T, class A>
SEQLAB_HD void backward_chunk_channel(int64_t idx, int64_t c, const Dims& d, const Inputs<T>& in, const T* dy,
                                      const T* ckpt, const Workspace<A>& w, const Grads<T>& g) {
  const int64_t b = idx / d.D, ch = idx % d.D, N = d.N, K = d.chunk, nc = d.chunks(), R = chunk_rows(d);
  A* S = w.states + idx * (R + 1) * N;  // [(L + 1)·N]
  A* carry = w.carry + idx * carry_per_thread(d);
  A *dB_part = w.dB_part + idx * R * N, *dC_part = w.dC_part + idx * R * N;
  const T* Ad = in.A + ch * N;
  const A Dd = in.D ? static_cast<A>(in.D[ch]) : A(0);
  A slope;
  A dh[kMaxState], dA[kMaxState];
  for (int64_t n = 0; n < N; ++n) {
    dh[n] = carry[n];
    dA[n] = carry[N + n];
  }
  A dD = carry[2 * N], dbias = carry[2 * N + 1];
  const int64_t t0 = c * K, L = d.T - t0 < K ? d.T - t0 : K;
  for (int64_t n = 0; n < N; ++n) {
    S[n] = ckpt ? static_cast<A>(ckpt[((b * nc + c) * d.D + ch) * N + n]) : w.own[(idx * nc + c) * N + n];
  }
  for (int64_t s = 0; s < L; ++s) {
    for (int64_t n = 0; n < N; ++n) S[(s + 1) * N + n] = S[s * N + n];
    const int64_t i = d.btd(b, t0 + s, ch);
    scan_step<T, A>(d, in, b, t0 + s, ch, step_of<T, A>(d, in, i, ch, &slope), static_cast<A>(in.u[i]),
                    S + (s + 1) * N);
  }
  for (int64_t s = L - 1; s >= 0; --s) {
    const int64_t t = t0 + s, i = d.btd(b, t, ch);
    const A *hp = S + s * N, *hc = S + (s + 1) * N;
    const T *Bt = in.B + d.btn(b, t), *Ct = in.C + d.btn(b, t);
    const A dt = step_of<T, A>(d, in, i, ch, &slope), u = static_cast<A>(in.u[i]);
    A gy = static_cast<A>(dy[i]);
    if (in.z) {
      A yhat = Dd * u;
      for (int64_t n = 0; n < N; ++n) yhat += static_cast<A>(Ct[n]) * hc[n];
      const A z = static_cast<A>(in.z[i]), sz = sigmoid_of(z);
      if (g.dz) g.dz[i] = static_cast<T>(gy * yhat * sz * (A(1) + z * (A(1) - sz)));
      gy *= z * sz;
    }
    dD += gy * u;
    A du = Dd * gy, ddt = 0;
    for (int64_t n = 0; n < N; ++n) {
      const A Bn = static_cast<A>(Bt[n]), An = static_cast<A>(Ad[n]);
      dh[n] += gy * static_cast<A>(Ct[n]);
      dC_part[s * N + n] = gy * hc[n];
      const A a = exp(dt * An), ahp = a * hp[n];
      ddt += dh[n] * (An * ahp + u * Bn);
      dA[n] += dh[n] * dt * ahp;
      dB_part[s * N + n] = dh[n] * dt * u;
      du += dh[n] * dt * Bn;
      dh[n] *= a;
    }
    g.du[i] = static_cast<T>(du);
    const A ddel = ddt * slope;
    g.ddelta[i] = static_cast<T>(ddel);
    dbias += ddel;
  }
  for (int64_t n = 0; n < N; ++n) {
    carry[n] = dh[n];
    carry[N + n] = dA[n];
  }
  carry[2 * N] = dD;
  carry[2 * N + 1] = dbias;
}

// After backward_chunk_channel of chunk c: element i < B·L·N (L the chunk's steps), i = (b·L + s)·N + n,
// sums the channels' terms in channel order, dB_t[n] = Σ_{d = 0…D−1} dB_part[b, d, s, n] from 0 (likewise
// dC), t = c·chunk + s, and writes them in the output type. Consecutive threads read consecutive n, s.
template <class T, class A>
SEQLAB_HD void reduce_chunk_element(int64_t i, int64_t c, const Dims& d, const Workspace<A>& w, const Grads<T>& g) {
  const int64_t N = d.N, R = chunk_rows(d), t0 = c * d.chunk, L = d.T - t0 < d.chunk ? d.T - t0 : d.chunk;
  const int64_t b = i / (L * N), s = (i / N) % L, n = i % N;
  A sB = 0, sC = 0;
  for (int64_t ch = 0; ch < d.D; ++ch) {
    const int64_t at = ((b * d.D + ch) * R + s) * N + n;
    sB += w.dB_part[at];
    sC += w.dC_part[at];
  }
  g.dB[d.btn(b, t0 + s) + n] = static_cast<T>(sB);
  g.dC[d.btn(b, t0 + s) + n] = static_cast<T>(sC);
}

// After the last chunk: element i < D·N + 2·D. For i = ch·N + n < D·N: dA[ch, n] = Σ_{b = 0…B−1} of the
// threads' partials in batch order, and dh0[b, ch, n] = the carry's dh (where dh0 is wanted); then dD[ch]
// and d bias[ch] likewise summed over b in order (skipped where null).
template <class T, class A>
SEQLAB_HD void finish_channel_element(int64_t i, const Dims& d, const Workspace<A>& w, const Grads<T>& g) {
  const int64_t N = d.N, dn = d.D * N, per = carry_per_thread(d);
  if (i < dn) {
    const int64_t ch = i / N, n = i % N;
    A sum = 0;
    for (int64_t b = 0; b < d.B; ++b) {
      const A* carry = w.carry + (b * d.D + ch) * per;
      sum += carry[N + n];
      if (g.dh0) g.dh0[(b * d.D + ch) * N + n] = static_cast<T>(carry[n]);
    }
    g.dA[i] = static_cast<T>(sum);
  } else if (i < dn + 2 * d.D) {
    const bool bias = i >= dn + d.D;
    const int64_t ch = i - dn - (bias ? d.D : 0);
    T* out = bias ? g.dbias : g.dD;
    if (!out) return;
    A sum = 0;
    for (int64_t b = 0; b < d.B; ++b) sum += w.carry[(b * d.D + ch) * per + 2 * N + (bias ? 1 : 0)];
    out[ch] = static_cast<T>(sum);
  }
}

}  // namespace seqlab::selective_scan_cuda
