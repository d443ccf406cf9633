// CUDA side of the DeltaNet / Gated DeltaNet slots declared in src/tensor/slots/delta/delta_net.h (entry points,
// CPU kernels and the equations: src/layers/delta/delta_net.cpp, docs/variants/delta_net.md). Inputs are
// contiguous: q, k [B, T, H, dk], v [B, T, H, dv], beta, g [B, T, H], initial_state [B, H, dk, dv].
//
// Both forms (chunkwise and recurrent) run the recurrent form: they are the same function of the
// inputs (the CPU tests hold them equal to 1e-10 in f64), and column j of the state evolves apart from
// the other columns, which gives a schedule that can be checked line by line. The per-thread math is in
// src/cuda/delta/delta_net_schedule.h as __host__ __device__ functions; tests/delta_net_emulation_test.cc
// runs that exact schedule on the CPU against the CPU kernels. This file only launches it.
//
// Forward (delta_net_fwd): one thread per (b, h, value column j), B·H·dv threads in blocks of 128; the
// thread keeps its column S[:, j] (dk values, compute type) in a local array and walks t = 0..T−1:
//   u = v_t[j] − α_t k_t·S[:, j],  S[:, j] ← α_t S[:, j] + β_t u k_tᵀ,  o_t[j] = c q_t·S[:, j];
// writes o_t[j] and final_state[:, j]. q_t and k_t are read by every thread of the head (broadcast).
// Backward (delta_net_bwd): one block of 128 threads per (b, h). Thread j < dv owns column j (its
// running gradient dS[:, j] and its replayed state in local arrays); every thread reduces. Global
// scratch per (b, h), in the compute type: a checkpoint of the state every kSegment = 32 steps, the
// replayed states of one segment, dS per step and three dv-vectors per step. Per segment, last first:
// column threads replay and walk it backwards (writing dv), __syncthreads, all threads form dq, dk,
// dβ, dg of the segment (each element by one thread summing over j in a fixed order), __syncthreads.
// No atomics: the same inputs give the same bits.
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64. dk, dv ≤ 128 (a clear error beyond).
// Compiled for sm_80/sm_90; not yet run on a GPU (tests/delta_net_gpu_test.cc checks it against
// the CPU there).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/delta/delta_net_schedule.h"
#include "tensor/slots/delta/delta_net.h"

namespace seqlab::cuda {
namespace {

namespace dn = delta_net_cuda;

constexpr int kForwardThreads = 128;

template <class T>
__global__ void __launch_bounds__(kForwardThreads)
    delta_net_fwd(int64_t n, dn::Dims d, dn::Inputs<T> in, compute_t<T> scale, T* o, T* fin) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) dn::forward_column(idx, d, in, scale, o, fin);
}

// Block bh = blockIdx.x; the phases of delta_net_schedule.h with the barriers between them.
template <class T>
__global__ void __launch_bounds__(dn::kBackwardThreads)
    delta_net_bwd(dn::Dims d, dn::Inputs<T> in, const T* dout, const T* dfinal, compute_t<T> scale,
                  compute_t<T>* scratch, dn::Grads<T> gr) {
  using A = compute_t<T>;
  const int64_t bh = blockIdx.x, j = threadIdx.x;
  const bool column = j < d.dv;
  const dn::Scratch<A> w = dn::scratch_of(scratch, d, bh);
  A s[dn::kMaxHeadDim], ds[dn::kMaxHeadDim];
  if (column) dn::backward_begin(bh, j, d, in, dfinal, w, s, ds);
  for (int64_t c = d.segments() - 1; c >= 0; --c) {
    if (column) dn::backward_segment_column(bh, j, c, d, in, dout, scale, w, s, ds, gr.dv);
    __syncthreads();
    dn::backward_segment_reduce(bh, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), c, d, in, dout, scale,
                                w, gr);
    __syncthreads();
  }
  if (column) dn::backward_end(bh, j, d, ds, gr);
}

void check_tensor(const Tensor& t, const Tensor& q, const char* what) {
  if (!t.is_contiguous() || t.dtype() != q.dtype() || !t.device().is_cuda() || t.device() != q.device()) {
    throw std::logic_error(std::string("delta_net on CUDA: ") + what + " must be a contiguous " +
                           dtype_name(q.dtype()) + " tensor on " + q.device().str() + ", got " + shape_str(t.shape()) +
                           " " + dtype_name(t.dtype()) + " on " + t.device().str());
  }
}

dn::Dims dims_of(const Tensor& q, const Tensor& v) {
  const dn::Dims d{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
  if (d.dk > dn::kMaxHeadDim || d.dv > dn::kMaxHeadDim) {
    throw std::invalid_argument("delta_net on CUDA: head dims up to " + std::to_string(dn::kMaxHeadDim) +
                                " are supported, got dk = " + std::to_string(d.dk) + ", dv = " + std::to_string(d.dv));
  }
  return d;
}

template <class T>
const T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}
template <class T>
T* mut(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

void forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                  const Tensor& s0, const kernel::DeltaNetParams& p, const Tensor& o, const Tensor& fin) {
  for (auto [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&beta, "beta"}, {&o, "o"}, {&fin, "final_state"}}) {
    check_tensor(*t, q, what);
  }
  if (g.defined()) check_tensor(g, q, "g");
  if (s0.defined()) check_tensor(s0, q, "initial_state");
  const dn::Dims d = dims_of(q, v);
  const int64_t n = d.B * d.H * d.dv;
  if (n == 0) return;
  dispatch_floating(q.dtype(), "delta_net", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const dn::Inputs<T> in{ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(beta), ptr<T>(g), ptr<T>(s0)};
    const int device = q.device().index;
    DeviceGuard guard(device);
    const auto blocks = static_cast<unsigned>((n + kForwardThreads - 1) / kForwardThreads);
    delta_net_fwd<T>
        <<<blocks, kForwardThreads, 0, stream(device)>>>(n, d, in, static_cast<A>(p.scale), mut<T>(o), mut<T>(fin));
    SEQLAB_CUDA_CHECK_LAUNCH("delta_net forward kernel");
  });
}

void backward_cuda(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& beta, const Tensor& g, const Tensor& s0, const kernel::DeltaNetParams& p,
                   const kernel::DeltaNetGrads& gr) {
  for (auto [t, what] : {std::pair{&dout, "dout"},
                         {&dfinal, "dfinal_state"},
                         {&q, "q"},
                         {&k, "k"},
                         {&v, "v"},
                         {&beta, "beta"},
                         {&gr.dq, "dq"},
                         {&gr.dk, "dk"},
                         {&gr.dv, "dv"},
                         {&gr.dbeta, "dbeta"}}) {
    check_tensor(*t, q, what);
  }
  if (g.defined() != gr.dg.defined() || s0.defined() != gr.dinitial_state.defined()) {
    throw std::logic_error(
        "delta_net on CUDA: dg and dinitial_state must be given exactly when g and "
        "initial_state are");
  }
  if (g.defined()) {
    check_tensor(g, q, "g");
    check_tensor(gr.dg, q, "dg");
  }
  if (s0.defined()) {
    check_tensor(s0, q, "initial_state");
    check_tensor(gr.dinitial_state, q, "dinitial_state");
  }
  const dn::Dims d = dims_of(q, v);
  if (d.B * d.H == 0) return;
  dispatch_floating(q.dtype(), "delta_net backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const dn::Inputs<T> in{ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(beta), ptr<T>(g), ptr<T>(s0)};
    const dn::Grads<T> grads{mut<T>(gr.dq),    mut<T>(gr.dk), mut<T>(gr.dv),
                             mut<T>(gr.dbeta), mut<T>(gr.dg), mut<T>(gr.dinitial_state)};
    // Scratch in the compute type, returned to the allocator's cache at exit: safe, since every later
    // user of its block is queued after this kernel on the same stream.
    Tensor scratch = Tensor::empty({d.B * d.H * dn::scratch_per_head(d)}, dtype_of_compute<A>(), q.device());
    const int device = q.device().index;
    DeviceGuard guard(device);
    delta_net_bwd<T><<<static_cast<unsigned>(d.B * d.H), dn::kBackwardThreads, 0, stream(device)>>>(
        d, in, ptr<T>(dout), ptr<T>(dfinal), static_cast<A>(p.scale), static_cast<A*>(scratch.raw_data()), grads);
    SEQLAB_CUDA_CHECK_LAUNCH("delta_net backward kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(delta_net_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(delta_net_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
