// The GLA token mixer (gated linear attention, seed 000 §7.1) around the `gla` op (gla.h):
//
//   q, k = x W_q, x W_k      v = x W_v                       per head: [B, T, H, D], D = C / H
//   g    = log σ(x W_g1 W_g2 + b_g) / τ                       log of α = σ(·)^(1/τ) over the key dim
//   o    = gla(q, k, v, g)                                    S_t = diag(α_t) S_{t−1} + k_tᵀ v_t, o_t = q_t S_t
//   y    = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o                per-head norm, swish output gate
//
// The low-rank gate (rank gate_rank) and the temperature τ keep α near 1 at initialisation, so the
// state forgets slowly at first.
#pragma once

#include "layers/mixer.h"

namespace seqlab {

class GlaLayer : public Mixer {
 public:
  GlaLayer(const MixerConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x, MixerState* state) const override;

 private:
  int64_t heads_, head_dim_, chunk_;
  double temperature_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& gate_down_;
  Linear& gate_up_;
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

}  // namespace seqlab
