// The Mamba selective scan (S6, seed 000 §6.2), a fused op with a hand-derived backward.
//
//   u, delta [B, T, D]  (D = d_inner channels),  A [D, N],  B, C [B, T, N],  D [D] (optional),
//   z [B, T, D] (optional),  delta_bias [D] (optional),  h₀ [B, D, N] (optional)
//   Δ_t   = softplus(delta_t + delta_bias)   (delta_softplus; else Δ_t = delta_t + delta_bias)
//   h_t   = exp(Δ_t A) ⊙ h_{t−1} + Δ_t u_t B_t          per channel d: h_t[d, :] ∈ R^N
//   y_t   = C_t · h_t + D ⊙ u_t                          per channel: Σ_n C_t[n] h_t[d, n] + D[d] u_t[d]
//   y_t  ← y_t ⊙ silu(z_t)                               with z
//   y [B, T, D],  final_state = h_{T−1} [B, D, N]
// A is meant to be negative (the mixer passes A = −exp(A_log)) and Δ ≥ 0, so that every decay
// exp(Δ A) is in (0, 1]: nothing grows, whatever Δ; a decay may underflow to 0, which is its value.
//
// Two forms, selected by SelectiveScanOptions::form, both the recurrence step by step on the CPU
// (each channel's state is N numbers: there is no chunk-sized matrix product to gain, unlike GLA):
// - chunked (training): the forward keeps only the state entering every chunk of `chunk` steps (saved
//   for the backward: B·⌈T/chunk⌉·D·N numbers instead of the B·T·D·N of every state); the backward
//   walks the chunks in reverse, recomputing each chunk's states from its checkpoint.
// - recurrent (decode: one token from a given state): keeps nothing; its backward re-runs the forward
//   to find the chunk checkpoints, then walks back as the chunked form does.
// The backward (docs/variants/mamba.md): with dh = ∂L/∂h_t, walking t = T−1 … 0,
//   dy'_t = dy_t ⊙ silu(z_t),  dz_t = dy_t ⊙ ŷ_t ⊙ silu'(z_t)      (ŷ_t the output before the gate)
//   dh   += dy'_t C_t,  dC_t += dy'_t h_t,  dD += dy'_t u_t,  du_t = D dy'_t + Δ_t Σ_n dh B_t
//   dΔ_t  = Σ_n dh ⊙ (A a_t h_{t−1} + u_t B_t),  dA += dh Δ_t a_t h_{t−1},  dB_t += dh Δ_t u_t
//   ddelta_t = dΔ_t σ(delta_t + delta_bias),  ddelta_bias += ddelta_t,   dh ← a_t ⊙ dh
// (a_t = exp(Δ_t A)), and d initial_state = dh at the end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/slots/ssm/selective_scan.h"
#include "tensor/tensor.h"

namespace seqlab {

struct SelectiveScanOptions {
  SelectiveScanForm form = SelectiveScanForm::chunked;
  int64_t chunk = 64;          // steps per chunk: the backward's checkpoint spacing
  bool delta_softplus = true;  // Δ = softplus(delta + delta_bias); false: Δ = delta + delta_bias
};

struct SelectiveScanOutput {
  Tensor y;            // [B, T, D]
  Tensor final_state;  // [B, D, N]
};

// The fused op, differentiable in every input through both outputs. Throws std::invalid_argument
// naming the shapes when they do not fit, or when chunk ≤ 0.
SelectiveScanOutput selective_scan(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                   const Tensor& C, const Tensor& D = Tensor(), const Tensor& z = Tensor(),
                                   const Tensor& delta_bias = Tensor(), const Tensor& initial_state = Tensor(),
                                   const SelectiveScanOptions& opts = {});

// The decay of the state over the tokens of delta [B, T, D]: exp(A ⊙ Σ_t Δ_t) [B, D, N], with Δ as the op
// forms it (softplus of delta + delta_bias when delta_softplus). Differentiable (autograd primitives):
// the transition of a segment for sequence parallelism by state passing.
Tensor selective_scan_decay(const Tensor& delta, const Tensor& A, const Tensor& delta_bias, bool delta_softplus);

const char* selective_scan_form_name(SelectiveScanForm form);      // "chunked" / "recurrent"
SelectiveScanForm parse_selective_scan_form(const std::string& s);  // throws std::invalid_argument otherwise

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots. The forward
// also returns the checkpoints in the chunked form (undefined in the recurrent form).
struct SelectiveScanRaw {
  Tensor y, final_state, checkpoints;
};
SelectiveScanRaw selective_scan_forward(const SelectiveScanInputs& in, const SelectiveScanOptions& opts);
// dy and dfinal may be undefined (zeros); checkpoints as the forward returned them (or undefined).
// `need` per input in the order u, delta, A, B, C, D, z, delta_bias, initial_state.
SelectiveScanGrads selective_scan_backward(const Tensor& dy, const Tensor& dfinal, const SelectiveScanInputs& in,
                                           const Tensor& checkpoints, const SelectiveScanOptions& opts,
                                           const std::vector<bool>& need);

}  // namespace kernel
}  // namespace seqlab
