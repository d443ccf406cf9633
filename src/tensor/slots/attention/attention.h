// Kernel slots of fused softmax attention (the op: src/layers/attention/attention.h). The CPU kernels
// live in the op's room (src/layers/attention/attention.cpp), the CUDA kernels in
// src/cuda/attention/attention.cu; both register here.
//
//   q [B, T, H, Dk],  k [B, S, Hk, Dk],  v [B, S, Hk, Dv],  o [B, T, H, Dv],  lse [B, T, H]
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab::kernel {

// Options with the scale resolved (> 0) and the block validated, as the kernels receive them.
struct AttentionParams {
  bool causal = true;
  double scale = 1;
  int64_t block = 64;
};

// What masks the scores of one call besides causality, each optional (undefined: absent), contiguous, on the
// inputs' device:
//   q_lengths [B] i64  query rows i >= q_lengths[b] are padding: their o row is 0, their lse -inf, and no
//                      gradient flows into or out of them (dout, dlse of those rows are ignored).
//   k_lengths [B] i64  keys j >= k_lengths[b] are padding: no query sees them (on top of the causal limit).
//   bias [Bb, H, T, S] additive bias in q's dtype, Bb = 1 (shared by every batch row) or B:
//                      s_ij = scale * q_i . k_j + bias[b or 0, h, i, j].
// A row that sees no key at all (k_lengths[b] = 0, or every key it may see is padding) gets o = 0 and
// lse = -inf, never NaN, and zero gradients into q, k, v and bias from that row.
struct AttentionMasks {
  Tensor q_lengths, k_lengths, bias;
};
inline auto tensor_fields(AttentionMasks& m) { return std::tie(m.q_lengths, m.k_lengths, m.bias); }

struct AttentionGrads {
  Tensor dq, dk, dv;  // undefined where not asked for
  Tensor dbias;       // [B, H, T, S] (always per batch row; the entry point sums over b when bias had Bb = 1);
                      // undefined where not asked for
};
inline auto tensor_fields(AttentionGrads& g) { return std::tie(g.dq, g.dk, g.dv, g.dbias); }

// All tensors contiguous, one dtype (lse and dlse: its accumulate_dtype; the lengths: i64), shapes as above;
// except that the CPU kernels also take q, k, v, dq, dk, dv whose tokens hold their heads × D contiguously
// (strides [·, ·, D, 1], e.g. head splits of one projection), which the entry points pass on the CPU. The
// forward writes every element of o and lse. The backward reads dout [B, T, H, Dv] and dlse [B, T, H] (zeros when
// unused) and writes every element of each defined gradient in `grads`; undefined ones are skipped.
SEQLAB_DECLARE_KERNEL(attention_forward_kernel,
                      void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMasks& masks,
                               const AttentionParams& p, const Tensor& o, const Tensor& lse));
SEQLAB_DECLARE_KERNEL(attention_backward_kernel,
                      void (*)(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                               const Tensor& v, const AttentionMasks& masks, const Tensor& o, const Tensor& lse,
                               const AttentionParams& p, const AttentionGrads& grads));

}  // namespace seqlab::kernel
