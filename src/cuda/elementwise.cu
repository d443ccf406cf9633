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
// dimension, a bias broadcast over [B, T, C] as two. The functors and StridedOffsets are in
// elementwise_kernels.cuh (host-includable: tests/elementwise_emulation_test.cc runs them on the
// CPU); this file holds the launchers.
#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/elementwise_kernels.cuh"
#include "cuda/reduce_rows_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

// The functors, StridedOffsets and the op dispatch are in elementwise_kernels.cuh.
using namespace elementwise;

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
    using U = fill_bits_t<T>;
    const U bits = fill_bits<T>(value);
    if (bits == 0 && dst.nbytes() > 0) {
      DeviceGuard guard(dst.device().index);
      SEQLAB_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, dst.nbytes(), stream(dst.device().index)));
      return;
    }
    launch("fill kernel", dst, dst.numel(), FillFn<U>{static_cast<U*>(dst.raw_data()), bits});
  });
}

// ---- elementwise ops -----------------------------------------------------------------------------

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
  with_binary(op_value, [&](auto op) {
    dispatch_floating(out.dtype(), kernel::binary_name(op), [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(kernel::binary_name(op), out, out.numel(),
             BinaryFn<T, decltype(op)::value>{static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
                                              static_cast<T*>(out.raw_data()), at});
    });
  });
}

void scalar_cuda(ScalarOp op_value, const Tensor& x, double s, const Tensor& out) {
  with_scalar(op_value, [&](auto op) {
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
