// The linear-attention token mixer (Katharopoulos et al., seed 000 §5.1) around the
// `linear_attention` op (linear_attention.h):
//
//   q, k, v = x W_q, x W_k, x W_v                            per head: [B, T, H, D], D = C / H
//   o_t     = φ(q_t) S_t / (φ(q_t)·z_t + ε),  S_t = Σ_{s≤t} φ(k_s)ᵀ v_s,  z_t = Σ_{s≤t} φ(k_s)
//   y       = o W_o
//
// φ is the recipe's feature map: elu+1 (default), relu, identity, or performer — FAVOR+ positive
// orthogonal random features (Choromanski et al.), φ(x) = exp(ω_i·x' − ‖x'‖²/2)/√m with
// x' = x / D^(1/4), so that φ(q)·φ(k) estimates exp(q·k/√D), the softmax kernel. ω [m, D] (m =
// feature_count) is drawn once per layer from the model's initialisation seed and not trained; the
// same recipe and seed give the same ω, so checkpoints need not hold it.
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
  Tensor omega_;  // performer only: [m, D] random features
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& out_;
};

}  // namespace seqlab
