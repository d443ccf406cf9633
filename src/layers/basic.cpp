#include "layers/basic.h"

#include "autograd/ops.h"

namespace seqlab {

Linear::Linear(int64_t in, int64_t out, bool bias, Generator& gen, double init_std)
    : weight_(add_parameter("weight", Tensor::randn({out, in}, gen, DType::f32, init_std), ParamRole::matrix)) {
  if (bias) bias_ = &add_parameter("bias", Tensor::zeros({out}), ParamRole::bias);
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight_, bias_ ? *bias_ : Tensor()); }
Tensor Linear::forward_gelu(const Tensor& x) const { return linear_gelu(x, weight_, bias_ ? *bias_ : Tensor()); }

Embedding::Embedding(int64_t vocab, int64_t dim, Generator& gen, double init_std)
    : weight_(add_parameter("weight", Tensor::randn({vocab, dim}, gen, DType::f32, init_std), ParamRole::embedding)) {}

Tensor Embedding::forward(const Tensor& index) const { return embedding(weight_, index); }

Norm::Norm(NormKind kind, int64_t dim, double eps)
    : kind_(kind), eps_(eps), weight_(add_parameter("weight", Tensor::ones({dim}), ParamRole::norm)) {
  if (kind == NormKind::layer_norm) bias_ = &add_parameter("bias", Tensor::zeros({dim}), ParamRole::norm);
}

Tensor Norm::forward(const Tensor& x) const {
  return kind_ == NormKind::layer_norm ? layer_norm(x, weight_, *bias_, eps_) : rms_norm(x, weight_, eps_);
}

AddNormResult Norm::add_forward(const Tensor& x, const Tensor& residual) const {
  if (!residual.defined()) return {x, forward(x)};
  return kind_ == NormKind::layer_norm ? add_layer_norm(x, residual, weight_, *bias_, eps_)
                                       : add_rms_norm(x, residual, weight_, eps_);
}

}  // namespace seqlab
