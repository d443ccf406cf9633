// Device code of the row reductions outside norm and softmax: the row sums of src/cuda/elementwise.cu
// (sum_rows) and the row max with its first argmax of src/cuda/index.cu (max_rows). A header of its
// own, needing only CUDA's built-ins, so that tests/rows_emulation_test.cc runs these same
// kernels on the CPU over tests/cuda_emulation.h.
#pragma once

#include <cstdint>

#include "cuda/block_reduce.cuh"

namespace seqlab::cuda::rows {

// ---- row sums ------------------------------------------------------------------------------------

// Rows shorter than this are summed by one thread each: a block per row would leave most threads idle.
constexpr int64_t kShortRow = 32;

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  SEQLAB_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// out[r] = Σ_i x[r, i] for a contiguous x [rows, inner], one block per row (blocks stride over the
// rows when there are more rows than blocks). Each thread adds every kThreads-th element of the row in
// a register, each warp combines its 32 sums by shuffles, and warp 0 combines the 8 warp sums from
// shared memory. Reads x once, writes out once; accumulates in f32 (f64 for f64). A single long row
// (a sum over the whole tensor) keeps only one multiprocessor busy; a two-pass version would fix that.
template <class T>
__global__ void __launch_bounds__(kThreads) sum_rows_by_block(const T* x, T* out, int64_t rows, int64_t inner) {
  using A = compute_t<T>;
  __shared__ A warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * inner;
    A acc = 0;
    for (int64_t i = threadIdx.x; i < inner; i += kThreads) acc += convert<A>(row[i]);
    acc = warp_sum(acc);
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = warp_sum(lane < kThreads / 32 ? warp_sums[lane] : A(0));
      if (lane == 0) out[r] = convert<T>(acc);
    }
    __syncthreads();  // warp_sums is rewritten for the next row
  }
}

// out[r] = Σ_i x[r, i] by thread r, for rows shorter than kShortRow (0 for empty rows).
template <class T>
struct SumShortRowsFn {
  const T* x;
  T* out;
  int64_t inner;
  __device__ void operator()(int64_t r) const {
    compute_t<T> acc = 0;
    for (int64_t i = 0; i < inner; ++i) acc += convert<compute_t<T>>(x[r * inner + i]);
    out[r] = convert<T>(acc);
  }
};

// ---- max over rows -------------------------------------------------------------------------------

// A candidate for a row's max: value and column; column −1 is "no candidate yet".
template <class A>
struct Best {
  A value;
  int64_t index;
};

// The CPU's sequential rule `if (row[i] > row[best]) best = i` starting from best = 0, made
// associative: a non-NaN value beats NaN, a larger value beats a smaller, and equal values go to the
// earlier column. The one case that differs, a NaN in column 0 (the CPU never moves off it), is
// applied after the reduction.
template <class A>
__device__ __forceinline__ Best<A> better(Best<A> a, Best<A> b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  const bool a_nan = isnan(a.value), b_nan = isnan(b.value);
  if (a_nan != b_nan) return a_nan ? b : a;
  if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
  return a.index < b.index ? a : b;
}

// One block per row r of x [outer, inner] (inner ≥ 1): out[r] = x[r, best], index[r] = best, the
// CPU's first argmax. Reads the row once; writes one value and one index per row.
template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    max_rows(const T* x, T* out, int64_t* index, int64_t outer, int64_t inner) {
  using A = compute_t<T>;
  __shared__ A values[kMaxWarps];
  __shared__ int64_t columns[kMaxWarps];
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const T* row = x + r * inner;
    Best<A> best{A(0), -1};
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) best = better(best, Best<A>{convert<A>(row[i]), i});
    SEQLAB_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) {
      const Best<A> other{__shfl_xor_sync(0xffffffffu, best.value, offset),
                          __shfl_xor_sync(0xffffffffu, best.index, offset)};
      best = better(best, other);
    }
    __syncthreads();  // the previous row's readers are done with the shared arrays
    if (threadIdx.x % 32 == 0) {
      values[threadIdx.x / 32] = best.value;
      columns[threadIdx.x / 32] = best.index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      best = Best<A>{values[0], columns[0]};
      for (unsigned w = 1; w < blockDim.x / 32; ++w) best = better(best, Best<A>{values[w], columns[w]});
      const A first = convert<A>(row[0]);
      if (isnan(first)) best = Best<A>{first, 0};
      out[r] = convert<T>(best.value);
      index[r] = best.index;
    }
  }
}

}  // namespace seqlab::cuda::rows
