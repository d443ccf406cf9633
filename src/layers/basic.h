// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, and the short causal convolution some
// mixers put before their op. Each is a thin module over differentiable ops of src/autograd/ops.h
// (the convolution: over the fused causal_conv1d op of layers/ssm/conv1d.h).
#pragma once

#include "autograd/ops.h"
#include "layers/module.h"

namespace seqlab {

// y = x Wᵀ + b; W [out, in] initialised N(0, init_std²), b zeros.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, Generator& gen, double init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  // gelu(x Wᵀ + b), the GEMM and the GELU fused (linear_gelu).
  Tensor forward_gelu(const Tensor& x) const;
  Tensor& weight() { return weight_; }

 private:
  Tensor& weight_;
  Tensor* bias_ = nullptr;
};

// y = W[index]; W [vocab, dim] initialised N(0, init_std²).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Generator& gen, double init_std = 0.02);
  Tensor forward(const Tensor& index) const;
  Tensor& weight() { return weight_; }

 private:
  Tensor& weight_;
};

enum class NormKind { layer_norm, rms_norm };

// LayerNorm (gain and bias) or RMSNorm (gain) over the last dimension; gains start at 1.
class Norm : public Module {
 public:
  Norm(NormKind kind, int64_t dim, double eps);
  Tensor forward(const Tensor& x) const;
  // The residual add before the norm, fused with it: sum = x + residual, y = norm(sum) (one pass,
  // add_layer_norm / add_rms_norm). With residual undefined, sum is x and y = forward(x).
  AddNormResult add_forward(const Tensor& x, const Tensor& residual) const;

 private:
  NormKind kind_;
  double eps_;
  Tensor& weight_;
  Tensor* bias_ = nullptr;
};

// Depthwise causal convolution over time, the `causal_conv1d` op (layers/ssm/conv1d.h):
// y_t = act(Σ_{j<K} w_j ⊙ x_{t−j} + b) (x_{<0} from the state, or 0), weights w [K, C] with 1 ≤ K ≤ 4,
// the bias b [C] and act = SiLU only when the options ask for them. `conv_state` (when not null) holds
// the last K−1 inputs, read before and replaced after (a decode step continues it).
struct ShortConvOptions {
  bool bias = false;  // a learned bias b [C], starting at 0
  bool silu = false;  // y = silu(conv(x)), fused into the op
};

class SequenceGroup;

class ShortConv : public Module {
 public:
  // Throws std::invalid_argument when kernel is not in 1 … 4 (kMaxConv1dWidth).
  ShortConv(int64_t channels, int64_t kernel, Generator& gen, ShortConvOptions opts = {});
  Tensor forward(const Tensor& x, Tensor* conv_state) const;
  // Under sequence parallelism: x [B, 2c, C] is a rank's two chunks (layers/sequence_parallel.h), each
  // convolved continuing the K − 1 inputs before it in the whole sequence (sequence_halo), from zeros
  // before the first chunk. The halo's gradient goes back to the ranks that hold those inputs.
  Tensor forward_sequence(const Tensor& x, const SequenceGroup& sp) const;
  int64_t kernel_size() const { return kernel_; }

 private:
  int64_t kernel_;
  bool silu_;
  Tensor& weight_;
  Tensor* bias_ = nullptr;
};

// x / √(Σ x² + eps) over the last dimension.
Tensor l2_normalize(const Tensor& x, double eps = 1e-6);
// log σ(x) = −softplus(−x), the log of a gate in (0, 1).
Tensor log_sigmoid(const Tensor& x);

}  // namespace seqlab
