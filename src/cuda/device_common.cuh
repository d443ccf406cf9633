// The device side of common.cuh: element types (bf16 computes in f32), conversions and the grid-stride
// loop. Needs nothing but CUDA's built-ins, so a host compiler can include it too, over the emulation
// of CUDA in tests/cuda_emulation.h (which provides __nv_bfloat16 and the rest when __CUDACC__ is not
// defined); the *_kernels.cuh headers build on it, and the tests run their kernels on the CPU.
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

// Full unrolling for nvcc (the shuffle steps of a warp reduction); nothing for a host compiler, which
// would warn about the CUDA pragma.
#ifdef __CUDACC__
#define SEQLAB_UNROLL _Pragma("unroll")
#else
#define SEQLAB_UNROLL
#endif

namespace seqlab::cuda {

using bf16_t = __nv_bfloat16;  // bit-identical to seqlab's bf16

template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<bf16_t> {
  using type = float;
};
// The type a kernel computes and accumulates in: f32 for f32 and bf16, f64 for f64, itself for integers.
template <class T>
using compute_t = typename Compute<T>::type;

// One element from one type to another, as convert_scalar does on the CPU (bf16 through f32).
template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<From, bf16_t>) {
    return convert<To>(__bfloat162float(x));
  } else if constexpr (std::is_same_v<To, bf16_t>) {
    return __float2bfloat16(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

constexpr int kThreads = 256;  // threads per block of the grid-stride and one-block-per-row kernels

// Blocks for a grid-stride loop over n items on a GPU with `multiprocessors` multiprocessors: enough to
// cover n, at most 32 per multiprocessor.
inline int grid_stride_blocks(int64_t n, int multiprocessors) {
  return static_cast<int>(std::min((n + kThreads - 1) / kThreads, int64_t{multiprocessors} * 32));
}

// f(i) for every i < n, each thread taking i, i + gridDim·blockDim, ...
template <class F>
__global__ void __launch_bounds__(kThreads) grid_stride_loop(int64_t n, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}

}  // namespace seqlab::cuda
