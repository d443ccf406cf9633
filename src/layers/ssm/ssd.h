// Mamba-2's state space duality (SSD, seed 000 §6.3), a fused op with a hand-derived backward.
//
//   x [B, T, H, P],  dt [B, T, H] (Δ ≥ 0),  A [H] (≤ 0),  B, C [B, T, G, N] (G groups, H a multiple of G),
//   D [H] (optional),  S₀ [B, H, P, N] (optional)
//   head h reads group g = h / (H/G) of B and C; a_t = exp(Δ_t A_h), a scalar per token and head
//   S_t = a_t S_{t−1} + Δ_t x_t B_tᵀ                 (S_t ∈ R^{P×N}, per batch entry and head)
//   y_t = S_t C_t + D_h x_t                           y [B, T, H, P],  final_state = S_T [B, H, P, N]
//
// The op takes Δ already computed (the mixer forms softplus(dt + dt_bias) with autograd primitives):
// the op's inputs are the recurrence's own quantities, so its forms, its gradient check and the op runner
// need no knowledge of how Δ is parametrised, and an elementwise softplus costs nothing beside the scan.
// A must be ≤ 0 and Δ ≥ 0 (every decay a_t ≤ 1): the kernels do not check values.
//
// Two forms, selected by SsdOptions::form, each with its own backward:
// - recurrent: the recurrence step by step (also the decode step: T = 1 from a given state). Its
//   backward walks time in reverse, recomputing the states from checkpoints every `chunk` steps.
// - chunkwise (training; the "dual" form): chunks of `chunk` tokens with in-chunk cumulative log-decays
//   c_r = Σ_{s ≤ r in chunk} Δ_s A. Inside a chunk the output is masked attention,
//   y = (L ∘ (C Bᵀ)) (Δ x) with L_rs = exp(c_r − c_s) for r ≥ s (0 above the diagonal); the state
//   entering the chunk adds exp(c_r) S C_r; the state leaving it is exp(c_last) S + Σ_s exp(c_last − c_s)
//   Δ_s x_s B_sᵀ. Every exponent is a difference taken in the direction of time (≤ 0), so nothing
//   overflows at any Δ. Its backward is chunkwise too: the states entering the chunks are recomputed,
//   then the chunks run in reverse with the gradient of the state leaving each.
// The derivations are in docs/variants/mamba2.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/slots/ssm/ssd.h"
#include "tensor/tensor.h"

namespace seqlab {

struct SsdOptions {
  SsdForm form = SsdForm::chunkwise;
  int64_t chunk = 64;  // tokens per chunk (recurrent form: steps between checkpointed states in the backward)
};

struct SsdOutput {
  Tensor y;            // [B, T, H, P]
  Tensor final_state;  // [B, H, P, N]
};

// The fused op, differentiable in every input through both outputs. Throws std::invalid_argument naming
// the shapes when they do not fit (H not a multiple of G included), or when chunk ≤ 0.
SsdOutput ssd(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
              const Tensor& D = Tensor(), const Tensor& initial_state = Tensor(), const SsdOptions& opts = {});

const char* ssd_form_name(SsdForm form);      // "chunkwise" / "recurrent"
SsdForm parse_ssd_form(const std::string& s);  // throws std::invalid_argument for anything else

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
SsdOutput ssd_forward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
                      const Tensor& D, const Tensor& initial_state, const SsdOptions& opts);
// dy and dfinal may be undefined (no gradient reached that output: zeros). `need` per input in the order
// x, dt, A, B, C, D, initial_state.
SsdGrads ssd_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                      const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                      const SsdOptions& opts, const std::vector<bool>& need);

}  // namespace kernel
}  // namespace seqlab
