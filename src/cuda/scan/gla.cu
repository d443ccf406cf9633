// CUDA side of the GLA slots declared in src/tensor/slots/scan/gla.h (entry points, CPU kernels and the equations:
// src/layers/scan/gla.cpp, docs/variants/gla.md). Inputs are contiguous: q, k, g [B, T, H, dk], v and the
// optional gv [B, T, H, dv], the optional initial state [B, H, dk, dv].
//
//   S_t = (exp(g_t)ᵀ exp(gv_t)) ⊙ S_{t−1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   final_state = S_T
//
// What runs: the column-parallel recurrence of gated_scan.h for both forms (the chunkwise and the
// recurrent form compute the same function; only rounding differs, and the CPU tests hold the two
// forms to each other): one block per (tile of 32 value columns, head, batch entry), each thread a
// column and 8 state rows in registers. The backward is the recurrent form's reverse-time recurrence with
// the states recomputed from checkpoints every 16 steps; dg_t and dgv_t come out directly as the row and
// column sums of dS ⊙ αβᵀ ⊙ S_{t−1}, each a sum of bounded terms at any gate strength (the CPU's chunkwise
// backward gets them from bounded pair sums, docs/variants/gla.md). p.chunk and p.sub_chunk tile the CPU
// kernels' work and do not change what this computes.
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64; head dims up to 128 (a clear error
// beyond). Deterministic: no atomics, every sum in a fixed order. Compiled for sm_80/sm_90; not yet run on
// a GPU (tests/gla_gpu_test.cc compares it with the CPU kernels; tests/gla_emulation_test.cc runs
// its schedule on the CPU).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/scan/gated_scan_kernels.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/slots/scan/gla.h"

namespace seqlab::cuda {
namespace {

struct GlaKernels {};  // the tag naming this op's instantiations of the gated_scan.cuh kernels

template <class E>
const E* in_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const E*>(t.raw_data()) : nullptr;
}
template <class E>
E* out_or_null(const Tensor& t) {
  return t.defined() ? static_cast<E*>(t.raw_data()) : nullptr;
}

void check_inputs(const char* op, int device, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& gv, const Tensor& h0) {
  rows::require_contiguous(op, device, {&q, &k, &v, &g});
  if (gv.defined()) rows::require_contiguous(op, device, {&gv});
  if (h0.defined()) rows::require_contiguous(op, device, {&h0});
  scan::check_head_dims(op, q.size(3), v.size(3));
}

template <class E, class A>
scan::Problem<E, A> problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                               const Tensor& h0, double scale) {
  scan::Problem<E, A> pb = scan::qkv_problem<E, A>(q, k, v, scale);
  pb.g = in_or_null<E>(g);
  pb.gv = in_or_null<E>(gv);
  pb.h0 = in_or_null<E>(h0);
  return pb;
}

void forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                  const Tensor& h0, const kernel::GlaParams& p, const Tensor& o, const Tensor& final_state) {
  const int device = q.device().index;
  check_inputs("gla", device, q, k, v, g, gv, h0);
  rows::require_contiguous("gla", device, {&o, &final_state});
  dispatch_floating(q.dtype(), "gla", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A = compute_t<E>;
    DeviceGuard guard(device);
    scan::launch_forward<GlaKernels, E, A>("gla forward kernel", device, problem_of<E, A>(q, k, v, g, gv, h0, p.scale),
                                           out_or_null<E>(o), out_or_null<E>(final_state));
  });
}

void backward_cuda(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& g, const Tensor& gv, const Tensor& h0, const kernel::GlaParams& p,
                   const kernel::GlaGrads& grads) {
  const int device = q.device().index;
  check_inputs("gla backward", device, q, k, v, g, gv, h0);
  rows::require_contiguous("gla backward", device, {&dout, &dfinal, &grads.dq, &grads.dk, &grads.dv});
  for (const Tensor* t : {&grads.dg, &grads.dgv, &grads.dinitial_state}) {
    if (t->defined()) rows::require_contiguous("gla backward", device, {t});
  }
  dispatch_floating(q.dtype(), "gla backward", [&](auto tag) {
    using E = typename decltype(tag)::type;
    using A = compute_t<E>;
    scan::BackwardIO<E, A> io;
    io.dout = in_or_null<E>(dout);
    io.dfinal = in_or_null<E>(dfinal);
    io.dv = out_or_null<E>(grads.dv);
    io.dgv = gv.defined() ? out_or_null<E>(grads.dgv) : nullptr;
    io.dh0 = out_or_null<E>(grads.dinitial_state);
    DeviceGuard guard(device);
    scan::launch_backward<GlaKernels, E, A>("gla backward kernel", q.device(),
                                            problem_of<E, A>(q, k, v, g, gv, h0, p.scale), io, out_or_null<E>(grads.dq),
                                            out_or_null<E>(grads.dk), out_or_null<E>(grads.dg));
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(gla_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(gla_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
