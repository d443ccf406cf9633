// The linear-attention token mixer (Katharopoulos et al., seed 000 §5.1) around the
// `linear_attention` op (linear_attention.h):
//
//   q, k, v = x W_q, x W_k, x W_v                            per head: [B, T, H, D], D = C / H
//   o_t     = φ(q_t) S_t / (φ(q_t)·z_t + ε),  S_t = Σ_{s≤t} φ(k_s)ᵀ v_s,  z_t = Σ_{s≤t} φ(k_s)
//   y       = o W_o
//
// φ is the recipe's feature map (elu+1 by default, relu, identity).
#pragma once

#include "layers/mixer.h"

namespace seqlab {

class LinearAttentionLayer : public Mixer {
 public:
  LinearAttentionLayer(const MixerConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x, MixerState* state) const override;

 private:
  int64_t heads_, head_dim_, chunk_;
  std::string feature_map_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& out_;
};

}  // namespace seqlab
