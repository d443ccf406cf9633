// The DeltaNet and Gated DeltaNet token mixers (seed 000 §7.4, 002) around the `delta_net` op
// (delta_net.h):
//
//   q, k, v = silu(ShortConv(x W_q | x W_k | x W_v))          a causal depthwise convolution of K taps
//   q, k    = q / ‖q‖, k / ‖k‖ per head                        L2-normalised: the delta rule stays stable
//   β       = σ(x W_β)                     [B, T, H]           the write strength
//   g       = log σ(x W_a + b_a) / τ       [B, T, H]           Gated DeltaNet only: the decay α = exp(g)
//   S_t     = α_t (I − β_t k_tᵀ k_t) S_{t−1} + β_t k_tᵀ v_t,   o_t = q_t S_t
//   y       = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o
#pragma once

#include "layers/mixer.h"

namespace seqlab {

class DeltaNetLayer : public Mixer {
 public:
  DeltaNetLayer(const MixerConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x, MixerState* state) const override;

 private:
  int64_t heads_, head_dim_, chunk_;
  double temperature_;
  Linear& qkv_;
  ShortConv& conv_;
  Linear& beta_;
  Linear* decay_ = nullptr;  // Gated DeltaNet
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

}  // namespace seqlab
