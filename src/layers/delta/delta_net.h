// DeltaNet and Gated DeltaNet: one fused op, the gate being an optional input.
//
//   q, k [B, T, H, dk],  v [B, T, H, dv],  beta [B, T, H],  g [B, T, H] (optional, g = log α ≤ 0)
//   per (batch, head), rows q_t, k_t (1 × dk), v_t (1 × dv), state S_t (dk × dv), c = scale:
//     DeltaNet:        S_t = S_{t−1} + β_t k_tᵀ (v_t − k_t S_{t−1}) = (I − β_t k_tᵀ k_t) S_{t−1} + β_t k_tᵀ v_t
//     Gated DeltaNet:  S_t = α_t (I − β_t k_tᵀ k_t) S_{t−1} + β_t k_tᵀ v_t,   α_t = exp(g_t)
//     o_t = c q_t S_t                                      (c = 1/√dk unless `scale` > 0)
//   S_0 = initial_state [B, H, dk, dv] (zeros when absent);  outputs o [B, T, H, dv], final_state = S_T.
//
// β_t ∈ (0, 1) is the write strength; the delta rule writes only the prediction error v_t − k_t S_{t−1}
// (seeds 000 §7.4, 002). Keys are expected L2-normalised (the DeltaNet layer normalises them, so that
// I − β kᵀk is a contraction); the op itself is exact for any keys, and is tested with normalised ones.
// Every output is differentiable in every input, including beta, g and initial_state.
//
// Two forms, each with its own hand-derived backward, equal to rounding:
// - recurrent: the recurrence above, step by step (T = 1 from a given state is the decode step);
// - chunkwise: chunks of C tokens; inside a chunk the product of the (I − β kᵀk) factors is folded
//   into the UT / WY representation: with b_i the cumulative log-gate inside the chunk, γ_i = e^{b_i},
//     A_ij = β_i e^{b_i − b_j} k_i·k_j (j < i),  𝒯 = (I + A)⁻¹ diag(β)   (a unit lower-triangular solve)
//     δ = 𝒯 (V − diag(γ) K S_0) = U − W S_0,   U = 𝒯 V (pseudo values),  W = 𝒯 diag(γ) K
//     O = c diag(γ) Q S_0 + c (Q Kᵀ ⊙ M) δ,    M_ij = e^{b_i − b_j} (j ≤ i), 0 above
//     S_C = γ_C S_0 + Kᵀ diag(e^{b_C − b_j}) δ
//   Only ratios e^{b_i − b_j} with i ≥ j (≤ 1) are formed, so log-gates near −∞ cannot overflow.
// The derivations (forward and backward, through the triangular solve) are in docs/variants/delta_net.md.
#pragma once

#include <cstdint>
#include <tuple>
#include <string>

#include "tensor/slots/delta/delta_net.h"
#include "tensor/tensor.h"

namespace seqlab {

struct DeltaNetOptions {
  DeltaNetForm form = DeltaNetForm::chunkwise;
  int64_t chunk = 64;  // tokens per chunk (chunkwise); states checkpointed every `chunk` steps (recurrent backward)
  double scale = 0;    // 0: 1/√dk (any value ≤ 0 means the default)
};

struct DeltaNetOutput {
  Tensor o;            // [B, T, H, dv]
  Tensor final_state;  // [B, H, dk, dv]
};

// The fused op. g undefined: DeltaNet; initial_state undefined: S_0 = 0. Throws std::invalid_argument
// naming the shapes when they do not fit the layout above, or when chunk ≤ 0.
DeltaNetOutput delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                         const Tensor& g = Tensor(), const Tensor& initial_state = Tensor(),
                         const DeltaNetOptions& opts = {});

// "chunkwise" / "recurrent" (the registry's `form` attribute); parse throws on anything else.
const char* delta_net_form_name(DeltaNetForm form);
DeltaNetForm parse_delta_net_form(const std::string& name);

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
DeltaNetOutput delta_net_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                                 const Tensor& initial_state, const DeltaNetOptions& opts);
// `dfinal_state` may be undefined (no gradient reached final_state).
DeltaNetGrads delta_net_backward(const Tensor& dout, const Tensor& dfinal_state, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& beta, const Tensor& g, const Tensor& initial_state,
                                 const DeltaNetOptions& opts);

}  // namespace kernel
}  // namespace seqlab
