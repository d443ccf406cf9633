// CUDA side of the SSD slots declared in src/tensor/slots/ssm/ssd.h (entry points, CPU kernels and the
// equations: src/layers/ssm/ssd.cpp, docs/variants/mamba2.md). Inputs are contiguous: x [B, T, H, P],
// dt [B, T, H], A [H], B and C [B, T, G, N], the optional D [H] and initial state [B, H, P, N].
//
//   S_t = exp(Δ_t A_h) S_{t−1} + Δ_t x_t B_tᵀ,   y_t = S_t C_t + D_h x_t,   final_state = S_T
//
// What runs (ssd_kernels.cuh): the recurrence step by step for both forms (the chunkwise and the recurrent
// form compute the same function; only rounding differs, and the CPU tests hold the two forms to each
// other), one block per (head, batch entry), rows of the state per thread; the backward walks time in
// reverse from √T checkpoints, with the sums over the head's rows (dB, dC, dΔ) taken by column threads in
// a fixed order, then the heads of each group and the batch summed by two small kernels. p.chunk tiles the
// CPU kernels' work and does not change what this computes. A correct kernel, not a fast one: the
// chunkwise (tensor-core) form on the GPU is later work.
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64. Deterministic: no atomics. Compiled for
// sm_80/sm_90; tests/ssd_gpu_test.cc compares it with the CPU kernels on a GPU, tests/ssd_emulation_test.cc
// runs its kernels on the CPU.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/runtime.h"
#include "cuda/ssm/ssd_kernels.cuh"
#include "tensor/slots/ssm/ssd.h"

namespace seqlab::cuda {
namespace {

using namespace ssd;  // the kernels (ssd_kernels.cuh)

template <class E>
const E* in_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const E*>(t.raw_data()) : nullptr;
}
template <class E>
E* out_or_null(const Tensor& t) {
  return t.defined() ? static_cast<E*>(t.raw_data()) : nullptr;
}

void check_inputs(const char* op, int device, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm,
                  const Tensor& Cm, const Tensor& D, const Tensor& h0) {
  rows::require_contiguous(op, device, {&x, &dt, &A, &Bm, &Cm});
  if (D.defined()) rows::require_contiguous(op, device, {&D});
  if (h0.defined()) rows::require_contiguous(op, device, {&h0});
}

template <class E>
SsdProblem<E> problem_of(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                         const Tensor& D, const Tensor& h0) {
  return {x.size(0),         x.size(1),          x.size(2),          x.size(3),
          Bm.size(2),        Bm.size(3),         in_or_null<E>(x),   in_or_null<E>(dt),
          in_or_null<E>(A),  in_or_null<E>(Bm),  in_or_null<E>(Cm),  in_or_null<E>(D),
          in_or_null<E>(h0)};
}

void forward_cuda(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                  const Tensor& D, const Tensor& h0, const kernel::SsdParams&, const Tensor& y,
                  const Tensor& final_state) {
  const int device = x.device().index;
  check_inputs("ssd", device, x, dt, A, Bm, Cm, D, h0);
  rows::require_contiguous("ssd", device, {&y, &final_state});
  const int64_t B = x.size(0), H = x.size(2);
  if (B == 0) return;
  dispatch_floating(x.dtype(), "ssd", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A_ = compute_t<E>;
    // The running state in the compute type, returned to the allocator's cache at exit: safe, since every
    // later user of its block is queued after this kernel on the same stream.
    Tensor state = Tensor::empty(final_state.shape(), accumulate_dtype(x.dtype()), x.device());
    DeviceGuard guard(device);
    ssd_forward_kernel<E, A_><<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(B)), kBlock, 0, stream(device)>>>(
        problem_of<E>(x, dt, A, Bm, Cm, D, h0), out_or_null<E>(y), out_or_null<E>(final_state),
        static_cast<A_*>(state.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("ssd forward kernel");
  });
}

void backward_cuda(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                   const Tensor& Bm, const Tensor& Cm, const Tensor& D, const Tensor& h0, const kernel::SsdParams&,
                   const kernel::SsdGrads& grads) {
  const int device = x.device().index;
  check_inputs("ssd backward", device, x, dt, A, Bm, Cm, D, h0);
  rows::require_contiguous("ssd backward", device,
                           {&dy, &dfinal, &grads.dx, &grads.ddt, &grads.dA, &grads.dB, &grads.dC});
  for (const Tensor* t : {&grads.dD, &grads.dinitial_state}) {
    if (t->defined()) rows::require_contiguous("ssd backward", device, {t});
  }
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), P = x.size(3), G = Bm.size(2), N = Bm.size(3);
  dispatch_floating(x.dtype(), "ssd backward", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A_ = compute_t<E>;
    const DType at = accumulate_dtype(x.dtype());
    const Device dev = x.device();
    const int64_t K = ssd_segment(T), nseg = (T + K - 1) / K;
    // Scratch in the compute type (see forward_cuda for why it may be released at exit).
    Tensor dB_head = Tensor::empty({B, T, H, N}, at, dev), dC_head = Tensor::empty({B, T, H, N}, at, dev);
    Tensor dA_part = Tensor::empty({B, H}, at, dev), dD_part = Tensor::empty({B, H}, at, dev);
    Tensor dS = Tensor::empty({B, H, P, N}, at, dev), ckpt = Tensor::empty({B, H, nseg, P, N}, at, dev);
    Tensor seg = Tensor::empty({B, H, K, P, N}, at, dev), rows_part = Tensor::empty({B, H, 3, P}, at, dev);
    SsdBackwardIO<E, A_> io;
    io.dy = in_or_null<E>(dy);
    io.dfinal = in_or_null<E>(dfinal);
    io.dx = out_or_null<E>(grads.dx);
    io.ddt = out_or_null<E>(grads.ddt);
    io.dh0 = out_or_null<E>(grads.dinitial_state);
    io.dB_head = static_cast<A_*>(dB_head.raw_data());
    io.dC_head = static_cast<A_*>(dC_head.raw_data());
    io.dA_part = static_cast<A_*>(dA_part.raw_data());
    io.dD_part = static_cast<A_*>(dD_part.raw_data());
    io.dS = static_cast<A_*>(dS.raw_data());
    io.ckpt = static_cast<A_*>(ckpt.raw_data());
    io.seg = static_cast<A_*>(seg.raw_data());
    io.rows = static_cast<A_*>(rows_part.raw_data());
    io.K = K;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    if (B > 0) {  // T = 0 too: then d initial_state = d final_state, and dA, dD are 0
      ssd_backward_kernel<E, A_><<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(B)), kBlock, 0, st>>>(
          problem_of<E>(x, dt, A, Bm, Cm, D, h0), io);
      SEQLAB_CUDA_CHECK_LAUNCH("ssd backward kernel");
    }
    const int64_t count = B * T * G * N;
    if (count > 0) {
      ssd_sum_heads<E, A_><<<blocks_for(count, device), kThreads, 0, st>>>(
          count, H, G, N, io.dB_head, io.dC_head, out_or_null<E>(grads.dB), out_or_null<E>(grads.dC));
      SEQLAB_CUDA_CHECK_LAUNCH("ssd sum of heads kernel");
    }
    ssd_sum_batch<E, A_><<<blocks_for(H, device), kThreads, 0, st>>>(B, H, io.dA_part, io.dD_part,
                                                                     out_or_null<E>(grads.dA), out_or_null<E>(grads.dD));
    SEQLAB_CUDA_CHECK_LAUNCH("ssd sum over the batch kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(ssd_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(ssd_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
