#include "layers/basic.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "layers/sequence_parallel.h"
#include "layers/ssm/conv1d.h"
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

ShortConv::ShortConv(int64_t channels, int64_t kernel, Generator& gen, ShortConvOptions opts)
    : kernel_(kernel),
      silu_(opts.silu),
      // Start near the identity (the current token through, a little of the past) so a fresh layer
      // passes its inputs on.
      weight_(add_parameter("weight", [&] {
        if (kernel < 1 || kernel > kMaxConv1dWidth) {
          throw std::invalid_argument("ShortConv: kernel size " + std::to_string(kernel) + " is not in 1 … " +
                                      std::to_string(kMaxConv1dWidth) + " (the causal_conv1d op's widths)");
        }
        Tensor w = Tensor::randn({kernel, channels}, gen, DType::f32, 0.02);
        kernel::fill_(kernel::narrow(w, 0, 0, 1), 1.0);
        return w;
      }(), ParamRole::matrix)) {
  if (opts.bias) bias_ = &add_parameter("bias", Tensor::zeros({channels}), ParamRole::bias);
}

Tensor ShortConv::forward(const Tensor& x, Tensor* conv_state) const {
  const Tensor past = conv_state != nullptr ? *conv_state : Tensor();  // undefined: zeros
  Conv1dOutput r = causal_conv1d(x, weight_, bias_ != nullptr ? *bias_ : Tensor(), past, silu_);
  if (conv_state != nullptr) *conv_state = r.final_state.detach();
  return r.y;
}

Tensor ShortConv::forward_sequence(const Tensor& x, const SequenceGroup& sp) const {
  const int64_t c = sequence_chunk_len(x.size(1), "ShortConv");
  const std::vector<Tensor> halo = sequence_halo(x, kernel_ - 1, sp);
  const Tensor bias = bias_ != nullptr ? *bias_ : Tensor();
  return concat({causal_conv1d(narrow(x, 1, 0, c), weight_, bias, halo[0], silu_).y,
                 causal_conv1d(narrow(x, 1, c, c), weight_, bias, halo[1], silu_).y},
                1);
}

Tensor l2_normalize(const Tensor& x, double eps) { return mul(x, rsqrt(add(sum(square(x), {-1}, true), eps))); }

Tensor log_sigmoid(const Tensor& x) { return neg(softplus(neg(x))); }

}  // namespace seqlab
