// CUDA side of the retention slots declared in src/tensor/slots/scan/retention.h (entry points, CPU kernels and the
// equations: src/layers/scan/retention.cpp, docs/variants/retention.md). Inputs are contiguous: q, k
// [B, T, H, dk], v [B, T, H, dv], s0 [B, H, dk, dv] (the entry point passes zeros when absent).
//
//   S_n = γ_h S_{n−1} + k_nᵀ v_n,   o_n = scale · q_n S_n,   final state S_{T−1}
//
// What runs: the column-parallel recurrence of gated_scan.h with a constant decay per head (α = γ_h on
// every row, β = 1) for all three forms (parallel, chunkwise and recurrent compute the same function;
// only rounding differs): one block per (tile of 32 value columns, head, batch entry), each thread a
// column and 8 state rows in registers; the backward is the reverse-time recurrence
//   dS += scale q_nᵀ do_n,  dq_n = scale S_n do_n,  dk_n = dS v_n,  dv_n = k_n dS,  dS ← γ_h dS
// with the states recomputed from checkpoints every 16 steps (never divided by γ, which may be 0), and
// ds0 = dS at the end. γ is multiplied step by step in the compute type rather than raised to powers,
// so the CPU's std::pow and this differ by rounding only. f32 and bf16 compute in f32 (bf16 rounded on
// store), f64 in f64; head dims up to 128 (a clear error beyond). Deterministic: no atomics, every sum in
// a fixed order. Compiled for sm_80/sm_90; not yet run on a GPU (tests/retention_gpu_test.cc
// compares it with the CPU kernels; tests/retention_emulation_test.cc runs its schedule on the CPU).
#include <cuda_bf16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda/scan/gated_scan_kernels.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/slots/scan/retention.h"

namespace seqlab::cuda {
namespace {

struct RetentionKernels {};  // the tag naming this op's instantiations of the gated_scan.cuh kernels

// The γ_h as a device buffer [H] in the compute type (the kernels' α when g is absent).
Tensor decays_on(const Tensor& q, const kernel::RetentionParams& p, DType acc) {
  if (static_cast<int64_t>(p.gammas.size()) != q.size(2)) {
    throw std::invalid_argument("retention on CUDA: " + std::to_string(p.gammas.size()) + " gammas for " +
                                std::to_string(q.size(2)) + " heads");
  }
  return Tensor::from_vector(p.gammas, Shape{q.size(2)}, acc, q.device());
}

template <class E, class A>
scan::Problem<E, A> problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0,
                               const Tensor& decays, double scale) {
  scan::Problem<E, A> pb = scan::qkv_problem<E, A>(q, k, v, scale);
  pb.h0 = static_cast<const E*>(s0.raw_data());
  pb.decay = static_cast<const A*>(decays.raw_data());
  return pb;
}

void forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const kernel::RetentionParams& p,
                  const Tensor& o, const Tensor& s) {
  const int device = q.device().index;
  rows::require_contiguous("retention", device, {&q, &k, &v, &s0, &o, &s});
  scan::check_head_dims("retention", q.size(3), v.size(3));
  dispatch_floating(q.dtype(), "retention", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A = compute_t<E>;
    DeviceGuard guard(device);
    const Tensor decays = decays_on(q, p, dtype_of_compute<A>());
    scan::launch_forward<RetentionKernels, E, A>("retention forward kernel", device,
                                                 problem_of<E, A>(q, k, v, s0, decays, p.scale),
                                                 static_cast<E*>(o.raw_data()), static_cast<E*>(s.raw_data()));
  });
}

void backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const Tensor& dout,
                   const Tensor& ds, const kernel::RetentionParams& p, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const Tensor& ds0) {
  const int device = q.device().index;
  rows::require_contiguous("retention backward", device, {&q, &k, &v, &s0, &dout, &ds, &dq, &dk, &dv, &ds0});
  scan::check_head_dims("retention backward", q.size(3), v.size(3));
  dispatch_floating(q.dtype(), "retention backward", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A = compute_t<E>;
    DeviceGuard guard(device);
    const Tensor decays = decays_on(q, p, dtype_of_compute<A>());
    scan::BackwardIO<E, A> io;
    io.dout = static_cast<const E*>(dout.raw_data());
    io.dfinal = static_cast<const E*>(ds.raw_data());
    io.dv = static_cast<E*>(dv.raw_data());
    io.dh0 = static_cast<E*>(ds0.raw_data());
    scan::launch_backward<RetentionKernels, E, A>(
        "retention backward kernel", q.device(), problem_of<E, A>(q, k, v, s0, decays, p.scale), io,
        static_cast<E*>(dq.raw_data()), static_cast<E*>(dk.raw_data()), nullptr);
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(retention_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(retention_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
