// The device code of src/cuda/attention/attention_tc.cu (read its header comment first: layouts, equations,
// synchronisation and why wmma). A header of its own so that tests/attention_tc_emulation_test.cc can
// run these same kernels on the CPU, over an emulation of the CUDA and wmma pieces they use.
//
// The includer provides, before including: the CUDA built-ins used below (thread and block indices,
// barriers, shuffles, bf16 conversions, uint4) and nvcuda::wmma; seqlab::cuda::bf16_t; Problem
// (cuda/attention/attention_tc.h); SEQLAB_TC_ATTENTION (1 where bf16 wmma exists: the kernels trap otherwise);
// and SEQLAB_TC_SHARED_MEMORY(name), which declares `name` as the block's dynamic shared memory
// (unsigned char, 128-byte aligned).
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
#define SEQLAB_TC_NO_UNROLL _Pragma("unroll 1")
#else
#define SEQLAB_TC_UNROLL
#define SEQLAB_TC_NO_UNROLL
#endif

namespace seqlab::cuda::attention_tc::kernels {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 64;  // query rows per forward/dQ block, keys per dK/dV block, rows of every staged tile
constexpr int kFrag = 16;  // wmma fragment edge; each warp owns kFrag rows of its block's tile
static_assert(kTile == kWarps * kFrag, "each warp owns one fragment-high slice of the block's tile");
constexpr int kLdS = kTile + 4;  // f32 score tiles [16][kTile]
constexpr int kLdP = kTile + 8;  // bf16 probability tiles [16][kTile]
template <int D>
constexpr int kLdT = D + 8;  // bf16 staged tiles [kTile][D]
template <int D>
constexpr int kLdO = D + 4;  // f32 output scratch [16][D]

constexpr size_t round32(size_t bytes) { return (bytes + 31) / 32 * 32; }

// Byte offsets of the dynamic shared memory pieces (all multiples of 32).
template <int D>
struct FwdLayout {
  static constexpr size_t kTileBytes = size_t{kTile} * kLdT<D> * sizeof(bf16_t);
  static constexpr int kScratchFloats = kFrag * std::max(kLdS, kLdO<D>);  // per warp: scores, then PV / o
  static constexpr int kProbElems = kFrag * kLdP;                          // per warp: P
  static constexpr size_t k = 0, v = k + kTileBytes, scratch = v + kTileBytes,
                          prob = scratch + round32(size_t{kWarps} * kScratchFloats * sizeof(float)),
                          bytes = prob + round32(size_t{kWarps} * kProbElems * sizeof(bf16_t));
  static_assert(kTileBytes % 32 == 0 && kScratchFloats * sizeof(float) % 32 == 0 &&
                    kProbElems * sizeof(bf16_t) % 32 == 0,
                "every warp's piece must start 32-byte aligned");
};

template <int D>
struct BwdLayout {
  static constexpr size_t kTileBytes = size_t{kTile} * kLdT<D> * sizeof(bf16_t);
  static constexpr int kScratchFloats = kFrag * std::max(2 * kLdS, kLdO<D>);  // per warp: S and dP, then output
  static constexpr int kProbElems = kFrag * kLdP;                              // per warp: two tiles (P, dS)
  static constexpr size_t k = 0, v = k + kTileBytes, q = v + kTileBytes, dout = q + kTileBytes,
                          lse = dout + kTileBytes, delta = lse + round32(kTile * sizeof(float)),
                          scratch = delta + round32(kTile * sizeof(float)),
                          prob = scratch + round32(size_t{kWarps} * kScratchFloats * sizeof(float)),
                          bytes = prob + round32(size_t{kWarps} * 2 * kProbElems * sizeof(bf16_t));
  static_assert(kTileBytes % 32 == 0 && kScratchFloats * sizeof(float) % 32 == 0 &&
                    kLdS * kFrag * sizeof(float) % 32 == 0 && kProbElems * sizeof(bf16_t) % 32 == 0,
                "every warp's piece must start 32-byte aligned");
};

// The tiles both backward kernels stage in their shared memory (BwdLayout): K, V, Q, dO [64][D+8]
// bf16 and the rows' lse and δ [64] f32.
struct BwdTiles {
  bf16_t *k, *v, *q, *dout;
  float *lse, *delta;
};
template <int D>
__device__ __forceinline__ BwdTiles backward_tiles(unsigned char* smem) {
  using L = BwdLayout<D>;
  return {reinterpret_cast<bf16_t*>(smem + L::k),   reinterpret_cast<bf16_t*>(smem + L::v),
          reinterpret_cast<bf16_t*>(smem + L::q),   reinterpret_cast<bf16_t*>(smem + L::dout),
          reinterpret_cast<float*>(smem + L::lse), reinterpret_cast<float*>(smem + L::delta)};
}

#if SEQLAB_TC_ATTENTION
namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16_t, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16_t, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16_t, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// dst[r][0, D) = src[r·stride + (0, D)] for r < n, zeros for n ≤ r < kTile (dst leading dim kLdT<D>).
// The whole block copies, 16 bytes per thread per step (src rows are 16-byte aligned).
template <int D>
__device__ __forceinline__ void stage_tile(const bf16_t* __restrict__ src, int64_t stride, int n, bf16_t* dst) {
  constexpr int kVecs = D / 8;  // 16-byte vectors per row
  for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
    const int r = e / kVecs, c = e % kVecs * 8;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (r < n) x = *reinterpret_cast<const uint4*>(src + r * stride + c);
    *reinterpret_cast<uint4*>(dst + r * kLdT<D> + c) = x;
  }
}

// Ls[r] = lse[first + r·stride], Ds[r] = delta[first + r·stride] for r < n; zeros up to kTile.
__device__ __forceinline__ void stage_row_stats(const float* __restrict__ lse, const float* __restrict__ delta,
                                                int64_t first, int64_t stride, int n, float* Ls, float* Ds) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    Ls[r] = r < n ? lse[first + r * stride] : 0.f;
    Ds[r] = r < n ? delta[first + r * stride] : 0.f;
  }
}

// One warp: dst[r·stride + c] = bf16(F[r][c]) for rows r < n (F is the warp's [16][D] f32 scratch,
// leading dim kLdO<D>); lanes take consecutive column pairs of a row, so a warp stores 128 bytes at once.
template <int D>
__device__ __forceinline__ void write_rows(const float* F, int n, bf16_t* __restrict__ dst, int64_t stride) {
  constexpr int kPairs = D / 2;
  for (int e = threadIdx.x % 32; e < kFrag * kPairs; e += 32) {
    const int r = e / kPairs, c = e % kPairs * 2;
    if (r < n) {
      *reinterpret_cast<__nv_bfloat162*>(dst + r * stride + c) =
          __floats2bfloat162_rn(F[r * kLdO<D> + c], F[r * kLdO<D> + c + 1]);
    }
  }
}

// One warp: C = A Bᵀ with A [16][D] at a and B [kTile][D] at b (both staged tiles, leading dim kLdT<D>);
// C [16][kTile] (f32) stored row-major at c with leading dim kLdS. As wmma sees it, Bᵀ is the D × kTile
// matrix whose (d, n) element is b[n·kLdT + d], i.e. b read column-major. C is formed kCols 16-column
// blocks at a time (fewer live accumulators where registers are short, at the cost of reloading A).
template <int D, int kCols = kTile / kFrag>
__device__ __forceinline__ void product_abt(const bf16_t* a, const bf16_t* b, float* c) {
  static_assert((kTile / kFrag) % kCols == 0, "column blocks per pass must divide the tile");
SEQLAB_TC_UNROLL
  for (int n0 = 0; n0 < kTile / kFrag; n0 += kCols) {
    FragC acc[kCols];
SEQLAB_TC_UNROLL
    for (int n = 0; n < kCols; ++n) wmma::fill_fragment(acc[n], 0.f);
SEQLAB_TC_UNROLL
    for (int kk = 0; kk < D / kFrag; ++kk) {
      FragA fa;
      wmma::load_matrix_sync(fa, a + kk * kFrag, kLdT<D>);
SEQLAB_TC_UNROLL
      for (int n = 0; n < kCols; ++n) {
        FragBCol fb;
        wmma::load_matrix_sync(fb, b + (n0 + n) * kFrag * kLdT<D> + kk * kFrag, kLdT<D>);
        wmma::mma_sync(acc[n], fa, fb, acc[n]);
      }
    }
SEQLAB_TC_UNROLL
    for (int n = 0; n < kCols; ++n) {
      wmma::store_matrix_sync(c + (n0 + n) * kFrag, acc[n], kLdS, wmma::mem_row_major);
    }
  }
}

// One warp: acc += A B with A [16][kTile] at a (bf16, leading dim kLdP) and B [kTile][D] at b (a staged
// tile, leading dim kLdT<D>); acc[n] holds columns 16n .. 16n + 15 of the [16][D] sum.
template <int D>
__device__ __forceinline__ void product_ab_acc(FragC (&acc)[D / kFrag], const bf16_t* a, const bf16_t* b) {
SEQLAB_TC_NO_UNROLL
  for (int kk = 0; kk < kTile / kFrag; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * kFrag, kLdP);
SEQLAB_TC_UNROLL
    for (int n = 0; n < D / kFrag; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + kk * kFrag * kLdT<D> + n * kFrag, kLdT<D>);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// One warp: dst rows (scale · acc) through the warp's scratch F (then free again).
template <int D>
__device__ __forceinline__ void write_acc(FragC (&acc)[D / kFrag], float scale, float* F, int n, bf16_t* dst,
                                          int64_t stride) {
SEQLAB_TC_UNROLL
  for (int f = 0; f < D / kFrag; ++f) {
SEQLAB_TC_UNROLL
    for (int e = 0; e < acc[f].num_elements; ++e) acc[f].x[e] *= scale;  // the same scalar for every element
    wmma::store_matrix_sync(F + f * kFrag, acc[f], kLdO<D>, wmma::mem_row_major);
  }
  __syncwarp();
  write_rows<D>(F, n, dst, stride);
  __syncwarp();
}

// Score column blocks per pass in tc_dkdv: at D = 128 its dK and dV accumulators take 128 registers,
// and four more live accumulators pushed it past 255 (spills in ptxas -v).
template <int D>
constexpr int kDkdvCols = D > 64 ? 2 : 4;

// Clamps the causal offset to a range where "c < r + lim" for 0 ≤ r, c < kTile keeps its truth value.
__device__ __forceinline__ int clamp_offset(int64_t lim) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(lim, -2 * kTile), 2 * kTile));
}
#endif  // SEQLAB_TC_ATTENTION

// Forward; see the file comment. Grid (⌈T/64⌉, H, B), kThreads threads, FwdLayout<D>::bytes of shared
// memory: K and V tiles [64][D+8] bf16 (the Q tile passes through the K tile before the key loop), per
// warp an f32 scratch [16][max(68, D+4)] and a bf16 P tile [16][72].
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_forward(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
               bf16_t* __restrict__ o, float* __restrict__ lse) {
#if SEQLAB_TC_ATTENTION
  using L = FwdLayout<D>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* F = reinterpret_cast<float*>(smem + L::scratch) + warp * L::kScratchFloats;
  bf16_t* P = reinterpret_cast<bf16_t*>(smem + L::prob) + warp * L::kProbElems;

  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (p.H / p.Hk), i0 = int64_t{blockIdx.x} * kTile;
  const int rows = static_cast<int>(std::min<int64_t>(kTile, p.T - i0));
  const int64_t q_first = (b * p.T + i0) * p.H + h;  // row number of (b, i0, h) in [B, T, H]
  const int64_t kv_first = b * p.S * p.Hk + hk;       // row number of (b, 0, hk) in [B, S, Hk]

  stage_tile<D>(q + q_first * D, p.H * D, rows, Ks);
  __syncthreads();
  FragA qf[D / kFrag];  // this warp's 16 query rows
SEQLAB_TC_UNROLL
  for (int kk = 0; kk < D / kFrag; ++kk) wmma::load_matrix_sync(qf[kk], Ks + warp * kFrag * kLdT<D> + kk * kFrag, kLdT<D>);

  // Lanes 2r and 2r + 1 own row r of the warp's 16 (columns 2t + half of each [16][·] scratch).
  const int r = lane >> 1, half = lane & 1, row = warp * kFrag + r;
  const bool valid = row < rows;
  const int64_t row_key_end = !valid ? 0 : p.causal ? i0 + row + p.S - p.T + 1 : p.S;
  const int64_t tile_key_end = p.causal ? i0 + rows + p.S - p.T : p.S;  // key_end of the block's last row
  float m = -INFINITY, l = 0.f, acc[D / 2];
SEQLAB_TC_UNROLL
  for (int t = 0; t < D / 2; ++t) acc[t] = 0.f;

  for (int64_t j0 = 0; j0 < tile_key_end; j0 += kTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kTile, tile_key_end - j0));
    __syncthreads();  // every warp is done with the previous K/V tile (the first time: with Q in Ks)
    stage_tile<D>(k + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Ks);
    stage_tile<D>(v + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Vs);
    __syncthreads();

    // 1. S = Q_w K_tileᵀ (unscaled) → F [16][kLdS].
    {
      FragC s[kTile / kFrag];
SEQLAB_TC_UNROLL
      for (int n = 0; n < kTile / kFrag; ++n) wmma::fill_fragment(s[n], 0.f);
SEQLAB_TC_UNROLL
      for (int kk = 0; kk < D / kFrag; ++kk) {
SEQLAB_TC_UNROLL
        for (int n = 0; n < kTile / kFrag; ++n) {
          FragBCol kb;
          wmma::load_matrix_sync(kb, Ks + n * kFrag * kLdT<D> + kk * kFrag, kLdT<D>);
          wmma::mma_sync(s[n], qf[kk], kb, s[n]);
        }
      }
SEQLAB_TC_UNROLL
      for (int n = 0; n < kTile / kFrag; ++n) wmma::store_matrix_sync(F + n * kFrag, s[n], kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // 2. Online softmax of row r over the `seen` keys of this tile it sees (scale > 0, so the max of
    //    the raw scores is the max of the scaled ones).
    const int seen = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(nk, row_key_end - j0)));
    const float* Sr = F + r * kLdS;
    float mx = -INFINITY;
SEQLAB_TC_UNROLL
    for (int t = 0; t < kTile / 2; ++t) {
      const int c = 2 * t + half;
      if (c < seen) mx = fmaxf(mx, Sr[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, p.scale * mx);
    const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);  // 0 on the row's first keys
    float sum = 0.f;
SEQLAB_TC_UNROLL
    for (int t = 0; t < kTile / 2; ++t) {
      const int c = 2 * t + half;
      const float pc = c < seen ? expf(p.scale * Sr[c] - m_new) : 0.f;
      P[r * kLdP + c] = __float2bfloat16(pc);
      sum += pc;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();

    // 3. PV = P V_tile → F [16][kLdO] (the scores there are consumed), one 16-column block at a time.
SEQLAB_TC_UNROLL
    for (int n = 0; n < D / kFrag; ++n) {
      FragC pv;
      wmma::fill_fragment(pv, 0.f);
SEQLAB_TC_UNROLL
      for (int kk = 0; kk < kTile / kFrag; ++kk) {
        FragA pa;
        FragBRow vb;
        wmma::load_matrix_sync(pa, P + kk * kFrag, kLdP);
        wmma::load_matrix_sync(vb, Vs + kk * kFrag * kLdT<D> + n * kFrag, kLdT<D>);
        wmma::mma_sync(pv, pa, vb, pv);
      }
      wmma::store_matrix_sync(F + n * kFrag, pv, kLdO<D>, wmma::mem_row_major);
    }
    __syncwarp();

    // 4. o ← α o + PV for row r.
SEQLAB_TC_UNROLL
    for (int t = 0; t < D / 2; ++t) acc[t] = acc[t] * alpha + F[r * kLdO<D> + 2 * t + half];
    // (The next tile's scores overwrite F only after its two __syncthreads; the final o / ℓ below is
    // written by each lane over exactly the elements it read here.)
  }

  const float inv = valid ? 1.f / l : 0.f;
SEQLAB_TC_UNROLL
  for (int t = 0; t < D / 2; ++t) F[r * kLdO<D> + 2 * t + half] = acc[t] * inv;
  if (valid && half == 0) lse[q_first + row * p.H] = m + logf(l);
  __syncwarp();
  write_rows<D>(F, rows - warp * kFrag, o + (q_first + warp * kFrag * p.H) * D, p.H * D);
#else
  __trap();
#endif
}

// dK/dV; see the file comment. Grid (⌈S/64⌉, Hk, B), kThreads threads, BwdLayout<D>::bytes of shared
// memory: K, V, Q, dO tiles [64][D+8] bf16, lse and δ [64] f32, per warp an f32 scratch (Sᵀ and dPᵀ
// [16][68] each, later the output rows [16][D+4]) and two bf16 tiles [16][72] (Pᵀ, dSᵀ). A null dk or dv
// is not computed.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_dkdv(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
            const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
            bf16_t* __restrict__ dk, bf16_t* __restrict__ dv) {
#if SEQLAB_TC_ATTENTION
  using L = BwdLayout<D>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  const auto [Ks, Vs, Qs, dOs, Ls, Ds] = backward_tiles<D>(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* St = reinterpret_cast<float*>(smem + L::scratch) + warp * L::kScratchFloats;  // [16 keys][64 queries]
  float* dPt = St + kFrag * kLdS;
  bf16_t* Pt = reinterpret_cast<bf16_t*>(smem + L::prob) + warp * 2 * L::kProbElems;
  bf16_t* dSt = Pt + L::kProbElems;

  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = int64_t{blockIdx.x} * kTile, group = p.H / p.Hk;
  const int nk = static_cast<int>(std::min<int64_t>(kTile, p.S - j0));
  const int64_t kv_first = (b * p.S + j0) * p.Hk + hk;  // row number of (b, j0, hk) in [B, S, Hk]
  const bool need_dk = dk != nullptr, need_dv = dv != nullptr;
  stage_tile<D>(k + kv_first * D, p.Hk * D, nk, Ks);
  stage_tile<D>(v + kv_first * D, p.Hk * D, nk, Vs);

  FragC dka[D / kFrag], dva[D / kFrag];
SEQLAB_TC_UNROLL
  for (int n = 0; n < D / kFrag; ++n) {
    wmma::fill_fragment(dka[n], 0.f);
    wmma::fill_fragment(dva[n], 0.f);
  }
  // Queries before i_first see none of these keys (causal: i + S − T < j0); later ones see some.
  const int64_t i_first = p.causal ? std::max<int64_t>(0, j0 - (p.S - p.T)) : 0;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = i_first - i_first % kTile; i0 < p.T; i0 += kTile) {
      const int rows = static_cast<int>(std::min<int64_t>(kTile, p.T - i0));
      const int64_t q_first = (b * p.T + i0) * p.H + h;
      __syncthreads();  // every warp is done with the previous query tile
      stage_tile<D>(q + q_first * D, p.H * D, rows, Qs);
      stage_tile<D>(dout + q_first * D, p.H * D, rows, dOs);
      stage_row_stats(lse, delta, q_first, p.H, rows, Ls, Ds);
      __syncthreads();  // (the first time this also publishes K and V)

      product_abt<D, kDkdvCols<D>>(Ks + warp * kFrag * kLdT<D>, Qs, St);                  // Sᵀ = K_w Q_tileᵀ
      if (need_dk) product_abt<D, kDkdvCols<D>>(Vs + warp * kFrag * kLdT<D>, dOs, dPt);   // dPᵀ = V_w dO_tileᵀ
      __syncwarp();
      // Element (key c of the warp's 16, query r of the tile): lane owns r = lane + 32·(u & 1).
      const int lim = clamp_offset(i0 + p.S - p.T + 1 - j0);  // key 16w + c visible to row r iff 16w + c < r + lim
SEQLAB_TC_UNROLL
      for (int u = 0; u < 2 * kFrag; ++u) {
        const int c = u >> 1, r = lane + 32 * (u & 1), key = warp * kFrag + c;
        const bool visible = r < rows && key < nk && (!p.causal || key < r + lim);
        const float pr = visible ? expf(p.scale * St[c * kLdS + r] - Ls[r]) : 0.f;
        Pt[c * kLdP + r] = __float2bfloat16(pr);
        if (need_dk) dSt[c * kLdP + r] = __float2bfloat16(pr * (dPt[c * kLdS + r] - Ds[r]));
      }
      __syncwarp();
      if (need_dv) product_ab_acc<D>(dva, Pt, dOs);   // dV_w += Pᵀ dO_tile
      if (need_dk) product_ab_acc<D>(dka, dSt, Qs);   // dK_w += dSᵀ Q_tile
    }
  }
  // The scratch becomes output rows: its last reads (the element step) are behind a __syncwarp already.
  const int key_rows = nk - warp * kFrag;
  const int64_t out_first = (kv_first + warp * kFrag * p.Hk) * D;
  if (need_dv) write_acc<D>(dva, 1.f, St, key_rows, dv + out_first, p.Hk * D);
  if (need_dk) write_acc<D>(dka, p.scale, St, key_rows, dk + out_first, p.Hk * D);
#else
  __trap();
#endif
}

// dQ; see the file comment. Grid (⌈T/64⌉, H, B), kThreads threads, BwdLayout<D>::bytes of shared memory
// (the same pieces as tc_dkdv; one of each warp's two bf16 tiles holds dS).
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_dq(Problem p, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
          const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
          bf16_t* __restrict__ dq) {
#if SEQLAB_TC_ATTENTION
  using L = BwdLayout<D>;
  SEQLAB_TC_SHARED_MEMORY(smem);
  const auto [Ks, Vs, Qs, dOs, Ls, Ds] = backward_tiles<D>(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* Sw = reinterpret_cast<float*>(smem + L::scratch) + warp * L::kScratchFloats;  // [16 queries][64 keys]
  float* dPw = Sw + kFrag * kLdS;
  bf16_t* dSw = reinterpret_cast<bf16_t*>(smem + L::prob) + warp * 2 * L::kProbElems;

  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (p.H / p.Hk), i0 = int64_t{blockIdx.x} * kTile;
  const int rows = static_cast<int>(std::min<int64_t>(kTile, p.T - i0));
  const int64_t q_first = (b * p.T + i0) * p.H + h;
  const int64_t kv_first = b * p.S * p.Hk + hk;
  stage_tile<D>(q + q_first * D, p.H * D, rows, Qs);
  stage_tile<D>(dout + q_first * D, p.H * D, rows, dOs);
  stage_row_stats(lse, delta, q_first, p.H, rows, Ls, Ds);

  FragC dqa[D / kFrag];
SEQLAB_TC_UNROLL
  for (int n = 0; n < D / kFrag; ++n) wmma::fill_fragment(dqa[n], 0.f);
  const int64_t tile_key_end = p.causal ? i0 + rows + p.S - p.T : p.S;
  for (int64_t j0 = 0; j0 < tile_key_end; j0 += kTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kTile, tile_key_end - j0));
    __syncthreads();  // every warp is done with the previous K/V tile
    stage_tile<D>(k + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Ks);
    stage_tile<D>(v + (kv_first + j0 * p.Hk) * D, p.Hk * D, nk, Vs);
    __syncthreads();  // (the first time this also publishes Q, dO, lse and δ)

    product_abt<D>(Qs + warp * kFrag * kLdT<D>, Ks, Sw);    // S = Q_w K_tileᵀ
    product_abt<D>(dOs + warp * kFrag * kLdT<D>, Vs, dPw);  // dP = dO_w V_tileᵀ
    __syncwarp();
    // Element (query r of the warp's 16, key c of the tile): lane owns c = lane + 32·(u & 1).
    const int lim = clamp_offset(i0 + p.S - p.T + 1 - j0);  // key c visible to block row rr iff c < rr + lim
SEQLAB_TC_UNROLL
    for (int u = 0; u < 2 * kFrag; ++u) {
      const int r = u >> 1, c = lane + 32 * (u & 1), rr = warp * kFrag + r;
      const bool visible = rr < rows && c < nk && (!p.causal || c < rr + lim);
      const float pr = visible ? expf(p.scale * Sw[r * kLdS + c] - Ls[rr]) : 0.f;
      dSw[r * kLdP + c] = __float2bfloat16(pr * (dPw[r * kLdS + c] - Ds[rr]));
    }
    __syncwarp();
    product_ab_acc<D>(dqa, dSw, Ks);  // dQ_w += dS K_tile
  }
  write_acc<D>(dqa, p.scale, Sw, rows - warp * kFrag, dq + (q_first + warp * kFrag * p.H) * D, p.H * D);
#else
  __trap();
#endif
}

}  // namespace seqlab::cuda::attention_tc::kernels
