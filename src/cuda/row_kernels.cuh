// Shared pieces of the row-wise CUDA kernels (src/cuda/{norm,softmax,index}.cu): element types and
// conversions, dtype dispatch, launch helpers, and block reductions for the "one block per row" design.
//
// One block per row: block r (blocks stride over the rows when there are more rows than blocks) reads
// its row with a block-strided loop, each thread accumulating in a register; block_sum / block_max
// then combine the threads' values, first by warp shuffles, then across warps through shared memory,
// and hand the result to every thread. The combination order depends only on the block size, so a
// row's statistics are the same bits on every run. bf16 (__nv_bfloat16, bit-identical to seqlab::bf16)
// is loaded to f32, computed in f32 and rounded to nearest even on store; f64 computes in f64.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "tensor/tensor.h"

namespace seqlab::cuda::rows {

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float rsqrt_of(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_of(double x) { return 1.0 / sqrt(x); }

// Calls fn(Tag<I>{}) with I the C++ type of an index dtype (i32, i64); throws for others.
template <class Fn>
void dispatch_index_type(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::i32:
      return fn(Tag<int32_t>{});
    case DType::i64:
      return fn(Tag<int64_t>{});
    default:
      throw std::invalid_argument(std::string(op) + " on CUDA: expected an i32 or i64 index tensor, got " +
                                  dtype_name(d));
  }
}

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Throws std::logic_error unless every tensor is defined, contiguous and on `device`: the slots'
// callers promise this, and a kernel would read garbage if one did not.
inline void require_contiguous(const char* op, int device, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!t->defined() || !t->is_contiguous() || !t->device().is_cuda() || t->device().index != device) {
      throw std::logic_error(std::string(op) + " on CUDA: expected contiguous tensors on cuda:" +
                             std::to_string(device) + ", got " +
                             (t->defined() ? shape_str(t->shape()) + " on " + t->device().str() +
                                                 (t->is_contiguous() ? "" : " (strided)")
                                           : std::string("an undefined tensor")));
    }
  }
}

// ---- launching -----------------------------------------------------------------------------------

constexpr int kMaxThreads = kThreads;  // threads per block, every kernel here
constexpr int kMaxWarps = kMaxThreads / 32;

// Threads for one block per row of `cols` elements: a whole number of warps, at most kMaxThreads, so
// short rows do not leave most of a 256-thread block idle.
inline int row_threads(int64_t cols) {
  const int64_t warps = std::clamp<int64_t>((cols + 31) / 32, 1, kMaxWarps);
  return static_cast<int>(warps * 32);
}

// Blocks for one block per row: one per row, at most 32 per multiprocessor (the kernels' row loop
// strides over the rest).
inline int row_blocks(int64_t rows, int device) {
  return static_cast<int>(std::min<int64_t>(rows, int64_t{multiprocessor_count(device)} * 32));
}

// Runs f(i) for i in [0, n) on the stream of `device` (the caller holds a DeviceGuard for it).
template <class F>
void launch_elements(const char* what, int device, int64_t n, const F& f) {
  if (n == 0) return;
  grid_stride_loop<<<blocks_for(n, device), kThreads, 0, stream(device)>>>(n, f);
  SEQLAB_CUDA_CHECK_LAUNCH(what);
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
#pragma unroll
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
