// What every CUDA kernel file shares: the device element types (bf16 computes in f32), conversions,
// dtype dispatch, and the grid-stride launch shape. Included only by nvcc-compiled files in src/cuda.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/runtime.h"
#include "tensor/tensor.h"

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

template <class T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<T>{}) with T the device element type of d.
template <class Fn>
void dispatch_all(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::f64:
      return fn(Tag<double>{});
    case DType::bf16:
      return fn(Tag<bf16_t>{});
    case DType::i32:
      return fn(Tag<int32_t>{});
    case DType::i64:
      return fn(Tag<int64_t>{});
  }
}

// Calls fn(Tag<T>{}) with T the device element type of a floating dtype; throws naming `op` for others.
template <class Fn>
void dispatch_floating(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::f64:
      return fn(Tag<double>{});
    case DType::bf16:
      return fn(Tag<bf16_t>{});
    default:
      throw std::invalid_argument(std::string(op) + " on CUDA: expected a f32, f64 or bf16 tensor, got " +
                                  dtype_name(d));
  }
}

// ---- launching -----------------------------------------------------------------------------------

constexpr int kThreads = 256;  // threads per block of the grid-stride and one-block-per-row kernels

// Blocks for a grid-stride loop over n items: enough to cover n, at most 32 per multiprocessor.
inline int blocks_for(int64_t n, int device) {
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 32;
  return static_cast<int>(std::min((n + kThreads - 1) / kThreads, cap));
}

// f(i) for every i < n, each thread taking i, i + gridDim·blockDim, ...
template <class F>
__global__ void __launch_bounds__(kThreads) grid_stride_loop(int64_t n, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}

}  // namespace seqlab::cuda
