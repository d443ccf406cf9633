// Sums over a row in interleaved lanes, for the CPU kernels' reductions.
//
// lane_sum<Acc>(n, term) = Σ_{i < n} term(i), as kSumLanes partial sums (lane l takes the terms
// i ≡ l mod kSumLanes) added in a fixed tree at the end. One running sum is a chain of dependent adds
// that the compiler may not reorder, so it stays scalar (and `#pragma omp simd reduction` is not
// vectorised by GCC 12 inside the kernels' parallel regions); independent lanes are vectorised, and
// the order of the additions is fixed by n alone: not by the thread count or the vector width.
#pragma once

#include <cstdint>

namespace seqlab {

constexpr int kSumLanes = 8;

template <class Acc, class Term>
inline Acc lane_sum(int64_t n, Term&& term) {
  Acc acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) acc[l] += term(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += term(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The tree in which `dot` (tensor/blas_rows.h) and the softmax rows (tensor/softmax_rows.h) add their
// eight partial sums, each the sum of the entries ≡ l mod 8 with any tail in sum 0 (lane_sum above
// spreads its tail over the lanes and adds neighbours first).
template <class A>
inline A dot_tree(const A* s) {
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

}  // namespace seqlab
