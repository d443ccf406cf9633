#include "layers/basic.h"

#include "autograd/ops.h"
#include "tensor/kernels.h"

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

ShortConv::ShortConv(int64_t channels, int64_t kernel, Generator& gen)
    : channels_(channels),
      kernel_(kernel),
      // Start near the identity (the current token through, a little of the past) so a fresh layer
      // passes its inputs on.
      weight_(add_parameter("weight", [&] {
        Tensor w = Tensor::randn({kernel, channels}, gen, DType::f32, 0.02);
        kernel::fill_(kernel::narrow(w, 0, 0, 1), 1.0);
        return w;
      }(), ParamRole::matrix)) {}

Tensor ShortConv::forward(const Tensor& x, Tensor* conv_state) const {
  const int64_t B = x.shape()[0], T = x.shape()[1];
  Tensor past = conv_state != nullptr && conv_state->defined()
                    ? *conv_state
                    : Tensor::zeros({B, kernel_ - 1, channels_}, x.dtype(), x.device());
  Tensor padded = kernel_ > 1 ? concat({past, x}, 1) : x;  // [B, K−1+T, C]
  // y_t = Σ_j w_j ⊙ x_{t−j}: x_{t−j} sits at row t + K−1−j of `padded`.
  Tensor y;
  for (int64_t j = 0; j < kernel_; ++j) {
    Tensor term = mul(narrow(padded, 1, kernel_ - 1 - j, T), reshape(narrow(weight_, 0, j, 1), {channels_}));
    y = j == 0 ? term : add(y, term);
  }
  if (conv_state != nullptr) *conv_state = narrow(padded, 1, T, kernel_ - 1).detach();
  return y;
}

Tensor l2_normalize(const Tensor& x, double eps) { return mul(x, rsqrt(add(sum(square(x), {-1}, true), eps))); }

Tensor log_sigmoid(const Tensor& x) { return neg(softplus(neg(x))); }

}  // namespace seqlab
