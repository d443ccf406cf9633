// CUDA copies, fills, elementwise ops and row sums: the CUDA side of the slots that
// src/tensor/cpu/{copy,elementwise,reduce}.cpp fill for the CPU, computing the same per-element
// formulas (src/tensor/elementwise_math.h).
//
// Every elementwise kernel is `f(i) for i in [0, n)` in one grid-stride loop (grid_stride_loop), with
// f a small functor holding the pointers; each functor's comment states what it computes and the
// memory it touches. The op is a template argument, so the formula's switch folds away as on the CPU.
// bf16 (__nv_bfloat16, bit-identical to seqlab::bf16) is loaded to f32, computed in f32 and rounded
// to nearest even on store. Strided operands are addressed through StridedOffsets, which first merges
// the dimensions that are contiguous for every operand: a contiguous tensor is indexed as one
// dimension, a bias broadcast over [B, T, C] as two.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/reduce_rows_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

// Calls fn(std::integral_constant<Enum, op>{}) for the runtime value of op.
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

// ---- strided addressing --------------------------------------------------------------------------

constexpr int kMaxDims = 8;

// Element offsets of N operands iterated over one shape, from the row-major linear index. Passed to
// kernels by value; dimensions are stored innermost first.
template <int N>
struct StridedOffsets {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};

  __device__ __forceinline__ void operator()(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = ndim == 1 ? i * stride[k][0] : 0;
    if (ndim == 1) return;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {  // constant d keeps size[] and stride[] out of local memory
      if (d == ndim) break;
      const int64_t q = i / size[d], r = i - q * size[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * stride[k][d];
      i = q;
    }
  }
};

// Drops size-1 dimensions and merges neighbours that are contiguous in every operand.
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

// ---- launching -----------------------------------------------------------------------------------

// Runs f(i) for i in [0, n) on the stream of `on`'s device: enough blocks to cover n, at most 32 per
// multiprocessor (the grid-stride loop covers the rest).
template <class F>
void launch(const char* what, const Tensor& on, int64_t n, const F& f) {
  if (n == 0) return;
  const int device = on.device().index;
  DeviceGuard guard(device);
  grid_stride_loop<<<blocks_for(n, device), kThreads, 0, stream(device)>>>(n, f);
  SEQLAB_CUDA_CHECK_LAUNCH(what);
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

// out[i] = bits: writes n elements of a contiguous tensor with the bit pattern of the value.
template <class U>
struct FillFn {
  U* out;
  U bits;
  __device__ void operator()(int64_t i) const { out[i] = bits; }
};

void copy_cuda(const Tensor& dst, const Tensor& src) {
  const int device = dst.device().index;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.nbytes() == 0) return;
    DeviceGuard guard(device);
    SEQLAB_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream(device)));
    return;
  }
  const StridedOffsets<2> at = strided_offsets<2>(dst.shape(), {&dst, &src}, "copy");
  dispatch_all(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_all(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      launch("copy kernel", dst, dst.numel(),
             CopyFn<D, S>{static_cast<D*>(dst.raw_data()), static_cast<const S*>(src.raw_data()), at});
    });
  });
}

void fill_cuda(const Tensor& dst, double value) {
  // The value is converted on the host by the CPU's own rule, so both devices store the same bits.
  dispatch_any(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert_scalar<T>(value);
    using U = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    U bits;
    std::memcpy(&bits, &v, sizeof(U));
    if (bits == 0 && dst.nbytes() > 0) {
      DeviceGuard guard(dst.device().index);
      SEQLAB_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, dst.nbytes(), stream(dst.device().index)));
      return;
    }
    launch("fill kernel", dst, dst.numel(), FillFn<U>{static_cast<U*>(dst.raw_data()), bits});
  });
}

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

void unary_cuda(UnaryOp op_value, const Tensor& x, double alpha, const Tensor& out) {
  with_unary(op_value, [&](auto op) {
    dispatch_floating(x.dtype(), kernel::unary_name(op), [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(kernel::unary_name(op), out, x.numel(),
             UnaryFn<T, decltype(op)::value>{static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()),
                                             static_cast<compute_t<T>>(alpha)});
    });
  });
}

void unary_backward_cuda(UnaryOp op_value, const Tensor& dy, const Tensor& x, const Tensor& y, double alpha,
                         const Tensor& dx) {
  with_unary(op_value, [&](auto op) {
    dispatch_floating(x.dtype(), kernel::unary_name(op), [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(kernel::unary_name(op), dx, x.numel(),
             UnaryBackwardFn<T, decltype(op)::value>{static_cast<const T*>(dy.raw_data()),
                                                     static_cast<const T*>(x.raw_data()),
                                                     static_cast<const T*>(y.raw_data()),
                                                     static_cast<T*>(dx.raw_data()), static_cast<compute_t<T>>(alpha)});
    });
  });
}

void binary_cuda(BinaryOp op_value, const Tensor& a, const Tensor& b, const Tensor& out) {
  const StridedOffsets<2> at = strided_offsets<2>(out.shape(), {&a, &b}, kernel::binary_name(op_value));
  with_op<BinaryOp, BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div>(op_value, [&](auto op) {
    dispatch_floating(out.dtype(), kernel::binary_name(op), [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(kernel::binary_name(op), out, out.numel(),
             BinaryFn<T, decltype(op)::value>{static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
                                              static_cast<T*>(out.raw_data()), at});
    });
  });
}

void scalar_cuda(ScalarOp op_value, const Tensor& x, double s, const Tensor& out) {
  with_op<ScalarOp, ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv>(
      op_value, [&](auto op) {
        dispatch_floating(x.dtype(), "scalar op", [&](auto tag) {
          using T = typename decltype(tag)::type;
          launch("scalar op", out, x.numel(),
                 ScalarFn<T, decltype(op)::value>{static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()),
                                                  static_cast<compute_t<T>>(s)});
        });
      });
}

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const StridedOffsets<3> at = strided_offsets<3>(out.shape(), {&cond, &a, &b}, "where");
  dispatch_floating(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_all(cond.dtype(), [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      launch("where", out, out.numel(),
             WhereFn<C, T>{static_cast<const C*>(cond.raw_data()), static_cast<const T*>(a.raw_data()),
                           static_cast<const T*>(b.raw_data()), static_cast<T*>(out.raw_data()), at});
    });
  });
}

// ---- row sums ------------------------------------------------------------------------------------

// The row-sum kernels are in reduce_rows_kernels.cuh.
using rows::kShortRow;
using rows::row_grid;
using rows::sum_rows_by_block;
using rows::SumShortRowsFn;

void sum_rows_cuda(const Tensor& x, const Tensor& out) {
  if (x.dim() != 2 || !x.is_contiguous() || !out.is_contiguous() || out.numel() != x.size(0)) {
    throw std::logic_error("sum_rows on CUDA: expected a contiguous [rows, inner] input and [rows] output, got " +
                           shape_str(x.shape()) + " and " + shape_str(out.shape()));
  }
  const int64_t rows = x.size(0), inner = x.size(1);
  dispatch_floating(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    if (inner < kShortRow) {
      launch("sum of short rows", out, rows, SumShortRowsFn<T>{in, o, inner});
      return;
    }
    if (rows == 0) return;
    const int device = out.device().index;
    DeviceGuard guard(device);
    const int blocks = row_grid(rows, multiprocessor_count(device));
    sum_rows_by_block<T><<<blocks, kThreads, 0, stream(device)>>>(in, o, rows, inner);
    SEQLAB_CUDA_CHECK_LAUNCH("sum_rows_by_block");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(copy_kernel, DeviceType::CUDA, &cuda::copy_cuda);
SEQLAB_REGISTER_KERNEL(fill_kernel, DeviceType::CUDA, &cuda::fill_cuda);
SEQLAB_REGISTER_KERNEL(unary_kernel, DeviceType::CUDA, &cuda::unary_cuda);
SEQLAB_REGISTER_KERNEL(unary_backward_kernel, DeviceType::CUDA, &cuda::unary_backward_cuda);
SEQLAB_REGISTER_KERNEL(binary_kernel, DeviceType::CUDA, &cuda::binary_cuda);
SEQLAB_REGISTER_KERNEL(scalar_kernel, DeviceType::CUDA, &cuda::scalar_cuda);
SEQLAB_REGISTER_KERNEL(where_kernel, DeviceType::CUDA, &cuda::where_cuda);
SEQLAB_REGISTER_KERNEL(sum_rows_kernel, DeviceType::CUDA, &cuda::sum_rows_cuda);
}  // namespace seqlab::kernel
