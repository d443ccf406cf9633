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
// Backward (backward_channel), thread (b, d), with dh = ∂L/∂h_t from dfinal:
//   ckpt: the forward's checkpoints, or (recurrent form) a forward sweep into the thread's scratch;
//   per chunk, last first: its states recomputed from the checkpoint into the thread's scratch S
//   ((chunk + 1)·N: S[0] entering, S[i + 1] after step t0 + i — bitwise the forward's states, the same
//   operations in the same order), then the steps in reverse:
//     g = dy_t silu(z_t), dz_t = dy_t ŷ_t silu'(z_t);  du_t = D g + Δ_t Σ_n dh B_t;  dh += g C_t
//     dΔ_t = Σ_n dh (A a_t h_{t−1} + u_t B_t),  ddelta_t = dΔ_t σ(delta_t + bias),  dh ← a_t ⊙ dh
//   and the sums over threads: dC_t += g h_t, dB_t += Δ_t u_t dh (over d), dA += Δ_t a_t h_{t−1} dh,
//   dD += g u_t, d bias += ddelta_t (over b) — atomic adds into compute-type accumulators (dA, dD, d bias
//   once per thread from its registers, dB and dC per step), which finish_element then converts to the
//   output type. The atomics make the order of those sums, and so their last bits, vary from run to run
//   on a GPU; everything else is deterministic.
// Memory: the forward touches only its inputs and outputs; the backward's global scratch is
// accumulators (2·B·T·N + D·N + 2·D) and, per thread, (chunk + 1)·N (+ ⌈T/chunk⌉·N without checkpoints),
// in the compute type (f32 for f32 and bf16, f64 for f64).
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

// The outputs of the backward: du, ddelta always; dz, dh0 may be null. The sums over threads go into
// the accumulators of Accumulators and are written by finish_element into dB, dC, dA and, where not
// null, dD and dbias.
template <class T>
struct Grads {
  T *du, *ddelta, *dz, *dh0, *dB, *dC, *dA, *dD, *dbias;
};

// Compute-type accumulators, zero before the backward kernel: dB, dC [B, T, N], dA [D, N], dD, dbias [D].
template <class A>
struct Accumulators {
  A *dB, *dC, *dA, *dD, *dbias;
};

SEQLAB_HD int64_t accumulator_elements(const Dims& d) { return 2 * d.B * d.T * d.N + d.D * d.N + 2 * d.D; }

template <class A>
SEQLAB_HD Accumulators<A> accumulators_of(A* base, const Dims& d) {
  Accumulators<A> acc;
  acc.dB = base;
  acc.dC = acc.dB + d.B * d.T * d.N;
  acc.dA = acc.dC + d.B * d.T * d.N;
  acc.dD = acc.dA + d.D * d.N;
  acc.dbias = acc.dD + d.D;
  return acc;
}

// Per-thread scratch of the backward: the chunk's states, then (without checkpoints) the thread's own.
SEQLAB_HD int64_t scratch_per_thread(const Dims& d, bool checkpoints) {
  return (d.chunk + 1) * d.N + (checkpoints ? 0 : d.chunks() * d.N);
}

// *p += v: an atomic add on the device (threads of many channels add into one element); on the host the
// emulated threads run one after another.
template <class A>
SEQLAB_HD void add_to(A* p, A v) {
#ifdef __CUDA_ARCH__
  atomicAdd(p, v);
#else
  *p += v;
#endif
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
// Backward. Thread idx < B·D owns channel ch of batch entry b, as the forward. `ckpt` is the forward's
// checkpoints or null (then the thread makes its own in its scratch); `scratch` is this thread's
// scratch_per_thread elements. Writes du, ddelta, dz at (b, t, ch) for every t and dh0[b, ch, :]; adds
// into the accumulators.
// ---------------------------------------------------------------------------------------------------
template <class T, class A>
SEQLAB_HD void backward_channel(int64_t idx, const Dims& d, const Inputs<T>& in, const T* dy, const T* dfinal,
                                const T* ckpt, A* scratch, const Grads<T>& g, const Accumulators<A>& acc) {
  const int64_t b = idx / d.D, ch = idx % d.D, N = d.N, K = d.chunk, nc = d.chunks();
  A* S = scratch;                 // [(K + 1)·N]
  A* own = scratch + (K + 1) * N;  // [nc·N] without ckpt
  const T* Ad = in.A + ch * N;
  const A Dd = in.D ? static_cast<A>(in.D[ch]) : A(0);
  A slope;
  if (!ckpt) {
    for (int64_t n = 0; n < N; ++n) S[n] = in.h0 ? static_cast<A>(in.h0[(b * d.D + ch) * N + n]) : A(0);
    for (int64_t t = 0; t < d.T; ++t) {
      if (t % K == 0) {
        for (int64_t n = 0; n < N; ++n) own[(t / K) * N + n] = S[n];
      }
      const int64_t i = d.btd(b, t, ch);
      scan_step<T, A>(d, in, b, t, ch, step_of<T, A>(d, in, i, ch, &slope), static_cast<A>(in.u[i]), S);
    }
  }
  A dh[kMaxState], dA[kMaxState];
  for (int64_t n = 0; n < N; ++n) {
    dh[n] = static_cast<A>(dfinal[(b * d.D + ch) * N + n]);
    dA[n] = A(0);
  }
  A dD = 0, dbias = 0;
  for (int64_t c = nc - 1; c >= 0; --c) {
    const int64_t t0 = c * K, L = d.T - t0 < K ? d.T - t0 : K;
    for (int64_t n = 0; n < N; ++n) {
      S[n] = ckpt ? static_cast<A>(ckpt[((b * nc + c) * d.D + ch) * N + n]) : own[c * N + n];
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
        add_to(acc.dC + d.btn(b, t) + n, gy * hc[n]);
        const A a = exp(dt * An), ahp = a * hp[n];
        ddt += dh[n] * (An * ahp + u * Bn);
        dA[n] += dh[n] * dt * ahp;
        add_to(acc.dB + d.btn(b, t) + n, dh[n] * dt * u);
        du += dh[n] * dt * Bn;
        dh[n] *= a;
      }
      g.du[i] = static_cast<T>(du);
      const A ddel = ddt * slope;
      g.ddelta[i] = static_cast<T>(ddel);
      dbias += ddel;
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    add_to(acc.dA + ch * N + n, dA[n]);
    if (g.dh0) g.dh0[(b * d.D + ch) * N + n] = static_cast<T>(dh[n]);
  }
  add_to(acc.dD + ch, dD);
  add_to(acc.dbias + ch, dbias);
}

// After the backward kernel: element i < 2·B·T·N + D·N + 2·D of the accumulators into its output
// (dB, dC, dA, dD, dbias in that order; dD and dbias skipped where null).
template <class T, class A>
SEQLAB_HD void finish_element(int64_t i, const Dims& d, const Accumulators<A>& acc, const Grads<T>& g) {
  const int64_t btn = d.B * d.T * d.N, dn = d.D * d.N;
  if (i < btn) {
    g.dB[i] = static_cast<T>(acc.dB[i]);
  } else if (i < 2 * btn) {
    g.dC[i - btn] = static_cast<T>(acc.dC[i - btn]);
  } else if (i < 2 * btn + dn) {
    g.dA[i - 2 * btn] = static_cast<T>(acc.dA[i - 2 * btn]);
  } else if (i < 2 * btn + dn + d.D) {
    if (g.dD) g.dD[i - 2 * btn - dn] = static_cast<T>(acc.dD[i - 2 * btn - dn]);
  } else if (i < 2 * btn + dn + 2 * d.D) {
    if (g.dbias) g.dbias[i - 2 * btn - dn - d.D] = static_cast<T>(acc.dbias[i - 2 * btn - dn - d.D]);
  }
}

}  // namespace seqlab::selective_scan_cuda
