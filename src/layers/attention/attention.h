// Fused scaled dot-product (softmax) attention, causal or bidirectional, with grouped KV heads.
//
//   q [B, T, H, Dk],  k [B, S, Hk, Dk],  v [B, S, Hk, Dv],  H divisible by Hk
//   s_ij = scale · q_i · k_j          (query head h reads kv head h / (H/Hk))
//   lse_i = log Σ_{j visible} exp(s_ij),   o_i = Σ_{j visible} exp(s_ij − lse_i) v_j
//   o [B, T, H, Dv],  lse [B, T, H]   (lse in f32 for bf16 inputs: accumulate_dtype)
//
// Query i sits at key position i + S − T, so a block of new queries against a longer KV cache
// needs no offset; with `causal` it sees keys j ≤ i + S − T. The fused op never forms a T×S
// matrix: the forward streams key blocks through an online softmax and saves only lse; the
// backward recomputes P tile by tile from it. Both outputs are differentiable (ring attention
// merges partial results by lse). The math is written out in docs/variants/attention.md.
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/slots/attention/attention.h"
#include "tensor/tensor.h"

namespace seqlab {

struct AttentionOptions {
  bool causal = true;
  double scale = 0;    // ≤ 0: 1/√Dk
  int64_t block = 64;  // keys per tile (and query rows per parallel task)
};

struct AttentionOutput {
  Tensor o;    // [B, T, H, Dv]
  Tensor lse;  // [B, T, H], accumulate_dtype of the inputs' (f32 for bf16)
};

// The fused op (differentiable in q, k, v through both outputs). Throws std::invalid_argument
// naming the shapes when they do not fit the layout above, or when causal attention has more
// queries than keys (T > S would place queries before the first key).
AttentionOutput attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& opts = {});
inline Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {}) {
  return attention_with_lse(q, k, v, opts).o;
}

// The naive form: materialises softmax(Q Kᵀ · scale + mask) V over [B, H, T, S] with primitive
// autograd ops (so its gradients come from their backward passes). For tests and comparisons.
AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale = 0);

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts);
// `dlse` may be undefined (no gradient reached lse).
AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionOptions& opts,
                                  bool need_dq, bool need_dk, bool need_dv);

}  // namespace kernel
}  // namespace seqlab
