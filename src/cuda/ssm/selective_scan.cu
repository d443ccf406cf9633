// CUDA side of the selective scan's slots declared in src/tensor/slots/ssm/selective_scan.h (entry
// points, CPU kernels and the equations: src/layers/ssm/selective_scan.cpp, docs/variants/mamba.md).
// Inputs are contiguous: u, delta, z [B, T, D], A [D, N], B, C [B, T, N], D, delta_bias [D],
// initial_state [B, D, N].
//
// What runs: the per-thread schedule of src/cuda/ssm/selective_scan_schedule.h (tests/
// selective_scan_emulation_test.cc runs it on the CPU against the CPU kernels); this file launches it.
//   forward (ss_fwd): one thread per (b, d), B·D threads in blocks of 128, the channel's N-element state in
//     local memory; writes y, the final state and, in the chunked form, the checkpoints.
//   backward: ss_bwd_begin, one thread per (b, d), sets each thread's carry (dh = d final_state) and, in the
//     recurrent form, finds its checkpoints; then per chunk, last first, two launches: ss_bwd_chunk, one
//     thread per (b, d) walking the chunk back from the checkpoint (its states recomputed into the thread's
//     global scratch), writing du, ddelta, dz and its terms of the chunk's dB, dC, and ss_bwd_reduce_chunk,
//     one thread per (b, step, n), summing those terms over d in channel order into dB, dC; last,
//     ss_bwd_finish sums the threads' dA, dD, d bias over b in batch order and writes d initial_state.
//     Deterministic: no atomics, every sum in a fixed order. The scratch is bounded by the chunk (the
//     schedule header gives its size); 2·⌈T/chunk⌉ + 2 launches.
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64. N ≤ 64 (a clear error beyond). A
// simple kernel, correct rather than fast: a chunked parallel scan over time is other work. Compiled for
// sm_80/sm_90; tests/selective_scan_gpu_test.cc compares it with the CPU kernels on a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/ssm/selective_scan_schedule.h"
#include "tensor/slots/ssm/selective_scan.h"

namespace seqlab::cuda {
namespace {

namespace ss = selective_scan_cuda;

constexpr int kThreads = 128;

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_fwd(int64_t n, ss::Dims d, ss::Inputs<T> in, T* y, T* fin, T* ckpt) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::forward_channel<T, compute_t<T>>(idx, d, in, y, fin, ckpt);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_bwd_begin(int64_t n, ss::Dims d, ss::Inputs<T> in, const T* dfinal, bool ckpt_given,
                 ss::Workspace<compute_t<T>> w) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::backward_begin_channel<T, compute_t<T>>(idx, d, in, dfinal, ckpt_given, w);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_bwd_chunk(int64_t n, int64_t c, ss::Dims d, ss::Inputs<T> in, const T* dy, const T* ckpt,
                 ss::Workspace<compute_t<T>> w, ss::Grads<T> g) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::backward_chunk_channel<T, compute_t<T>>(idx, c, d, in, dy, ckpt, w, g);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_bwd_reduce_chunk(int64_t n, int64_t c, ss::Dims d, ss::Workspace<compute_t<T>> w, ss::Grads<T> g) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::reduce_chunk_element<T, compute_t<T>>(idx, c, d, w, g);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_bwd_finish(int64_t n, ss::Dims d, ss::Workspace<compute_t<T>> w, ss::Grads<T> g) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::finish_channel_element<T, compute_t<T>>(idx, d, w, g);
}

void check_tensor(const Tensor& t, const Tensor& u, const char* what) {
  if (!t.is_contiguous() || t.dtype() != u.dtype() || !t.device().is_cuda() || t.device() != u.device()) {
    throw std::logic_error(std::string("selective_scan on CUDA: ") + what + " must be a contiguous " +
                           dtype_name(u.dtype()) + " tensor on " + u.device().str() + ", got " + shape_str(t.shape()) +
                           " " + dtype_name(t.dtype()) + " on " + t.device().str());
  }
}

void check_inputs(const kernel::SelectiveScanInputs& in) {
  for (auto [t, what] : {std::pair{&in.u, "u"}, {&in.delta, "delta"}, {&in.A, "A"}, {&in.B, "B"}, {&in.C, "C"}}) {
    check_tensor(*t, in.u, what);
  }
  for (auto [t, what] : {std::pair{&in.D, "D"}, {&in.z, "z"}, {&in.delta_bias, "delta_bias"},
                         {&in.initial_state, "initial_state"}}) {
    if (t->defined()) check_tensor(*t, in.u, what);
  }
}

ss::Dims dims_of(const kernel::SelectiveScanInputs& in, const kernel::SelectiveScanParams& p) {
  const ss::Dims d{in.u.size(0), in.u.size(1), in.u.size(2), in.A.size(1), p.chunk, p.delta_softplus};
  if (d.N > ss::kMaxState) {
    throw std::invalid_argument("selective_scan on CUDA: state sizes up to " + std::to_string(ss::kMaxState) +
                                " are supported, got N = " + std::to_string(d.N));
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

template <class T>
ss::Inputs<T> inputs_of(const kernel::SelectiveScanInputs& in) {
  return {ptr<T>(in.u), ptr<T>(in.delta), ptr<T>(in.A),          ptr<T>(in.B),           ptr<T>(in.C),
          ptr<T>(in.D), ptr<T>(in.z),     ptr<T>(in.delta_bias), ptr<T>(in.initial_state)};
}

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

void forward_cuda(const kernel::SelectiveScanInputs& in, const kernel::SelectiveScanParams& p, const Tensor& y,
                  const Tensor& fin, const Tensor& ckpt) {
  check_inputs(in);
  check_tensor(y, in.u, "y");
  check_tensor(fin, in.u, "final_state");
  if (ckpt.defined()) check_tensor(ckpt, in.u, "checkpoints");
  const ss::Dims d = dims_of(in, p);
  const int64_t n = d.B * d.D;
  if (n == 0) return;
  dispatch_floating(in.u.dtype(), "selective_scan", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int device = in.u.device().index;
    DeviceGuard guard(device);
    ss_fwd<T><<<blocks_of(n), kThreads, 0, stream(device)>>>(n, d, inputs_of<T>(in), mut<T>(y), mut<T>(fin),
                                                             mut<T>(ckpt));
    SEQLAB_CUDA_CHECK_LAUNCH("selective_scan forward kernel");
  });
}

void backward_cuda(const Tensor& dy, const Tensor& dfinal, const kernel::SelectiveScanInputs& in, const Tensor& ckpt,
                   const kernel::SelectiveScanParams& p, const kernel::SelectiveScanGrads& gr) {
  check_inputs(in);
  for (auto [t, what] : {std::pair{&dy, "dy"}, {&dfinal, "dfinal_state"}, {&gr.du, "du"}, {&gr.ddelta, "ddelta"},
                         {&gr.dA, "dA"}, {&gr.dB, "dB"}, {&gr.dC, "dC"}}) {
    check_tensor(*t, in.u, what);
  }
  for (auto [t, what] : {std::pair{&ckpt, "checkpoints"}, {&gr.dD, "dD"}, {&gr.dz, "dz"},
                         {&gr.ddelta_bias, "ddelta_bias"}, {&gr.dinitial_state, "dinitial_state"}}) {
    if (t->defined()) check_tensor(*t, in.u, what);
  }
  const ss::Dims d = dims_of(in, p);
  dispatch_floating(in.u.dtype(), "selective_scan backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const int device = in.u.device().index;
    // The workspace, uninitialised (every element is written before it is read), returns to the allocator's
    // cache at exit: safe, since every later user of its block is queued after these kernels on the same
    // stream. Its per-chunk buffers are rewritten by each chunk's launch once the previous chunk's reduce
    // (queued before it on the stream) has read them.
    const bool with_ckpt = ckpt.defined();
    const Tensor ws_t = Tensor::empty({ss::workspace_elements(d, with_ckpt)}, dtype_of_compute<A>(), in.u.device());
    const ss::Workspace<A> w = ss::workspace_of(static_cast<A*>(ws_t.raw_data()), d, with_ckpt);
    const ss::Inputs<T> xin = inputs_of<T>(in);
    const ss::Grads<T> g{mut<T>(gr.du), mut<T>(gr.ddelta), mut<T>(gr.dz), mut<T>(gr.dinitial_state), mut<T>(gr.dB),
                         mut<T>(gr.dC), mut<T>(gr.dA),     mut<T>(gr.dD), mut<T>(gr.ddelta_bias)};
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    const int64_t n = d.B * d.D;
    if (n > 0) {
      ss_bwd_begin<T><<<blocks_of(n), kThreads, 0, st>>>(n, d, xin, ptr<T>(dfinal), with_ckpt, w);
      SEQLAB_CUDA_CHECK_LAUNCH("selective_scan backward begin kernel");
    }
    for (int64_t c = d.chunks() - 1; c >= 0; --c) {
      if (n > 0) {
        ss_bwd_chunk<T><<<blocks_of(n), kThreads, 0, st>>>(n, c, d, xin, ptr<T>(dy), ptr<T>(ckpt), w, g);
        SEQLAB_CUDA_CHECK_LAUNCH("selective_scan backward chunk kernel");
      }
      const int64_t steps = std::min(d.chunk, d.T - c * d.chunk), m = d.B * steps * d.N;
      if (m > 0) {
        ss_bwd_reduce_chunk<T><<<blocks_of(m), kThreads, 0, st>>>(m, c, d, w, g);
        SEQLAB_CUDA_CHECK_LAUNCH("selective_scan backward chunk reduce kernel");
      }
    }
    const int64_t m = d.D * d.N + 2 * d.D;
    if (m > 0) {
      ss_bwd_finish<T><<<blocks_of(m), kThreads, 0, st>>>(m, d, w, g);
      SEQLAB_CUDA_CHECK_LAUNCH("selective_scan backward finish kernel");
    }
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(selective_scan_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(selective_scan_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
