// Differentiable primitive operations. Each records a node when an input requires grad; its
// backward is written right under its forward in src/autograd/ops_*.cpp. The raw kernels they
// run are in src/tensor/kernels.h.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "tensor/tensor.h"

namespace seqlab {

// ---- views and copies (ops_view.cpp) ----
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor to_dtype(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// ---- elementwise (ops_elementwise.cpp); binary ops broadcast like NumPy ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& x, double s);
Tensor mul(const Tensor& x, double s);
Tensor pow(const Tensor& x, double exponent);
Tensor rsub(const Tensor& x, double s);  // s − x
Tensor rdiv(const Tensor& x, double s);  // s / x
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation
Tensor relu(const Tensor& x);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor softplus(const Tensor& x);
// cond ≠ 0 ? a : b (cond of any dtype, not differentiated), broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);  // mask ≠ 0 → value

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& x, double s);
Tensor operator-(const Tensor& x, double s);
Tensor operator*(const Tensor& x, double s);
Tensor operator/(const Tensor& x, double s);
Tensor operator*(double s, const Tensor& x);

// ---- reductions (ops_reduce.cpp); empty dims = all dimensions ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // grad to the first max
Tensor cumsum(const Tensor& x, int64_t dim);

// ---- products (ops_matmul.cpp) ----
// a [..., M, K] @ b [..., K, N] with broadcast batch dimensions; b may be 2-D.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x Wᵀ + b for x [..., in], weight [out, in] (PyTorch's layout), bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// y = gelu(x Wᵀ + b) (tanh form), the GEMM and the GELU fused where the device can (kernel::linear):
// the same values as gelu(linear(x, weight, bias)) up to rounding of the pre-activation in bf16.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- softmax and losses (ops_softmax.cpp) ----
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
// Mean over targets ≠ ignore_index of −log softmax(logits)[target]; logits [..., V], targets [...].
// With weights [...] (shaped as targets): Σ w·ℓ / Σ w over the counted targets (0 when Σ w = 0);
// differentiable in logits and weights.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     const Tensor& weights = Tensor());

// ---- normalisation (ops_norm.cpp) over the last dimension ----
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// The residual add fused with the norm after it (a pre-norm block's x = x + f(·); h = norm(x)), in one
// pass over each row: sum = x + residual (the new residual stream) and y = norm(sum). x and residual
// have the same shape. Both outputs are differentiable: with ds and dy their incoming gradients,
// dx = dresidual = ds + dnorm(dy) at sum. The same bits as add followed by layer_norm / rms_norm.
struct AddNormResult {
  Tensor sum;  // x + residual
  Tensor y;    // norm(x + residual)
};
AddNormResult add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                             double eps = 1e-5);
AddNormResult add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps = 1e-6);

// ---- indexing and structure (ops_index.cpp) ----
Tensor embedding(const Tensor& weight, const Tensor& index);  // weight [V, C], index [...] → [..., C]
// Zeroes each element with probability p and scales survivors by 1/(1−p); identity when !training.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);

}  // namespace seqlab
