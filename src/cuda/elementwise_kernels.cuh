// The device code of src/cuda/elementwise.cu (read its header comment first): the functors its
// grid-stride loops run (copy, fill, unary and its backward, binary, scalar, where), the strided
// addressing they share (StridedOffsets, and strided_offsets, the host code that builds it by merging
// dimensions), the fill's bit pattern and the compile-time op dispatch. A header of its own, needing
// only CUDA's built-ins and host code of src/tensor, so that tests/elementwise_emulation_test.cc
// runs these same functors on the CPU over tests/cuda_emulation.h, with the same launch shape.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/device_common.cuh"
#include "tensor/elementwise_math.h"
#include "tensor/tensor.h"

namespace seqlab::cuda::elementwise {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

// ---- compile-time ops ----------------------------------------------------------------------------

// Calls fn(std::integral_constant<Enum, op>{}) for the runtime value of op (one of Ops).
template <class Enum, Enum... Ops, class Fn>
void with_op(Enum op, Fn&& fn) {
  (void)((op == Ops ? (fn(std::integral_constant<Enum, Ops>{}), true) : false) || ...);
}

template <class Fn>
void with_unary(UnaryOp op, Fn&& fn) {
  with_op<UnaryOp, UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::square,
          UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::silu, UnaryOp::gelu, UnaryOp::relu, UnaryOp::elu,
          UnaryOp::softplus>(op, fn);
}
template <class Fn>
void with_binary(BinaryOp op, Fn&& fn) {
  with_op<BinaryOp, BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div>(op, fn);
}
template <class Fn>
void with_scalar(ScalarOp op, Fn&& fn) {
  with_op<ScalarOp, ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv>(op, fn);
}

// ---- strided addressing --------------------------------------------------------------------------

constexpr int kMaxDims = 8;

// Element offsets of N operands iterated over one shape, from the row-major linear index i:
// off[k] = Σ_d (i_d · stride[k][d]) with i_d the digits of i in the mixed radix size[] (innermost
// first). Passed to kernels by value; reads nothing from memory.
template <int N>
struct StridedOffsets {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};

  __device__ __forceinline__ void operator()(int64_t i, int64_t (&off)[N]) const {
    SEQLAB_UNROLL
    for (int k = 0; k < N; ++k) off[k] = ndim == 1 ? i * stride[k][0] : 0;
    if (ndim == 1) return;
    SEQLAB_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {  // constant d keeps size[] and stride[] out of local memory
      if (d == ndim) break;
      const int64_t q = i / size[d], r = i - q * size[d];
      SEQLAB_UNROLL
      for (int k = 0; k < N; ++k) off[k] += r * stride[k][d];
      i = q;
    }
  }
};

// The StridedOffsets of `operands` (views of `shape`, strides in elements) over `shape`: drops size-1
// dimensions and merges each dimension into its inner neighbour where that is contiguous with it in
// every operand (stride[d] = stride[inner] · size[inner], which also holds for two broadcast
// dimensions of stride 0), so a contiguous tensor is one dimension and a bias broadcast over
// [B, T, C] two. Throws std::invalid_argument naming `op` when more than kMaxDims dimensions remain.
template <int N>
StridedOffsets<N> strided_offsets(const Shape& shape, const std::array<const Tensor*, N>& operands, const char* op) {
  StridedOffsets<N> s;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    const int last = s.ndim - 1;
    bool merge = s.ndim > 0;
    for (int k = 0; k < N && merge; ++k) merge = operands[k]->strides()[d] == s.stride[k][last] * s.size[last];
    if (merge) {
      s.size[last] *= shape[d];
      continue;
    }
    if (s.ndim == kMaxDims) {
      throw std::invalid_argument(std::string(op) + " on CUDA: the strided layout of shape " + shape_str(shape) +
                                  " needs more than " + std::to_string(kMaxDims) + " dimensions");
    }
    for (int k = 0; k < N; ++k) s.stride[k][s.ndim] = operands[k]->strides()[d];
    s.size[s.ndim++] = shape[d];
  }
  return s;
}

// ---- copy and fill -------------------------------------------------------------------------------

// dst[at(i)[0]] = convert(src[at(i)[1]]): reads and writes numel elements, both sides strided.
template <class D, class S>
struct CopyFn {
  D* dst;
  const S* src;
  StridedOffsets<2> at;
  __device__ void operator()(int64_t i) const {
    int64_t off[2];
    at(i, off);
    dst[off[0]] = convert<D>(src[off[1]]);
  }
};

// The unsigned integer as wide as an element of T: what a fill stores.
template <class T>
using fill_bits_t =
    std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

// The bits of `value` as an element of T (a host type of dtype.h: float, double, bf16, int32_t,
// int64_t), converted on the host by the CPU's own rule (convert_scalar), so both devices store the
// same bits.
template <class T>
fill_bits_t<T> fill_bits(double value) {
  const T v = convert_scalar<T>(value);
  fill_bits_t<T> bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// out[i] = bits: writes n elements of a contiguous tensor with the bit pattern of the value.
template <class U>
struct FillFn {
  U* out;
  U bits;
  __device__ void operator()(int64_t i) const { out[i] = bits; }
};

// ---- elementwise ops -----------------------------------------------------------------------------

// out[i] = f(x[i]): reads n elements of x, writes n of out (both contiguous).
template <class T, UnaryOp kOp>
struct UnaryFn {
  const T* x;
  T* out;
  compute_t<T> alpha;
  __device__ void operator()(int64_t i) const {
    out[i] = convert<T>(math::unary_forward(kOp, convert<compute_t<T>>(x[i]), alpha));
  }
};

// dx[i] = dy[i] · f'(x[i]) (given y = f(x)): reads n elements each of dy, x, y, writes n of dx.
template <class T, UnaryOp kOp>
struct UnaryBackwardFn {
  const T *dy, *x, *y;
  T* dx;
  compute_t<T> alpha;
  __device__ void operator()(int64_t i) const {
    using C = compute_t<T>;
    dx[i] = convert<T>(math::unary_backward(kOp, convert<C>(dy[i]), convert<C>(x[i]), convert<C>(y[i]), alpha));
  }
};

// out[i] = a[at(i)[0]] op b[at(i)[1]]: a and b are broadcast views (stride 0 where expanded), so an
// element of a may be read many times; writes n elements of a contiguous out.
template <class T, BinaryOp kOp>
struct BinaryFn {
  const T *a, *b;
  T* out;
  StridedOffsets<2> at;
  __device__ void operator()(int64_t i) const {
    using C = compute_t<T>;
    int64_t off[2];
    at(i, off);
    out[i] = convert<T>(math::binary(kOp, convert<C>(a[off[0]]), convert<C>(b[off[1]])));
  }
};

// out[i] = x[i] op s: reads n elements of x, writes n of out (both contiguous).
template <class T, ScalarOp kOp>
struct ScalarFn {
  const T* x;
  T* out;
  compute_t<T> s;
  __device__ void operator()(int64_t i) const {
    out[i] = convert<T>(math::scalar(kOp, convert<compute_t<T>>(x[i]), s));
  }
};

// out[i] = cond[at(i)[0]] ≠ 0 ? a[at(i)[1]] : b[at(i)[2]]: three broadcast views read, one element of
// either a or b per output; writes n elements of a contiguous out.
template <class C, class T>
struct WhereFn {
  const C* cond;
  const T *a, *b;
  T* out;
  StridedOffsets<3> at;
  __device__ void operator()(int64_t i) const {
    int64_t off[3];
    at(i, off);
    out[i] = convert<double>(cond[off[0]]) != 0.0 ? a[off[1]] : b[off[2]];
  }
};

}  // namespace seqlab::cuda::elementwise
