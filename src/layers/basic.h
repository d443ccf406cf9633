// The basic layers: Linear, Embedding, LayerNorm, RMSNorm. Each is a thin module over one
// differentiable op of src/autograd/ops.h.
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

}  // namespace seqlab
