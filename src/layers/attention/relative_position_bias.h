// T5's relative position bias: one learned scalar per (bucket, head), looked up by the bucket of each
// query–key distance, added to the attention scores (attention.h's `bias`; Bb = 1, shared by the batch).
//
//   table [NB, H] (NB = num_buckets)  →  bias [1, H, T, S],  bias[0, h, i, j] = table[bucket(rel_ij), h]
//   rel_ij = j − (i + S − T)          (query i sits at key position i + S − T, as in attention.h)
//
//   bidirectional: nb = NB / 2,  bucket = (rel > 0 ? nb : 0) + f(|rel|, nb)
//   causal:        nb = NB,      bucket = f(max(−rel, 0), nb)
//   f(n, nb) = n                                                                   if n < max_exact = nb / 2
//            = min(nb − 1, max_exact + ⌊log(n / max_exact) / log(max_distance / max_exact) · (nb − max_exact)⌋)
//
// Half of a direction's buckets are exact distances, the other half log-spaced up to max_distance; every
// distance beyond shares the last bucket. The log expression is evaluated in float32 as T5 (Mesh TensorFlow)
// and Hugging Face transformers evaluate it, so a table trained there indexes the same buckets here. Causal
// bucketing gives every key after the query (rel > 0) bucket 0, like rel = 0: the causal mask hides them.
//
// The bucket depends on i and j only through the diagonal d = j − i, so the backward sums dbias along
// each diagonal first and then the diagonals of each bucket:
//   dtable[n, h] = Σ_{d: bucket(d − (S − T)) = n} Σ_i dbias[0, h, i, i + d]
// deterministically (no scatter, no atomics). The math is in docs/variants/attention.md.
#pragma once

#include <cstdint>

#include "tensor/slots/attention/relative_position_bias.h"
#include "tensor/tensor.h"

namespace seqlab {

struct RelativePositionOptions {
  bool bidirectional = true;
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
};

// table [NB, H] -> [1, H, T, S], differentiable in table. Throws std::invalid_argument naming the shape or
// option when table is not [num_buckets, H] of a floating dtype, when T or S is not in [1, 2^31), when
// num_buckets leaves no exact bucket (< 4 bidirectional, < 2 causal), or when max_distance ≤ max_exact.
Tensor relative_position_bias(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts);
// The bucketing, for tests: the bucket of rel = j − (i + S − T). Throws like relative_position_bias for
// options it refuses.
int64_t relative_position_bucket(int64_t rel, const RelativePositionOptions& opts);

// The naive form: the [T, S] bucket indices gathered from the table by the embedding op (whose backward,
// a scatter-add, gives the table's gradient), permuted to [1, H, T, S]. For tests and comparisons.
Tensor relative_position_bias_reference(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts);

namespace kernel {

// Raw entry points: check, make contiguous, allocate, call the slots. The backward takes dbias [1, H, T, S]
// and returns dtable [num_buckets, H].
Tensor relative_position_bias_forward(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts);
Tensor relative_position_bias_backward(const Tensor& dbias, int64_t T, int64_t S, const RelativePositionOptions& opts);

}  // namespace kernel
}  // namespace seqlab
