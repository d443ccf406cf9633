// The device code of src/cuda/ssm/ssd.cu (Mamba-2's SSD; the equations: src/layers/ssm/ssd.h,
// docs/variants/mamba2.md). A header of its own, needing only CUDA's built-ins, so that
// tests/ssd_emulation_test.cc runs these same kernels on the CPU over tests/cuda_emulation.h.
//
// The recurrence S_t = a_t S_{t−1} + Δ_t x_t B_tᵀ, y_t = S_t C_t + D x_t, a_t = exp(Δ_t A_h), step by step
// (the recurrent form; the chunkwise form computes the same function, and the CPU tests hold the two forms to
// each other): one block per (batch entry, head), the head's P × N state in global scratch of the compute
// type A (f32 for f32 and bf16, f64 for f64), read and written by its block only.
// - Forward: thread i owns state rows p ≡ i (mod blockDim): S_p ← a S_p + Δ x_p B, y_p = S_p · C + D x_p, a
//   row at a time, no barrier (rows never meet).
// - Backward, in reverse time from checkpoints: a first pass keeps the state entering every segment of K
//   steps (K = ssd_segment(T) ≈ √T, so checkpoints and one segment's states are about 2√T states); each
//   segment's states are recomputed, then walked back. Per step, two phases between barriers:
//     rows (thread owns p):    dS_p += dy_p C;  u_p = dS_p · B;  dx_p = Δ u_p + D dy_p;
//                              partials Δ-part x_p u_p, log-part dS_p · S_{t−1,p}, D-part dy_p x_p
//     columns (thread owns n): dC_n = Σ_p S_t[p,n] dy_p;  dB_n = Δ Σ_p dS[p,n] x_p;  dS[·,n] ← a dS[·,n]
//                              and thread 0 sums the partials in order: dℓ = a Σ_p log-part,
//                              ddt = Σ_p Δ-part + A dℓ, dA += Δ dℓ, dD += Σ_p D-part
//   so every sum runs in a fixed order (deterministic, no atomics). dB and dC are written per head
//   ([B, T, H, N], compute type); ssd_sum_heads then adds the heads of each group, ssd_sum_batch the
//   per-(batch, head) dA and dD over the batch.
// Memory: the forward reads every input once and writes y and the state; the backward reads them and the
// checkpoints, and writes per (batch, head) (⌈T/K⌉ + K) states of scratch.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::ssd {

constexpr int kBlock = 128;  // threads per (batch, head) block; rows and columns beyond it loop

// Steps between backward checkpoints: ⌈√T⌉, so the checkpoints (⌈T/K⌉) and one segment (K) take ~2√T states.
inline int64_t ssd_segment(int64_t T) {
  int64_t k = 1;
  while (k * k < T) ++k;
  return k;
}

// The inputs, as the launchers pass them: x [B, T, H, P], dt [B, T, H], A [H], Bm, Cm [B, T, G, N], D [H] or
// null, h0 [B, H, P, N] or null; contiguous, of the storage type E.
template <class E>
struct SsdProblem {
  int64_t nb, nt, nh, np, ng, nn;
  const E *x, *dt, *A, *Bm, *Cm, *D, *h0;
};

template <class E, class A>
__device__ __forceinline__ A load(const E* p, int64_t i) {
  return convert<A>(p[i]);
}

// One step of one row: S_p ← a S_p + u B (u = Δ x_p); returns S_p · C when C is given.
template <class E, class A>
__device__ __forceinline__ A ssd_row_step(A* S, int64_t N, A a, A u, const E* Bt, const E* Ct) {
  A y = 0;
  for (int64_t n = 0; n < N; ++n) {
    const A s = a * S[n] + u * load<E, A>(Bt, n);
    S[n] = s;
    if (Ct != nullptr) y += s * load<E, A>(Ct, n);
  }
  return y;
}

// a_t = exp(Δ_t A_h), in double as the CPU kernels form it, rounded to A.
template <class A>
__device__ __forceinline__ A decay_of(A delta, A a_h) {
  return static_cast<A>(exp(static_cast<double>(delta) * static_cast<double>(a_h)));
}

// Forward of one (b, h) per block (grid (H, B)): y, the final state (E) and the running state (scratch
// [B, H, P, N] of A).
template <class E, class A>
__global__ void __launch_bounds__(kBlock) ssd_forward_kernel(SsdProblem<E> pb, E* y, E* final_state, A* state) {
  const int64_t h = blockIdx.x, b = blockIdx.y, P = pb.np, N = pb.nn, T = pb.nt, H = pb.nh;
  const int64_t g = h / (H / pb.ng);
  const A a_h = load<E, A>(pb.A, h), d_h = pb.D != nullptr ? load<E, A>(pb.D, h) : A(0);
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int64_t base = ((b * H + h) * P + p) * N;
    A* S = state + base;
    for (int64_t n = 0; n < N; ++n) S[n] = pb.h0 != nullptr ? load<E, A>(pb.h0, base + n) : A(0);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t bt = b * T + t;
      const A delta = load<E, A>(pb.dt, bt * H + h), xp = load<E, A>(pb.x, (bt * H + h) * P + p);
      const E* row = pb.Bm + (bt * pb.ng + g) * N;
      const A s_c = ssd_row_step<E, A>(S, N, decay_of(delta, a_h), delta * xp, row, pb.Cm + (bt * pb.ng + g) * N);
      y[(bt * H + h) * P + p] = convert<E>(s_c + d_h * xp);
    }
    for (int64_t n = 0; n < N; ++n) final_state[base + n] = convert<E>(S[n]);
  }
}

// What the backward writes: dx, ddt [storage E], dh0 (E, or null), and the per-head and per-(b, h) shares of
// the sums (compute type): dB, dC [B, T, H, N], dA, dD [B, H].
template <class E, class A>
struct SsdBackwardIO {
  const E *dy, *dfinal;
  E *dx, *ddt, *dh0;
  A *dB_head, *dC_head, *dA_part, *dD_part;
  // Scratch per (b, h): the running dS [P, N], the checkpoints [⌈T/K⌉, P, N], one segment's states [K, P, N],
  // the partial sums of the rows [3, P].
  A *dS, *ckpt, *seg, *rows;
  int64_t K;
};

// Backward of one (b, h) per block (grid (H, B)). See the header comment for the phases.
template <class E, class A>
__global__ void __launch_bounds__(kBlock) ssd_backward_kernel(SsdProblem<E> pb, SsdBackwardIO<E, A> io) {
  const int64_t h = blockIdx.x, b = blockIdx.y, P = pb.np, N = pb.nn, T = pb.nt, H = pb.nh, G = pb.ng;
  const int64_t g = h / (H / G), SZ = P * N, K = io.K, nseg = (T + K - 1) / K, bh = b * H + h;
  const A a_h = load<E, A>(pb.A, h), d_h = pb.D != nullptr ? load<E, A>(pb.D, h) : A(0);
  A* dS = io.dS + bh * SZ;
  A* ckpt = io.ckpt + bh * nseg * SZ;
  A* seg = io.seg + bh * K * SZ;
  A* rows = io.rows + bh * 3 * P;  // [Δ-part, log-part, D-part] × P
  const int tid = threadIdx.x, nthreads = blockDim.x;
  // Checkpoints: the state entering each segment, rows in parallel; dS from d final_state.
  for (int64_t p = tid; p < P; p += nthreads) {
    A* S = ckpt + p * N;  // segment 0's entering state, then carried forward segment by segment
    for (int64_t n = 0; n < N; ++n) {
      S[n] = pb.h0 != nullptr ? load<E, A>(pb.h0, bh * SZ + p * N + n) : A(0);
      dS[p * N + n] = load<E, A>(io.dfinal, bh * SZ + p * N + n);
    }
    for (int64_t s = 0; s + 1 < nseg; ++s) {
      A* next = ckpt + (s + 1) * SZ + p * N;
      for (int64_t n = 0; n < N; ++n) next[n] = ckpt[s * SZ + p * N + n];
      for (int64_t t = s * K; t < (s + 1) * K; ++t) {
        const int64_t bt = b * T + t;
        const A delta = load<E, A>(pb.dt, bt * H + h), xp = load<E, A>(pb.x, (bt * H + h) * P + p);
        ssd_row_step<E, A>(next, N, decay_of(delta, a_h), delta * xp, pb.Bm + (bt * G + g) * N, static_cast<const E*>(nullptr));
      }
    }
  }
  A dA = 0, dD = 0;  // thread 0's running sums
  for (int64_t s = nseg - 1; s >= 0; --s) {
    const int64_t t0 = s * K, t1 = t0 + K < T ? t0 + K : T;
    __syncthreads();  // the previous segment's column phase is done with seg
    for (int64_t p = tid; p < P; p += nthreads) {  // seg[t − t0] = S_t
      for (int64_t t = t0; t < t1; ++t) {
        const A* prev = t > t0 ? seg + (t - t0 - 1) * SZ + p * N : ckpt + s * SZ + p * N;
        A* cur = seg + (t - t0) * SZ + p * N;
        for (int64_t n = 0; n < N; ++n) cur[n] = prev[n];
        const int64_t bt = b * T + t;
        const A delta = load<E, A>(pb.dt, bt * H + h), xp = load<E, A>(pb.x, (bt * H + h) * P + p);
        ssd_row_step<E, A>(cur, N, decay_of(delta, a_h), delta * xp, pb.Bm + (bt * G + g) * N, static_cast<const E*>(nullptr));
      }
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const int64_t bt = b * T + t;
      const A delta = load<E, A>(pb.dt, bt * H + h), a = decay_of(delta, a_h);
      const E *Bt = pb.Bm + (bt * G + g) * N, *Ct = pb.Cm + (bt * G + g) * N;
      const A* St = seg + (t - t0) * SZ;
      const A* Sp = t > t0 ? seg + (t - t0 - 1) * SZ : ckpt + s * SZ;
      __syncthreads();  // the segment's states are written; the last column phase is done with dS and rows
      for (int64_t p = tid; p < P; p += nthreads) {  // rows
        const A dyp = load<E, A>(io.dy, (bt * H + h) * P + p), xp = load<E, A>(pb.x, (bt * H + h) * P + p);
        A u = 0, dl = 0;
        A* ds = dS + p * N;
        for (int64_t n = 0; n < N; ++n) {
          const A v = ds[n] + dyp * load<E, A>(Ct, n);
          ds[n] = v;
          u += v * load<E, A>(Bt, n);
          dl += v * Sp[p * N + n];
        }
        io.dx[(bt * H + h) * P + p] = convert<E>(delta * u + d_h * dyp);
        rows[p] = xp * u;
        rows[P + p] = dl;
        rows[2 * P + p] = dyp * xp;
      }
      __syncthreads();
      for (int64_t n = tid; n < N; n += nthreads) {  // columns
        A dc = 0, db = 0;
        for (int64_t p = 0; p < P; ++p) {
          const A dyp = load<E, A>(io.dy, (bt * H + h) * P + p), xp = load<E, A>(pb.x, (bt * H + h) * P + p);
          dc += St[p * N + n] * dyp;
          db += dS[p * N + n] * xp;
          dS[p * N + n] *= a;
        }
        io.dC_head[(bt * H + h) * N + n] = dc;
        io.dB_head[(bt * H + h) * N + n] = delta * db;
      }
      if (tid == 0) {
        A ddelta = 0, dlog = 0, dd = 0;
        for (int64_t p = 0; p < P; ++p) {
          ddelta += rows[p];
          dlog += rows[P + p];
          dd += rows[2 * P + p];
        }
        dlog *= a;
        io.ddt[bt * H + h] = convert<E>(ddelta + a_h * dlog);
        dA += delta * dlog;
        dD += dd;
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    io.dA_part[bh] = dA;
    io.dD_part[bh] = dD;
  }
  if (io.dh0 != nullptr) {
    for (int64_t i = tid; i < SZ; i += nthreads) io.dh0[bh * SZ + i] = convert<E>(dS[i]);
  }
}

// dB[b, t, g, n] = Σ_{heads j of group g} dB_head[b, t, j, n] (and dC), in head order; grid-stride over
// B·T·G·N.
template <class E, class A>
__global__ void __launch_bounds__(kThreads)
    ssd_sum_heads(int64_t count, int64_t H, int64_t G, int64_t N, const A* dB_head, const A* dC_head, E* dB, E* dC) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, hg = H / G;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    const int64_t n = i % N, g = (i / N) % G, bt = i / (N * G);
    A sb = 0, sc = 0;
    for (int64_t j = 0; j < hg; ++j) {
      const int64_t k = (bt * H + g * hg + j) * N + n;
      sb += dB_head[k];
      sc += dC_head[k];
    }
    dB[i] = convert<E>(sb);
    dC[i] = convert<E>(sc);
  }
}

// dA[h] = Σ_b dA_part[b, h] (and dD where given), in batch order; grid-stride over H.
template <class E, class A>
__global__ void __launch_bounds__(kThreads)
    ssd_sum_batch(int64_t B, int64_t H, const A* dA_part, const A* dD_part, E* dA, E* dD) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; h < H; h += step) {
    A sa = 0, sd = 0;
    for (int64_t b = 0; b < B; ++b) {
      sa += dA_part[b * H + h];
      sd += dD_part[b * H + h];
    }
    dA[h] = convert<E>(sa);
    if (dD != nullptr) dD[h] = convert<E>(sd);
  }
}

}  // namespace seqlab::cuda::ssd
