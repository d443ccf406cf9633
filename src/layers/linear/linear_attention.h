// Linear attention (Katharopoulos et al.) and Performer FAVOR+ random features, fused ops.
//
//   q, k [B, T, H, dk],  v [B, T, H, dv];  φ ∈ {elu+1, relu, identity} applied inside the op
//   S_t = S_{t−1} + φ(k_t)ᵀ v_t          S [B, H, dk, dv]   (S_0 = initial_state, or 0)
//   z_t = z_{t−1} + φ(k_t)               z [B, H, dk]       (z_0 = initial_normalizer, or 0)
//   o_t = φ(q_t) S_t / (φ(q_t)·z_t + eps)        (normalize = true)
//   o_t = φ(q_t) S_t                              (normalize = false: z does not enter o)
//   final_state = S_T, final_normalizer = z_T (always carried, so a layer can pass both on)
//
// Forms (all equal, each with its own hand-derived backward; docs/variants/linear_attention.md):
//   recurrent  — the step above, token by token (decoding: T = 1 from a given state);
//   chunkwise  — per chunk of C tokens: o = φQ S_prev + mask(φQ φKᵀ) V (and the same for the
//                normaliser with V → 1), then S += φKᵀ V; GEMMs at chunk level;
//   noncausal  — every query reads the whole sequence: o_t = φ(q_t) S_T / (φ(q_t)·z_T + eps),
//                i.e. φ(Q)(φ(K)ᵀV) normalised by φ(Q)·Σφ(K) (plus the initial state, if any).
// q is not scaled (a scale would cancel in the normalised form; a layer may scale q itself).
//
// Performer FAVOR+ (Choromanski et al.): performer_features(x, ω) = exp(ω_i·x − ‖x‖²/2 − s)/√m
// per row x [d] and feature i < m, with ω [m, d] from orthogonal_random_features. Then
// E[φ(q)·φ(k)] = exp(q·k) · exp(−s_q − s_k), so linear_attention on φ(q), φ(k) with
// feature_map = identity is Performer's approximation of softmax attention.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/slots/linear/linear_attention.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class FeatureMap { elu_plus_one, relu, identity };

struct LinearAttentionOptions {
  FeatureMap feature_map = FeatureMap::elu_plus_one;
  LinearAttentionForm form = LinearAttentionForm::chunkwise;
  bool normalize = true;
  double eps = 1e-6;
  int64_t chunk = 64;  // tokens per chunk of the chunkwise form
};

struct LinearAttentionOutput {
  Tensor o;                 // [B, T, H, dv]
  Tensor final_state;       // [B, H, dk, dv]
  Tensor final_normalizer;  // [B, H, dk]
};

// The fused op, differentiable in q, k, v, initial_state and initial_normalizer through all three
// outputs. The optional inputs may be undefined (zeros). Throws std::invalid_argument naming the
// shapes when they do not fit the layout above, or when eps < 0 or chunk ≤ 0.
LinearAttentionOutput linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& initial_state = Tensor(), const Tensor& initial_normalizer = Tensor(),
                                       const LinearAttentionOptions& = {});

// Parses "elu_plus_one" / "elu+1", "relu", "identity" and "chunkwise", "recurrent", "noncausal";
// throws std::invalid_argument listing the accepted names.
FeatureMap parse_feature_map(const std::string& name);
LinearAttentionForm parse_linear_attention_form(const std::string& name);

// ---- Performer FAVOR+ ----
// φ(x)_i = exp(ω_i·x − ‖x‖²/2 − s(x)) / √m for x [B, T, H, d], ω [m, d] → [B, T, H, m].
// s(x) = 0, or with `stabilize` s(x) = max_i ω_i·x per row (differentiated as the max: its
// gradient flows through the arg-max feature). A per-row s cancels in normalised linear attention
// when applied to queries; keys need s = 0 (or one shared constant), since a per-key factor would
// reweight the keys. Differentiable in x and ω (ω is not trained by Performer, but its gradient
// is exact and gradient-checked).
Tensor performer_features(const Tensor& x, const Tensor& omega, bool stabilize = false);

// m rows of dimension d: ⌈m/d⌉ blocks, each the d orthonormal rows of Gram–Schmidt applied to a
// d × d Gaussian matrix (the last block truncated), every row then scaled by an independent
// χ_d-distributed norm (the norm of a fresh Gaussian d-vector), so that each row is marginally
// N(0, I_d) while the rows of one block stay orthogonal. Deterministic given the generator's
// state; a layer redraws by reseeding. Throws std::invalid_argument when m ≤ 0 or d ≤ 0.
Tensor orthogonal_random_features(int64_t m, int64_t d, Generator& gen, DType dtype = DType::f32);

}  // namespace seqlab
