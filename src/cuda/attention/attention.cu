// CUDA side of the fused attention slots declared in src/tensor/slots/attention/attention.h (the CPU kernels, the
// entry points that check shapes, and the equations are in src/layers/attention/attention.cpp and
// docs/variants/attention.md). Inputs are contiguous: q [B, T, H, Dk], k [B, S, Hk, Dk],
// v [B, S, Hk, Dv]; query head h reads kv head h / (H/Hk); query i sits at key position i + S − T,
// so with `causal` it sees keys j < key_end(i) = i + S − T + 1, otherwise all S keys.
//
// What runs where:
// - bf16 with Dk = Dv ∈ {64, 128} on compute capability ≥ 8.0 (and 16-byte aligned tensors, enough
//   shared memory): the tensor-core kernels of src/cuda/attention/attention_tc.cu (mma.sync m16n8k16 bf16
//   products with f32 accumulation, the softmax in registers; forward, and after this file's δ kernel,
//   dK/dV and dQ), chosen by attention_tc::supports(). Validated on an H200 (docs/perf.md, GPU).
// - Everything else (f32, f64, other bf16 shapes): the FMA kernels of attention_kernels.cuh (described
//   below; a header of their own so tests/attention_emulation_test.cc runs them on the CPU, over
//   tests/cuda_emulation.h, against the CPU kernels). Plain FMA arithmetic, no tensor
//   cores, no asynchronous copies. f32 and bf16 compute and accumulate in f32 (bf16 rounded on
//   store), f64 in f64. lse and dlse are in the compute type (f32 for bf16: accumulate_dtype). Head
//   dims up to 128 (each lane of a warp owns ≤ 4 of a row's dims). Pass tests/attention_gpu_test.cc on an H200.
// Either way the T × S matrix is never formed in global memory, and every output element is written
// by exactly one thread in a fixed order, so results are deterministic (no atomics).
//
// The FMA kernels:
// Forward (attention_fwd): one block of 4 warps per (batch, query head, tile of 4·RPW query rows).
//   Key/value tiles of 32 keys are staged in shared memory (in the compute type); for each of its
//   rows a warp computes the 32 scores with lane c owning key c, updates the running max m and sum ℓ
//   (online softmax) and rescales/accumulates the output row, lane owning dims lane + 32k.
//   Writes o_i = Σ_j e^{s_ij − m_i} v_j / ℓ_i and lse_i = m_i + log ℓ_i.
// Backward, three launches (deterministic):
//   1. attention_delta: δ_i = dO_i · O_i − dlse_i, one warp per row, in the compute type.
//   2. attention_dkdv: one block per (batch, kv head, tile of 4·KPW keys); the keys' k and v rows
//      live in registers (lane owns dims); query tiles of all heads in the group are staged in
//      shared memory; per (query row, key): P = exp(s − lse), dP = dO·v, dS = P (dP − δ), then
//      dV_j += P dO_i and dK_j += scale dS q_i.
//   3. attention_dq: the forward's geometry: per query tile, key/value tiles in shared memory,
//      lane c computes s and dP for key c, then dQ_i += scale Σ_c dS_ic k_c (lane owns dims).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/attention/attention_tc.h"
#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "tensor/slots/attention/attention.h"

#define SEQLAB_ATTENTION_SHARED_MEMORY(name) extern __shared__ __align__(16) unsigned char name[]
#include "cuda/attention/attention_kernels.cuh"

namespace seqlab::cuda {
namespace {

using namespace attention_fma;

Geo geometry(const Tensor& q, const Tensor& k, const Tensor& v, const kernel::AttentionParams& p) {
  Geo g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 1, p.causal};
  g.group = g.H / g.Hk;
  return g;
}

// `dtype`: q's, or for lse and dlse accumulate_dtype(q's) (f32 for bf16).
void check_tensor(const Tensor& t, const Tensor& q, const char* what, DType dtype) {
  if (!t.is_contiguous() || t.dtype() != dtype || !t.device().is_cuda() || t.device() != q.device()) {
    throw std::logic_error(std::string("attention on CUDA: ") + what + " must be a contiguous " + dtype_name(dtype) +
                           " tensor on " + q.device().str() + ", got " + shape_str(t.shape()) + " " +
                           dtype_name(t.dtype()) + " on " + t.device().str());
  }
}

void check_geometry(const Geo& g) {
  if (g.Dk > kMaxHeadDim || g.Dv > kMaxHeadDim) {
    throw std::invalid_argument("attention on CUDA: head dims up to " + std::to_string(kMaxHeadDim) +
                                " are supported, got Dk = " + std::to_string(g.Dk) + ", Dv = " + std::to_string(g.Dv));
  }
  if (g.H > 65535 || g.Hk > 65535 || g.B > 65535) {
    throw std::invalid_argument("attention on CUDA: batch and head counts up to 65535 are supported, got B = " +
                                std::to_string(g.B) + ", H = " + std::to_string(g.H));
  }
  if (g.Dk == 0 || g.Hk == 0 || g.H % g.Hk != 0 || g.S == 0 || (g.causal && g.T > g.S)) {
    throw std::logic_error("attention on CUDA: inconsistent shapes (the entry point checks these)");
  }
}

// Raises the kernel's dynamic shared memory limit to `bytes` (above the default 48 KiB when needed).
template <class Kernel>
void allow_shared(Kernel kernel_fn, size_t bytes) {
  SEQLAB_CUDA_CHECK(
      cudaFuncSetAttribute(kernel_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The tensor-core kernels' view of the call (attention_tc.h); they take it only for bf16 with Dk = Dv
// and when attention_tc::supports() accepts the shape, the device and the pointers.
attention_tc::Problem tc_problem(const Geo& g, const kernel::AttentionParams& p) {
  return {g.B, g.T, g.S, g.H, g.Hk, g.Dk, g.causal, static_cast<float>(p.scale)};
}

void forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const kernel::AttentionParams& p, const Tensor& o,
                  const Tensor& lse) {
  for (auto [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}}) check_tensor(*t, q, what, q.dtype());
  check_tensor(lse, q, "lse", accumulate_dtype(q.dtype()));
  const Geo g = geometry(q, k, v, p);
  if (g.B == 0 || g.T == 0 || g.H == 0) return;
  check_geometry(g);
  const int device = q.device().index;
  if (q.dtype() == DType::bf16 && g.Dk == g.Dv) {
    const attention_tc::Problem tp = tc_problem(g, p);
    DeviceGuard guard(device);
    if (attention_tc::supports(tp, device, {q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data()})) {
      attention_tc::forward(tp, device, q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), o.data<bf16>(),
                            lse.data<float>());
      return;
    }
  }
  dispatch_floating(q.dtype(), "attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const LaunchShape shape = forward_shape<A>(g);
    DeviceGuard guard(device);
    allow_shared(attention_fwd<T>, shape.shared_bytes);
    attention_fwd<T><<<shape.grid, kAttentionThreads, shape.shared_bytes, stream(device)>>>(
        g, static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
        static_cast<const T*>(v.raw_data()), static_cast<A>(p.scale), static_cast<T*>(o.raw_data()),
        static_cast<A*>(lse.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("attention forward kernel");
  });
}

void backward_cuda(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const kernel::AttentionParams& p,
                   const kernel::AttentionGrads& grads) {
  for (auto [t, what] : {std::pair{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}}) {
    check_tensor(*t, q, what, q.dtype());
  }
  check_tensor(lse, q, "lse", accumulate_dtype(q.dtype()));
  check_tensor(dlse, q, "dlse", accumulate_dtype(q.dtype()));
  for (auto [t, what] : {std::pair{&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"}}) {
    if (t->defined()) check_tensor(*t, q, what, q.dtype());
  }
  const Geo g = geometry(q, k, v, p);
  if (!grads.dq.defined() && !grads.dk.defined() && !grads.dv.defined()) return;
  check_geometry(g);
  const int device = q.device().index;
  dispatch_floating(q.dtype(), "attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const A scale = static_cast<A>(p.scale);
    const T *Q = static_cast<const T*>(q.raw_data()), *K = static_cast<const T*>(k.raw_data()),
            *V = static_cast<const T*>(v.raw_data()), *dO = static_cast<const T*>(dout.raw_data());
    const A* L = static_cast<const A*>(lse.raw_data());
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    if (g.B * g.T * g.H == 0) {  // no queries: dK and dV are zero (dq is empty)
      if (grads.dk.defined() && grads.dk.numel() > 0) {
        SEQLAB_CUDA_CHECK(cudaMemsetAsync(grads.dk.raw_data(), 0, grads.dk.numel() * sizeof(T), st));
      }
      if (grads.dv.defined() && grads.dv.numel() > 0) {
        SEQLAB_CUDA_CHECK(cudaMemsetAsync(grads.dv.raw_data(), 0, grads.dv.numel() * sizeof(T), st));
      }
      return;
    }
    // δ [B, T, H] in the compute type; returned to the allocator's cache at exit, which is safe since
    // every later user of its block is queued after these kernels on the same stream.
    const int64_t n = g.B * g.T * g.H;
    Tensor delta = Tensor::empty({n}, dtype_of_compute<A>(), q.device());
    A* D = static_cast<A*>(delta.raw_data());
    attention_delta<T><<<delta_blocks(n), kAttentionThreads, 0, st>>>(n, g.Dv, dO, static_cast<const T*>(o.raw_data()),
                                                                      static_cast<const A*>(dlse.raw_data()), D);
    SEQLAB_CUDA_CHECK_LAUNCH("attention backward delta kernel");

    if constexpr (std::is_same_v<T, bf16_t>) {
      const attention_tc::Problem tp = tc_problem(g, p);
      bf16* dq = grads.dq.defined() ? grads.dq.data<bf16>() : nullptr;
      bf16* dk = grads.dk.defined() ? grads.dk.data<bf16>() : nullptr;
      bf16* dv = grads.dv.defined() ? grads.dv.data<bf16>() : nullptr;
      if (g.Dk == g.Dv && attention_tc::supports(tp, device, {Q, K, V, dO, dq, dk, dv})) {
        attention_tc::backward(tp, device, q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), dout.data<bf16>(),
                               lse.data<float>(), D, dq, dk, dv);
        return;
      }
    }

    if (grads.dk.defined() || grads.dv.defined()) {
      const LaunchShape shape = dkdv_shape<A>(g);
      allow_shared(attention_dkdv<T>, shape.shared_bytes);
      attention_dkdv<T><<<shape.grid, kAttentionThreads, shape.shared_bytes, st>>>(
          g, Q, K, V, dO, L, D, scale, grads.dk.defined() ? static_cast<T*>(grads.dk.raw_data()) : nullptr,
          grads.dv.defined() ? static_cast<T*>(grads.dv.raw_data()) : nullptr);
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dK/dV kernel");
    }
    if (grads.dq.defined()) {
      const LaunchShape shape = dq_shape<A>(g);
      allow_shared(attention_dq<T>, shape.shared_bytes);
      attention_dq<T><<<shape.grid, kAttentionThreads, shape.shared_bytes, st>>>(g, Q, K, V, dO, L, D, scale,
                                                                                 static_cast<T*>(grads.dq.raw_data()));
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dQ kernel");
    }
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(attention_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(attention_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
