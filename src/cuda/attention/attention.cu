// CUDA side of the fused attention slots declared in src/tensor/slots/attention/attention.h (the CPU kernels, the
// entry points that check shapes, and the equations are in src/layers/attention/attention.cpp and
// docs/variants/attention.md). Inputs are contiguous: q [B, T, H, Dk], k [B, S, Hk, Dk],
// v [B, S, Hk, Dv]; query head h reads kv head h / (H/Hk); query i sits at key position i + S − T.
// The masks (AttentionMasks, each optional): q_lengths [B] and k_lengths [B] (i64) and an additive bias
// [B or 1, H, T, S] in q's dtype:
//   s_ij = scale q_i·k_j + bias_ij,  visible iff i < q_len_b and j < key_end(i) = min(k_len_b, causal ?
//   i + S − T + 1 : S).
// A row that sees no key (a padded query, k_len_b = 0, or a bias of −∞ on every key it may see) gets o = 0
// and lse = −∞, and sends no gradient into q, k, v or the bias (its dO and dlse are never read into a sum);
// nothing in these kernels turns that into NaN. The backward also writes dbias [B, H, T, S] = dS (the
// gradient of the scores) when asked, every element once, zeros where hidden.
//
// What runs where:
// - bf16 with Dk = Dv ∈ {64, 128} on compute capability ≥ 8.0 (and 16-byte aligned tensors, enough
//   shared memory): the tensor-core kernels of src/cuda/attention/attention_tc.cu (mma.sync m16n8k16 bf16
//   products with f32 accumulation, the softmax in registers; forward, and after this file's δ kernel,
//   dK/dV and dQ with dbias), chosen by attention_tc::supports(); they take every mask (lengths and bias).
//   Validated on an H200 (docs/perf.md, GPU) before the masks; with the masks, by the emulation tests only.
// - Everything else (f32, f64, other bf16 shapes): the FMA kernels of attention_kernels.cuh (described
//   below; a header of their own so tests/attention_emulation_test.cc runs them on the CPU, over
//   tests/cuda_emulation.h, against the CPU kernels). Plain FMA arithmetic, no tensor
//   cores, no asynchronous copies. f32 and bf16 compute and accumulate in f32 (bf16 rounded on
//   store), f64 in f64. lse and dlse are in the compute type (f32 for bf16: accumulate_dtype). Head
//   dims up to 128 (each lane of a warp owns ≤ 4 of a row's dims). Pass tests/attention_gpu_test.cc on an H200.
// Either way the T × S matrix is never formed in global memory (the bias and dbias are the caller's
// T × S tensors, read and written once), key tiles past a row tile's last visible key (the causal limit
// or k_len) are never staged, and every output element is written by exactly one thread in a fixed
// order, so results are deterministic (no atomics).
//
// The FMA kernels:
// Forward (attention_fwd): one block of 4 warps per (batch, query head, tile of 4·RPW query rows).
//   Key/value tiles of 32 keys are staged in shared memory (in the compute type); for each of its
//   rows a warp computes the 32 scores with lane c owning key c (adding the bias), updates the running
//   max m and sum ℓ (online softmax) and rescales/accumulates the output row, lane owning dims lane + 32k.
//   Writes o_i = Σ_j e^{s_ij − m_i} v_j / ℓ_i and lse_i = m_i + log ℓ_i (0 and −∞ when ℓ_i = 0).
// Backward, three launches (deterministic):
//   1. attention_delta: δ_i = dO_i · O_i − dlse_i, one warp per row, in the compute type.
//   2. attention_dkdv: one block per (batch, kv head, tile of 4·KPW keys); the keys' k and v rows
//      live in registers (lane owns dims); the real query rows of all heads in the group are staged in
//      shared memory tile by tile; per (query row, visible key): P = exp(s − lse), dP = dO·v,
//      dS = P (dP − δ), then dV_j += P dO_i and dK_j += scale dS q_i.
//   3. attention_dq: the forward's geometry: per query tile, key/value tiles in shared memory,
//      lane c computes s and dP for key c, then dQ_i += scale Σ_c dS_ic k_c (lane owns dims) and
//      dbias_ic = dS_ic (coalesced: lane c writes key c). Launched when dq or dbias is asked for.
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

Geo geometry(const Tensor& q, const Tensor& k, const Tensor& v, const kernel::AttentionMasks& masks,
             const kernel::AttentionParams& p) {
  Geo g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 1, p.causal};
  g.group = g.H / g.Hk;
  g.q_lengths = masks.q_lengths.defined() ? masks.q_lengths.data<int64_t>() : nullptr;
  g.k_lengths = masks.k_lengths.defined() ? masks.k_lengths.data<int64_t>() : nullptr;
  g.bias_batched = masks.bias.defined() && masks.bias.size(0) == g.B;
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

// The masks as the entry point hands them over: lengths [B] i64, bias [1 or B, H, T, S] in q's dtype, all
// contiguous on q's device (the entry point checks the length values).
void check_masks(const kernel::AttentionMasks& masks, const Tensor& q, const Tensor& k) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), S = k.size(1);
  for (auto [t, what] : {std::pair{&masks.q_lengths, "q_lengths"}, {&masks.k_lengths, "k_lengths"}}) {
    if (!t->defined()) continue;
    check_tensor(*t, q, what, DType::i64);
    if (t->shape() != Shape{B}) {
      throw std::logic_error(std::string("attention on CUDA: ") + what + " must be [" + std::to_string(B) + "], got " +
                             shape_str(t->shape()));
    }
  }
  if (masks.bias.defined()) {
    check_tensor(masks.bias, q, "bias", q.dtype());
    const Shape& s = masks.bias.shape();
    if (s.size() != 4 || (s[0] != 1 && s[0] != B) || s[1] != H || s[2] != T || s[3] != S) {
      throw std::logic_error("attention on CUDA: bias must be [1 or " + std::to_string(B) + ", " + std::to_string(H) +
                             ", " + std::to_string(T) + ", " + std::to_string(S) + "], got " + shape_str(s));
    }
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
attention_tc::Problem tc_problem(const Geo& g, const kernel::AttentionMasks& masks, const kernel::AttentionParams& p) {
  attention_tc::Problem tp{g.B, g.T, g.S, g.H, g.Hk, g.Dk, g.causal, static_cast<float>(p.scale)};
  tp.q_lengths = g.q_lengths;
  tp.k_lengths = g.k_lengths;
  tp.bias = masks.bias.defined() ? masks.bias.data<bf16>() : nullptr;
  tp.bias_batched = g.bias_batched;
  return tp;
}

// The bias as the FMA kernels read it (null when absent).
template <class T>
const T* bias_of(const kernel::AttentionMasks& masks) {
  return masks.bias.defined() ? static_cast<const T*>(masks.bias.raw_data()) : nullptr;
}

void forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const kernel::AttentionMasks& masks,
                  const kernel::AttentionParams& p, const Tensor& o, const Tensor& lse) {
  for (auto [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}}) check_tensor(*t, q, what, q.dtype());
  check_tensor(lse, q, "lse", accumulate_dtype(q.dtype()));
  check_masks(masks, q, k);
  const Geo g = geometry(q, k, v, masks, p);
  if (g.B == 0 || g.T == 0 || g.H == 0) return;
  check_geometry(g);
  const int device = q.device().index;
  if (q.dtype() == DType::bf16 && g.Dk == g.Dv) {
    const attention_tc::Problem tp = tc_problem(g, masks, p);
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
        static_cast<const T*>(v.raw_data()), bias_of<T>(masks), static_cast<A>(p.scale), static_cast<T*>(o.raw_data()),
        static_cast<A*>(lse.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("attention forward kernel");
  });
}

void backward_cuda(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const kernel::AttentionMasks& masks, const Tensor& o, const Tensor& lse,
                   const kernel::AttentionParams& p, const kernel::AttentionGrads& grads) {
  for (auto [t, what] : {std::pair{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}}) {
    check_tensor(*t, q, what, q.dtype());
  }
  check_tensor(lse, q, "lse", accumulate_dtype(q.dtype()));
  check_tensor(dlse, q, "dlse", accumulate_dtype(q.dtype()));
  check_masks(masks, q, k);
  for (auto [t, what] : {std::pair{&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"}, {&grads.dbias, "dbias"}}) {
    if (t->defined()) check_tensor(*t, q, what, q.dtype());
  }
  const Geo g = geometry(q, k, v, masks, p);
  if (grads.dbias.defined() && grads.dbias.shape() != Shape{g.B, g.H, g.T, g.S}) {
    throw std::logic_error("attention on CUDA: dbias must be " + shape_str({g.B, g.H, g.T, g.S}) + ", got " +
                           shape_str(grads.dbias.shape()));
  }
  if (!grads.dq.defined() && !grads.dk.defined() && !grads.dv.defined() && !grads.dbias.defined()) return;
  check_geometry(g);
  const int device = q.device().index;
  dispatch_floating(q.dtype(), "attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const A scale = static_cast<A>(p.scale);
    const T *Q = static_cast<const T*>(q.raw_data()), *K = static_cast<const T*>(k.raw_data()),
            *V = static_cast<const T*>(v.raw_data()), *dO = static_cast<const T*>(dout.raw_data());
    const A* L = static_cast<const A*>(lse.raw_data());
    T* dbias = grads.dbias.defined() ? static_cast<T*>(grads.dbias.raw_data()) : nullptr;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    if (g.B * g.T * g.H == 0) {  // no queries: dK and dV are zero (dq and dbias are empty)
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
      const attention_tc::Problem tp = tc_problem(g, masks, p);
      bf16* dq = grads.dq.defined() ? grads.dq.data<bf16>() : nullptr;
      bf16* dk = grads.dk.defined() ? grads.dk.data<bf16>() : nullptr;
      bf16* dv = grads.dv.defined() ? grads.dv.data<bf16>() : nullptr;
      bf16* db = grads.dbias.defined() ? grads.dbias.data<bf16>() : nullptr;
      if (g.Dk == g.Dv && attention_tc::supports(tp, device, {Q, K, V, dO, dq, dk, dv})) {
        attention_tc::backward(tp, device, q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), dout.data<bf16>(),
                               lse.data<float>(), D, dq, dk, dv, db);
        return;
      }
    }

    const T* bias = bias_of<T>(masks);
    if (grads.dk.defined() || grads.dv.defined()) {
      const LaunchShape shape = dkdv_shape<A>(g);
      allow_shared(attention_dkdv<T>, shape.shared_bytes);
      attention_dkdv<T><<<shape.grid, kAttentionThreads, shape.shared_bytes, st>>>(
          g, Q, K, V, dO, bias, L, D, scale, grads.dk.defined() ? static_cast<T*>(grads.dk.raw_data()) : nullptr,
          grads.dv.defined() ? static_cast<T*>(grads.dv.raw_data()) : nullptr);
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dK/dV kernel");
    }
    if (grads.dq.defined() || dbias) {
      const LaunchShape shape = dq_shape<A>(g);
      allow_shared(attention_dq<T>, shape.shared_bytes);
      attention_dq<T><<<shape.grid, kAttentionThreads, shape.shared_bytes, st>>>(
          g, Q, K, V, dO, bias, L, D, scale, grads.dq.defined() ? static_cast<T*>(grads.dq.raw_data()) : nullptr,
          dbias);
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dQ/dbias kernel");
    }
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(attention_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(attention_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
