#include "layers/mixer.h"

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

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
