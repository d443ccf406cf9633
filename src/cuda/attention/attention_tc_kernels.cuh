// The device code of src/cuda/attention/attention_tc.cu (read its header comment first: layouts, equations,
// the fragment bookkeeping, synchronisation). A header of its own so that tests/attention_tc_emulation_test.cc
// can run these same kernels on the CPU, over an emulation of the CUDA and tensor-core pieces they use.
//
// The includer provides, before including: the CUDA built-ins used below (thread and block indices,
// barriers, shuffles, bf16 conversions, uint4, exp2f); seqlab::cuda::bf16_t; the functions of
// seqlab::cuda::tc that src/cuda/tensor_core.cuh defines (mma_16816, ldmatrix_x4, ldmatrix_x4_trans,
// cp_async_16, cp_async_4, cp_async_commit, cp_async_wait<N>, pack_bf16x2); Problem
// (cuda/attention/attention_tc.h); SEQLAB_TC_ATTENTION (1 where those instructions exist: the kernels
// trap otherwise); and SEQLAB_TC_SHARED_MEMORY(name), which declares `name` as the block's dynamic shared
// memory (unsigned char, 128-byte aligned).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_tc.h"

// Loop unrolling for nvcc (fragment arrays stay in registers only when indexed by unrolled loops);
// nothing for a host compiler.
#ifdef __CUDACC__
#define SEQLAB_TC_UNROLL _Pragma("unroll")
#else
#define SEQLAB_TC_UNROLL
#endif

namespace seqlab::cuda::attention_tc::kernels {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // rows of one m-tile (the mma's M); a warp owns MT m-tiles of its block's tile
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Staged tiles are rows of D bf16 with a pitch of D + 8: consecutive rows start 16 bytes apart modulo the
// 128 bytes of the 32 banks, so the eight 16-byte rows one ldmatrix phase reads hit eight different bank
// quads (no conflicts).
template <int D>
constexpr int kLd = D + 8;
template <int D>
constexpr size_t tile_bytes(int rows) {
  return size_t(rows) * kLd<D> * 2;
}

// A kernel's tile shape. MT m-tiles per warp: the block owns BR = 64·MT rows (queries for the forward and
// dQ kernels, keys for dK/dV), and every right-hand tile a warp loads from shared memory feeds MT products
// (MT = 2 halves the shared-memory traffic per product, for twice the accumulator registers). N rows per
// streamed tile: keys for forward and dQ, queries for dK/dV.
template <int D_, int MT_, int N_>
struct Shape {
  static constexpr int D = D_, MT = MT_, N = N_, BR = kWarps * kRows * MT;
  static_assert(D % 16 == 0 && N % 16 == 0, "tiles are whole 16 × 16 fragments");
};

// Byte offsets of the dynamic shared memory pieces (multiples of 128). Double-buffered pieces lie back to
// back: buffer b of piece X is at X + b · its size.
template <class S>
struct FwdLayout {  // Q of the block's rows; K and V tiles, two of each
  static constexpr size_t kTileBytes = tile_bytes<S::D>(S::N);
  static constexpr size_t q = 0, k = tile_bytes<S::D>(S::BR), v = k + 2 * kTileBytes, bytes = v + 2 * kTileBytes;
};
template <class S>
struct DqLayout {  // Q and dO of the block's rows; K and V tiles, two of each
  static constexpr size_t kTileBytes = tile_bytes<S::D>(S::N);
  static constexpr size_t q = 0, dout = tile_bytes<S::D>(S::BR), k = 2 * dout, v = k + 2 * kTileBytes,
                          bytes = v + 2 * kTileBytes;
};
template <class S>
struct DkdvLayout {  // K and V of the block's keys; Q, dO, lse and δ of a query tile, two of each
  static constexpr size_t kTileBytes = tile_bytes<S::D>(S::N), kStatBytes = (S::N * sizeof(float) + 127) / 128 * 128;
  static constexpr size_t k = 0, v = tile_bytes<S::D>(S::BR), q = 2 * v, dout = q + 2 * kTileBytes,
                          lse = dout + 2 * kTileBytes, delta = lse + 2 * kStatBytes, bytes = delta + 2 * kStatBytes;
};

// The shapes compiled, by head dim: the default (one m-tile per warp) and the wide one (two), chosen at
// run time (attention_tc.cu). At D = 128 the dK and dV accumulators of two m-tiles would take 256 registers
// a thread, so that kernel keeps one there; streamed tiles shrink to 32 rows where two m-tiles' score and
// gradient tiles would otherwise crowd the accumulators.
template <int D>
struct Shapes {
  using Forward = Shape<D, 1, 64>;
  using Dq = Shape<D, 1, 64>;
  using Dkdv = Shape<D, 1, D == 128 ? 32 : 64>;
  using WideForward = Shape<D, 2, D == 128 ? 32 : 64>;
  using WideDq = Shape<D, 2, 32>;
  using WideDkdv = Shape<D, D == 128 ? 1 : 2, 32>;
};

#if SEQLAB_TC_ATTENTION
// ---- warp-level tile products (src/cuda/tensor_core.cuh has the fragment layouts) -------------------------
// Each takes MT m-tiles at once: the right-hand fragments are loaded once and used by all MT.

// This lane's part of ldmatrix addressing: row l % 8 of matrix l / 8.
struct LaneRow {
  int i, m;
};
__device__ __forceinline__ LaneRow lane_row() {
  const int lane = threadIdx.x % 32;
  return {lane % 8, lane / 8};
}

// The A fragment of the 16 × 16 block of a row-major bf16 matrix at `a` (pitch lda, shared memory).
// Matrices 0..3 of the ldmatrix are (rows 0–7, cols 0–7), (rows 8–15, cols 0–7), (rows 0–7, cols 8–15),
// (rows 8–15, cols 8–15): a[0..3] in the A layout.
__device__ __forceinline__ void load_a(uint32_t (&af)[4], const bf16_t* a, int lda) {
  const LaneRow l = lane_row();
  tc::ldmatrix_x4(af, a + ((l.m & 1) * 8 + l.i) * lda + (l.m >> 1) * 8);
}

// acc[mt][n] += A_mt · Bᵀ over one 16-deep slice: af[mt] the A fragment of m-tile mt (16 rows × 16 of the
// inner dimension), B the 8·N rows × 16 at `b` (row-major, pitch ldb, shared memory); acc[mt][n] is
// columns 8n … 8n+7 of m-tile mt's 16 × 8N product. B row-major is Bᵀ column-major, the "col" operand of
// mma: ldmatrix matrices (rows 8n–8n+7, cols 0–7), (same rows, cols 8–15), then rows 8n+8 … give b0, b1
// of n-blocks n and n+1.
template <int MT, int N>
__device__ __forceinline__ void mma_abt_slice(float (&acc)[MT][N][4], const uint32_t (&af)[MT][4], const bf16_t* b,
                                              int ldb) {
  static_assert(N % 2 == 0, "n-blocks come in pairs (one ldmatrix.x4)");
  const LaneRow l = lane_row();
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; n += 2) {
    uint32_t bf[4];
    tc::ldmatrix_x4(bf, b + (n * 8 + (l.m >> 1) * 8 + l.i) * ldb + (l.m & 1) * 8);
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      tc::mma_16816(acc[mt][n], af[mt], bf[0], bf[1]);
      tc::mma_16816(acc[mt][n + 1], af[mt], bf[2], bf[3]);
    }
  }
}

// acc += A · Bᵀ, A the warp's 16·MT rows × K at `a` (pitch lda), B 8·N rows × K at `b` (pitch ldb), both
// row-major bf16 in shared memory.
template <int K, int MT, int N>
__device__ __forceinline__ void warp_abt(float (&acc)[MT][N][4], const bf16_t* a, int lda, const bf16_t* b, int ldb) {
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[MT][4];
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) load_a(af[mt], a + mt * kRows * lda + kk * 16, lda);
    mma_abt_slice<MT, N>(acc, af, b + kk * 16, ldb);
  }
}
// The same with A's fragments already in registers (af[mt][kk]: m-tile mt, 16-deep slice kk).
template <int K, int MT, int N>
__device__ __forceinline__ void warp_abt(float (&acc)[MT][N][4], const uint32_t (&af)[MT][K / 16][4], const bf16_t* b,
                                         int ldb) {
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t slice[MT][4];
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
      for (int r = 0; r < 4; ++r) slice[mt][r] = af[mt][kk][r];
    }
    mma_abt_slice<MT, N>(acc, slice, b + kk * 16, ldb);
  }
}

// acc[mt] += P_mt · B: P_mt m-tile mt's 16 rows × 16·KK in registers as A fragments, B 16·KK rows × 8·N at
// `b` (row-major, pitch ldb, shared memory). Row-major B is what ldmatrix.trans turns into the "col"
// operand: matrices (rows 16kk + 0–7, cols 8n …), (rows 16kk + 8–15, cols 8n …), then cols 8n + 8 … give
// b0, b1 of n-blocks n and n+1.
template <int KK, int MT, int N>
__device__ __forceinline__ void warp_pb(float (&acc)[MT][N][4], const uint32_t (&pa)[MT][KK][4], const bf16_t* b,
                                        int ldb) {
  static_assert(N % 2 == 0, "n-blocks come in pairs (one ldmatrix.x4)");
  const LaneRow l = lane_row();
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < KK; ++kk) {
SEQLAB_TC_UNROLL
    for (int n = 0; n < N; n += 2) {
      uint32_t bf[4];
      tc::ldmatrix_x4_trans(bf, b + (kk * 16 + (l.m & 1) * 8 + l.i) * ldb + n * 8 + (l.m >> 1) * 8);
SEQLAB_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        tc::mma_16816(acc[mt][n], pa[mt][kk], bf[0], bf[1]);
        tc::mma_16816(acc[mt][n + 1], pa[mt][kk], bf[2], bf[3]);
      }
    }
  }
}

// The A fragments of MT 16 × 8N f32 products held in C layout, rounded to bf16: slice kk is n-blocks 2kk and
// 2kk + 1 (the registers line up; see src/cuda/tensor_core.cuh).
template <int MT, int N>
__device__ __forceinline__ void to_a(uint32_t (&pa)[MT][N / 2][4], const float (&c)[MT][N][4]) {
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
    for (int kk = 0; kk < N / 2; ++kk) {
      pa[mt][kk][0] = tc::pack_bf16x2(c[mt][2 * kk][0], c[mt][2 * kk][1]);
      pa[mt][kk][1] = tc::pack_bf16x2(c[mt][2 * kk][2], c[mt][2 * kk][3]);
      pa[mt][kk][2] = tc::pack_bf16x2(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
      pa[mt][kk][3] = tc::pack_bf16x2(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
    }
  }
}

template <int MT, int N>
__device__ __forceinline__ void zero(float (&acc)[MT][N][4]) {
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
    for (int n = 0; n < N; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  }
}

// ---- staging tiles -----------------------------------------------------------------------------------------

// dst rows [0, rows) (pitch kLd<D>) ← src + r·stride for r < n, by cp.async 16 bytes at a time (the caller
// commits and waits); rows r ≥ n are zeroed with plain stores, so a padded row never feeds NaN from stale
// shared memory into a product (0 · NaN would poison the sums).
template <int D, int kRowCount>
__device__ __forceinline__ void stage_async(const bf16_t* __restrict__ src, int64_t stride, int n, bf16_t* dst) {
  constexpr int kVecs = D / 8;  // 16-byte vectors per row
  for (int e = threadIdx.x; e < kRowCount * kVecs; e += kThreads) {
    const int r = e / kVecs, c = e % kVecs * 8;
    if (r < n) {
      tc::cp_async_16(dst + r * kLd<D> + c, src + r * stride + c);
    } else {
      *reinterpret_cast<uint4*>(dst + r * kLd<D> + c) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Ls[r] ← lse[first + r·stride], Ds[r] ← delta[first + r·stride] for r < n (cp.async, 4 bytes), zeros up
// to kRowCount.
template <int kRowCount>
__device__ __forceinline__ void stage_stats_async(const float* __restrict__ lse, const float* __restrict__ delta,
                                                  int64_t first, int64_t stride, int n, float* Ls, float* Ds) {
  for (int e = threadIdx.x; e < 2 * kRowCount; e += kThreads) {
    const int r = e % kRowCount;
    const float* src = e < kRowCount ? lse : delta;
    float* dst = e < kRowCount ? Ls : Ds;
    if (r < n) {
      tc::cp_async_4(dst + r, src + first + r * stride);
    } else {
      dst[r] = 0.f;
    }
  }
}

// One m-tile's 16 output rows from a 16 × 8N accumulator in C layout: dst[r·stride + c] = bf16(acc · scale_r)
// for rows r < n (scale[0] for row g, scale[1] for row g + 8). Each lane stores its pairs of columns.
template <int N>
__device__ __forceinline__ void store_rows(const float (&acc)[N][4], const float (&scale)[2], int n,
                                           bf16_t* __restrict__ dst, int64_t stride) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
SEQLAB_TC_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= n) continue;
SEQLAB_TC_UNROLL
    for (int j = 0; j < N; ++j) {
      *reinterpret_cast<__nv_bfloat162*>(dst + r * stride + j * 8 + 2 * t) =
          __floats2bfloat162_rn(acc[j][2 * half] * scale[half], acc[j][2 * half + 1] * scale[half]);
    }
  }
}

// One batch row's real queries [0, q_len) and keys [0, k_len): T and S, or less where the lengths say so.
struct Limits {
  int64_t q_len, k_len;
};
// The entry point has checked the lengths (0 ≤ q_len ≤ T, 0 ≤ k_len ≤ S); the clamp only keeps a direct call
// of the slot with bad lengths inside the tensors.
__device__ __forceinline__ Limits limits(const Problem& p, int64_t b) {
  return {p.q_lengths ? std::min(std::max(p.q_lengths[b], int64_t{0}), p.T) : p.T,
          p.k_lengths ? std::min(std::max(p.k_lengths[b], int64_t{0}), p.S) : p.S};
}
// Whether query `query` sees key `key`: both real, and the key not past the causal limit. A query past
// q_len (or T) sees nothing, a key past k_len (or S) is seen by none.
__device__ __forceinline__ bool visible(const Problem& p, const Limits& lim, int64_t query, int64_t key) {
  return query < lim.q_len && key < lim.k_len && (!p.causal || key < query + p.S - p.T + 1);
}
// The [T, S] bias of batch row b and head h (null without a bias).
__device__ __forceinline__ const bf16_t* bias_plane(const Problem& p, int64_t b, int64_t h) {
  return p.bias == nullptr ? nullptr
                           : reinterpret_cast<const bf16_t*>(p.bias) + ((p.bias_batched ? b : 0) * p.H + h) * p.T * p.S;
}

// Sets s[n][e] = −∞ where element e of n-block n of one m-tile (row row0 + g + 8·(e/2), column
// col0 + 8n + 2t + e%2) is not visible (visible()). Rows and columns here are query and key positions;
// `transposed` swaps which index is the query (the dK/dV kernel's tiles are keys × queries).
template <int N>
__device__ __forceinline__ void mask(float (&s)[N][4], const Problem& p, const Limits& lim, int64_t row0, int64_t col0,
                                     bool transposed) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; ++n) {
SEQLAB_TC_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e / 2), col = col0 + 8 * n + 2 * t + e % 2;
      const int64_t query = transposed ? col : row, key = transposed ? row : col;
      if (!visible(p, lim, query, key)) s[n][e] = -INFINITY;
    }
  }
}
// Whether any element of the tile of queries [q0, q0 + nq) × keys [k0, k0 + nk) is hidden (then mask()).
__device__ __forceinline__ bool needs_mask(const Problem& p, const Limits& lim, int64_t q0, int nq, int64_t k0,
                                           int nk) {
  return q0 + nq > lim.q_len || k0 + nk > lim.k_len || (p.causal && k0 + nk - 1 >= q0 + p.S - p.T + 1);
}
// With a bias: the raw scores of one m-tile (laid out as for mask()) turned into log2 units with the bias
// added where visible, −∞ elsewhere: s ← scale2·s + log2(e)·bias[query, key] (bias: the [T, S] plane of
// the tile's batch row and head). The bias is read only where visible, so never past q_len, k_len.
template <int N>
__device__ __forceinline__ void bias_scores(float (&s)[N][4], const Problem& p, const Limits& lim,
                                            const bf16_t* __restrict__ bias, float scale2, int64_t row0, int64_t col0,
                                            bool transposed) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; ++n) {
SEQLAB_TC_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e / 2), col = col0 + 8 * n + 2 * t + e % 2;
      const int64_t query = transposed ? col : row, key = transposed ? row : col;
      s[n][e] = visible(p, lim, query, key) ? fmaf(s[n][e], scale2, kLog2e * __bfloat162float(bias[query * p.S + key]))
                                            : -INFINITY;
    }
  }
}

// Sum and max over the four lanes of a group (the lanes that share rows g and g + 8).
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float group_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
// The part of the forward and dQ kernels' set-up they share: the block's query rows (b, h, rows i0 …
// i0 + rows − 1 of the block's BR; the first `real` of them are real queries, the rest padding), where they
// and the kv head start in memory, the batch row's limits, and the key tiles of N that the block's last
// real row sees (none without a real row or a real key). Without kMasks the lengths are ignored (the
// limits are T and S).
template <class Sh, bool kMasks>
struct QueryBlock {
  int64_t b, h, hk, i0, q_first, kv_first;
  Limits lim;
  int rows, real, key_tiles;
  __device__ __forceinline__ explicit QueryBlock(const Problem& p)
      : b(blockIdx.z), h(blockIdx.y), hk(h / (p.H / p.Hk)), i0(int64_t{blockIdx.x} * Sh::BR),
        q_first((b * p.T + i0) * p.H + h),  // row number of (b, i0, h) in [B, T, H]
        kv_first(b * p.S * p.Hk + hk),      // row number of (b, 0, hk) in [B, S, Hk]
        lim(kMasks ? limits(p, b) : Limits{p.T, p.S}),
        rows(static_cast<int>(std::min<int64_t>(Sh::BR, p.T - i0))) {
    real = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(rows, lim.q_len - i0)));
    // Keys the block's last real row sees.
    const int64_t key_end = real == 0 ? 0 : p.causal ? std::min(lim.k_len, i0 + real + p.S - p.T) : lim.k_len;
    key_tiles = static_cast<int>((key_end + Sh::N - 1) / Sh::N);
  }
  // Stages key tile j (keys j·N …, zero rows past k_len) of k and v into Kdst and Vdst.
  __device__ __forceinline__ void stage_kv(const Problem& p, const bf16_t* __restrict__ k,
                                           const bf16_t* __restrict__ v, int j, bf16_t* Kdst, bf16_t* Vdst) const {
    const int64_t j0 = int64_t{j} * Sh::N;
    const int nk = static_cast<int>(std::min<int64_t>(Sh::N, lim.k_len - j0));
    stage_async<Sh::D, Sh::N>(k + (kv_first + j0 * p.Hk) * Sh::D, p.Hk * Sh::D, nk, Kdst);
    stage_async<Sh::D, Sh::N>(v + (kv_first + j0 * p.Hk) * Sh::D, p.Hk * Sh::D, nk, Vdst);
  }
};

// Zeros `count` rows of D bf16 at dst + r·stride (a block-wide loop: the rows of a block whose queries see
// no key at all).
template <int D>
__device__ __forceinline__ void zero_rows(bf16_t* __restrict__ dst, int64_t stride, int count) {
  for (int e = threadIdx.x; e < count * D; e += kThreads) dst[e / D * stride + e % D] = __float2bfloat16(0.f);
}

// The top of every streamed loop's iteration `it` of `count`: stage_next() stages iteration it + 1 into the
// other buffer (whose last readers passed the barrier that ended iteration it − 1), then this thread
// waits for its copies of iteration it, and the barrier makes everyone's visible.
template <class StageNext>
__device__ __forceinline__ void next_tile(int it, int count, StageNext&& stage_next) {
  if (it + 1 < count) stage_next();
  tc::cp_async_commit();  // an empty group on the last iteration keeps the wait below uniform
  tc::cp_async_wait<1>();
  __syncthreads();
}

// Readies a warp's MT m-tiles of raw scores (query rows r0 + 16·mt …, keys j0 … j0 + N − 1) for the
// softmax: without a bias, masks (−∞) the hidden elements and leaves the rest raw (the caller scales by
// scale2); with one (`bias`: the [T, S] plane), applies bias_scores (the caller then scales by 1).
template <int MT, int N>
__device__ __forceinline__ void ready_scores(float (&s)[MT][N / 8][4], const Problem& p, const Limits& lim,
                                             const bf16_t* __restrict__ bias, float scale2, int64_t r0, int64_t j0) {
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t rows0 = r0 + mt * kRows;
    if (bias != nullptr) {
      bias_scores(s[mt], p, lim, bias, scale2, rows0, j0, false);
    } else if (needs_mask(p, lim, rows0, kRows, j0, N)) {
      mask(s[mt], p, lim, rows0, j0, false);
    }
  }
}
#endif  // SEQLAB_TC_ATTENTION

// Forward; see the file comment. Grid (⌈T/BR⌉, H, B), kThreads threads, FwdLayout<Sh>::bytes of shared memory.
// kMasks: compiled with the code of the masks (launched when p has lengths or a bias); without it they are
// ignored, and the kernel keeps the registers of one with no masks to handle.
template <class Sh, bool kMasks>
__global__ void __launch_bounds__(kThreads)
    tc_forward(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
               bf16_t* __restrict__ o, float* __restrict__ lse) {
#if SEQLAB_TC_ATTENTION
  constexpr int D = Sh::D, MT = Sh::MT, N = Sh::N, BR = Sh::BR;
  // The warp's Q fragments stay in registers where they fit beside the scores and the output (D·MT ≤ 128:
  // up to 32 registers); otherwise they are reloaded from shared memory for every key tile.
  constexpr bool kQInRegisters = D * MT <= 128;
  using L = FwdLayout<Sh>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* const Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  // Buffer `buf` of a double-buffered piece: computed, not an array of two pointers indexed at run time
  // (which could go to local memory).
  auto Ks = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::k + buf * L::kTileBytes); };
  auto Vs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::v + buf * L::kTileBytes); };
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const QueryBlock<Sh, kMasks> blk(p);
  const int64_t i0 = blk.i0, q_first = blk.q_first;
  const int rows = blk.rows, w0 = warp * kRows * MT;  // w0: the warp's first row in the block
  if (blk.key_tiles == 0) {  // no row of the block sees a key: o = 0, lse = −∞ (the whole block returns)
    zero_rows<D>(o + q_first * D, p.H * D, rows);
    for (int r = threadIdx.x; r < rows; r += kThreads) lse[q_first + r * p.H] = -INFINITY;
    return;
  }
  const bf16_t* const bias = kMasks ? bias_plane(p, blk.b, blk.h) : nullptr;

  stage_async<D, BR>(q + q_first * D, p.H * D, blk.real, Qs);  // padded query rows are zeroed
  blk.stage_kv(p, k, v, 0, Ks(0), Vs(0));
  tc::cp_async_commit();
  uint32_t qa[MT][kQInRegisters ? D / 16 : 1][4];
  if constexpr (kQInRegisters) {
    tc::cp_async_wait<0>();
    __syncthreads();
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
      for (int kk = 0; kk < D / 16; ++kk) load_a(qa[mt][kk], Qs + (w0 + mt * kRows) * kLd<D> + kk * 16, kLd<D>);
    }
  }

  // Running statistics of rows g and g + 8 of each m-tile in log2 units (m = max of scale·log2(e)·s seen
  // so far, ℓ = this lane's share of Σ 2^(that − m)), and the output accumulator, acc[mt][n] = columns
  // 8n … 8n+7. With a bias, ready_scores has put the scores in log2 units already: they are scaled by 1.
  const float scale2 = p.scale * kLog2e, sc = bias != nullptr ? 1.f : scale2;
  float m[MT][2], l[MT][2], acc[MT][D / 8][4];
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  zero(acc);
  for (int j = 0; j < blk.key_tiles; ++j) {
    const int buf = j & 1;
    // (At j = 0 the barrier also publishes Q where it stays in shared memory.)
    next_tile(j, blk.key_tiles, [&] { blk.stage_kv(p, k, v, j + 1, Ks(buf ^ 1), Vs(buf ^ 1)); });

    float s[MT][N / 8][4];  // S = Q_w K_jᵀ (raw scores) for the warp's 16·MT rows × N keys
    zero(s);
    if constexpr (kQInRegisters) {
      warp_abt<D, MT, N / 8>(s, qa, Ks(buf), kLd<D>);
    } else {
      warp_abt<D, MT, N / 8>(s, Qs + w0 * kLd<D>, kLd<D>, Ks(buf), kLd<D>);
    }
    ready_scores<MT, N>(s, p, blk.lim, bias, scale2, i0 + w0, int64_t{j} * N);

    // Online softmax: m' = max(m, sc·max s), α = 2^(m − m'), p = 2^(sc·s − m'), ℓ ← α ℓ + Σ p,
    // o ← α o + P V. A row that has seen no key yet (or only −∞ bias) keeps m' = −∞; it subtracts 0
    // instead (p = 0, α = 0).
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      float alpha[2], sub[2], sum[2] = {0.f, 0.f};
SEQLAB_TC_UNROLL
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
SEQLAB_TC_UNROLL
        for (int n = 0; n < N / 8; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * half], s[mt][n][2 * half + 1]));
        const float m_new = fmaxf(m[mt][half], group_max(mx) * sc);
        sub[half] = m_new == -INFINITY ? 0.f : m_new;
        alpha[half] = exp2f(m[mt][half] - sub[half]);
        m[mt][half] = m_new;
      }
SEQLAB_TC_UNROLL
      for (int n = 0; n < N / 8; ++n) {
SEQLAB_TC_UNROLL
        for (int e = 0; e < 4; ++e) {
          s[mt][n][e] = exp2f(fmaf(s[mt][n][e], sc, -sub[e / 2]));
          sum[e / 2] += s[mt][n][e];
        }
      }
SEQLAB_TC_UNROLL
      for (int half = 0; half < 2; ++half) l[mt][half] = l[mt][half] * alpha[half] + sum[half];
SEQLAB_TC_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        acc[mt][n][0] *= alpha[0];
        acc[mt][n][1] *= alpha[0];
        acc[mt][n][2] *= alpha[1];
        acc[mt][n][3] *= alpha[1];
      }
    }
    uint32_t pa[MT][N / 16][4];
    to_a<MT, N / 8>(pa, s);
    warp_pb<N / 16, MT, D / 8>(acc, pa, Vs(buf), kLd<D>);
    __syncthreads();  // every warp is done with tile j before tile j + 2 is staged into its buffers
  }

  // o = acc / ℓ, lse = ln 2 · (m + log2 ℓ) (ℓ summed over the group's four lanes first). Rows past T are
  // not written; a row that saw no key (padding, or −∞ bias on every key) has ℓ = 0: o = 0, lse = −∞.
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
SEQLAB_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const float sum = group_sum(l[mt][half]);
      inv[half] = sum > 0.f ? 1.f / sum : 0.f;
      const int row = w0 + mt * kRows + g + 8 * half;
      if (threadIdx.x % 4 == 0 && row < rows) {
        lse[q_first + row * p.H] = sum > 0.f ? kLn2 * (m[mt][half] + log2f(sum)) : -INFINITY;
      }
    }
    const int r0 = w0 + mt * kRows;
    store_rows<D / 8>(acc[mt], inv, rows - r0, o + (q_first + r0 * p.H) * D, p.H * D);
  }
#else
  __trap();
#endif
}

// dQ and dbias; see the file comment. Grid (⌈T/BR⌉, H, B), kThreads threads, DqLayout<Sh>::bytes of shared
// memory. A null dq or dbias is not written (the kernel runs when either is asked for). kMasks: as for the
// forward, and for dbias too (launched when p has lengths or a bias, or dbias is asked for).
template <class Sh, bool kMasks>
__global__ void __launch_bounds__(kThreads)
    tc_dq(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
          const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
          bf16_t* __restrict__ dq, bf16_t* __restrict__ dbias) {
#if SEQLAB_TC_ATTENTION
  constexpr int D = Sh::D, MT = Sh::MT, N = Sh::N, BR = Sh::BR;
  using L = DqLayout<Sh>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* const Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  bf16_t* const dOs = reinterpret_cast<bf16_t*>(smem + L::dout);
  auto Ks = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::k + buf * L::kTileBytes); };
  auto Vs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::v + buf * L::kTileBytes); };
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const QueryBlock<Sh, kMasks> blk(p);
  const int64_t i0 = blk.i0, q_first = blk.q_first;
  const int rows = blk.rows, w0 = warp * kRows * MT;
  // dbias rows (b, h, i0 …) of [B, H, T, S].
  bf16_t* const dbias_rows =
      !kMasks || dbias == nullptr ? nullptr : dbias + ((blk.b * p.H + blk.h) * p.T + i0) * p.S;
  // The keys from `from` on: no row of the block sees them, so their dS is 0 (a block-wide loop).
  auto zero_dbias_from = [&](int64_t from) {
    if (dbias_rows == nullptr || from >= p.S) return;
    const int64_t width = p.S - from;
    for (int64_t e = threadIdx.x; e < rows * width; e += kThreads)
      dbias_rows[e / width * p.S + from + e % width] = __float2bfloat16(0.f);
  };
  if (blk.key_tiles == 0) {  // no row of the block sees a key: dQ = 0, dbias = 0 (the whole block returns)
    if (dq != nullptr) zero_rows<D>(dq + q_first * D, p.H * D, rows);
    zero_dbias_from(0);
    return;
  }
  const bf16_t* const bias = kMasks ? bias_plane(p, blk.b, blk.h) : nullptr;
  stage_async<D, BR>(q + q_first * D, p.H * D, blk.real, Qs);  // padded query rows are zeroed, so is their dO
  stage_async<D, BR>(dout + q_first * D, p.H * D, blk.real, dOs);
  blk.stage_kv(p, k, v, 0, Ks(0), Vs(0));
  tc::cp_async_commit();

  // lse (log2 units) and δ of rows g and g + 8 of each m-tile (0 for padded rows and rows past T, whose
  // scores are all hidden). lse = −∞ (a real row that saw only −∞ bias) becomes +∞, so that P = 0 there.
  float lse2[MT][2], dl[MT][2];
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int row = w0 + mt * kRows + g + 8 * half;
      const float l = row < blk.real ? lse[q_first + row * p.H] : 0.f;
      lse2[mt][half] = l == -INFINITY ? INFINITY : l * kLog2e;
      dl[mt][half] = row < blk.real ? delta[q_first + row * p.H] : 0.f;
    }
  }
  // With a bias, ready_scores has put the scores in log2 units already: they are scaled by 1.
  const float scale2 = p.scale * kLog2e, sc = bias != nullptr ? 1.f : scale2;
  float acc[MT][D / 8][4];
  zero(acc);
  for (int j = 0; j < blk.key_tiles; ++j) {
    const int buf = j & 1;
    // (At j = 0 the barrier also publishes Q and dO.)
    next_tile(j, blk.key_tiles, [&] { blk.stage_kv(p, k, v, j + 1, Ks(buf ^ 1), Vs(buf ^ 1)); });

    float s[MT][N / 8][4], dp[MT][N / 8][4];
    zero(s);
    zero(dp);
    warp_abt<D, MT, N / 8>(s, Qs + w0 * kLd<D>, kLd<D>, Ks(buf), kLd<D>);    // S = Q_w K_jᵀ
    warp_abt<D, MT, N / 8>(dp, dOs + w0 * kLd<D>, kLd<D>, Vs(buf), kLd<D>);  // dP = dO_w V_jᵀ
    ready_scores<MT, N>(s, p, blk.lim, bias, scale2, i0 + w0, int64_t{j} * N);
    // dS = P ∘ (dP − δ) with P = 2^(sc·S − lse2) (0 where hidden); kept in s.
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
      for (int n = 0; n < N / 8; ++n) {
SEQLAB_TC_UNROLL
        for (int e = 0; e < 4; ++e) {
          s[mt][n][e] = exp2f(fmaf(s[mt][n][e], sc, -lse2[mt][e / 2])) * (dp[mt][n][e] - dl[mt][e / 2]);
        }
      }
    }
    if (dbias_rows != nullptr) {  // dbias = dS (f32, rounded once), for the tile's rows within T, keys within S
SEQLAB_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
SEQLAB_TC_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int row = w0 + mt * kRows + g + 8 * (e / 2);
          if (row >= rows) continue;
SEQLAB_TC_UNROLL
          for (int n = 0; n < N / 8; ++n) {
            const int64_t col = int64_t{j} * N + 8 * n + 2 * t + e % 2;
            if (col < p.S) dbias_rows[row * p.S + col] = __float2bfloat16(s[mt][n][e]);
          }
        }
      }
    }
    if (dq != nullptr) {
      uint32_t da[MT][N / 16][4];
      to_a<MT, N / 8>(da, s);
      warp_pb<N / 16, MT, D / 8>(acc, da, Ks(buf), kLd<D>);  // dQ_w += dS K_j
    }
    __syncthreads();
  }
  zero_dbias_from(int64_t{blk.key_tiles} * N);
  if (dq == nullptr) return;
  const float scale[2] = {p.scale, p.scale};
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    const int r0 = w0 + mt * kRows;
    store_rows<D / 8>(acc[mt], scale, rows - r0, dq + (q_first + r0 * p.H) * D, p.H * D);
  }
#else
  __trap();
#endif
}

// dK/dV; see the file comment. Grid (⌈S/BR⌉, Hk, B), kThreads threads, DkdvLayout<Sh>::bytes of shared
// memory. A null dk or dv is not computed (dS is needed only for dK). kMasks: as for the forward.
template <class Sh, bool kMasks>
__global__ void __launch_bounds__(kThreads)
    tc_dkdv(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
            const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
            bf16_t* __restrict__ dk, bf16_t* __restrict__ dv) {
#if SEQLAB_TC_ATTENTION
  constexpr int D = Sh::D, MT = Sh::MT, N = Sh::N, BR = Sh::BR;
  using L = DkdvLayout<Sh>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* const Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* const Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  auto Qs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::q + buf * L::kTileBytes); };
  auto dOs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::dout + buf * L::kTileBytes); };
  auto Ls = [&](int buf) { return reinterpret_cast<float*>(smem + L::lse + buf * L::kStatBytes); };
  auto Ds = [&](int buf) { return reinterpret_cast<float*>(smem + L::delta + buf * L::kStatBytes); };
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;

  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = int64_t{blockIdx.x} * BR, group = p.H / p.Hk;
  const int nk = static_cast<int>(std::min<int64_t>(BR, p.S - j0));
  const int64_t kv_first = (b * p.S + j0) * p.Hk + hk;  // row number of (b, j0, hk) in [B, S, Hk]
  const bool need_dk = dk != nullptr, need_dv = dv != nullptr;
  const int w0 = warp * kRows * MT;  // the warp's first key in the block
  const Limits lim = kMasks ? limits(p, b) : Limits{p.T, p.S};
  // The query tiles that see any of these keys, for every query head of the group: iteration it is head
  // hk·group + it / tiles, tile it % tiles. They run from the tile of the first query that sees key j0
  // (causal: query i sees key j iff j < i + S − T + 1; every later real query sees it too) up to q_len,
  // and there are none when key j0, and so every key of the block, is padding (j0 ≥ k_len).
  const int64_t i_first = p.causal ? std::max<int64_t>(0, j0 - (p.S - p.T)) : 0;
  const int64_t i_end = j0 < lim.k_len ? lim.q_len : 0;
  const int64_t i_start = i_first - i_first % N;
  const int query_tiles = i_first < i_end ? static_cast<int>((i_end - i_start + N - 1) / N) : 0;
  const int iterations = static_cast<int>(group) * query_tiles;
  auto stage_queries = [&](int it, int buf) {
    const int64_t h = hk * group + it / query_tiles, i0 = i_start + int64_t{it % query_tiles} * N;
    const int rows = static_cast<int>(std::min<int64_t>(N, i_end - i0));  // zeros past q_len
    const int64_t q_first = (b * p.T + i0) * p.H + h;
    stage_async<D, N>(q + q_first * D, p.H * D, rows, Qs(buf));
    stage_async<D, N>(dout + q_first * D, p.H * D, rows, dOs(buf));
    stage_stats_async<N>(lse, delta, q_first, p.H, rows, Ls(buf), Ds(buf));
  };
  if (iterations > 0) {  // (otherwise no query sees these keys: dK = dV = 0, written below)
    stage_async<D, BR>(k + kv_first * D, p.Hk * D, static_cast<int>(std::min<int64_t>(nk, lim.k_len - j0)), Ks);
    stage_async<D, BR>(v + kv_first * D, p.Hk * D, static_cast<int>(std::min<int64_t>(nk, lim.k_len - j0)), Vs);
    stage_queries(0, 0);
    tc::cp_async_commit();
  }

  // With a bias, bias_scores puts the scores in log2 units: they are scaled by 1.
  const float scale2 = p.scale * kLog2e, sc = kMasks && p.bias != nullptr ? 1.f : scale2;
  float dka[MT][D / 8][4], dva[MT][D / 8][4];
  zero(dka);
  zero(dva);
  for (int it = 0; it < iterations; ++it) {
    const int buf = it & 1;
    next_tile(it, iterations, [&] { stage_queries(it + 1, buf ^ 1); });  // (K and V too, at it = 0)

    // Sᵀ = K_w Q_itᵀ and dPᵀ = V_w dO_itᵀ: the warp's 16·MT keys × N queries.
    float st[MT][N / 8][4], dpt[MT][N / 8][4];
    zero(st);
    warp_abt<D, MT, N / 8>(st, Ks + w0 * kLd<D>, kLd<D>, Qs(buf), kLd<D>);
    if (need_dk) {
      zero(dpt);
      warp_abt<D, MT, N / 8>(dpt, Vs + w0 * kLd<D>, kLd<D>, dOs(buf), kLd<D>);
    }
    const int64_t i0 = i_start + int64_t{it % query_tiles} * N;
    const bf16_t* const bias = kMasks ? bias_plane(p, b, hk * group + it / query_tiles) : nullptr;
    // Pᵀ = 2^(sc·Sᵀ − log2(e)·lse_query) (0 where hidden, and for a query whose lse is −∞: it saw only −∞
    // bias), dSᵀ = Pᵀ ∘ (dPᵀ − δ_query); column c of n-block n is query 8n + 2t + c of the tile.
SEQLAB_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      const int64_t r0 = j0 + w0 + mt * kRows;
      if (bias != nullptr) {
        bias_scores(st[mt], p, lim, bias, scale2, r0, i0, true);
      } else if (needs_mask(p, lim, i0, N, r0, kRows)) {
        mask(st[mt], p, lim, r0, i0, true);
      }
SEQLAB_TC_UNROLL
      for (int n = 0; n < N / 8; ++n) {
SEQLAB_TC_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * n + 2 * t + e % 2;
          const float l = Ls(buf)[col];
          st[mt][n][e] = exp2f(fmaf(st[mt][n][e], sc, l == -INFINITY ? -INFINITY : -kLog2e * l));
          if (need_dk) dpt[mt][n][e] = st[mt][n][e] * (dpt[mt][n][e] - Ds(buf)[col]);
        }
      }
    }
    if (need_dv) {
      uint32_t pa[MT][N / 16][4];
      to_a<MT, N / 8>(pa, st);
      warp_pb<N / 16, MT, D / 8>(dva, pa, dOs(buf), kLd<D>);  // dV_w += Pᵀ dO_it
    }
    if (need_dk) {
      uint32_t da[MT][N / 16][4];
      to_a<MT, N / 8>(da, dpt);
      warp_pb<N / 16, MT, D / 8>(dka, da, Qs(buf), kLd<D>);  // dK_w += dSᵀ Q_it
    }
    __syncthreads();
  }
SEQLAB_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    const int r0 = w0 + mt * kRows;
    const int64_t out_first = (kv_first + r0 * p.Hk) * D;
    if (need_dv) store_rows<D / 8>(dva[mt], {1.f, 1.f}, nk - r0, dv + out_first, p.Hk * D);
    if (need_dk) store_rows<D / 8>(dka[mt], {p.scale, p.scale}, nk - r0, dk + out_first, p.Hk * D);
  }
#else
  __trap();
#endif
}

}  // namespace seqlab::cuda::attention_tc::kernels
