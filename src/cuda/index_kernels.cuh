// The device code of src/cuda/index.cu (read its header comment first): the functors its grid-stride
// loops run for the embedding gather, the embedding backward (sort input, bucket starts, per-row sums),
// the max backward's scatter and the cumulative sums, and the bit range of the backward's radix sort.
// A header of its own, needing only CUDA's built-ins, so that tests/index_emulation_test.cc runs
// these same functors on the CPU over tests/cuda_emulation.h, with the same launch shape. (max_rows is
// in reduce_rows_kernels.cuh.)
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::indexing {

// ---- embedding -----------------------------------------------------------------------------------

// out[t, j] = weight[index[t], j]   weight [V, C], index [N], out [N, C]: one thread per output element;
// reads N·C weights (rows in any order) and N indices (cached across the row), writes N·C.
template <class T, class I>
struct EmbeddingFn {
  const T* weight;
  const I* index;
  T* out;
  int64_t c;
  __device__ void operator()(int64_t i) const {
    const int64_t t = i / c, j = i - t * c;
    out[i] = weight[static_cast<int64_t>(index[t]) * c + j];
  }
};

// keys[t] = index[t] as i32, positions[t] = t: the sort's input. Reads and writes N values each.
template <class I>
struct SortInputFn {
  const I* index;
  int32_t* keys;
  int32_t* positions;
  __device__ void operator()(int64_t t) const {
    keys[t] = static_cast<int32_t>(index[t]);
    positions[t] = static_cast<int32_t>(t);
  }
};

// The radix sort of keys in [0, v) orders by bits [0, end_bit) only: the smallest end_bit ≥ 1 with
// 2^end_bit ≥ v (at most 31, the keys being non-negative i32).
inline int sort_end_bit(int64_t v) {
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) < v) ++end_bit;
  return end_bit;
}

// start[u] = the first k with sorted[k] ≥ u (lower bound; start[V] = N): bucket u of the sorted keys is
// [start[u], start[u + 1]). One thread per u ≤ V, log2 N reads of the sorted keys each.
struct BucketStartFn {
  const int32_t* sorted;
  int32_t* start;
  int64_t n;
  __device__ void operator()(int64_t u) const {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < u) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    start[u] = static_cast<int32_t>(lo);
  }
};

// dweight[u, j] = Σ_{k ∈ [start[u], start[u+1])} dy[order[k], j], summed in k order (increasing token
// position) in f32 (f64 for f64). One thread per element of dweight [V, C]: a warp reads whole rows of
// dy, coalesced; every dy row is read once, dweight written once.
template <class T>
struct EmbeddingGradFn {
  const T* dy;
  const int32_t* order;
  const int32_t* start;
  T* dweight;
  int64_t c;
  __device__ void operator()(int64_t i) const {
    const int64_t u = i / c, j = i - u * c;
    compute_t<T> acc = 0;
    for (int32_t k = start[u]; k < start[u + 1]; ++k) acc += convert<compute_t<T>>(dy[int64_t{order[k]} * c + j]);
    dweight[i] = convert<T>(acc);
  }
};

// ---- the max backward ----------------------------------------------------------------------------

// dx[r, index[r]] = dy[r] for a dx [outer, inner] the caller zeroed: one thread per row, one read of
// dy and index and one write each.
template <class T>
struct ScatterRowsFn {
  const T* dy;
  const int64_t* index;
  T* dx;
  int64_t inner;
  __device__ void operator()(int64_t r) const { dx[r * inner + index[r]] = dy[r]; }
};

// ---- cumulative sums -----------------------------------------------------------------------------

// out[o, j, i] = Σ_{j' ≤ j} x[o, j', i] (j' ≥ j when reverse) for x [outer, n, inner]: thread p owns
// column (o, i) = (p / inner, p % inner) and runs down its n elements, accumulating in f32 (f64 for
// f64) in the CPU's order. Neighbouring threads take neighbouring i, so reads and writes are coalesced
// when inner is large; each element is read and written once.
template <class T>
struct CumsumFn {
  const T* x;
  T* out;
  int64_t n, inner;
  bool reverse;
  __device__ void operator()(int64_t p) const {
    const int64_t base = (p / inner) * n * inner + p % inner;
    compute_t<T> acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t at = base + (reverse ? n - 1 - s : s) * inner;
      acc += convert<compute_t<T>>(x[at]);
      out[at] = convert<T>(acc);
    }
  }
};

}  // namespace seqlab::cuda::indexing
