// CPU elementwise kernels: one loop each, the per-element formula from elementwise_math.h.
#include "tensor/cpu/parallel.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"

namespace seqlab::cpu {
namespace {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

void unary_cpu(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) {
  dispatch_float(x.dtype(), kernel::unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const T a = static_cast<T>(alpha);
    parallel_for(x.numel(), kParallelGrain / 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o[i] = math::unary_forward(op, in[i], a);
    });
  });
}

void unary_backward_cpu(UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y, double alpha,
                        const Tensor& dx) {
  dispatch_float(x.dtype(), kernel::unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T *g = dy.data<T>(), *in = x.data<T>(), *out = y.data<T>();
    T* d = dx.data<T>();
    const T a = static_cast<T>(alpha);
    parallel_for(x.numel(), kParallelGrain / 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) d[i] = math::unary_backward(op, g[i], in[i], out[i], a);
    });
  });
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(out.dtype(), kernel::binary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T *pa = a.data<T>(), *pb = b.data<T>();
    T* o = out.data<T>();
    const int64_t n = out.numel();
    if (a.is_contiguous() && b.is_contiguous()) {
      parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) o[i] = math::binary(op, pa[i], pb[i]);
      });
      return;
    }
    parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      StridedWalker<2> walk(out.shape(), {&a.strides(), &b.strides()}, begin);
      for (int64_t i = begin; i < end; ++i, walk.next()) {
        o[i] = math::binary(op, pa[walk.offset(0)], pb[walk.offset(1)]);
      }
    });
  });
}

void scalar_cpu(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  dispatch_float(x.dtype(), "scalar op", [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const T sv = static_cast<T>(s);
    parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o[i] = math::scalar(op, in[i], sv);
    });
  });
}

void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(out.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    dispatch_any(cond.dtype(), [&](auto ctag) {
      using C = decltype(ctag);
      const C* pc = static_cast<const C*>(cond.raw_data());
      const T *pa = a.data<T>(), *pb = b.data<T>();
      T* o = out.data<T>();
      parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
        StridedWalker<3> walk(out.shape(), {&cond.strides(), &a.strides(), &b.strides()}, begin);
        for (int64_t i = begin; i < end; ++i, walk.next()) {
          bool take_a = convert_scalar<double>(pc[walk.offset(0)]) != 0.0;
          o[i] = take_a ? pa[walk.offset(1)] : pb[walk.offset(2)];
        }
      });
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(unary_kernel, DeviceType::CPU, &cpu::unary_cpu);
SEQLAB_REGISTER_KERNEL(unary_backward_kernel, DeviceType::CPU, &cpu::unary_backward_cpu);
SEQLAB_REGISTER_KERNEL(binary_kernel, DeviceType::CPU, &cpu::binary_cpu);
SEQLAB_REGISTER_KERNEL(scalar_kernel, DeviceType::CPU, &cpu::scalar_cpu);
SEQLAB_REGISTER_KERNEL(where_kernel, DeviceType::CPU, &cpu::where_cpu);
}  // namespace seqlab::kernel
