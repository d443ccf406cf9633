// The device code of src/cuda/attention/relative_position_bias.cu (read its header comment first: the launches,
// and why the buckets come from the host), and the host-side bucketing it launches with. A header of its own,
// needing only CUDA's built-ins, so that tests/relative_position_bias_emulation_test.cc runs these same kernels
// on the CPU over tests/cuda_emulation.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::relative_position {

constexpr int kWarps = 4;  // warps per block of the diagonal sums
constexpr int kDiagonalThreads = 32 * kWarps;

// ---- host: T5's bucketing (the slot's formula, src/tensor/slots/attention/relative_position_bias.h) ----

// The bucket of relative position rel = j − (i + S − T):
//   bidirectional: nb = num_buckets / 2, bucket = (rel > 0 ? nb : 0) + f(|rel|)
//   causal:        nb = num_buckets,     bucket = f(max(−rel, 0))
//   f(n) = n for n < max_exact = nb / 2, else
//          min(nb − 1, max_exact + int(log(n / max_exact) / log(max_distance / max_exact) · (nb − max_exact))),
// the log expression in float32 as T5 and Hugging Face transformers evaluate it: n / max_exact and its log in
// float32, log(max_distance / max_exact) in double rounded to float32 (a Python float meeting a float32
// tensor), each product and quotient rounded to float32, and the conversion truncating toward zero.
// Throws std::invalid_argument where the bucketing is not defined (fewer than 2 buckets per direction,
// or max_distance ≤ max_exact, where the log divides by zero or flips sign).
inline int64_t bucket(int64_t rel, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  const int64_t nb = bidirectional ? num_buckets / 2 : num_buckets, max_exact = nb / 2;
  if (max_exact < 1 || max_distance <= max_exact) {
    throw std::invalid_argument("relative_position_bias: num_buckets = " + std::to_string(num_buckets) + " (" +
                                (bidirectional ? "bidirectional" : "causal") +
                                ") and max_distance = " + std::to_string(max_distance) +
                                " leave no log-spaced buckets: need max_exact = " + std::to_string(max_exact) +
                                " ≥ 1 and max_distance > max_exact");
  }
  int64_t base = 0, n = 0;
  if (bidirectional) {
    base = rel > 0 ? nb : 0;
    n = rel < 0 ? -rel : rel;
  } else {
    n = rel < 0 ? -rel : 0;
  }
  if (n < max_exact) return base + n;
  const float ratio = static_cast<float>(n) / static_cast<float>(max_exact);
  const float denominator = static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = std::log(ratio) / denominator * static_cast<float>(nb - max_exact);
  // The clamp before the conversion (compared in double, exact for these integers): far beyond max_distance
  // the scaled log may exceed what an int64 holds.
  if (static_cast<double>(scaled) >= static_cast<double>(nb - 1 - max_exact)) return base + nb - 1;
  return base + max_exact + static_cast<int64_t>(scaled);
}

// The bucket of every diagonal d = j − i of a T × S bias (the bucket depends only on d: rel = d − (S − T)),
// entry d + T − 1 for d = −(T − 1) … S − 1: T + S − 1 entries (none when T or S is 0).
inline std::vector<int32_t> diagonal_buckets(bool bidirectional, int64_t num_buckets, int64_t max_distance, int64_t T,
                                             int64_t S) {
  std::vector<int32_t> buckets(T > 0 && S > 0 ? static_cast<size_t>(T + S - 1) : 0);
  for (size_t e = 0; e < buckets.size(); ++e) {
    const int64_t d = static_cast<int64_t>(e) - (T - 1);
    buckets[e] = static_cast<int32_t>(bucket(d - (S - T), bidirectional, num_buckets, max_distance));
  }
  return buckets;
}

// ---- device ------------------------------------------------------------------------------------------

// Forward: bias[h, i, j] = table[buckets[j − i + T − 1], h] for every element of bias [1, H, T, S] (table
// [NB, H]), one thread per element in a grid-stride loop: a copy, no arithmetic. Writes the bias once;
// reads the small table and the T + S − 1 buckets from cache.
template <class T>
__global__ void __launch_bounds__(kThreads)
    relative_position_bias_fwd(int64_t H, int64_t Tn, int64_t S, const int32_t* __restrict__ buckets,
                               const T* __restrict__ table, T* __restrict__ bias) {
  const int64_t n = H * Tn * S, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t j = e % S, i = e / S % Tn, h = e / (S * Tn);
    bias[e] = table[buckets[j - i + Tn - 1] * H + h];
  }
}

// Backward, pass 1: diag[h, d + T − 1] = Σ_i dbias[h, i, i + d] over the rows i with 0 ≤ i + d < S, in the
// compute type A (f32 for bf16). Block (chunk of 32 diagonals, h) with 4 warps: lane c owns diagonal
// d = d0 + c, and warp w walks the rows i ≡ w (mod 4), so each step's 32 loads are one row's consecutive
// keys (coalesced). The warps' partial sums are then added in warp order through shared memory. Every
// sum runs in a fixed order: the same bits on every run. Reads dbias once; writes diag [H, T + S − 1] once.
template <class T>
__global__ void __launch_bounds__(kDiagonalThreads)
    relative_position_bias_diagonals(int64_t Tn, int64_t S, const T* __restrict__ dbias,
                                     compute_t<T>* __restrict__ diag) {
  using A = compute_t<T>;
  __shared__ A partial[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t h = blockIdx.y, diagonals = Tn + S - 1;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * 32;  // the chunk's first diagonal index
  const int64_t d = first + lane - (Tn - 1);                    // this lane's diagonal j − i
  // Rows where some diagonal of the chunk is inside the matrix: j = i + d ∈ [0, S) for d in the chunk.
  const int64_t d_lo = first - (Tn - 1), d_hi = min(first + 31, diagonals - 1) - (Tn - 1);
  const int64_t i_lo = max(int64_t{0}, -d_hi), i_hi = min(Tn, S - d_lo);
  const T* plane = dbias + h * Tn * S;
  A acc = 0;
  for (int64_t i = i_lo + warp; i < i_hi; i += kWarps) {
    const int64_t j = i + d;
    if (first + lane < diagonals && j >= 0 && j < S) acc += convert<A>(plane[i * S + j]);
  }
  partial[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && first + lane < diagonals) {
    A sum = partial[0][lane];
    SEQLAB_UNROLL
    for (int w = 1; w < kWarps; ++w) sum += partial[w][lane];
    diag[h * diagonals + first + lane] = sum;
  }
}

// Backward, pass 2: dtable[b, h] = Σ over the diagonals e with buckets[e] = b of diag[h, e], in increasing e
// (a fixed order), one thread per (b, h) of dtable [NB, H] in a grid-stride loop; 0 for a bucket no
// diagonal falls in. Reads the buckets and diag once per bucket; writes dtable once.
template <class T>
__global__ void __launch_bounds__(kThreads)
    relative_position_bias_buckets(int64_t NB, int64_t H, int64_t diagonals, const int32_t* __restrict__ buckets,
                                   const compute_t<T>* __restrict__ diag, T* __restrict__ dtable) {
  using A = compute_t<T>;
  const int64_t n = NB * H, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t b = e / H, h = e % H;
    const A* row = diag + h * diagonals;
    A sum = 0;
    for (int64_t x = 0; x < diagonals; ++x) {
      if (buckets[x] == b) sum += row[x];
    }
    dtable[e] = convert<T>(sum);
  }
}

}  // namespace seqlab::cuda::relative_position
