// The RetNet token mixer (multi-scale retention, seed 000 §5.3) around the `retention` op (retention.h):
//
//   q, k = RoPE(x W_q), RoPE(x W_k)      v = x W_v            per head: [B, T, H, D], D = C / H
//   o    = retention(q, k, v)                                 S_n = γ_h S_{n−1} + k_nᵀ v_n, o_n = q_n S_n
//   y    = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o                per-head (group) norm, swish gate
//
// γ_h = 1 − 2^(−5−h): each head forgets at its own rate ("multi-scale"). The rotation makes the
// score of positions n, m depend on n − m (RetNet's xPos-style relative position).
#pragma once

#include "layers/mixer.h"

namespace seqlab {

class RetNetLayer : public Mixer {
 public:
  RetNetLayer(const MixerConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x, MixerState* state) const override;

 private:
  int64_t heads_, head_dim_, chunk_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

}  // namespace seqlab
