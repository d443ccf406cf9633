// CPU elementwise kernels: one loop each, the per-element formula from elementwise_math.h.
// unary, unary_backward, binary and scalar take bf16 themselves (tensor/bf16_convert.h): each element
// is loaded to f32, computed by the f32 formula and rounded once on store, the bits the dispatch
// layer's f32 stand-ins give, without their copies. The contiguous loops run on blocks widened to f32
// (map_runs), so the f32 loop itself computes them; the broadcasting rows of binary round per element.
#include <algorithm>
#include <type_traits>

#include "tensor/bf16_convert.h"
#include "tensor/cpu/avx512.h"
#include "tensor/cpu/elementwise_runs.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

// Calls fn(std::integral_constant<Enum, op>) so that the per-element switch in elementwise_math.h
// folds away at compile time and each op gets its own tight (vectorisable) loop.
template <class Enum, Enum... Ops, class Fn>
void with_constant(Enum op, Fn&& fn) {
  bool matched = ((op == Ops ? (fn(std::integral_constant<Enum, Ops>{}), true) : false) || ...);
  (void)matched;
}

template <class Fn>
void with_unary(UnaryOp op, Fn&& fn) {
  with_constant<UnaryOp, UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::square,
                UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::silu, UnaryOp::gelu, UnaryOp::relu, UnaryOp::elu,
                UnaryOp::softplus>(op, fn);
}

template <class Fn>
void with_binary(BinaryOp op, Fn&& fn) {
  with_constant<BinaryOp, BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div>(op, fn);
}

template <class Fn>
void with_scalar(ScalarOp op, Fn&& fn) {
  with_constant<ScalarOp, ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv>(op, fn);
}

// The contiguous loops, over S = float or double. Not inlined: a bf16 kernel's blocks (map_runs) and
// the f32 kernel then run one compiled loop, so they agree to the bit by construction.
template <class Op, class S>
[[gnu::noinline]] void unary_run(Op op, S* y, int64_t n, const S* x, S a) {
  // f32 GELU, SiLU and sigmoid on AVX-512 where the CPU has it: the same bits (cpu/avx512.h), twice as fast.
  if constexpr (avx512_unary_forward(Op::value) && std::is_same_v<S, float>) {
    if (unary_forward_avx512(Op::value, y, n, x)) return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = math::unary_forward(op(), x[i], a);
}
template <class Op, class S>
[[gnu::noinline]] void unary_backward_run(Op op, S* dx, int64_t n, const S* dy, const S* x, const S* y, S a) {
  if constexpr (avx512_unary_backward(Op::value) && std::is_same_v<S, float>) {
    if (unary_backward_avx512(Op::value, dx, n, dy, x)) return;
  }
  for (int64_t i = 0; i < n; ++i) dx[i] = math::unary_backward(op(), dy[i], x[i], y[i], a);
}
template <class Op, class S>
[[gnu::noinline]] void binary_run(Op op, S* out, int64_t n, const S* a, const S* b) {
  for (int64_t i = 0; i < n; ++i) out[i] = math::binary(op(), a[i], b[i]);
}
template <class Op, class S>
[[gnu::noinline]] void scalar_run(Op op, S* y, int64_t n, const S* x, S s) {
  for (int64_t i = 0; i < n; ++i) y[i] = math::scalar(op(), x[i], s);
}

void unary_cpu(UnaryOp op_value, const Tensor& x, double alpha, const Tensor& out) {
  if (x.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&x, &out})) {
    return bf16_on_cpu::call_on_standins(&unary_cpu, op_value, x, alpha, out);
  }
  with_unary(op_value, [&](auto op) {
    dispatch_float_or_bf16(x.dtype(), kernel::unary_name(op), [&](auto tag) {
      using T = decltype(tag);
      using S = compute_t<T>;
      const T* in = x.data<T>();
      T* o = out.data<T>();
      const S a = static_cast<S>(alpha);
      auto loop = [&](S* yo, int64_t n, const S* xi) { unary_run(op, yo, n, xi, a); };
      parallel_for(x.numel(), kParallelGrain / 8, [&](int64_t begin, int64_t end) {
        // bf16 GELU, SiLU and sigmoid on AVX-512: widened and rounded in registers, the same bits.
        if constexpr (std::is_same_v<T, bf16> && avx512_unary_forward(std::decay_t<decltype(op)>::value)) {
          if (unary_forward_avx512(op(), o + begin, end - begin, in + begin)) return;
        }
        map_runs(begin, end, o, loop, in);
      });
    });
  });
}

void unary_backward_cpu(UnaryOp op_value, const Tensor& dy, const Tensor& x, const Tensor& y, double alpha,
                        const Tensor& dx) {
  if (x.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&dy, &x, &y, &dx})) {
    return bf16_on_cpu::call_on_standins(&unary_backward_cpu, op_value, dy, x, y, alpha, dx);
  }
  with_unary(op_value, [&](auto op) {
    dispatch_float_or_bf16(x.dtype(), kernel::unary_name(op), [&](auto tag) {
      using T = decltype(tag);
      using S = compute_t<T>;
      const T *g = dy.data<T>(), *in = x.data<T>(), *out = y.data<T>();
      T* d = dx.data<T>();
      const S a = static_cast<S>(alpha);
      // Only what the formula reads is loaded (for bf16: widened); the unread one is passed as the other.
      constexpr bool reads_x = math::unary_backward_reads_x(op()), reads_y = math::unary_backward_reads_y(op());
      parallel_for(x.numel(), kParallelGrain / 8, [&](int64_t begin, int64_t end) {
        if constexpr (reads_x && reads_y) {
          auto loop = [&](S* dxo, int64_t n, const S* dyi, const S* xi, const S* yi) {
            unary_backward_run(op, dxo, n, dyi, xi, yi, a);
          };
          map_runs(begin, end, d, loop, g, in, out);
        } else {
          auto loop = [&](S* dxo, int64_t n, const S* dyi, const S* xy) {
            unary_backward_run(op, dxo, n, dyi, xy, xy, a);
          };
          if constexpr (std::is_same_v<T, bf16> && avx512_unary_backward(std::decay_t<decltype(op)>::value)) {
            if (unary_backward_avx512(op(), d + begin, end - begin, g + begin, in + begin)) return;
          }
          map_runs(begin, end, d, loop, g, reads_y ? out : in);
        }
      });
    });
  });
}

// out = a op b where a and b are broadcast views of out's (contiguous) shape. When the last
// dimension of both operands has stride 0 or 1, rows are processed by a tight inner loop.
void binary_cpu(BinaryOp op_value, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&a, &b, &out})) {
    return bf16_on_cpu::call_on_standins(&binary_cpu, op_value, a, b, out);
  }
  with_binary(op_value, [&](auto op) {
    dispatch_float_or_bf16(out.dtype(), kernel::binary_name(op), [&](auto tag) {
      using T = decltype(tag);
      // f(u, v) = op(u, v) rounded to T; one per-element formula for every loop below.
      auto f = [&](T u, T v) { return to_storage<T>(math::binary(op(), from_storage(u), from_storage(v))); };
      const T *pa = a.data<T>(), *pb = b.data<T>();
      T* o = out.data<T>();
      const int64_t n = out.numel();
      if (a.is_contiguous() && b.is_contiguous()) {
        auto loop = [&](compute_t<T>* oo, int64_t m, const compute_t<T>* ai, const compute_t<T>* bi) {
          binary_run(op, oo, m, ai, bi);
        };
        parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) { map_runs(begin, end, o, loop, pa, pb); });
        return;
      }
      const int64_t inner = out.dim() > 0 ? out.size(-1) : 1;
      const int64_t sa = out.dim() > 0 ? a.strides().back() : 0, sb = out.dim() > 0 ? b.strides().back() : 0;
      if (out.dim() > 0 && inner > 1 && (sa == 0 || sa == 1) && (sb == 0 || sb == 1)) {
        Shape rows(out.shape().begin(), out.shape().end() - 1);
        Shape ra(a.strides().begin(), a.strides().end() - 1), rb(b.strides().begin(), b.strides().end() - 1);
        parallel_for(shape_numel(rows), std::max<int64_t>(1, kParallelGrain / inner), [&](int64_t begin, int64_t end) {
          StridedWalker<2> walk(rows, {&ra, &rb}, begin);
          for (int64_t r = begin; r < end; ++r, walk.next()) {
            const T *ra_ptr = pa + walk.offset(0), *rb_ptr = pb + walk.offset(1);
            T* orow = o + r * inner;
            if (sa == 1 && sb == 1) {
              for (int64_t i = 0; i < inner; ++i) orow[i] = f(ra_ptr[i], rb_ptr[i]);
            } else if (sa == 1) {
              const T bv = rb_ptr[0];
              for (int64_t i = 0; i < inner; ++i) orow[i] = f(ra_ptr[i], bv);
            } else if (sb == 1) {
              const T av = ra_ptr[0];
              for (int64_t i = 0; i < inner; ++i) orow[i] = f(av, rb_ptr[i]);
            } else {
              const T v = f(ra_ptr[0], rb_ptr[0]);
              for (int64_t i = 0; i < inner; ++i) orow[i] = v;
            }
          }
        });
        return;
      }
      parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
        StridedWalker<2> walk(out.shape(), {&a.strides(), &b.strides()}, begin);
        for (int64_t i = begin; i < end; ++i, walk.next()) {
          o[i] = f(pa[walk.offset(0)], pb[walk.offset(1)]);
        }
      });
    });
  });
}

void scalar_cpu(ScalarOp op_value, const Tensor& x, double s, const Tensor& out) {
  if (x.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&x, &out})) {
    return bf16_on_cpu::call_on_standins(&scalar_cpu, op_value, x, s, out);
  }
  with_scalar(op_value, [&](auto op) {
    dispatch_float_or_bf16(x.dtype(), "scalar op", [&](auto tag) {
      using T = decltype(tag);
      using S = compute_t<T>;
      const T* in = x.data<T>();
      T* o = out.data<T>();
      const S sv = static_cast<S>(s);
      auto loop = [&](S* yo, int64_t n, const S* xi) { scalar_run(op, yo, n, xi, sv); };
      parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) { map_runs(begin, end, o, loop, in); });
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

template <class S>
void unary_forward_run(UnaryOp op, S* y, int64_t n, const S* x, S alpha) {
  with_unary(op, [&](auto o) { unary_run(o, y, n, x, alpha); });
}
template void unary_forward_run<float>(UnaryOp, float*, int64_t, const float*, float);
template void unary_forward_run<double>(UnaryOp, double*, int64_t, const double*, double);

}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(unary_kernel, DeviceType::CPU, &cpu::unary_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(unary_backward_kernel, DeviceType::CPU, &cpu::unary_backward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(binary_kernel, DeviceType::CPU, &cpu::binary_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(scalar_kernel, DeviceType::CPU, &cpu::scalar_cpu);
SEQLAB_REGISTER_KERNEL(where_kernel, DeviceType::CPU, &cpu::where_cpu);
}  // namespace seqlab::kernel
