// The device code of src/cuda/attention/rope.cu (read its header comment first: the two launches, and why the
// angle is formed in double). A header of its own, needing only CUDA's built-ins, so that
// tests/rope_emulation_test.cc runs these same kernels on the CPU over tests/cuda_emulation.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::rotary {

// θ_i = base^(−2i/D) for i < D/2, on the host, with std::pow exactly as the CPU kernel forms them.
inline std::vector<double> inverse_frequencies(double base, int64_t D) {
  std::vector<double> theta(static_cast<size_t>(D / 2));
  for (size_t i = 0; i < theta.size(); ++i) {
    theta[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  }
  return theta;
}

// For j = t·P + i < T·P:  φ = (start + t)·θ_i (in double, θ [P] from the host);
//   cos_t[j] = cos φ,  sin_t[j] = sign · sin φ  (sign = −1 for the inverse rotation), rounded to A,
// the compute type of the rotated tensors (f32 for bf16, as the CPU computes bf16 in f32).
// Writes the two [T, P] tables once; reads θ (P doubles) from cache.
template <class A>
__global__ void __launch_bounds__(kThreads)
    rope_tables(int64_t Tn, int64_t P, const double* theta, int64_t start, double sign, A* cos_t, A* sin_t) {
  const int64_t n = Tn * P;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) {
    const int64_t t = j / P, i = j - t * P;
    const double phi = static_cast<double>(start + t) * theta[i];
    cos_t[j] = static_cast<A>(cos(phi));
    sin_t[j] = static_cast<A>(sign * sin(phi));
  }
}

// For every pair j < B·T·H·P of x, y [B, T, H, D] (pair j is elements 2j and 2j+1; i = j mod P,
// t = (j / (H·P)) mod T), with c = cos_t[t, i], s = sin_t[t, i], in the compute type A = compute_t<T>
// (bf16 loaded to f32, the result rounded to nearest even on store):
//   y_{2j} = x_{2j} c − x_{2j+1} s,   y_{2j+1} = x_{2j} s + x_{2j+1} c.
// Reads x once and the small tables once per pair (from cache); writes y once.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_rotate_pairs(int64_t pairs, int64_t Tn, int64_t HP, int64_t P, const compute_t<T>* cos_t,
                      const compute_t<T>* sin_t, const T* x, T* y) {
  using A = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < pairs; j += step) {
    const int64_t i = j % P, t = (j / HP) % Tn;
    const A c = cos_t[t * P + i], s = sin_t[t * P + i];
    const A x0 = convert<A>(x[2 * j]), x1 = convert<A>(x[2 * j + 1]);
    y[2 * j] = convert<T>(x0 * c - x1 * s);
    y[2 * j + 1] = convert<T>(x0 * s + x1 * c);
  }
}

}  // namespace seqlab::cuda::rotary
