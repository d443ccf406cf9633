// Fused scaled dot-product (softmax) attention, causal or bidirectional, with grouped KV heads,
// key padding, query padding and an additive bias.
//
//   q [B, T, H, Dk],  k [B, S, Hk, Dk],  v [B, S, Hk, Dv],  H divisible by Hk
//   bias [Bb, H, T, S], Bb = 1 or B (optional),  q_lengths, k_lengths [B] (optional)
//   s_ij = scale · q_i · k_j + bias[b or 0, h, i, j]   (query head h reads kv head h / (H/Hk))
//   V(i) = { j < k_lengths[b] } ∩ { j ≤ i + S − T if causal },  empty when i ≥ q_lengths[b]
//   lse_i = log Σ_{j ∈ V(i)} exp(s_ij),   o_i = Σ_{j ∈ V(i)} exp(s_ij − lse_i) v_j
//   o [B, T, H, Dv],  lse [B, T, H]   (lse in f32 for bf16 inputs: accumulate_dtype)
//
// A row with V(i) empty (a padded query, or k_lengths[b] = 0) gets o_i = 0 and lse_i = −∞, never NaN, and
// passes no gradient in either direction: its dout and dlse are ignored, and it adds nothing to dq, dk, dv
// or dbias.
//
// Query i sits at key position i + S − T, so a block of new queries against a longer KV cache
// needs no offset; with `causal` it sees keys j ≤ i + S − T. The fused op never forms a T×S
// matrix: the forward streams key blocks through an online softmax and saves only lse; the
// backward recomputes P tile by tile from it (only dbias, when asked for, is [B, H, T, S]). Both
// outputs are differentiable (ring attention merges partial results by lse). The math is written
// out in docs/variants/attention.md.
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
  // ({} so that the brace-initialised options of existing callers, {causal, scale, block}, draw no warning.)
  Tensor q_lengths{};  // [B] i32 or i64 (converted to i64), values in [0, T]; undefined: every query valid
  Tensor k_lengths{};  // [B] i32 or i64, values in [0, S]; undefined: every key valid
};

struct AttentionOutput {
  Tensor o;    // [B, T, H, Dv]
  Tensor lse;  // [B, T, H], accumulate_dtype of the inputs' (f32 for bf16)
};

// The fused op (differentiable in q, k, v and bias through both outputs; the lengths are never
// differentiated). bias [1 or B, H, T, S] (undefined: none) has q's dtype and device; the lengths
// may be on any device (they are copied to q's). Throws std::invalid_argument naming the shapes when
// they do not fit the layout above, when a length is out of range, or when causal attention has more
// queries than keys (T > S would place queries before the first key).
AttentionOutput attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& opts = {}, const Tensor& bias = Tensor());
inline Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {},
                        const Tensor& bias = Tensor()) {
  return attention_with_lse(q, k, v, opts, bias).o;
}

// The naive form: materialises softmax(Q Kᵀ · scale + bias + mask) V over [B, H, T, S] with primitive
// autograd ops (so its gradients come from their backward passes), rows that see no key set to
// o = 0, lse = −∞ by masked fills (which pass them no gradient). For tests and comparisons.
AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                    const Tensor& bias = Tensor());
// The same without lengths or bias: attention_reference(q, k, v, {causal, scale}).
AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale = 0);

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, convert the lengths, allocate outputs, call
// the slots. `bias` may be undefined.
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                  const Tensor& bias = Tensor());
// `dlse` may be undefined (no gradient reached lse). dbias (when `need_dbias`, which needs `bias`) has
// bias's shape: summed over the batch when bias is shared by every batch row (Bb = 1).
AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionOptions& opts,
                                  bool need_dq, bool need_dk, bool need_dv, const Tensor& bias = Tensor(),
                                  bool need_dbias = false);

}  // namespace kernel
}  // namespace seqlab
