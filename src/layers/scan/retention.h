// RetNet retention (Sun et al. 2023, seed 000 §5.3), a fused op: linear attention with a constant
// per-head decay.
//
//   q, k [B, T, H, dk],  v [B, T, H, dv],  γ_h per head (default γ_h = 1 − 2^(−5−h)),  c = scale
//   S_n = γ_h S_{n−1} + k_nᵀ v_n           S [B, H, dk, dv],  S_{−1} = initial_state (or 0)
//   o_n = c q_n S_n                        o [B, T, H, dv],   final_state = S_{T−1}
//
// Forms (all equal, each with its own hand-derived backward; docs/variants/retention.md):
//   parallel   — o = (c Q Kᵀ ⊙ D) V + c diag(γ^(n+1)) Q S_0 with D_nm = γ^(n−m) for n ≥ m, else 0;
//                final_state = γ^T S_0 + Kᵀ diag(γ^(T−1−m)) V. O(T²) per (batch, head).
//   chunkwise  — the parallel form inside chunks of C tokens, the state between them:
//                o_r = c Σ_{s≤r} γ^(r−s) (q_r·k_s) v_s + c γ^(r+1) q_r S_prev,
//                S ← γ^L S_prev + Σ_s γ^(L−1−s) k_sᵀ v_s.
//   recurrent  — the step above, token by token (decoding: T = 1 from a given state).
// Only non-negative powers of γ appear anywhere, so γ near 0 or 1 (log γ from −20 to −1e-6) cannot
// overflow. The q/k rotation (xPos/RoPE), the group norm and the swish gate belong to the layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/slots/scan/retention.h"
#include "tensor/tensor.h"

namespace seqlab {

struct RetentionOptions {
  RetentionForm form = RetentionForm::chunkwise;
  int64_t chunk = 64;           // tokens per chunk of the chunkwise form
  double scale = 0;             // ≤ 0: 1/√dk
  std::vector<double> gammas;   // one per head in [0, 1]; empty: 1 − 2^(−5−h)
};

struct RetentionOutput {
  Tensor o;            // [B, T, H, dv]
  Tensor final_state;  // [B, H, dk, dv]
};

// The fused op, differentiable in q, k, v and initial_state (may be undefined: zeros) through both
// outputs. γ is a fixed option, not a tensor (RetNet does not train it). Throws
// std::invalid_argument naming the shapes when they do not fit the layout above, or when chunk ≤ 0
// or the gammas are not H values in [0, 1].
RetentionOutput retention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state = Tensor(),
                          const RetentionOptions& = {});

// RetNet's default decays γ_h = 1 − 2^(−5−h), h < H.
std::vector<double> retention_default_gammas(int64_t H);

// Parses "parallel", "chunkwise", "recurrent"; throws std::invalid_argument listing them.
RetentionForm parse_retention_form(const std::string& name);

}  // namespace seqlab
