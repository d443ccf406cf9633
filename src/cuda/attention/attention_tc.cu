// Tensor-core kernels of the fused attention op for bf16 (f32 accumulation), called from
// src/cuda/attention/attention.cu when attention_tc::supports() accepts the call (Dk = Dv ∈ {64, 128}, compute
// capability ≥ 8.0, enough shared memory, 16-byte aligned tensors), with or without the masks (lengths,
// bias); everything else runs there on the FMA kernels. Equations: docs/variants/attention.md. The device code is in
// attention_tc_kernels.cuh; this file compiles it with the real CUDA pieces (src/cuda/tensor_core.cuh: mma.sync,
// ldmatrix, cp.async) and holds the launches. tests/attention_gpu_test.cc checks these kernels against the CPU slots
// where a GPU is; tests/attention_tc_emulation_test.cc runs the same kernel source on the CPU on every build (one fiber
// per CUDA thread; mma, ldmatrix and cp.async emulated lane by lane from their documented layouts), which
// checks indexing, fragment bookkeeping, masking, tiling and barrier placement, but not the real hardware,
// compiler or performance.
//
// Layout: q [B, T, H, D], k and v [B, S, Hk, D], o and dO like q, lse and δ [B, T, H]; query head h reads
// kv head h / (H/Hk); query i sits at key position i + S − T and with `causal` sees keys
// j < key_end(i) = i + S − T + 1, otherwise all S keys.
// Masks (Problem; attention.cu hands them over from AttentionMasks): with lengths, query i of batch row b
// is real iff i < q_len_b and key j iff j < k_len_b; a padded query sees no key, a padded key is seen by no
// query (on top of the causal limit). Staging zeroes the rows of q, dO, k and v past q_len and k_len (as it
// zeroes rows past T and S), so padded rows' values, whatever they hold, never reach a product, and the
// loops stop at the last real row's last visible key: a tile of padding is never loaded or multiplied.
// With a bias [B or 1, H, T, S], each visible score becomes s_ij = scale·q_i·k_j + bias_ij; the kernels
// fold the bias in where they mask (bias_scores: in log2 units, scale2·s + log2(e)·bias, read from global
// memory for visible elements only) and then scale by 1 instead of scale2. A row that sees no key, or only
// −∞ bias, ends with ℓ = 0: o = 0 and lse = −∞; the backward treats lse = −∞ as P = 0 (never ∞ − ∞), so
// such a row sends no gradient anywhere.
//
// Registers, not shared memory, carry every intermediate. Each warp owns 16 rows of its block's tile; a
// product's f32 accumulator is held in the mma C layout (lane 4g + t: rows g and g + 8, columns 2t and
// 2t + 1 of every 8-column block), so the row-wise steps (masking, running max and sum, exponentials,
// rescaling, the δ subtraction) work on registers, with the row's other values in the three other lanes of
// the group (two shuffles reduce over them). Two side-by-side 8-column C blocks are, register for register,
// the A fragment of the next product once rounded to bf16 (to_a), so P and dS go from one product into the
// next without a trip through shared memory. The right-hand operands come from shared memory through
// ldmatrix: a row-major tile read plainly is the Bᵀ of S = Q Kᵀ-style products, read with .trans it is the
// B of P V-style products; warp_abt and warp_pb are the two shapes every product below takes.
//
// Tile shapes (kernels::Shape<D, MT, N>): a block of 4 warps owns BR = 64·MT rows, each warp MT m-tiles of 16
// rows; the streamed tiles hold N = 32 or 64 rows (kernels::Shapes lists the wide and narrow sets; the
// launches below pick one by SEQLAB_ATTENTION_TC_SHAPE). Below, "16 rows" of a warp means each of its m-tiles.
//
// Shared memory: tiles are BR or N rows of D bf16 at a pitch of
// D + 8 (conflict-free ldmatrix), staged by cp.async 16 bytes a thread at a time; rows past the end of
// q/k/v are zeroed, so a padded row never brings NaN from stale memory into a product. The tile streamed
// in the inner loop is double-buffered: while the warps multiply tile j, tile j + 1's copies are in
// flight into the other buffer. Order: stage j + 1, commit, wait for all but the newest group (tile j is
// in), __syncthreads (everyone's copies of j are in), compute, __syncthreads (no warp still reads j's
// buffer when iteration j + 1 stages j + 2 into it).
//
// Forward (tc_forward): block (BR query rows, h, b), 4 warps; warp w's query rows stay in registers as
// A fragments where they fit (D·MT ≤ 128), else are reloaded from shared memory. Over the key tiles (N keys)
// up to the last visible key of the block's last real row (a block with none writes o = 0, lse = −∞ and
// returns):
//   S = Q_w K_jᵀ (raw scores, f32); masked to −∞ where hidden (only on tiles that hide anything), or with
//   a bias, biased and masked (bias_scores);
//   in log2 units (scale2 = scale·log2 e): m' = max(m, scale2·max S), α = 2^(m − m'),
//   P = 2^(scale2·S − m'), ℓ ← α ℓ + Σ P, o ← α o + P V_j (P rounded to bf16; V_j via ldmatrix.trans).
// Then o / ℓ is written as bf16 and lse = ln 2 · (m + log2 ℓ) in f32 (0 and −∞ where ℓ = 0). A row that
// has seen nothing yet subtracts 0 instead of −∞ (no ∞ − ∞). Reads q once, k and v once per query tile,
// the bias once; writes o and lse once.
//
// Backward (δ_i = dO_i·O_i − dlse_i is computed first by attention.cu's delta kernel, f32 [B, T, H]):
//   tc_dkdv: block (BR keys, hk, b), warp w owns 16·MT of them (K and V staged once). For every query
//     head of the group and every query tile that sees the key tile, up to q_len (Q, dO, lse, δ
//     double-buffered; no tile at all when the block's keys are all padding):
//       Sᵀ = K_w Q_tileᵀ, dPᵀ = V_w dO_tileᵀ; Pᵀ = 2^(scale2·Sᵀ − log2(e)·lse_query) (0 where hidden),
//       dSᵀ = Pᵀ (dPᵀ − δ_query); dV_w += Pᵀ dO_tile, dK_w += dSᵀ Q_tile (accumulators in registers).
//     Then dK = scale · dK_w and dV are written once per key. No atomics: the block alone owns these rows.
//   tc_dq: block (BR query rows, h, b) (Q, dO staged once; lse, δ of the lane's rows in registers);
//     over the key tiles the block's last real row sees: S = Q_w K_jᵀ, dP = dO_w V_jᵀ, dS = P (dP − δ) with
//     P = 2^(scale2·S − log2(e)·lse) (masked, biased), dQ_w += dS K_j; dQ = scale · dQ_w written once.
//     dbias = dS is written here too (this pass owns the (i, j) tiles query-major, so each element has
//     one writer): every lane stores its C-layout elements of the tile, rounded from f32 to bf16, and the
//     block zeroes the keys after its last tile. Launched when dq or dbias is asked for.
// P and dS are rounded to bf16 before their products (as flash attention does); every sum is f32.
// Each block's work is a fixed sequence, so the results are the same bits on every run.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/attention/attention_tc.h"
#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "cuda/tensor_core.cuh"

// mma.sync on bf16, ldmatrix and cp.async exist from compute capability 8.0; a build for an older target
// compiles the kernels to a trap, and supports() never chooses them there (it checks the kernels' binary
// version).
#define SEQLAB_TC_ATTENTION SEQLAB_TC_PTX
#define SEQLAB_TC_SHARED_MEMORY(name) extern __shared__ __align__(128) unsigned char name[]

#include "cuda/attention/attention_tc_kernels.cuh"

namespace seqlab::cuda::attention_tc {
namespace {

using namespace kernels;

// Calls fn(std::integral_constant<int, D>{}) for the supported head dims.
template <class Fn>
void dispatch_head_dim(int64_t D, Fn&& fn) {
  switch (D) {
    case 64:
      return fn(std::integral_constant<int, 64>{});
    case 128:
      return fn(std::integral_constant<int, 128>{});
    default:
      throw std::logic_error("attention on CUDA: the tensor-core kernels were called with head dim " +
                             std::to_string(D) + " (supports() accepts 64 and 128)");
  }
}

template <class Kernel>
void allow_shared(Kernel kernel_fn, size_t bytes) {
  SEQLAB_CUDA_CHECK(
      cudaFuncSetAttribute(kernel_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int rows) { return static_cast<unsigned>((n + rows - 1) / rows); }

// seqlab's bf16 and CUDA's __nv_bfloat16 are the same 16 bits (common.cuh).
const bf16_t* dev(const bf16* x) { return reinterpret_cast<const bf16_t*>(x); }
bf16_t* dev(bf16* x) { return reinterpret_cast<bf16_t*>(x); }

// Which of the compiled tile shapes (kernels::Shapes) the launches use: SEQLAB_ATTENTION_TC_SHAPE = "wide"
// (two m-tiles per warp, the default: faster on the H100/H200 measured in docs/perf.md) or "narrow" (one),
// read once. For benchmarking the two against each other; results agree to bf16 rounding either way.
bool wide_shapes() {
  static const bool wide = [] {
    const char* env = std::getenv("SEQLAB_ATTENTION_TC_SHAPE");
    const std::string value = env ? env : "";
    if (value.empty() || value == "wide") return true;
    if (value == "narrow") return false;
    throw std::invalid_argument("SEQLAB_ATTENTION_TC_SHAPE = \"" + value + "\": expected \"wide\" or \"narrow\"");
  }();
  return wide;
}

// Each launch picks the kernel compiled with the masks' code (kMasks) only for a call with lengths or a bias
// (or, for dQ, dbias): calls without keep kernels with the registers of ones with no masks to handle.
bool has_masks(const Problem& p) { return p.q_lengths != nullptr || p.k_lengths != nullptr || p.bias != nullptr; }
template <class Sh>
void launch_forward(const Problem& p, cudaStream_t st, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                    float* lse) {
  constexpr size_t smem = FwdLayout<Sh>::bytes;
  const auto kernel_fn = has_masks(p) ? tc_forward<Sh, true> : tc_forward<Sh, false>;
  allow_shared(kernel_fn, smem);
  const dim3 grid(tiles(p.T, Sh::BR), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  kernel_fn<<<grid, kThreads, smem, st>>>(p, dev(q), dev(k), dev(v), dev(o), lse);
  SEQLAB_CUDA_CHECK_LAUNCH("attention forward kernel (tensor cores)");
}

template <class Sh>
void launch_dkdv(const Problem& p, cudaStream_t st, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                 const float* lse, const float* delta, bf16* dk, bf16* dv) {
  constexpr size_t smem = DkdvLayout<Sh>::bytes;
  const auto kernel_fn = has_masks(p) ? tc_dkdv<Sh, true> : tc_dkdv<Sh, false>;
  allow_shared(kernel_fn, smem);
  const dim3 grid(tiles(p.S, Sh::BR), static_cast<unsigned>(p.Hk), static_cast<unsigned>(p.B));
  kernel_fn<<<grid, kThreads, smem, st>>>(p, dev(q), dev(k), dev(v), dev(dout), lse, delta, dev(dk), dev(dv));
  SEQLAB_CUDA_CHECK_LAUNCH("attention backward dK/dV kernel (tensor cores)");
}

template <class Sh>
void launch_dq(const Problem& p, cudaStream_t st, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
               const float* lse, const float* delta, bf16* dq, bf16* dbias) {
  constexpr size_t smem = DqLayout<Sh>::bytes;
  const auto kernel_fn = has_masks(p) || dbias != nullptr ? tc_dq<Sh, true> : tc_dq<Sh, false>;
  allow_shared(kernel_fn, smem);
  const dim3 grid(tiles(p.T, Sh::BR), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  kernel_fn<<<grid, kThreads, smem, st>>>(p, dev(q), dev(k), dev(v), dev(dout), lse, delta, dev(dq), dev(dbias));
  SEQLAB_CUDA_CHECK_LAUNCH("attention backward dQ/dbias kernel (tensor cores)");
}

}  // namespace

bool supports(const Problem& p, int device, std::initializer_list<const void*> pointers) {
  if (p.D != 64 && p.D != 128) return false;
  for (const void* ptr : pointers) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  }
  int major = 0, shared_optin = 0;
  SEQLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  SEQLAB_CUDA_CHECK(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (major < 8) return false;
  bool ok = false;
  dispatch_head_dim(p.D, [&](auto d) {
    using Sh = Shapes<decltype(d)::value>;
    // The binary the driver picked for this device must hold the real kernels, not the pre-8.0 trap.
    cudaFuncAttributes attr{};
    SEQLAB_CUDA_CHECK(cudaFuncGetAttributes(&attr, tc_forward<typename Sh::Forward, false>));
    ok = attr.binaryVersion >= 80 &&
         std::max({FwdLayout<typename Sh::Forward>::bytes, DqLayout<typename Sh::Dq>::bytes,
                   DkdvLayout<typename Sh::Dkdv>::bytes, FwdLayout<typename Sh::WideForward>::bytes,
                   DqLayout<typename Sh::WideDq>::bytes, DkdvLayout<typename Sh::WideDkdv>::bytes}) <=
             static_cast<size_t>(shared_optin);
  });
  return ok;
}

void forward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse) {
  const bool wide = wide_shapes();
  dispatch_head_dim(p.D, [&](auto d) {
    using Sh = Shapes<decltype(d)::value>;
    if (wide) {
      launch_forward<typename Sh::WideForward>(p, stream(device), q, k, v, o, lse);
    } else {
      launch_forward<typename Sh::Forward>(p, stream(device), q, k, v, o, lse);
    }
  });
}

void backward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
              const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv, bf16* dbias) {
  const bool wide = wide_shapes();
  dispatch_head_dim(p.D, [&](auto d) {
    using Sh = Shapes<decltype(d)::value>;
    cudaStream_t st = stream(device);
    if (dk || dv) {
      if (wide) {
        launch_dkdv<typename Sh::WideDkdv>(p, st, q, k, v, dout, lse, delta, dk, dv);
      } else {
        launch_dkdv<typename Sh::Dkdv>(p, st, q, k, v, dout, lse, delta, dk, dv);
      }
    }
    if (dq || dbias) {
      if (wide) {
        launch_dq<typename Sh::WideDq>(p, st, q, k, v, dout, lse, delta, dq, dbias);
      } else {
        launch_dq<typename Sh::Dq>(p, st, q, k, v, dout, lse, delta, dq, dbias);
      }
    }
  });
}

}  // namespace seqlab::cuda::attention_tc
