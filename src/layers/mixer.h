// Token mixers for RecurrentLm: the layer around a recurrent op (projections, gates, short
// convolution, per-head norm, output gate), one per variant (gla_layer.h, retnet_layer.h,
// linear_attention_layer.h, delta_net_layer.h), and the pieces they share.
//
// A mixer maps x [B, T, C] to [B, T, C]. Training runs the op's chunkwise form from a zero state.
// Decoding passes a MixerState: the op continues from the state it holds (the recurrent form for one
// token, the chunkwise form with an initial state for a prompt — the forms are equal) and the state
// is replaced by the op's final state.
#pragma once

#include <cstdint>

#include "layers/basic.h"
#include "layers/module.h"

namespace seqlab {

// Everything a mixer carries from one decoding call to the next (undefined until the first call).
struct MixerState {
  Tensor state;       // [B, H, dk, dv] the recurrence's matrix state
  Tensor normalizer;  // [B, H, dk] linear attention's z
  Tensor conv;        // [B, K−1, C'] the last inputs of a short convolution
  int64_t position = 0;
};

struct MixerConfig {
  int64_t d_model = 0, n_heads = 0;
  int64_t chunk = 64;               // chunk size of the chunkwise forms
  int64_t gate_rank = 16;           // GLA: rank of the gate projection
  double gate_temperature = 16;     // GLA: α = σ(·)^(1/τ)
  int64_t conv_size = 4;            // DeltaNet: short causal convolution over q, k, v
  std::string feature_map = "elu+1";  // linear attention: elu+1, relu, identity, performer
  int64_t feature_count = 64;       // linear attention with performer: random features m
  bool gated = false;               // DeltaNet: Gated DeltaNet (a decay α per token and head)
  double norm_eps = 1e-5, init_std = 0.02;
};

class Mixer : public Module {
 public:
  // x [B, T, C] → [B, T, C]; `state` null in training, else continued and replaced.
  virtual Tensor forward(const Tensor& x, MixerState* state) const = 0;
};

// Depthwise causal convolution over time: y_t = Σ_{j<K} w_j ⊙ x_{t−j} (x_{<0} from the state, or 0),
// weights w [K, C]. Composed of differentiable primitives (shifted narrows); `conv_state` (when not
// null) holds the last K−1 inputs, read before and replaced after.
class ShortConv : public Module {
 public:
  ShortConv(int64_t channels, int64_t kernel, Generator& gen);
  Tensor forward(const Tensor& x, Tensor* conv_state) const;

 private:
  int64_t channels_, kernel_;
  Tensor& weight_;
};

// x / √(Σ x² + eps) over the last dimension.
Tensor l2_normalize(const Tensor& x, double eps = 1e-6);
// log σ(x) = −softplus(−x), the log of a gate in (0, 1).
Tensor log_sigmoid(const Tensor& x);

}  // namespace seqlab
