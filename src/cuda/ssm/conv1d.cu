// CUDA side of the causal depthwise convolution slots declared in src/tensor/slots/ssm/conv1d.h (the op,
// the CPU kernels and the equations: src/layers/ssm/conv1d.{h,cpp}). The kernels are in conv1d_kernels.cuh
// (tests/conv1d_emulation_test.cc runs them on the CPU against the CPU slots).
//
// Simple kernels, one output element per thread in grid-stride loops; at W ≤ 4 the op is bound by memory,
// and each launch reads its inputs about once from DRAM (the W − 1 neighbours of an element come from
// the cache). The forward is two launches:
//   1. y = act(z), z = Σ_j w_j p_{t+W−1−j} (+ b): reads x (and h0) and w, writes y  [B, T, C];
//   2. final_state = the last W − 1 rows of p: reads and writes [B, W−1, C].
// The backward is three:
//   1. dz = dy ⊙ act'(z), z recomputed, into an A scratch [B, T, C] (A = compute_t<T>, f32 for bf16);
//   2. dx and dh0 from the W taps' shifted dz (+ dfinal): one element of [B, W−1+T, C] per thread;
//   3. dweight and dbias: one thread per (tap or bias, channel) summing over B·T in double — (W+1)·C
//      threads, each reading a strided column of dz and p (coalesced across channels).
// f32, f64 and bf16 (computed in f32, rounded on store, as the CPU slot computes bf16 through its f32
// stand-ins). Products are rounded before their adds (__fmul_rn), in the CPU kernel's order, so the f32
// forward equals the CPU's to the last bit except where the SiLU's exp differs (the device's expf
// against the CPU's polynomial).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "cuda/ssm/conv1d_kernels.cuh"
#include "tensor/slots/ssm/conv1d.h"

namespace seqlab::cuda {
namespace {

using conv1d::Geometry;

// The kernels' contract (the op's entry points in src/layers/ssm/conv1d.cpp have checked the user's
// shapes; this guards the slot against another caller).
Geometry geometry_of(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& h0, const char* what) {
  const int device = x.device().index;
  auto on_device = [&](const Tensor& t) {
    return !t.defined() ||
           (t.is_contiguous() && t.device().is_cuda() && t.device().index == device && t.dtype() == x.dtype());
  };
  const bool ok = x.dim() == 3 && weight.dim() == 2 && weight.size(0) >= 1 && weight.size(0) <= kMaxConv1dWidth &&
                  weight.size(1) == x.size(2) && (!bias.defined() || bias.shape() == Shape{x.size(2)}) &&
                  (!h0.defined() || h0.shape() == Shape{x.size(0), weight.size(0) - 1, x.size(2)}) && on_device(x) &&
                  on_device(weight) && on_device(bias) && on_device(h0);
  if (!ok) {
    throw std::logic_error(std::string(what) + " on CUDA: expected contiguous x [B, T, C], weight [W, C] (W ≤ " +
                           std::to_string(kMaxConv1dWidth) + "), bias [C] and initial_state [B, W−1, C] of one dtype " +
                           "on cuda:" + std::to_string(device) + ", got x " + shape_str(x.shape()) + " " +
                           dtype_name(x.dtype()) + ", weight " + shape_str(weight.shape()));
  }
  return {x.size(0), x.size(1), x.size(2), static_cast<int>(weight.size(0))};
}

template <class T>
const T* in_or_null(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? cptr<T>(t) : nullptr;
}
template <class T>
T* out_or_null(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? mptr<T>(t) : nullptr;
}

void forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& h0, bool silu,
                  const Tensor& y, const Tensor& final_state) {
  const Geometry g = geometry_of(x, weight, bias, h0, "causal_conv1d");
  const int device = x.device().index;
  dispatch_floating(x.dtype(), "causal_conv1d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    const int64_t n = g.B * g.T * g.C, nf = g.B * (g.W - 1) * g.C;
    if (n > 0) {
      conv1d::conv1d_forward<T><<<blocks_for(n, device), kThreads, 0, st>>>(
          g, in_or_null<T>(x), cptr<T>(weight), in_or_null<T>(bias), in_or_null<T>(h0), silu, mptr<T>(y));
      SEQLAB_CUDA_CHECK_LAUNCH("causal_conv1d forward kernel");
    }
    if (nf > 0) {
      conv1d::conv1d_final_state<T>
          <<<blocks_for(nf, device), kThreads, 0, st>>>(g, in_or_null<T>(x), in_or_null<T>(h0), mptr<T>(final_state));
      SEQLAB_CUDA_CHECK_LAUNCH("causal_conv1d final state kernel");
    }
  });
}

void backward_cuda(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& h0, bool silu, const kernel::Conv1dGrads& grads) {
  const Geometry g = geometry_of(x, weight, bias, h0, "causal_conv1d backward");
  const int device = x.device().index;
  dispatch_floating(x.dtype(), "causal_conv1d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const int64_t n = g.B * g.T * g.C, nd = g.B * (g.W - 1 + g.T) * g.C, np = (g.W + 1) * g.C;
    // Scratch dz [B, T, C] in A, returned to the allocator's cache at exit: safe, since every later user
    // of its block is queued after these kernels on the same stream.
    Tensor dz = Tensor::empty({g.B, g.T, g.C}, dtype_of_compute<A>(), x.device());
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    if (n > 0) {
      conv1d::conv1d_dz<T><<<blocks_for(n, device), kThreads, 0, st>>>(
          g, cptr<T>(dy), cptr<T>(x), cptr<T>(weight), in_or_null<T>(bias), in_or_null<T>(h0), silu, mptr<A>(dz));
      SEQLAB_CUDA_CHECK_LAUNCH("causal_conv1d dz kernel");
    }
    T* dx = out_or_null<T>(grads.dx);
    T* dh0 = out_or_null<T>(grads.dinitial_state);
    if (nd > 0 && (dx != nullptr || dh0 != nullptr)) {
      conv1d::conv1d_dinput<T><<<blocks_for(nd, device), kThreads, 0, st>>>(
          g, n > 0 ? cptr<A>(dz) : nullptr, cptr<T>(weight), in_or_null<T>(dfinal), dx, dh0);
      SEQLAB_CUDA_CHECK_LAUNCH("causal_conv1d input gradient kernel");
    }
    T* dw = out_or_null<T>(grads.dweight);
    T* db = out_or_null<T>(grads.dbias);
    if (dw != nullptr || db != nullptr) {
      conv1d::conv1d_dparams<T><<<blocks_for(np, device), kThreads, 0, st>>>(
          g, n > 0 ? cptr<A>(dz) : nullptr, in_or_null<T>(x), in_or_null<T>(h0), dw, db);
      SEQLAB_CUDA_CHECK_LAUNCH("causal_conv1d weight gradient kernel");
    }
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(conv1d_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(conv1d_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
