// S4D (Gu et al. 2022, "On the Parameterization and Initialization of Diagonal State Space Models"; seed
// 000 §6.1), a fused op with a hand-derived backward: H independent single-input single-output state
// space models, one per channel, each with N2 = N/2 complex modes (conjugate pairs dropped, hence 2·Re).
//
//   u [B, T, H],  Δ_h = exp(log_dt_h),  Λ = A [H, N2, 2] (Re Λ < 0),  B, C [H, N2, 2],  D [H] (optional)
//   continuous  x'(t) = Λ x(t) + B u(t),  y(t) = 2·Re(C x(t)) + D u(t)          (per channel h, per mode n)
//   zoh         Ā = exp(ΔΛ),                    B̄ = (Ā − 1)/Λ · B
//   bilinear    Ā = (1 + ΔΛ/2)/(1 − ΔΛ/2),      B̄ = Δ/(1 − ΔΛ/2) · B
//   discrete    x_t = Ā x_{t−1} + B̄ u_t,   y_t = 2·Re(Σ_n C_n x_{t,n}) + D u_t,   x_{−1} = initial_state
//   outputs     y [B, T, H],  final_state = x_{T−1} [B, H, N2, 2]
//
// Complex values are trailing (re, im) pairs everywhere (parameters, states, gradients). Two forms,
// selected by S4Options::form, each with its own backward (docs/variants/s4.md derives both):
// - convolution: y_t = Σ_{j ≤ t} K_j u_{t−j} + D u_t + 2·Re(Σ_n C_n Ā_n^{t+1} x_{−1,n}), the kernel
//   K_j = 2·Re(Σ_n C_n Ā_n^j B̄_n) built once per channel; the causal convolution is computed directly,
//   O(B·T²·H) (exact, no FFT round-off, and at the lengths trained here cheaper than writing a complex FFT).
// - recurrent: the scan above, token by token; the decode step (T = 1 from a state) and the reference.
// Only non-negative powers of Ā appear and |Ā| < 1 when Re Λ < 0, so no Δ (1e-4 … 10) overflows.
// The diagonal-plus-low-rank form of S4 (A = diag(Λ) − P Q*) is s4_dplr below: the same op with P, Q given.
//
// HiPPO-LegS (Gu et al. 2020/2021): the LegS matrix A_nk = −√(2n+1)√(2k+1) (n > k), −(n+1) (n = k), 0
// (n < k), its normal-plus-low-rank split A = S − P Pᵀ with P_n = √(n + ½) and S = −½ I + (skew-symmetric),
// and S's eigen-decomposition S = V Λ V* (conjugate pairs): S4D-LegS takes Λ's N/2 eigenvalues with
// positive imaginary part, and B = V* B_LegS (B_LegS,n = √(2n+1)) for those modes.
#pragma once

#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/slots/ssm/s4.h"
#include "tensor/tensor.h"

namespace seqlab {

struct S4Options {
  S4Form form = S4Form::convolution;
  S4Discretisation discretisation = S4Discretisation::zoh;
};

struct S4Output {
  Tensor y;            // [B, T, H]
  Tensor final_state;  // [B, H, N2, 2]
};

// The fused op, differentiable in every input through both outputs. u [B,T,H]; log_dt [H]; A, B, C
// [H,N2,2]; D [H] or undefined (no skip); initial_state [B,H,N2,2] or undefined (zeros). Throws
// std::invalid_argument naming the shapes when they do not fit.
S4Output s4(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
            const Tensor& D = Tensor(), const Tensor& initial_state = Tensor(), const S4Options& opts = {});

// The diagonal-plus-low-rank form of the same op (S4): A = diag(Λ) − P Q* with P, Q [H, N2, 2] (a rank-one
// correction per channel), discretised bilinearly into a dense Ā = (I − ΔA/2)⁻¹(I + ΔA/2), B̄ = Δ(I − ΔA/2)⁻¹ B;
// x_t = Ā x_{t−1} + B̄ u_t, y_t = 2·Re(C x_t) + D u_t, in both forms (convolution: K_j = 2·Re(C Ā^j B̄) by
// matrix-vector products, then the same direct causal convolution). O(N2²) per step: meant for small N.
// CPU and CUDA (src/cuda/ssm/s4.cu). Throws std::invalid_argument for zoh (which would need a matrix
// exponential) and for P, Q not both given or not shaped as A.
S4Output s4_dplr(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                 const Tensor& B, const Tensor& C, const Tensor& D = Tensor(), const Tensor& initial_state = Tensor(),
                 const S4Options& opts = {});

const char* s4_form_name(S4Form form);                        // "convolution" / "recurrent"
S4Form parse_s4_form(const std::string& s);                   // throws std::invalid_argument otherwise
const char* s4_discretisation_name(S4Discretisation d);       // "zoh" / "bilinear"
S4Discretisation parse_s4_discretisation(const std::string& s);

// ---- HiPPO-LegS ----

// The N×N LegS matrix (row-major): −√(2n+1)√(2k+1) below the diagonal, −(n+1) on it, 0 above.
std::vector<double> hippo_legs_matrix(int64_t N);

// LegS's normal-plus-low-rank form A = S − P Pᵀ and the eigen-decomposition of its normal part S:
// S = V diag(λ) V* over all N eigenvalues, which come in conjugate pairs; the first N/2 (positive
// imaginary part, ascending) and their unit eigenvectors are kept, the others are their conjugates.
struct HippoNplr {
  int64_t N = 0;
  std::vector<double> S;                     // [N, N] the normal part, −½ I + skew-symmetric
  std::vector<double> P;                     // [N] P_n = √(n + ½)
  std::vector<std::complex<double>> lambda;  // [N/2] eigenvalues of S, Re = −½, Im > 0 ascending
  std::vector<std::complex<double>> V;       // [N, N/2] their eigenvectors (column m for lambda[m]), orthonormal
};
// N even and ≥ 2; throws std::invalid_argument otherwise.
HippoNplr hippo_legs_nplr(int64_t N);

namespace kernel {

// Raw entry points: check shapes, make inputs contiguous, allocate outputs, call the slots.
S4Output s4_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
                    const Tensor& D, const Tensor& initial_state, const S4Options& opts);
// dy and dfinal may be undefined (zeros). `need` per input in the order u, log_dt, A, B, C, D,
// initial_state.
S4Grads s4_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                    const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                    const S4Options& opts, const std::vector<bool>& need);

S4Output s4_dplr_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                         const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                         const S4Options& opts);
// `need` per input in the order u, log_dt, A, P, Q, B, C, D, initial_state.
S4DplrGrads s4_dplr_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt,
                             const Tensor& A, const Tensor& P, const Tensor& Q, const Tensor& B, const Tensor& C,
                             const Tensor& D, const Tensor& initial_state, const S4Options& opts,
                             const std::vector<bool>& need);

}  // namespace kernel
}  // namespace seqlab
