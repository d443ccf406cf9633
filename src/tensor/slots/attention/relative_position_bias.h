// Kernel slots of T5's relative position bias (the op: src/layers/attention/relative_position_bias.h). The CPU
// kernels live in the op's room (src/layers/attention/relative_position_bias.cpp), the CUDA kernels in
// src/cuda/attention/; both register here.
//
//   table [NB, H] (NB = num_buckets),  bias [1, H, T, S]
//
// Both kernels take contiguous tensors of one dtype and write every element of their output.
#pragma once

#include <cstdint>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab::kernel {

// T5's bucketing, as published: for query i (at key position i + S - T) and key j, rel = j - (i + S - T).
//   bidirectional: nb = num_buckets / 2; bucket = (rel > 0 ? nb : 0) + f(|rel|, nb)
//   causal:        nb = num_buckets;     bucket = f(max(-rel, 0), nb)
//   f(n, nb) = n                                                       if n < nb/2 (= max_exact)
//            = min(nb - 1, max_exact + int(log(n / max_exact) / log(max_distance / max_exact) * (nb - max_exact)))
//   with the log expression evaluated in float32 exactly as T5 (and Hugging Face transformers) do.
struct RelativePositionParams {
  bool bidirectional = true;
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
  int64_t T = 0, S = 0;  // queries and keys
};
// table [NB, H] -> bias [1, H, T, S]: bias[0, h, i, j] = table[bucket(i, j), h].
SEQLAB_DECLARE_KERNEL(relative_position_bias_forward_kernel,
                      void (*)(const Tensor& table, const RelativePositionParams& p, const Tensor& bias));
// dbias [1, H, T, S] -> dtable [NB, H]: dtable[b, h] = sum over (i, j) with bucket(i, j) = b of dbias[0, h, i, j].
// Deterministic (no atomics): first sum each diagonal d = j - i (the bucket depends only on it), then each
// bucket's diagonals.
SEQLAB_DECLARE_KERNEL(relative_position_bias_backward_kernel,
                      void (*)(const Tensor& dbias, const RelativePositionParams& p, const Tensor& dtable));

}  // namespace seqlab::kernel
