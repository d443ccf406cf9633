// The device code of src/cuda/optim.cu (read its header comment first: types, the master weight, the
// deterministic two-pass sum of squares), and the sum's launch shape. A header of its own, needing only
// CUDA's built-ins, so that tests/optim_emulation_test.cc runs these same kernels on the CPU over
// tests/cuda_emulation.h, launched with the same grids.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::optim {

// S for a parameter type P: f64 for f64, f32 for f32 and bf16 (as Compute<P> in optim.cpp).
template <class P>
using state_t = std::conditional_t<std::is_same_v<P, double>, double, float>;

// ---- AdamW -----------------------------------------------------------------------------------------

template <class S>
struct AdamWCoefficients {
  S lr, lr_wd, eps, b1, c1, b2, c2, inv_bc1, inv_bc2;
};
// From an AdamWStep (tensor/slots/optim.h): each coefficient formed in double, then rounded to S once.
template <class S, class Step>
AdamWCoefficients<S> adamw_coefficients(const Step& s) {
  return {S(s.lr),
          S(s.lr * s.weight_decay),
          S(s.eps),
          S(s.beta1),
          S(1.0 - s.beta1),
          S(s.beta2),
          S(1.0 - s.beta2),
          S(1.0 / s.bias_correction1),
          S(1.0 / s.bias_correction2)};
}

// For each i < n (p of type P; g of type G: P, or f32 beside a master; m, v and the master w (or null)
// of type S; all read once and written once, g only read), with x = w when w is given, else p:
//   x ← x − lr·wd·x;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
//   x ← x − lr · (m / bc1) / (√(v / bc2) + ε)    with 1/bc1, 1/bc2 premultiplied;  p ← P(x).
template <class P, class G, class S>
__global__ void __launch_bounds__(kThreads)
    adamw_step_kernel_impl(int64_t n, AdamWCoefficients<S> k, P* p, const G* g, S* m, S* v, S* w) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const S gi = convert<S>(g[i]);
    S pi = w ? w[i] : convert<S>(p[i]);
    pi -= k.lr_wd * pi;
    const S mi = k.b1 * m[i] + k.c1 * gi;
    const S vi = k.b2 * v[i] + k.c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= k.lr * (mi * k.inv_bc1) / (sqrt(vi * k.inv_bc2) + k.eps);
    if (w) w[i] = pi;
    p[i] = convert<P>(pi);
  }
}

// ---- SGD -------------------------------------------------------------------------------------------

template <class S>
struct SgdCoefficients {
  S lr, lr_wd, mu;
  bool nesterov;
};
// From an SgdStep (tensor/slots/optim.h): each coefficient formed in double, then rounded to S once.
template <class S, class Step>
SgdCoefficients<S> sgd_coefficients(const Step& s) {
  return {S(s.lr), S(s.lr * s.weight_decay), S(s.momentum), s.nesterov};
}

// For each i < n (p of type P; g of type G: P, or f32 beside a master; b and the master w of type S or
// null; each read once, p, b and w written once), with x = w when w is given, else p:
//   x ← x − lr·wd·x;  b ← μ·b + g;  d = nesterov ? g + μ·b : b  (d = g without b);  x ← x − lr·d;
//   p ← P(x).
template <class P, class G, class S>
__global__ void __launch_bounds__(kThreads)
    sgd_step_kernel_impl(int64_t n, SgdCoefficients<S> k, P* p, const G* g, S* b, S* w) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const S gi = convert<S>(g[i]);
    S pi = w ? w[i] : convert<S>(p[i]);
    pi -= k.lr_wd * pi;
    S d = gi;
    if (b) {
      const S bi = k.mu * b[i] + gi;
      b[i] = bi;
      d = k.nesterov ? gi + k.mu * bi : bi;
    }
    pi -= k.lr * d;
    if (w) w[i] = pi;
    p[i] = convert<P>(pi);
  }
}

// ---- sum of squares --------------------------------------------------------------------------------

// Elements per block in pass 1: 32 per thread, so a 1M-element gradient fills 128 blocks.
constexpr int64_t kSumChunk = int64_t{kThreads} * 32;

// Pass 1's grid: one block per kSumChunk elements (the launcher rejects more than 2^31 − 1 blocks).
inline int64_t sum_squares_blocks(int64_t n) { return (n + kSumChunk - 1) / kSumChunk; }

// Sums acc over the block's kThreads threads in a fixed order (a shared-memory tree: thread t adds
// t + half for half = 128, 64, ..., 1). The result is valid in thread 0.
__device__ inline double block_sum(double acc) {
  __shared__ double buf[kThreads];
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) buf[threadIdx.x] += buf[threadIdx.x + half];
    __syncthreads();
  }
  return buf[0];
}

// Pass 1: partial[b] = Σ x[i]² over i in [b·kSumChunk, min(n, (b+1)·kSumChunk)), in double. Thread t
// sums the elements t, t + kThreads, ... of the block's range; block_sum combines the threads. Reads
// x once, writes gridDim.x doubles. Launched with exactly ceil(n / kSumChunk) blocks.
template <class T>
__global__ void __launch_bounds__(kThreads) sum_squares_partials(const T* x, int64_t n, double* partial) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSumChunk;
  const int64_t end = n - begin < kSumChunk ? n : begin + kSumChunk;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double e = convert<double>(x[i]);
    acc += e * e;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Pass 2, one block: *out = Σ_b partial[b] for b < count, thread t summing b = t, t + kThreads, ...
__global__ void __launch_bounds__(kThreads) sum_partials(const double* partial, int64_t count, double* out) {
  double acc = 0.0;
  for (int64_t b = threadIdx.x; b < count; b += kThreads) acc += partial[b];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = total;
}

// ---- scale -----------------------------------------------------------------------------------------

// x[i] ← k·x[i] for i < n, computed in S (f32 for bf16); reads and writes x once.
template <class T, class S>
__global__ void __launch_bounds__(kThreads) scale_inplace_kernel_impl(int64_t n, S k, T* x) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    x[i] = convert<T>(k * convert<S>(x[i]));
  }
}

}  // namespace seqlab::cuda::optim
