// The device side of the "one block per row" kernels (norm, softmax, cross-entropy, max over rows):
// their launch shape and block reductions. Host-includable over tests/cuda_emulation.h, like
// device_common.cuh; row_kernels.cuh adds the host side (dispatch, pointer and shape checks, launches).
//
// One block per row: block r (blocks stride over the rows when there are more rows than blocks) reads
// its row with a block-strided loop, each thread accumulating in a register; block_sum / block_max
// then combine the threads' values, first by warp shuffles, then across warps through shared memory,
// and hand the result to every thread. The combination order depends only on the block size, so a
// row's statistics are the same bits on every run. bf16 (__nv_bfloat16, bit-identical to seqlab::bf16)
// is loaded to f32, computed in f32 and rounded to nearest even on store; f64 computes in f64.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::rows {

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float rsqrt_of(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_of(double x) { return 1.0 / sqrt(x); }

// ---- launch shape --------------------------------------------------------------------------------

constexpr int kMaxThreads = kThreads;  // threads per block, every kernel here
constexpr int kMaxWarps = kMaxThreads / 32;

// Threads for one block per row of `cols` elements: a whole number of warps, at most kMaxThreads, so
// short rows do not leave most of a 256-thread block idle.
inline int row_threads(int64_t cols) {
  const int64_t warps = std::clamp<int64_t>((cols + 31) / 32, 1, kMaxWarps);
  return static_cast<int>(warps * 32);
}

// Blocks for one block per row on a GPU with `multiprocessors` multiprocessors: one per row, at most 32
// per multiprocessor (the kernels' row loop strides over the rest).
inline int row_grid(int64_t rows, int multiprocessors) {
  return static_cast<int>(std::min<int64_t>(rows, int64_t{multiprocessors} * 32));
}

// ---- block reductions ----------------------------------------------------------------------------
// Every thread of the block must call these (they hold barriers); blockDim.x is a multiple of 32 and
// at most kMaxThreads. `scratch` is a __shared__ array of kMaxWarps values; the leading barrier lets a
// block reuse one scratch array for reduction after reduction.

struct SumOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
// max(a, b); where a row holds a NaN the result may or may not be NaN, but every use here (softmax,
// log-sum-exp) then turns NaN through that element's exp term, as on the CPU. max_rows, which must
// return the CPU's exact winner, has its own reduction.
struct MaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return b > a ? b : a;
  }
};

template <class A, class Op>
__device__ __forceinline__ A block_reduce(A v, Op op, A* scratch) {
  SEQLAB_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // an earlier reduction's readers are done with scratch
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
  return v;
}

template <class A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
  return block_reduce(v, SumOp{}, scratch);
}
template <class A>
__device__ __forceinline__ A block_max(A v, A* scratch) {
  return block_reduce(v, MaxOp{}, scratch);
}

}  // namespace seqlab::cuda::rows
