// The device code of src/cuda/attention/attention.cu's FMA kernels (read that file's header comment first: what
// runs where, the tiling and the three backward launches), and their launch shapes. A header of its
// own, needing only CUDA's built-ins, so that tests/attention_emulation_test.cc runs these same
// kernels on the CPU over tests/cuda_emulation.h, launched with the same grids and shared memory.
//
// The includer defines SEQLAB_ATTENTION_SHARED_MEMORY(name), which declares `name` as the block's
// dynamic shared memory (unsigned char, at least 16-byte aligned): `extern __shared__` for nvcc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/block_reduce.cuh"
#include "cuda/device_common.cuh"

namespace seqlab::cuda::attention_fma {

using rows::exp_of;
using rows::log_of;

constexpr int kWarps = 4;
constexpr int kAttentionThreads = kWarps * 32;
constexpr int kMaxHeadDim = 128;
constexpr int kDimsPerLane = kMaxHeadDim / 32;  // dims d = lane + 32·k, k < 4
constexpr int kKeyTile = 32;                    // keys per staged tile in the forward and dQ (lane per key)

// Query rows per warp in the forward and dQ kernels, keys per warp in the dK/dV kernel, and query
// rows per staged tile there (fewer for f64: twice the registers and shared memory per element).
template <class A>
constexpr int kRowsPerWarp = sizeof(A) == 8 ? 2 : 4;
template <class A>
constexpr int kKeysPerWarp = sizeof(A) == 8 ? 2 : 4;
template <class A>
constexpr int kQueryTile = sizeof(A) == 8 ? 16 : 32;

template <class A>
__device__ __forceinline__ A warp_sum(A x) {
  SEQLAB_UNROLL
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
template <class A>
__device__ __forceinline__ A warp_max(A x) {
  SEQLAB_UNROLL
  for (int o = 16; o > 0; o >>= 1) {
    const A y = __shfl_xor_sync(0xffffffffu, x, o);
    x = y > x ? y : x;
  }
  return x;
}

// The keys one batch row's queries see. Query i < q_len sees keys j < key_end(i) =
// min(k_len, i + S − T + 1) when causal, else k_len; a padded query (i ≥ q_len) sees none. So key_end is
// nondecreasing over the real queries, and a key j ≥ k_len is seen by no query.
struct Limits {
  int64_t q_len, k_len, offset;  // offset = S − T: query i sits at key position i + offset
  bool causal;
  __device__ int64_t key_end(int64_t i) const {
    if (i >= q_len) return 0;
    return causal ? min(k_len, i + offset + 1) : k_len;
  }
  // The most keys any of the rows [i0, i0 + rows) sees: those of its last real row (0 without one).
  __device__ int64_t tile_key_end(int64_t i0, int64_t rows) const {
    const int64_t last = min(i0 + rows, q_len) - 1;
    return last < i0 ? 0 : key_end(last);
  }
};

// The call's sizes (attention.cu's geometry()): q [B, T, H, Dk], k [B, S, Hk, Dk], v [B, S, Hk, Dv],
// group = H / Hk query heads per kv head; row indices of the [.., H or Hk, D] tensors. The masks
// (AttentionMasks of src/tensor/slots/attention/attention.h): q_lengths and k_lengths [B] (i64, null
// when absent: every query or key is real); the bias [B or 1, H, T, S] is a kernel argument of its own
// (the element type), bias_batched saying which; dbias [B, H, T, S] always has B rows.
struct Geo {
  int64_t B, T, S, H, Hk, Dk, Dv, group;
  bool causal;
  const int64_t* q_lengths = nullptr;
  const int64_t* k_lengths = nullptr;
  bool bias_batched = false;
  __device__ int64_t q_row(int64_t b, int64_t i, int64_t h) const { return (b * T + i) * H + h; }
  __device__ int64_t kv_row(int64_t b, int64_t j, int64_t hk) const { return (b * S + j) * Hk + hk; }
  // Element offsets of row (b, h, i) of the bias and of dbias.
  __device__ int64_t bias_row(int64_t b, int64_t h, int64_t i) const {
    return (((bias_batched ? b : 0) * H + h) * T + i) * S;
  }
  __device__ int64_t dbias_row(int64_t b, int64_t h, int64_t i) const { return ((b * H + h) * T + i) * S; }
  // Batch row b's limits. The entry point has checked the lengths (0 ≤ q_len ≤ T, 0 ≤ k_len ≤ S); the clamp
  // only keeps a direct call of the slot with bad lengths inside the tensors.
  __device__ Limits limits(int64_t b) const {
    const int64_t ql = q_lengths ? min(max(q_lengths[b], int64_t{0}), T) : T;
    const int64_t kl = k_lengths ? min(max(k_lengths[b], int64_t{0}), S) : S;
    return {ql, kl, S - T, causal};
  }
};

// Copies rows [j0, j0 + n) of one kv head of x [B, S, Hk, D] into sh [kKeyTile][D + 1] (compute
// type; the padding keeps lane-per-row reads free of bank conflicts); rows past n are zeroed.
template <class T, class A>
__device__ void stage_keys(const Geo& g, const T* x, int64_t D, int64_t b, int64_t hk, int64_t j0, int64_t n, A* sh) {
  const int64_t ld = D + 1;
  for (int64_t e = threadIdx.x; e < kKeyTile * D; e += blockDim.x) {
    const int64_t c = e / D, d = e - c * D;
    sh[c * ld + d] = c < n ? convert<A>(x[g.kv_row(b, j0 + c, hk) * D + d]) : A(0);
  }
}

// One output row, lane owning dims d = lane + 32·t:  acc[t] += Σ_{c < n} w_c · tile[c·ld + d] for d < dims,
// where w_c is lane c's `w` (broadcast by shuffle). The forward's o += Σ_c p_c v_c and dQ's
// dq += Σ_c (scale·dS_c) k_c. Reads n rows of the shared tile; the whole warp calls it.
template <class A>
__device__ __forceinline__ void add_weighted_tile_rows(A (&acc)[kDimsPerLane], A w, const A* tile, int64_t ld,
                                                       int64_t dims, int64_t n, int lane) {
  for (int64_t c = 0; c < n; ++c) {
    const A wc = __shfl_sync(0xffffffffu, w, static_cast<int>(c));
    const A* row = tile + c * ld;
    SEQLAB_UNROLL
    for (int t = 0; t < kDimsPerLane; ++t) {
      const int64_t d = lane + 32 * t;
      if (d < dims) acc[t] += wc * row[d];
    }
  }
}

// Writes one output row held by a warp, lane owning dims d = lane + 32·t:  dst[d] = factor · acc[t] for
// d < dims, rounded to T. The forward's o = acc / ℓ and the backward's dK, dV and dQ rows.
template <class T, class A>
__device__ __forceinline__ void store_lane_row(T* dst, const A (&acc)[kDimsPerLane], A factor, int64_t dims, int lane) {
  SEQLAB_UNROLL
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int64_t d = lane + 32 * t;
    if (d < dims) dst[d] = convert<T>(acc[t] * factor);
  }
}

// Copies rows [i0, i0 + n) of one head of x [B, T, H, D] into sh [rows][D] (zeros past n).
template <class T, class A>
__device__ void stage_queries(const Geo& g, const T* x, int64_t D, int64_t b, int64_t h, int64_t i0, int64_t n,
                              int rows, A* sh) {
  for (int64_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int64_t r = e / D, d = e - r * D;
    sh[e] = r < n ? convert<A>(x[g.q_row(b, i0 + r, h) * D + d]) : A(0);
  }
}

// Forward. Block (tile, h, b) owns query rows i0 .. i0 + 4·RPW − 1 of head h; warp w owns rows
// w·RPW .. w·RPW + RPW − 1 of the tile. Per row, over the key tiles the tile's last real row sees (keys
// past k_len and the tiles beyond the causal limit are never staged):
//   s_c = scale q_i·k_c + bias_ic (lane c; −∞ beyond key_end(i)),  m' = max(m, max_c s_c),
//   ℓ ← ℓ e^{m − m'} + Σ_c e^{s_c − m'},  o ← o e^{m − m'} + Σ_c e^{s_c − m'} v_c,  m ← m'
// then o_i = o / ℓ, lse_i = m + log ℓ; a row that saw no key (padding, k_len = 0, or −∞ bias on every
// key it sees) keeps ℓ = 0 and gets o_i = 0, lse_i = −∞. `bias` is null or [B or 1, H, T, S]. Shared:
// Q tile [4·RPW][Dk], K tile [32][Dk+1], V tile [32][Dv+1]. Reads q once, k and v once per query tile,
// the bias once; writes o and lse once.
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_fwd(Geo g, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ bias, compute_t<T> scale, T* __restrict__ o, compute_t<T>* __restrict__ lse) {
  using A = compute_t<T>;
  constexpr int RPW = kRowsPerWarp<A>, BR = kWarps * RPW;
  SEQLAB_ATTENTION_SHARED_MEMORY(smem_raw);
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* Ks = Qs + BR * g.Dk;
  A* Vs = Ks + kKeyTile * (g.Dk + 1);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / g.group;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BR, rows = min(static_cast<int64_t>(BR), g.T - i0);
  const Limits lim = g.limits(b);
  stage_queries(g, q, g.Dk, b, h, i0, rows, BR, Qs);

  A m[RPW], l[RPW], acc[RPW][kDimsPerLane];
  SEQLAB_UNROLL
  for (int rr = 0; rr < RPW; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0;
    SEQLAB_UNROLL
    for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] = 0;
  }
  const int64_t tile_key_end = lim.tile_key_end(i0, rows);
  for (int64_t j0 = 0; j0 < tile_key_end; j0 += kKeyTile) {
    const int64_t nk = min(static_cast<int64_t>(kKeyTile), tile_key_end - j0);
    __syncthreads();  // the previous tile's readers are done (and, the first time, nothing to wait for)
    stage_keys(g, k, g.Dk, b, hk, j0, nk, Ks);
    stage_keys(g, v, g.Dv, b, hk, j0, nk, Vs);
    __syncthreads();
    SEQLAB_UNROLL
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr;
      if (r >= rows) continue;                                 // warp-uniform
      const int64_t seen = min(nk, lim.key_end(i0 + r) - j0);  // keys of this tile the row sees (may be ≤ 0)
      A s = -INFINITY;
      if (lane < seen) {
        const A* qr = Qs + r * g.Dk;
        const A* kc = Ks + lane * (g.Dk + 1);
        A dot = 0;
        for (int64_t d = 0; d < g.Dk; ++d) dot += qr[d] * kc[d];
        s = scale * dot;
        if (bias) s += convert<A>(bias[g.bias_row(b, h, i0 + r) + j0 + lane]);
      }
      const A tile_max = warp_max(s);
      if (tile_max > m[rr]) {  // rescale what was summed against the old max (0 on the first tile)
        const A rescale = exp_of(m[rr] - tile_max);
        l[rr] *= rescale;
        SEQLAB_UNROLL
        for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] *= rescale;
        m[rr] = tile_max;
      }
      // While every score the row has seen is −∞ (a bias of −∞), m is −∞ too and nothing is added.
      const A p = lane < seen && m[rr] != -INFINITY ? exp_of(s - m[rr]) : A(0);
      l[rr] += warp_sum(p);
      add_weighted_tile_rows(acc[rr], p, Vs, g.Dv + 1, g.Dv, max(seen, static_cast<int64_t>(0)), lane);
    }
  }
  SEQLAB_UNROLL
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr;
    if (r >= rows) continue;
    const int64_t row = g.q_row(b, i0 + r, h);
    const bool saw = l[rr] > 0;
    store_lane_row(o + row * g.Dv, acc[rr], saw ? A(1) / l[rr] : A(0), g.Dv, lane);
    if (lane == 0) lse[row] = saw ? m[rr] + log_of(l[rr]) : -INFINITY;
  }
}

// δ_r = Σ_d dO_rd O_rd − dlse_r for every row r < n of [n, Dv]; one warp per row, lanes striding
// over d, then a warp sum. Reads dO and O once; writes δ (compute type) once.
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_delta(int64_t n, int64_t Dv, const T* __restrict__ dout, const T* __restrict__ out,
                    const compute_t<T>* __restrict__ dlse, compute_t<T>* __restrict__ delta) {
  using A = compute_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < n; r += warps_total) {
    A dot = 0;
    for (int64_t d = lane; d < Dv; d += 32) dot += convert<A>(dout[r * Dv + d]) * convert<A>(out[r * Dv + d]);
    dot = warp_sum(dot);
    if (lane == 0) delta[r] = dot - dlse[r];
  }
}

// dK/dV. Block (tile, hk, b) owns keys j0 .. j0 + 4·KPW − 1 of kv head hk; warp w owns keys
// j0 + w·KPW + kk, holding k_j and v_j (lane owns dims lane + 32t) and the accumulators. For every
// query head h of the group and every real query row i that sees key j (j < key_end(i)):
//   s = scale q_i·k_j + bias_ij,  P = exp(s − lse_i) (0 when lse_i = −∞: the row saw nothing),
//   dP = dO_i·v_j,  dS = P (dP − δ_i),  dV_j += P dO_i,  dK_j += scale dS q_i
// (the two dots are warp sums). Query rows are staged QT at a time, from the first that sees the block's
// first key up to q_len (none when the whole block is padding, j0 ≥ k_len): Q [QT][Dk], dO [QT][Dv],
// lse and δ [QT]. Writes each requested dK/dV row once (zeros for keys no query sees).
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dkdv(Geo g, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ dout, const T* __restrict__ bias, const compute_t<T>* __restrict__ lse,
                   const compute_t<T>* __restrict__ delta, compute_t<T> scale, T* __restrict__ dk, T* __restrict__ dv) {
  using A = compute_t<T>;
  constexpr int KPW = kKeysPerWarp<A>, BK = kWarps * KPW, QT = kQueryTile<A>;
  SEQLAB_ATTENTION_SHARED_MEMORY(smem_raw);
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* dOs = Qs + QT * g.Dk;
  A* Ls = dOs + QT * g.Dv;
  A* Ds = Ls + QT;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * BK;
  const int64_t nk = min(static_cast<int64_t>(BK), g.S - j0);
  const Limits lim = g.limits(b);

  A kr[KPW][kDimsPerLane], vr[KPW][kDimsPerLane], dka[KPW][kDimsPerLane], dva[KPW][kDimsPerLane];
  SEQLAB_UNROLL
  for (int kk = 0; kk < KPW; ++kk) {
    const int64_t c = warp * KPW + kk;
    SEQLAB_UNROLL
    for (int t = 0; t < kDimsPerLane; ++t) {
      const int64_t d = lane + 32 * t;
      kr[kk][t] = c < nk && d < g.Dk ? convert<A>(k[g.kv_row(b, j0 + c, hk) * g.Dk + d]) : A(0);
      vr[kk][t] = c < nk && d < g.Dv ? convert<A>(v[g.kv_row(b, j0 + c, hk) * g.Dv + d]) : A(0);
      dka[kk][t] = 0;
      dva[kk][t] = 0;
    }
  }
  // The query rows that may see these keys: [i_first, i_end). i_first is the first that sees key j0
  // (every later real query sees it too); none when key j0 (and so every key of the block) is padding.
  const int64_t i_first = g.causal ? max(static_cast<int64_t>(0), j0 - (g.S - g.T)) : 0;
  const int64_t i_end = j0 < lim.k_len ? lim.q_len : 0;
  for (int64_t h = hk * g.group; h < (hk + 1) * g.group; ++h) {
    for (int64_t i0 = i_first - i_first % QT; i0 < i_end; i0 += QT) {
      const int64_t rows = min(static_cast<int64_t>(QT), i_end - i0);
      __syncthreads();
      stage_queries(g, q, g.Dk, b, h, i0, rows, QT, Qs);
      stage_queries(g, dout, g.Dv, b, h, i0, rows, QT, dOs);
      for (int r = threadIdx.x; r < QT; r += blockDim.x) {
        Ls[r] = r < rows ? convert<A>(lse[g.q_row(b, i0 + r, h)]) : A(0);
        Ds[r] = r < rows ? delta[g.q_row(b, i0 + r, h)] : A(0);
      }
      __syncthreads();
      SEQLAB_UNROLL
      for (int kk = 0; kk < KPW; ++kk) {
        const int64_t c = warp * KPW + kk;
        if (c >= nk) continue;  // warp-uniform
        const int64_t j = j0 + c;
        for (int64_t r = 0; r < rows; ++r) {
          if (j >= lim.key_end(i0 + r)) continue;  // the row does not see this key (uniform)
          const A* qr = Qs + r * g.Dk;
          const A* dor = dOs + r * g.Dv;
          A s = 0, dp = 0;
          SEQLAB_UNROLL
          for (int t = 0; t < kDimsPerLane; ++t) {
            const int64_t d = lane + 32 * t;
            if (d < g.Dk) s += qr[d] * kr[kk][t];
            if (d < g.Dv) dp += dor[d] * vr[kk][t];
          }
          s = scale * warp_sum(s);
          if (bias) s += convert<A>(bias[g.bias_row(b, h, i0 + r) + j]);
          dp = warp_sum(dp);
          const A p = Ls[r] == -INFINITY ? A(0) : exp_of(s - Ls[r]);
          const A ds = p * (dp - Ds[r]);
          SEQLAB_UNROLL
          for (int t = 0; t < kDimsPerLane; ++t) {
            const int64_t d = lane + 32 * t;
            if (d < g.Dv) dva[kk][t] += p * dor[d];
            if (d < g.Dk) dka[kk][t] += scale * ds * qr[d];
          }
        }
      }
    }
  }
  SEQLAB_UNROLL
  for (int kk = 0; kk < KPW; ++kk) {
    const int64_t c = warp * KPW + kk;
    if (c >= nk) continue;
    const int64_t row = g.kv_row(b, j0 + c, hk);
    if (dk) store_lane_row(dk + row * g.Dk, dka[kk], A(1), g.Dk, lane);
    if (dv) store_lane_row(dv + row * g.Dv, dva[kk], A(1), g.Dv, lane);
  }
}

// dQ and dbias. The forward's geometry: block (tile, h, b), warp w owns RPW query rows, key/value tiles of
// 32 staged in shared memory up to the tile's last real row's key_end. Per row and key tile, lane c
// computes for key c
//   s = scale q_i·k_c + bias_ic,  P = exp(s − lse_i) (0 when lse_i = −∞),  dP = dO_i·v_c,
//   dS_c = P (dP − δ_i)   (0 beyond key_end(i), so 0 on every padded row)
// and then dQ_i += scale Σ_c dS_c k_c with lane owning dims lane + 32t, and dbias_ic = dS_c (∂s/∂bias = 1).
// dq or dbias may be null (not asked for). Shared: Q [BR][Dk], dO [BR][Dv], K [32][Dk+1], V [32][Dv+1].
// Writes each dQ row once, and every element of each dbias row once: lane c for the keys of the visited
// tiles, zeros for the keys after them.
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dq(Geo g, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 const T* __restrict__ dout, const T* __restrict__ bias, const compute_t<T>* __restrict__ lse,
                 const compute_t<T>* __restrict__ delta, compute_t<T> scale, T* __restrict__ dq,
                 T* __restrict__ dbias) {
  using A = compute_t<T>;
  constexpr int RPW = kRowsPerWarp<A>, BR = kWarps * RPW;
  SEQLAB_ATTENTION_SHARED_MEMORY(smem_raw);
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* dOs = Qs + BR * g.Dk;
  A* Ks = dOs + BR * g.Dv;
  A* Vs = Ks + kKeyTile * (g.Dk + 1);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / g.group;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BR, rows = min(static_cast<int64_t>(BR), g.T - i0);
  const Limits lim = g.limits(b);
  stage_queries(g, q, g.Dk, b, h, i0, rows, BR, Qs);
  stage_queries(g, dout, g.Dv, b, h, i0, rows, BR, dOs);

  A lse_r[RPW], delta_r[RPW], acc[RPW][kDimsPerLane];
  SEQLAB_UNROLL
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr;
    lse_r[rr] = r < rows ? convert<A>(lse[g.q_row(b, i0 + r, h)]) : A(0);
    delta_r[rr] = r < rows ? delta[g.q_row(b, i0 + r, h)] : A(0);
    SEQLAB_UNROLL
    for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] = 0;
  }
  const int64_t tile_key_end = lim.tile_key_end(i0, rows);
  for (int64_t j0 = 0; j0 < tile_key_end; j0 += kKeyTile) {
    const int64_t nk = min(static_cast<int64_t>(kKeyTile), tile_key_end - j0);
    __syncthreads();
    stage_keys(g, k, g.Dk, b, hk, j0, nk, Ks);
    stage_keys(g, v, g.Dv, b, hk, j0, nk, Vs);
    __syncthreads();
    SEQLAB_UNROLL
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr;
      if (r >= rows) continue;  // warp-uniform
      const int64_t seen = min(nk, lim.key_end(i0 + r) - j0);
      A ds = 0;
      if (lane < seen) {
        const A *qr = Qs + r * g.Dk, *kc = Ks + lane * (g.Dk + 1);
        const A *dor = dOs + r * g.Dv, *vc = Vs + lane * (g.Dv + 1);
        A s = 0, dp = 0;
        for (int64_t d = 0; d < g.Dk; ++d) s += qr[d] * kc[d];
        for (int64_t d = 0; d < g.Dv; ++d) dp += dor[d] * vc[d];
        A x = scale * s;
        if (bias) x += convert<A>(bias[g.bias_row(b, h, i0 + r) + j0 + lane]);
        const A p = lse_r[rr] == -INFINITY ? A(0) : exp_of(x - lse_r[rr]);
        ds = p * (dp - delta_r[rr]);
      }
      if (dq) add_weighted_tile_rows(acc[rr], scale * ds, Ks, g.Dk + 1, g.Dk, max(seen, static_cast<int64_t>(0)), lane);
      if (dbias && lane < nk) dbias[g.dbias_row(b, h, i0 + r) + j0 + lane] = convert<T>(ds);
    }
  }
  SEQLAB_UNROLL
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr;
    if (r >= rows) continue;
    if (dq) store_lane_row(dq + g.q_row(b, i0 + r, h) * g.Dk, acc[rr], A(1), g.Dk, lane);
    if (dbias) {  // the keys after the visited tiles: no row of the tile sees them
      T* dbr = dbias + g.dbias_row(b, h, i0 + r);
      for (int64_t j = tile_key_end + lane; j < g.S; j += 32) dbr[j] = convert<T>(A(0));
    }
  }
}

// ---- launch shapes (attention.cu's launchers and the emulation test) -------------------------------
// Every kernel runs kAttentionThreads threads per block; A is the compute type (compute_t<T>).

struct LaunchShape {
  dim3 grid;
  size_t shared_bytes;  // dynamic shared memory per block
};

// attention_fwd: one block per (tile of 4·RPW query rows, query head, batch); Q, K and V tiles.
template <class A>
LaunchShape forward_shape(const Geo& g) {
  constexpr int BR = kWarps * kRowsPerWarp<A>;
  return {dim3(static_cast<unsigned>((g.T + BR - 1) / BR), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B)),
          sizeof(A) * static_cast<size_t>(BR * g.Dk + kKeyTile * (g.Dk + 1) + kKeyTile * (g.Dv + 1))};
}

// attention_delta: one warp per row of n, at most 65535 blocks (the kernel's loop strides over the rest).
inline unsigned delta_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kWarps - 1) / kWarps, 65535));
}

// attention_dkdv: one block per (tile of 4·KPW keys, kv head, batch); Q and dO tiles, lse and δ.
template <class A>
LaunchShape dkdv_shape(const Geo& g) {
  constexpr int BK = kWarps * kKeysPerWarp<A>, QT = kQueryTile<A>;
  return {dim3(static_cast<unsigned>((g.S + BK - 1) / BK), static_cast<unsigned>(g.Hk), static_cast<unsigned>(g.B)),
          sizeof(A) * static_cast<size_t>(QT * (g.Dk + g.Dv + 2))};
}

// attention_dq: the forward's grid; Q, dO, K and V tiles.
template <class A>
LaunchShape dq_shape(const Geo& g) {
  constexpr int BR = kWarps * kRowsPerWarp<A>;
  return {dim3(static_cast<unsigned>((g.T + BR - 1) / BR), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B)),
          sizeof(A) * static_cast<size_t>(BR * (g.Dk + g.Dv) + kKeyTile * (g.Dk + 1) + kKeyTile * (g.Dv + 1))};
}

}  // namespace seqlab::cuda::attention_fma
