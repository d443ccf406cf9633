// CUDA side of the selective scan's slots declared in src/tensor/slots/ssm/selective_scan.h (entry
// points, CPU kernels and the equations: src/layers/ssm/selective_scan.cpp, docs/variants/mamba.md).
// Inputs are contiguous: u, delta, z [B, T, D], A [D, N], B, C [B, T, N], D, delta_bias [D],
// initial_state [B, D, N].
//
// What runs: the per-thread schedule of src/cuda/ssm/selective_scan_schedule.h (tests/
// selective_scan_emulation_test.cc runs it on the CPU against the CPU kernels); this file launches it.
//   forward (ss_fwd): one thread per (b, d), B·D threads in blocks of 128, the channel's N-element state in
//     local memory; writes y, the final state and, in the chunked form, the checkpoints.
//   backward (ss_bwd): one thread per (b, d) again, walking the chunks in reverse from the checkpoints
//     (recomputed by the thread itself in the recurrent form), each chunk's states recomputed into the
//     thread's global scratch; du, ddelta, dz and d initial_state are its own, dB, dC, dA, dD and d bias
//     are atomic adds into zeroed compute-type accumulators, which ss_finish writes out.
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64. N ≤ 64 (a clear error beyond). A
// simple kernel, correct rather than fast: a chunked parallel scan over time is other work. Compiled for
// sm_80/sm_90; tests/selective_scan_gpu_test.cc compares it with the CPU kernels on a GPU.
#include <cuda_runtime.h>

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
    ss_bwd(int64_t n, ss::Dims d, ss::Inputs<T> in, const T* dy, const T* dfinal, const T* ckpt,
           compute_t<T>* scratch, ss::Grads<T> g, ss::Accumulators<compute_t<T>> acc) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) {
    ss::backward_channel<T, compute_t<T>>(idx, d, in, dy, dfinal, ckpt,
                                          scratch + idx * ss::scratch_per_thread(d, ckpt != nullptr), g, acc);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ss_finish(int64_t n, ss::Dims d, ss::Accumulators<compute_t<T>> acc, ss::Grads<T> g) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) ss::finish_element<T, compute_t<T>>(idx, d, acc, g);
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
    // Accumulators zeroed here; per-thread scratch uninitialised (every element is written before it is
    // read). Both return to the allocator's cache at exit: safe, since every later user of their blocks is
    // queued after these kernels on the same stream.
    const Tensor acc_t = Tensor::zeros({ss::accumulator_elements(d)}, dtype_of_compute<A>(), in.u.device());
    const int64_t n = d.B * d.D;
    const Tensor scratch =
        Tensor::empty({n * ss::scratch_per_thread(d, ckpt.defined())}, dtype_of_compute<A>(), in.u.device());
    const ss::Accumulators<A> acc = ss::accumulators_of(static_cast<A*>(acc_t.raw_data()), d);
    const ss::Grads<T> g{mut<T>(gr.du), mut<T>(gr.ddelta), mut<T>(gr.dz), mut<T>(gr.dinitial_state), mut<T>(gr.dB),
                         mut<T>(gr.dC), mut<T>(gr.dA),     mut<T>(gr.dD), mut<T>(gr.ddelta_bias)};
    DeviceGuard guard(device);
    if (n > 0) {
      ss_bwd<T><<<blocks_of(n), kThreads, 0, stream(device)>>>(n, d, inputs_of<T>(in), ptr<T>(dy), ptr<T>(dfinal),
                                                               ptr<T>(ckpt), static_cast<A*>(scratch.raw_data()), g,
                                                               acc);
      SEQLAB_CUDA_CHECK_LAUNCH("selective_scan backward kernel");
    }
    const int64_t m = ss::accumulator_elements(d);
    if (m > 0) {
      ss_finish<T><<<blocks_of(m), kThreads, 0, stream(device)>>>(m, d, acc, g);
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
