// What every CUDA kernel file shares: the device element types (bf16 computes in f32), conversions and
// the grid-stride loop (device_common.cuh), dtype dispatch, and the grid-stride launch shape. Included
// only by nvcc-compiled files in src/cuda.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/device_common.cuh"
#include "cuda/runtime.h"
#include "tensor/tensor.h"

namespace seqlab::cuda {

template <class T>
struct Tag {
  using type = T;
};

// The DType of a compute type (compute_t: f32 or f64), for scratch tensors the kernels read and write as A.
template <class A>
constexpr DType dtype_of_compute() {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "compute types are f32 and f64");
  return std::is_same_v<A, double> ? DType::f64 : DType::f32;
}

// A tensor's data as the device element type T (const for inputs, mutable for outputs).
template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

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

// Blocks for a grid-stride loop over n items on `device` (grid_stride_blocks).
inline int blocks_for(int64_t n, int device) { return grid_stride_blocks(n, multiprocessor_count(device)); }

}  // namespace seqlab::cuda
