// The causal depthwise convolution over time (the short convolution of Mamba, Mamba-2 and DeltaNet),
// a fused op with a hand-derived backward.
//
//   x [B, T, C],  weight w [W, C] (row j multiplies x_{t−j}),  bias b [C] (optional),
//   initial_state [B, W−1, C] (optional: zeros), the W − 1 inputs before x_0, oldest first
//   z_t = Σ_{j<W} w_j ⊙ x_{t−j}  (+ b),   x_{t−j} for t − j < 0 read from initial_state[W−1+t−j]
//   y_t = silu(z_t) = z_t σ(z_t) when `silu`, else z_t                   y [B, T, C]
//   final_state = the last W − 1 inputs of initial_state ++ x                [B, W−1, C]
//                 (reaching into initial_state when T < W − 1)
//
// One form: the convolution is its own recurrent form — the state is the W − 1 inputs it still
// needs — so a decode step is the op at T = 1 with the previous call's final_state, and a sequence
// split anywhere and run piece by piece from the carried state gives the whole sequence's outputs.
//
// Arithmetic: z_t is summed in the order j = 0, 1, …, W − 1, each product w_j x_{t−j} rounded to the
// dtype before its add (no fused multiply-add), and the bias added last: exactly the rounding of
// the composition of primitive mul and add ops that ShortConv used before this op, so models that
// were trained with it compute the same values to the last bit in f32.
//
// Backward (docs/variants/conv1d.md), with p = initial_state ++ x [B, W−1+T, C] the padded input
// (p_{W−1+t} = x_t) and dz_t = dy_t ⊙ act'(z_t) (silu: σ(z)(1 + z(1 − σ(z))); identity: 1):
//   dp_u = Σ_{j<W, 0 ≤ u−(W−1)+j < T} w_j ⊙ dz_{u−(W−1)+j}  (+ dfinal_{u−T} for u ≥ T)
//   dx_t = dp_{W−1+t},  dinitial_state_i = dp_i,  dw_j = Σ_{b,t} dz_t ⊙ p_{W−1+t−j},  db = Σ_{b,t} dz_t
// z is recomputed in the backward (W multiply-adds per element), so the op saves only its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/slots/ssm/conv1d.h"
#include "tensor/tensor.h"

namespace seqlab {

struct Conv1dOutput {
  Tensor y;            // [B, T, C]
  Tensor final_state;  // [B, W−1, C]
};

// The fused op, differentiable in x, weight, bias and initial_state through both outputs. Throws
// std::invalid_argument naming the shapes when they do not fit, or naming the width when W is not in
// 1 … kMaxConv1dWidth.
Conv1dOutput causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                           bool silu);

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
Conv1dOutput conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                            bool silu);
// dy and dfinal may be undefined (no gradient reached that output: zeros). `need` per input in the
// order x, weight, bias, initial_state.
Conv1dGrads conv1d_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& initial_state, bool silu, const std::vector<bool>& need);

}  // namespace kernel
}  // namespace seqlab
