// Tensor-core kernels of the fused attention op for bf16 (f32 accumulation), called from
// src/cuda/attention/attention.cu when attention_tc::supports() accepts the call (Dk = Dv ∈ {64, 128}, compute
// capability ≥ 8.0, enough shared memory, 16-byte aligned tensors); everything else runs there on the
// FMA kernels. Equations: docs/variants/attention.md. The device code is in attention_tc_kernels.cuh;
// this file compiles it with the real CUDA pieces and holds the launches.
// Status: compiled for sm_80 and sm_90, not yet run on a GPU. tests/attention_gpu_test.cc checks
// these kernels against the CPU slots where a GPU is; tests/attention_tc_emulation_test.cc runs the
// same kernel source on the CPU (one thread per CUDA thread, wmma emulated by its documented
// whole-matrix semantics) on every build, which checks indexing, masking, tiling, alignment and
// barrier placement, but not the real hardware, compiler or wmma library.
//
// Layout: q [B, T, H, D], k and v [B, S, Hk, D], o and dO like q, lse and δ [B, T, H]; query head h reads
// kv head h / (H/Hk); query i sits at key position i + S − T and with `causal` sees keys
// j < key_end(i) = i + S − T + 1, otherwise all S keys.
//
// Why nvcuda::wmma and not raw mma.sync/ldmatrix: nothing here could be run while writing it, so every
// step had to be checkable by reading. wmma's load/store/mma semantics are documented in terms of
// whole row- or column-major 16×16 matrices in memory, so each product below is an ordinary matrix
// identity about shared-memory tiles. The one thing wmma leaves unspecified — which lane holds which
// accumulator element — is never relied on: every row-wise step (masking, running max and sum,
// exp, rescaling by a per-row factor, the δ subtraction) stores the accumulator to shared memory
// with store_matrix_sync and runs with a plain lane → (row, column) mapping; the only operation
// applied to fragment elements in place is multiplying all of them by the same scalar. Raw mma.sync
// with hand-derived fragment layouts (and wgmma on Hopper) is faster, and is the next step once a GPU
// has validated this version and can validate that one against it.
//
// Shared memory and alignment: every staged tile is kTile (64) rows of D bf16 with a leading dimension
// of D + 8 (16 bytes of padding: rows start in different banks for the fragment loads), f32 score
// tiles have 64 + 4 columns, bf16 probability tiles 64 + 8, f32 output scratch D + 4. All leading
// dimensions are multiples of 8 (bf16) or 4 (f32), and every buffer size is a multiple of 32 bytes, so
// every fragment pointer below is 32-byte aligned, as load/store_matrix_sync require. Tiles are copied
// from global memory 16 bytes at a time (supports() checks the pointers; D·2 is a multiple of 16, so
// every row start is too); rows past the end of q/k/v are zero-filled, so a padded row never feeds a
// NaN from uninitialised shared memory into a product (0 · NaN would poison the sums).
//
// Synchronisation: a tile staged by the whole block is published by __syncthreads() and not
// overwritten before the next __syncthreads(); a warp's private scratch (scores, probabilities,
// output rows) is written by its fragment stores and read by its lanes (or the reverse) with a
// __syncwarp() between, which orders shared-memory accesses among the warp's lanes.
//
// Forward (tc_forward): block (query tile, h, b), 4 warps; warp w owns query rows 16w .. 16w + 15 of
// the block's 64, held as D/16 matrix_a fragments. Over the key tiles up to the causal limit of the
// block's last row (64 keys each, K and V staged in shared memory):
//   1. S = Q_w K_tileᵀ on tensor cores (f32), stored to the warp's scratch [16][64];
//   2. lanes 2r and 2r+1 own row r (columns 2t and 2t+1): with s = scale·S masked to the keys the row
//      sees, m' = max(m, max s), α = e^{m − m'}, p = e^{s − m'} (written to the warp's P tile as
//      bf16), ℓ ← α ℓ + Σ p (the f32 p), m ← m';
//   3. PV = P V_tile on tensor cores (bf16 P, f32 accumulation), stored to the scratch [16][D];
//   4. the row's output accumulator, in the lanes' registers (row r, columns 2t + half), becomes
//      o ← α o + PV.
// Then o / ℓ is written as bf16 and lse = m + log ℓ in f32 (accumulate_dtype of bf16). A row always sees key 0
// (key_end ≥ 1 since causal needs T ≤ S), so after the first tile m is finite for every real row and
// α is never e^{−∞ − (−∞)}; rows past T (padding) see no key, keep m = −∞ (α guarded to 1) and are
// never written. Reads q once, k and v once per query tile; writes o and lse once.
//
// Backward (δ_i = dO_i·O_i − dlse_i is computed first by attention.cu's delta kernel, f32 [B, T, H]):
//   tc_dkdv: block (key tile, hk, b), warp w owns keys 16w .. 16w + 15 of the block's 64. For every
//     query head of the group and every query tile that sees the key tile (Q, dO, lse, δ staged):
//       Sᵀ = K_w Q_tileᵀ, dPᵀ = V_w dO_tileᵀ (tensor cores, stored to scratch [16][64] each);
//       lanes map (key c, query r): Pᵀ = e^{scale·Sᵀ − lse_r} (0 where not visible), dSᵀ = Pᵀ (dPᵀ − δ_r),
//       both rounded to bf16;
//       dV_w += Pᵀ dO_tile, dK_w += dSᵀ Q_tile (tensor cores, accumulators kept in fragments).
//     Then dK = scale · dK_w (the one in-place fragment operation: the same scalar for every element)
//     and dV are written once per key. No atomics: the block alone owns these dK/dV rows.
//   tc_dq: block (query tile, h, b), warp w owns 16 query rows (Q, dO, lse, δ staged once); over the
//     key tiles the block's last row sees: S = Q_w K_tileᵀ, dP = dO_w V_tileᵀ, dS = P (dP − δ) with
//     P = e^{scale·S − lse} (masked), dQ_w += dS K_tile; dQ = scale · dQ_w written once.
// P and dS are rounded to bf16 before their products (as flash attention does); every sum is f32.
// Each block's work is a fixed sequence, so the results are the same bits on every run.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/attention/attention_tc.h"
#include "cuda/common.cuh"
#include "cuda/runtime.h"

// bf16 wmma fragments exist from compute capability 8.0; a build for an older target compiles the
// kernels to a trap, and supports() never chooses them there (it checks the kernels' binary version).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define SEQLAB_TC_ATTENTION 1
#else
#define SEQLAB_TC_ATTENTION 0
#endif
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

unsigned tiles(int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

// seqlab's bf16 and CUDA's __nv_bfloat16 are the same 16 bits (common.cuh).
const bf16_t* dev(const bf16* x) { return reinterpret_cast<const bf16_t*>(x); }
bf16_t* dev(bf16* x) { return reinterpret_cast<bf16_t*>(x); }

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
    constexpr int D = decltype(d)::value;
    // The binary the driver picked for this device must hold the real kernels, not the pre-8.0 trap.
    cudaFuncAttributes attr{};
    SEQLAB_CUDA_CHECK(cudaFuncGetAttributes(&attr, tc_forward<D>));
    ok = attr.binaryVersion >= 80 &&
         std::max(FwdLayout<D>::bytes, BwdLayout<D>::bytes) <= static_cast<size_t>(shared_optin);
  });
  return ok;
}

void forward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse) {
  dispatch_head_dim(p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    constexpr size_t smem = FwdLayout<D>::bytes;
    allow_shared(tc_forward<D>, smem);
    const dim3 grid(tiles(p.T), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
    tc_forward<D><<<grid, kThreads, smem, stream(device)>>>(p, dev(q), dev(k), dev(v), dev(o), lse);
    SEQLAB_CUDA_CHECK_LAUNCH("attention forward kernel (tensor cores)");
  });
}

void backward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
              const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv) {
  dispatch_head_dim(p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    constexpr size_t smem = BwdLayout<D>::bytes;
    cudaStream_t st = stream(device);
    if (dk || dv) {
      allow_shared(tc_dkdv<D>, smem);
      const dim3 grid(tiles(p.S), static_cast<unsigned>(p.Hk), static_cast<unsigned>(p.B));
      tc_dkdv<D><<<grid, kThreads, smem, st>>>(p, dev(q), dev(k), dev(v), dev(dout), lse, delta, dev(dk), dev(dv));
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dK/dV kernel (tensor cores)");
    }
    if (dq) {
      allow_shared(tc_dq<D>, smem);
      const dim3 grid(tiles(p.T), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
      tc_dq<D><<<grid, kThreads, smem, st>>>(p, dev(q), dev(k), dev(v), dev(dout), lse, delta, dev(dq));
      SEQLAB_CUDA_CHECK_LAUNCH("attention backward dQ kernel (tensor cores)");
    }
  });
}

}  // namespace seqlab::cuda::attention_tc
