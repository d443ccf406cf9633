// CUDA side of the optimizer slots declared in src/train/optim/optim.h (the CPU kernels are in
// src/train/optim/optim.cpp): the fused AdamW and SGD updates, the sum of squares behind the global
// gradient norm, and the in-place scale behind gradient clipping and averaging. The kernels are in
// optim_kernels.cuh (tests/optim_emulation_test.cc runs them on the CPU against these slots).
//
// The updates and the scale are elementwise, one grid-stride loop each, and compute exactly the
// CPU formulas in the same type: S = f64 for f64 parameters and f32 otherwise; bf16 parameters and
// gradients (__nv_bfloat16, bit-identical to seqlab::bf16) are widened to f32 and rounded to nearest
// even on store; the moments are always S. A bf16 parameter with an f32 master w (mixed precision)
// is updated on w, and p ← bf16(w). The scalar coefficients are formed in double on the host and
// rounded to S once, as on the CPU.
//
// The sum of squares is deterministic run to run: pass 1 gives each block a fixed range of
// kSumChunk elements and reduces it in a fixed order (per-thread strided sums, then a fixed
// shared-memory tree) into partial[b]; pass 2, one block, reduces the partials the same way. The
// order depends only on n, never on timing or on the device's multiprocessor count.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/optim_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/slots/optim.h"

namespace seqlab::cuda {
namespace {

using namespace optim;  // the kernels (optim_kernels.cuh)

// Throws std::logic_error naming the op when a tensor breaks the slots' contract (contiguous, on
// one CUDA device, n elements of the expected dtype).
void check_operand(const char* op, const char* name, const Tensor& t, int64_t n, DType dtype, int device) {
  if (!t.is_contiguous() || t.numel() != n || t.dtype() != dtype || !t.device().is_cuda() ||
      t.device().index != device) {
    throw std::logic_error(std::string(op) + " on CUDA: " + name + " must be a contiguous " + dtype_name(dtype) +
                           " tensor of " + std::to_string(n) + " elements on cuda:" + std::to_string(device) +
                           ", got " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) + " on " + t.device().str());
  }
}

// ---- AdamW -----------------------------------------------------------------------------------------

// The master w of a bf16 parameter, checked (f32, p's size, on p's device), or null.
float* master_of(const char* op, const Tensor& p, const Tensor& w, int device) {
  if (!w.defined()) return nullptr;
  if (p.dtype() != DType::bf16) {
    throw std::logic_error(std::string(op) + " on CUDA: a master weight is for bf16 parameters, got " +
                           dtype_name(p.dtype()));
  }
  check_operand(op, "the master weight", w, p.numel(), DType::f32, device);
  return static_cast<float*>(w.raw_data());
}

// Calls fn(Tag<G>{}) with G the gradient's element type: P, or float for an f32 sum of micro-batch
// gradients beside a bf16 parameter with its master (F32GradAccumulator); checks g either way.
template <class P, class Fn>
void with_grad_type(const char* op, const Tensor& p, const Tensor& g, const Tensor& w, int device, Fn&& fn) {
  if constexpr (std::is_same_v<P, bf16_t>) {
    if (w.defined() && g.dtype() == DType::f32) {
      check_operand(op, "g", g, p.numel(), DType::f32, device);
      fn(Tag<float>{});
      return;
    }
  }
  check_operand(op, "g", g, p.numel(), p.dtype(), device);
  fn(Tag<P>{});
}

void adamw_step_cuda(const kernel::AdamWStep& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                     const Tensor& w) {
  const int64_t n = p.numel();
  const int device = p.device().index;
  dispatch_floating(p.dtype(), "adamw_step", [&](auto tag) {
    using P = typename decltype(tag)::type;
    using S = state_t<P>;
    const DType state_dtype = std::is_same_v<S, double> ? DType::f64 : DType::f32;
    check_operand("adamw_step", "p", p, n, p.dtype(), device);
    check_operand("adamw_step", "m", m, n, state_dtype, device);
    check_operand("adamw_step", "v", v, n, state_dtype, device);
    float* const master = master_of("adamw_step", p, w, device);  // throws for a master beside a non-bf16 p
    S* wp = nullptr;
    if constexpr (std::is_same_v<S, float>) wp = master;
    if (n == 0) return;
    const AdamWCoefficients<S> k = adamw_coefficients<S>(s);
    DeviceGuard guard(device);
    with_grad_type<P>("adamw_step", p, g, w, device, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      adamw_step_kernel_impl<P, G, S><<<blocks_for(n, device), kThreads, 0, stream(device)>>>(
          n, k, static_cast<P*>(p.raw_data()), static_cast<const G*>(g.raw_data()), static_cast<S*>(m.raw_data()),
          static_cast<S*>(v.raw_data()), wp);
      SEQLAB_CUDA_CHECK_LAUNCH("adamw_step kernel");
    });
  });
}

// ---- SGD -------------------------------------------------------------------------------------------

void sgd_step_cuda(const kernel::SgdStep& s, const Tensor& p, const Tensor& g, const Tensor& b, const Tensor& w) {
  const int64_t n = p.numel();
  const int device = p.device().index;
  dispatch_floating(p.dtype(), "sgd_step", [&](auto tag) {
    using P = typename decltype(tag)::type;
    using S = state_t<P>;
    const DType state_dtype = std::is_same_v<S, double> ? DType::f64 : DType::f32;
    check_operand("sgd_step", "p", p, n, p.dtype(), device);
    if (b.defined()) check_operand("sgd_step", "the momentum buffer", b, n, state_dtype, device);
    if (n == 0) return;
    const SgdCoefficients<S> k = sgd_coefficients<S>(s);
    S* bp = b.defined() ? static_cast<S*>(b.raw_data()) : nullptr;
    float* const master = master_of("sgd_step", p, w, device);  // throws for a master beside a non-bf16 p
    S* wp = nullptr;
    if constexpr (std::is_same_v<S, float>) wp = master;
    DeviceGuard guard(device);
    with_grad_type<P>("sgd_step", p, g, w, device, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      sgd_step_kernel_impl<P, G, S><<<blocks_for(n, device), kThreads, 0, stream(device)>>>(
          n, k, static_cast<P*>(p.raw_data()), static_cast<const G*>(g.raw_data()), bp, wp);
      SEQLAB_CUDA_CHECK_LAUNCH("sgd_step kernel");
    });
  });
}

// ---- sum of squares --------------------------------------------------------------------------------

void sum_squares_cuda(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  const int device = x.device().index;
  dispatch_floating(x.dtype(), "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    check_operand("sum_squares", "x", x, n, x.dtype(), device);
    check_operand("sum_squares", "out", out, 1, DType::f64, device);
    if (n == 0) {
      kernel::fill_(out, 0.0);
      return;
    }
    const int64_t blocks = sum_squares_blocks(n);
    if (blocks > int64_t{0x7fffffff}) {
      throw std::invalid_argument("sum_squares on CUDA: " + std::to_string(n) + " elements is too many for one grid");
    }
    // partial[0, blocks) from pass 1, summed in order into out by pass 2; freed into the cache at return,
    // which is safe because every later user of the block is queued after us on stream(device).
    Tensor scratch = Tensor::empty({blocks}, DType::f64, x.device());
    double* partial = static_cast<double*>(scratch.raw_data());
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    sum_squares_partials<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(static_cast<const T*>(x.raw_data()), n, partial);
    SEQLAB_CUDA_CHECK_LAUNCH("sum_squares partials kernel");
    sum_partials<<<1, kThreads, 0, st>>>(partial, blocks, static_cast<double*>(out.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("sum_squares final kernel");
  });
}

// ---- scale -----------------------------------------------------------------------------------------

void scale_inplace_cuda(const Tensor& x, double s) {
  const int64_t n = x.numel();
  const int device = x.device().index;
  dispatch_floating(x.dtype(), "scale_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = state_t<T>;
    check_operand("scale_inplace", "x", x, n, x.dtype(), device);
    if (n == 0) return;
    DeviceGuard guard(device);
    scale_inplace_kernel_impl<T, S>
        <<<blocks_for(n, device), kThreads, 0, stream(device)>>>(n, S(s), static_cast<T*>(x.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("scale_inplace kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(adamw_step_kernel, DeviceType::CUDA, &cuda::adamw_step_cuda);
SEQLAB_REGISTER_KERNEL(sgd_step_kernel, DeviceType::CUDA, &cuda::sgd_step_cuda);
SEQLAB_REGISTER_KERNEL(sum_squares_kernel, DeviceType::CUDA, &cuda::sum_squares_cuda);
SEQLAB_REGISTER_KERNEL(scale_inplace_kernel, DeviceType::CUDA, &cuda::scale_inplace_cuda);
}  // namespace seqlab::kernel
