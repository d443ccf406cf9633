// Kernel slots of the S4D state space op (the op: src/layers/ssm/s4.h; CPU kernels in
// src/layers/ssm/s4.cpp, CUDA kernels in src/cuda/ssm/s4.cu).
//
//   u, y [B, T, H],  log_dt [H],  A (Λ), B, C [H, N2, 2],  D [H],  initial_state, final_state [B, H, N2, 2]
//
// A complex number is a trailing pair (re, im); N2 = N/2 complex modes per channel.
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

// convolution: y = K * u with K_t = 2·Re(C Ā^t B̄), computed directly (O(T²) per channel);
// recurrent: x_t = Ā x_{t−1} + B̄ u_t step by step (the decode step and the reference).
enum class S4Form { convolution, recurrent };
// zoh: Ā = exp(ΔΛ), B̄ = (Ā − 1)/Λ · B;  bilinear: Ā = (1 + ΔΛ/2)/(1 − ΔΛ/2), B̄ = Δ/(1 − ΔΛ/2) · B.
enum class S4Discretisation { zoh, bilinear };

namespace kernel {

struct S4Params {
  S4Form form = S4Form::convolution;
  S4Discretisation disc = S4Discretisation::zoh;
};

struct S4Grads {
  Tensor du, dlog_dt, dA, dB, dC, dD, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(S4Grads& g) {  // see tensor/dispatch.h
  return std::tie(g.du, g.dlog_dt, g.dA, g.dB, g.dC, g.dD, g.dinitial_state);
}

// All tensors contiguous, one dtype, shapes as above; D and initial_state may be undefined (zero).
// The forward writes every element of y and final_state. The backward reads dy and dfinal (zero-filled
// when unused) and writes every element of du, dlog_dt, dA, dB, dC (always defined), and of dD and
// dinitial_state where defined.
SEQLAB_DECLARE_KERNEL(s4_forward_kernel,
                      void (*)(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B,
                               const Tensor& C, const Tensor& D, const Tensor& initial_state, const S4Params& p,
                               const Tensor& y, const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(s4_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt,
                               const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& D,
                               const Tensor& initial_state, const S4Params& p, const S4Grads& grads));

// The diagonal-plus-low-rank form (S4: Λ − P Q*, bilinear, a dense N2 × N2 Ā per channel):
// P, Q [H, N2, 2] besides the inputs above; the backward also writes dP, dQ.
struct S4DplrGrads {
  Tensor du, dlog_dt, dA, dP, dQ, dB, dC, dD, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(S4DplrGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.du, g.dlog_dt, g.dA, g.dP, g.dQ, g.dB, g.dC, g.dD, g.dinitial_state);
}
SEQLAB_DECLARE_KERNEL(s4_dplr_forward_kernel,
                      void (*)(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P,
                               const Tensor& Q, const Tensor& B, const Tensor& C, const Tensor& D,
                               const Tensor& initial_state, const S4Params& p, const Tensor& y,
                               const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(s4_dplr_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt,
                               const Tensor& A, const Tensor& P, const Tensor& Q, const Tensor& B, const Tensor& C,
                               const Tensor& D, const Tensor& initial_state, const S4Params& p,
                               const S4DplrGrads& grads));

}  // namespace kernel
}  // namespace seqlab
