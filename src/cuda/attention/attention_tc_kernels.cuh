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
constexpr int kRows = 16;                // rows of the block's tile that one warp owns (one mma M)
constexpr int kTile = kWarps * kRows;    // query rows per forward / dQ block, keys per dK/dV block
constexpr int kKeys = 64;                // keys per K/V tile (forward, dQ)
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Queries per Q/dO tile in the dK/dV kernel: at D = 128 its dK and dV accumulators take 128 registers a
// thread, and 64-query score tiles on top would leave ptxas too few.
template <int D>
constexpr int kDkdvQueries = D > 64 ? 32 : 64;

// Staged tiles are rows of D bf16 with a pitch of D + 8: consecutive rows start 16 bytes apart modulo the
// 128 bytes of the 32 banks, so the eight 16-byte rows one ldmatrix phase reads hit eight different bank
// quads (no conflicts).
template <int D>
constexpr int kLd = D + 8;
template <int D, int kRowCount>
constexpr size_t tile_bytes() {
  return size_t{kRowCount} * kLd<D> * 2;
}

// Byte offsets of the dynamic shared memory pieces (multiples of 128).
template <int D>
struct FwdLayout {  // K and V tiles, two of each (double buffering); Q passes through k1 first
  static constexpr size_t kTileBytes = tile_bytes<D, kKeys>();
  static constexpr size_t k0 = 0, k1 = kTileBytes, v0 = 2 * kTileBytes, v1 = 3 * kTileBytes, bytes = 4 * kTileBytes;
  static_assert(kTile == kKeys, "Q passes through a K buffer");
};
template <int D>
struct DqLayout {  // Q and dO tiles of the block's rows; K and V tiles, two of each
  static constexpr size_t kTileBytes = tile_bytes<D, kKeys>();
  static constexpr size_t q = 0, dout = kTileBytes, k0 = 2 * kTileBytes, k1 = 3 * kTileBytes, v0 = 4 * kTileBytes,
                          v1 = 5 * kTileBytes, bytes = 6 * kTileBytes;
  static_assert(kTile == kKeys, "tiles of one size");
};
template <int D>
struct DkdvLayout {  // K and V tiles of the block's keys; Q, dO, lse and δ of a query tile, two of each
  static constexpr int kQ = kDkdvQueries<D>;
  static constexpr size_t kKvBytes = tile_bytes<D, kTile>(), kQBytes = tile_bytes<D, kQ>(),
                          kStatBytes = (kQ * sizeof(float) + 127) / 128 * 128;
  static constexpr size_t k = 0, v = kKvBytes, q0 = 2 * kKvBytes, q1 = q0 + kQBytes, dout0 = q1 + kQBytes,
                          dout1 = dout0 + kQBytes, lse0 = dout1 + kQBytes, lse1 = lse0 + kStatBytes,
                          delta0 = lse1 + kStatBytes, delta1 = delta0 + kStatBytes, bytes = delta1 + kStatBytes;
  static_assert(kKvBytes % 128 == 0 && kQBytes % 128 == 0, "pieces start 128-byte aligned");
};

#if SEQLAB_TC_ATTENTION
// ---- warp-level tile products (src/cuda/tensor_core.cuh has the fragment layouts) -------------------------

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

// acc[n] += A · Bᵀ over one 16-deep slice: A's fragment af (16 rows × 16 of the inner dimension), B the
// 8·N rows × 16 at `b` (row-major, pitch ldb, shared memory); acc[n] is columns 8n … 8n+7 of the 16 × 8N
// product. B row-major is Bᵀ column-major, the "col" operand of mma: matrices (rows 8n–8n+7, cols 0–7),
// (same rows, cols 8–15), then rows 8n+8 … give b0, b1 of n-blocks n and n+1.
template <int N>
__device__ __forceinline__ void mma_abt_slice(float (&acc)[N][4], const uint32_t (&af)[4], const bf16_t* b, int ldb) {
  static_assert(N % 2 == 0, "n-blocks come in pairs (one ldmatrix.x4)");
  const LaneRow l = lane_row();
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; n += 2) {
    uint32_t bf[4];
    tc::ldmatrix_x4(bf, b + (n * 8 + (l.m >> 1) * 8 + l.i) * ldb + (l.m & 1) * 8);
    tc::mma_16816(acc[n], af, bf[0], bf[1]);
    tc::mma_16816(acc[n + 1], af, bf[2], bf[3]);
  }
}

// acc += A · Bᵀ, A the warp's 16 rows × K at `a` (pitch lda), B 8·N rows × K at `b` (pitch ldb), both
// row-major bf16 in shared memory.
template <int K, int N>
__device__ __forceinline__ void warp_abt(float (&acc)[N][4], const bf16_t* a, int lda, const bf16_t* b, int ldb) {
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    load_a(af, a + kk * 16, lda);
    mma_abt_slice<N>(acc, af, b + kk * 16, ldb);
  }
}
// The same with A's fragments already in registers (af[kk] the 16-deep slice kk).
template <int K, int N>
__device__ __forceinline__ void warp_abt(float (&acc)[N][4], const uint32_t (&af)[K / 16][4], const bf16_t* b,
                                         int ldb) {
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) mma_abt_slice<N>(acc, af[kk], b + kk * 16, ldb);
}

// acc += P · B: P the warp's 16 rows × 16·KK in registers as A fragments, B 16·KK rows × 8·N at `b`
// (row-major, pitch ldb, shared memory). Row-major B is what ldmatrix.trans turns into the "col"
// operand: matrices (rows 16kk + 0–7, cols 8n …), (rows 16kk + 8–15, cols 8n …), then cols 8n + 8 … give
// b0, b1 of n-blocks n and n+1.
template <int KK, int N>
__device__ __forceinline__ void warp_pb(float (&acc)[N][4], const uint32_t (&pa)[KK][4], const bf16_t* b, int ldb) {
  static_assert(N % 2 == 0, "n-blocks come in pairs (one ldmatrix.x4)");
  const LaneRow l = lane_row();
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < KK; ++kk) {
SEQLAB_TC_UNROLL
    for (int n = 0; n < N; n += 2) {
      uint32_t bf[4];
      tc::ldmatrix_x4_trans(bf, b + (kk * 16 + (l.m & 1) * 8 + l.i) * ldb + n * 8 + (l.m >> 1) * 8);
      tc::mma_16816(acc[n], pa[kk], bf[0], bf[1]);
      tc::mma_16816(acc[n + 1], pa[kk], bf[2], bf[3]);
    }
  }
}

// The A fragments of a 16 × 8N f32 product held in C layout, rounded to bf16: slice kk is n-blocks 2kk and
// 2kk + 1 (the registers line up; see src/cuda/tensor_core.cuh).
template <int N>
__device__ __forceinline__ void to_a(uint32_t (&pa)[N / 2][4], const float (&c)[N][4]) {
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < N / 2; ++kk) {
    pa[kk][0] = tc::pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
    pa[kk][1] = tc::pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
    pa[kk][2] = tc::pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    pa[kk][3] = tc::pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// ---- staging tiles -----------------------------------------------------------------------------------------

// dst rows [0, kRowCount) (pitch kLd<D>) ← src + r·stride for r < n, by cp.async 16 bytes at a time (the
// caller commits and waits); rows r ≥ n are zeroed with plain stores, so a padded row never feeds NaN from
// stale shared memory into a product (0 · NaN would poison the sums).
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

// The warp's 16 output rows from a 16 × 8N accumulator in C layout: dst[r·stride + c] = bf16(acc · scale_r)
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

// Sets s[n][e] = −∞ where element e of n-block n (row row0 + g + 8·(e/2), column col0 + 8n + 2t + e%2) is
// not visible: column ≥ the row's key end, which is min(S, row + S − T + 1) when causal, else S (rows
// past T get S). Rows and columns here are query and key positions; `transposed` swaps which index is
// the query (the dK/dV kernel's tiles are keys × queries) and also hides queries ≥ T.
template <int N>
__device__ __forceinline__ void mask(float (&s)[N][4], const Problem& p, int64_t row0, int64_t col0, bool transposed) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
SEQLAB_TC_UNROLL
  for (int n = 0; n < N; ++n) {
SEQLAB_TC_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e / 2), col = col0 + 8 * n + 2 * t + e % 2;
      const int64_t query = transposed ? col : row, key = transposed ? row : col;
      const bool visible = query < p.T && key < p.S && (!p.causal || key < query + p.S - p.T + 1);
      if (!visible) s[n][e] = -INFINITY;
    }
  }
}
// Whether any element of the tile of queries [q0, q0 + nq) × keys [k0, k0 + nk) is hidden (then mask()).
__device__ __forceinline__ bool needs_mask(const Problem& p, int64_t q0, int nq, int64_t k0, int nk) {
  return q0 + nq > p.T || k0 + nk > p.S || (p.causal && k0 + nk - 1 >= q0 + p.S - p.T + 1);
}

// Sum over the four lanes of a group (the lanes that share rows g and g + 8).
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float group_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
#endif  // SEQLAB_TC_ATTENTION

// Forward; see the file comment. Grid (⌈T/64⌉, H, B), kThreads threads, FwdLayout<D>::bytes of shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_forward(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
               bf16_t* __restrict__ o, float* __restrict__ lse) {
#if SEQLAB_TC_ATTENTION
  using L = FwdLayout<D>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  // Buffer `buf` of a double-buffered piece (the two lie back to back); computed, not an array of two
  // pointers indexed at run time (which could go to local memory).
  auto Ks = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::k0 + buf * L::kTileBytes); };
  auto Vs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::v0 + buf * L::kTileBytes); };
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;

  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (p.H / p.Hk), i0 = int64_t{blockIdx.x} * kTile;
  const int rows = static_cast<int>(std::min<int64_t>(kTile, p.T - i0));
  const int64_t q_first = (b * p.T + i0) * p.H + h;  // row number of (b, i0, h) in [B, T, H]
  const int64_t kv_first = b * p.S * p.Hk + hk;       // row number of (b, 0, hk) in [B, S, Hk]
  const int64_t key_end = p.causal ? i0 + rows + p.S - p.T : p.S;  // keys the block's last row sees
  const int key_tiles = static_cast<int>((key_end + kKeys - 1) / kKeys);
  auto stage_kv = [&](int j, int buf) {
    const int64_t j0 = int64_t{j} * kKeys;
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, p.S - j0));
    stage_async<D, kKeys>(k + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Ks(buf));
    stage_async<D, kKeys>(v + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Vs(buf));
  };

  // Q (through Ks(1)) and the first K/V tile; the warp's 16 query rows stay in registers as A fragments.
  stage_async<D, kTile>(q + q_first * D, p.H * D, rows, Ks(1));
  stage_kv(0, 0);
  tc::cp_async_commit();
  tc::cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[D / 16][4];
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) load_a(qa[kk], Ks(1) + warp * kRows * kLd<D> + kk * 16, kLd<D>);
  __syncthreads();  // Ks(1) is free for tile 1

  // Running statistics of rows g and g + 8 of the warp in log2 units (m = max of scale·log2(e)·s seen so
  // far, ℓ = this lane's share of Σ 2^(that − m)), and the output accumulator o[n] = columns 8n … 8n+7.
  const float scale2 = p.scale * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[D / 8][4];
  zero(acc);
  for (int j = 0; j < key_tiles; ++j) {
    const int buf = j & 1;
    if (j + 1 < key_tiles) stage_kv(j + 1, buf ^ 1);  // that buffer's last readers passed the barrier below
    tc::cp_async_commit();
    tc::cp_async_wait<1>();  // this thread's copies of tile j have landed …
    __syncthreads();         // … and everyone's

    float s[kKeys / 8][4];  // S = Q_w K_jᵀ (raw scores) for the warp's 16 rows × 64 keys
    zero(s);
    warp_abt<D, kKeys / 8>(s, qa, Ks(buf), kLd<D>);
    const int64_t j0 = int64_t{j} * kKeys;
    if (needs_mask(p, i0 + warp * kRows, kRows, j0, kKeys)) mask(s, p, i0 + warp * kRows, j0, false);

    // Online softmax: m' = max(m, scale2·max s), α = 2^(m − m'), p = 2^(scale2·s − m'), ℓ ← α ℓ + Σ p,
    // o ← α o + P V. A row that has seen no key yet keeps m' = −∞; it subtracts 0 instead (p = 0, α = 1·0).
    float alpha[2], sub[2];
SEQLAB_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
SEQLAB_TC_UNROLL
      for (int n = 0; n < kKeys / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      const float m_new = fmaxf(m[half], group_max(mx) * scale2);
      sub[half] = m_new == -INFINITY ? 0.f : m_new;
      alpha[half] = exp2f(m[half] - sub[half]);
      m[half] = m_new;
    }
    float sum[2] = {0.f, 0.f};
SEQLAB_TC_UNROLL
    for (int n = 0; n < kKeys / 8; ++n) {
SEQLAB_TC_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(fmaf(s[n][e], scale2, -sub[e / 2]));
        sum[e / 2] += s[n][e];
      }
    }
SEQLAB_TC_UNROLL
    for (int half = 0; half < 2; ++half) l[half] = l[half] * alpha[half] + sum[half];
SEQLAB_TC_UNROLL
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    uint32_t pa[kKeys / 16][4];
    to_a<kKeys / 8>(pa, s);
    warp_pb<kKeys / 16, D / 8>(acc, pa, Vs(buf), kLd<D>);
    __syncthreads();  // every warp is done with tile j before tile j + 2 is staged into its buffers
  }

  // o = acc / ℓ, lse = ln 2 · (m + log2 ℓ) (ℓ summed over the group's four lanes first). Rows past T are
  // not written; every real row has seen key 0 (causal needs T ≤ S), so ℓ > 0 there.
  float inv[2];
SEQLAB_TC_UNROLL
  for (int half = 0; half < 2; ++half) {
    l[half] = group_sum(l[half]);
    inv[half] = l[half] > 0.f ? 1.f / l[half] : 0.f;
    const int row = warp * kRows + g + 8 * half;
    if (threadIdx.x % 4 == 0 && row < rows) lse[q_first + row * p.H] = kLn2 * (m[half] + log2f(l[half]));
  }
  store_rows<D / 8>(acc, inv, rows - warp * kRows, o + (q_first + warp * kRows * p.H) * D, p.H * D);
#else
  __trap();
#endif
}

// dQ; see the file comment. Grid (⌈T/64⌉, H, B), kThreads threads, DqLayout<D>::bytes of shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_dq(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
          const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
          bf16_t* __restrict__ dq) {
#if SEQLAB_TC_ATTENTION
  using L = DqLayout<D>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* const Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  bf16_t* const dOs = reinterpret_cast<bf16_t*>(smem + L::dout);
  auto Ks = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::k0 + buf * L::kTileBytes); };
  auto Vs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::v0 + buf * L::kTileBytes); };
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;

  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (p.H / p.Hk), i0 = int64_t{blockIdx.x} * kTile;
  const int rows = static_cast<int>(std::min<int64_t>(kTile, p.T - i0));
  const int64_t q_first = (b * p.T + i0) * p.H + h;
  const int64_t kv_first = b * p.S * p.Hk + hk;
  const int64_t key_end = p.causal ? i0 + rows + p.S - p.T : p.S;
  const int key_tiles = static_cast<int>((key_end + kKeys - 1) / kKeys);
  auto stage_kv = [&](int j, int buf) {
    const int64_t j0 = int64_t{j} * kKeys;
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, p.S - j0));
    stage_async<D, kKeys>(k + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Ks(buf));
    stage_async<D, kKeys>(v + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Vs(buf));
  };
  stage_async<D, kTile>(q + q_first * D, p.H * D, rows, Qs);
  stage_async<D, kTile>(dout + q_first * D, p.H * D, rows, dOs);
  stage_kv(0, 0);
  tc::cp_async_commit();

  // lse (log2 units) and δ of rows g and g + 8 of the warp (0 for rows past T: never written).
  float lse2[2], dl[2];
SEQLAB_TC_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = warp * kRows + g + 8 * half;
    lse2[half] = row < rows ? lse[q_first + row * p.H] * kLog2e : 0.f;
    dl[half] = row < rows ? delta[q_first + row * p.H] : 0.f;
  }
  const float scale2 = p.scale * kLog2e;
  const bf16_t* const Qw = Qs + warp * kRows * kLd<D>;
  const bf16_t* const dOw = dOs + warp * kRows * kLd<D>;
  float acc[D / 8][4];
  zero(acc);
  for (int j = 0; j < key_tiles; ++j) {
    const int buf = j & 1;
    if (j + 1 < key_tiles) stage_kv(j + 1, buf ^ 1);
    tc::cp_async_commit();
    tc::cp_async_wait<1>();
    __syncthreads();  // (the first time this also publishes Q and dO)

    float s[kKeys / 8][4], dp[kKeys / 8][4];
    zero(s);
    zero(dp);
    warp_abt<D, kKeys / 8>(s, Qw, kLd<D>, Ks(buf), kLd<D>);    // S = Q_w K_jᵀ
    warp_abt<D, kKeys / 8>(dp, dOw, kLd<D>, Vs(buf), kLd<D>);  // dP = dO_w V_jᵀ
    const int64_t j0 = int64_t{j} * kKeys;
    if (needs_mask(p, i0 + warp * kRows, kRows, j0, kKeys)) mask(s, p, i0 + warp * kRows, j0, false);
    // dS = P ∘ (dP − δ) with P = 2^(scale2·S − lse2) (0 where hidden); kept in s.
SEQLAB_TC_UNROLL
    for (int n = 0; n < kKeys / 8; ++n) {
SEQLAB_TC_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(fmaf(s[n][e], scale2, -lse2[e / 2])) * (dp[n][e] - dl[e / 2]);
      }
    }
    uint32_t da[kKeys / 16][4];
    to_a<kKeys / 8>(da, s);
    warp_pb<kKeys / 16, D / 8>(acc, da, Ks(buf), kLd<D>);  // dQ_w += dS K_j
    __syncthreads();
  }
  const float scale[2] = {p.scale, p.scale};
  store_rows<D / 8>(acc, scale, rows - warp * kRows, dq + (q_first + warp * kRows * p.H) * D, p.H * D);
#else
  __trap();
#endif
}

// dK/dV; see the file comment. Grid (⌈S/64⌉, Hk, B), kThreads threads, DkdvLayout<D>::bytes of shared
// memory. A null dk or dv is not computed (dS is needed only for dK).
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_dkdv(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
            const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
            bf16_t* __restrict__ dk, bf16_t* __restrict__ dv) {
#if SEQLAB_TC_ATTENTION
  using L = DkdvLayout<D>;
  constexpr int kQ = L::kQ;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* const Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* const Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  auto Qs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::q0 + buf * L::kQBytes); };
  auto dOs = [&](int buf) { return reinterpret_cast<bf16_t*>(smem + L::dout0 + buf * L::kQBytes); };
  auto Ls = [&](int buf) { return reinterpret_cast<float*>(smem + L::lse0 + buf * L::kStatBytes); };
  auto Ds = [&](int buf) { return reinterpret_cast<float*>(smem + L::delta0 + buf * L::kStatBytes); };
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;

  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = int64_t{blockIdx.x} * kTile, group = p.H / p.Hk;
  const int nk = static_cast<int>(std::min<int64_t>(kTile, p.S - j0));
  const int64_t kv_first = (b * p.S + j0) * p.Hk + hk;  // row number of (b, j0, hk) in [B, S, Hk]
  const bool need_dk = dk != nullptr, need_dv = dv != nullptr;
  // The query tiles that see any of these keys (causal: query i sees key j iff j < i + S − T + 1), for
  // every query head of the group: iteration it is head hk·group + it / tiles, tile it % tiles.
  const int64_t i_first = p.causal ? std::max<int64_t>(0, j0 - (p.S - p.T)) : 0;
  const int64_t i_start = i_first - i_first % kQ;
  const int query_tiles = static_cast<int>((p.T - i_start + kQ - 1) / kQ);
  const int iterations = static_cast<int>(group) * query_tiles;
  auto stage_queries = [&](int it, int buf) {
    const int64_t h = hk * group + it / query_tiles, i0 = i_start + int64_t{it % query_tiles} * kQ;
    const int rows = static_cast<int>(std::min<int64_t>(kQ, p.T - i0));
    const int64_t q_first = (b * p.T + i0) * p.H + h;
    stage_async<D, kQ>(q + q_first * D, p.H * D, rows, Qs(buf));
    stage_async<D, kQ>(dout + q_first * D, p.H * D, rows, dOs(buf));
    stage_stats_async<kQ>(lse, delta, q_first, p.H, rows, Ls(buf), Ds(buf));
  };
  stage_async<D, kTile>(k + kv_first * D, p.Hk * D, nk, Ks);
  stage_async<D, kTile>(v + kv_first * D, p.Hk * D, nk, Vs);
  stage_queries(0, 0);
  tc::cp_async_commit();

  const float scale2 = p.scale * kLog2e;
  const bf16_t* const Kw = Ks + warp * kRows * kLd<D>;
  const bf16_t* const Vw = Vs + warp * kRows * kLd<D>;
  float dka[D / 8][4], dva[D / 8][4];
  zero(dka);
  zero(dva);
  for (int it = 0; it < iterations; ++it) {
    const int buf = it & 1;
    if (it + 1 < iterations) stage_queries(it + 1, buf ^ 1);
    tc::cp_async_commit();
    tc::cp_async_wait<1>();
    __syncthreads();  // (the first time this also publishes K and V)

    // Sᵀ = K_w Q_itᵀ and dPᵀ = V_w dO_itᵀ: the warp's 16 keys × kQ queries.
    float st[kQ / 8][4], dpt[kQ / 8][4];
    zero(st);
    warp_abt<D, kQ / 8>(st, Kw, kLd<D>, Qs(buf), kLd<D>);
    if (need_dk) {
      zero(dpt);
      warp_abt<D, kQ / 8>(dpt, Vw, kLd<D>, dOs(buf), kLd<D>);
    }
    const int64_t i0 = i_start + int64_t{it % query_tiles} * kQ;
    if (needs_mask(p, i0, kQ, j0 + warp * kRows, kRows)) mask(st, p, j0 + warp * kRows, i0, true);
    // Pᵀ = 2^(scale2·Sᵀ − log2(e)·lse_query) (0 where hidden), dSᵀ = Pᵀ ∘ (dPᵀ − δ_query); column c of
    // n-block n is query 8n + 2t + c of the tile.
SEQLAB_TC_UNROLL
    for (int n = 0; n < kQ / 8; ++n) {
SEQLAB_TC_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + e % 2;
        st[n][e] = exp2f(fmaf(st[n][e], scale2, -kLog2e * Ls(buf)[col]));
        if (need_dk) dpt[n][e] = st[n][e] * (dpt[n][e] - Ds(buf)[col]);
      }
    }
    if (need_dv) {
      uint32_t pa[kQ / 16][4];
      to_a<kQ / 8>(pa, st);
      warp_pb<kQ / 16, D / 8>(dva, pa, dOs(buf), kLd<D>);  // dV_w += Pᵀ dO_it
    }
    if (need_dk) {
      uint32_t da[kQ / 16][4];
      to_a<kQ / 8>(da, dpt);
      warp_pb<kQ / 16, D / 8>(dka, da, Qs(buf), kLd<D>);  // dK_w += dSᵀ Q_it
    }
    __syncthreads();
  }
  const int key_rows = nk - warp * kRows;
  const int64_t out_first = (kv_first + warp * kRows * p.Hk) * D;
  if (need_dv) store_rows<D / 8>(dva, {1.f, 1.f}, key_rows, dv + out_first, p.Hk * D);
  if (need_dk) store_rows<D / 8>(dka, {p.scale, p.scale}, key_rows, dk + out_first, p.Hk * D);
#else
  __trap();
#endif
}

}  // namespace seqlab::cuda::attention_tc::kernels
