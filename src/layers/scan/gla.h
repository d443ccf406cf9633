// Gated linear attention (GLA, seed 000 §7.1), a fused op with a hand-derived backward.
//
//   q, k, g [B, T, H, dk],  v [B, T, H, dv],  gv [B, T, H, dv] (optional),  S₀ [B, H, dk, dv] (optional)
//   α_t = exp(g_t) over dk, β_t = exp(gv_t) over dv (β = 1 without gv); g, gv are log-gates ≤ 0
//   S_t = (α_tᵀ β_t) ⊙ S_{t−1} + k_tᵀ v_t          (S_t ∈ R^{dk×dv}, per batch entry and head)
//   o_t = (scale · q_t) S_t                          o [B, T, H, dv],  final_state = S_T [B, H, dk, dv]
//
// Two forms, selected by GlaOptions::form, each with its own backward:
// - recurrent: the recurrence step by step (also the decode step: T = 1 from a given state). Its
//   backward walks time in reverse with dS_{t−1} = αβᵀ ⊙ dS_t, recomputing the states from
//   checkpoints every `chunk` steps, and takes dg_t, dgv_t as row and column sums of
//   dS_t ⊙ αβᵀ ⊙ S_{t−1}.
// - chunkwise (training): chunks of `chunk` tokens with in-chunk cumulative log-gates
//   b_t = Σ_{s ≤ t in chunk} g_s; the state enters through exp(b_t) and leaves through
//   exp(b_last − b_s); inside a chunk, query sub-chunks of `sub_chunk` tokens see earlier
//   sub-chunks through q ⊙ exp(b_t − b_ref) and k ⊙ exp(b_ref − b_s) with b_ref the gate sum just
//   before the query sub-chunk (both factors ≤ 1), and their own sub-chunk through the exact
//   pairwise exp(b_t − b_s), t ≥ s. No factor exceeds 1, so strong gates never overflow. Its
//   backward gets dg_t (dgv_t) as the sum of the terms of the pairs of a key s and a query r with
//   s < t ≤ r — grouped by chunk and sub-chunk into sums of products of factors ≤ 1, so that no
//   sum cancels at any gate strength (never as a difference of cumulative sums).
// The derivations are in docs/variants/gla.md.
#pragma once

#include <cstdint>
#include <tuple>
#include <string>
#include <vector>

#include "tensor/slots/scan/gla.h"
#include "tensor/tensor.h"

namespace seqlab {

struct GlaOptions {
  GlaForm form = GlaForm::chunkwise;
  int64_t chunk = 64;      // tokens per chunk (recurrent form: steps between checkpointed states in the backward)
  int64_t sub_chunk = 16;  // tokens per sub-chunk inside a chunk (chunkwise form)
  double scale = 0;        // 0: 1/√dk
};

struct GlaOutput {
  Tensor o;            // [B, T, H, dv]
  Tensor final_state;  // [B, H, dk, dv]
};

// The fused op, differentiable in every input through both outputs. q, k, g [B,T,H,dk]; v [B,T,H,dv];
// gv [B,T,H,dv] or undefined (β = 1); initial_state [B,H,dk,dv] or undefined (zeros). Throws
// std::invalid_argument naming the shapes when they do not fit, or when chunk / sub_chunk ≤ 0 or
// scale < 0.
GlaOutput gla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv = Tensor(),
              const Tensor& initial_state = Tensor(), const GlaOptions& opts = {});

const char* gla_form_name(GlaForm form);      // "chunkwise" / "recurrent"
GlaForm parse_gla_form(const std::string& s);  // throws std::invalid_argument for anything else

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
GlaOutput gla_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                      const Tensor& initial_state, const GlaOptions& opts);
// dout and dfinal may be undefined (no gradient reached that output: zeros). `need` per input in the
// order q, k, v, g, gv, initial_state.
GlaGrads gla_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& g, const Tensor& gv, const Tensor& initial_state, const GlaOptions& opts,
                      const std::vector<bool>& need);

}  // namespace kernel
}  // namespace seqlab
