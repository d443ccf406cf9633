// Matrix products.
#include <stdexcept>
#include <string>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

// Y = A B (batched, broadcasting);  dA = Σ_broadcast dY Bᵀ,  dB = Σ_broadcast Aᵀ dY
Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::matmul(a, b);
  record("matmul", {a, b}, {&y}, {a, b}, [](const Grads& g, const Grads& s, const Needs& need) {
    const Tensor &dy = g[0], &A = s[0], &B = s[1];
    Tensor da, db;
    if (need[0]) da = kernel::sum_to(kernel::matmul(dy, B, false, true), A.shape());
    if (need[1]) {
      if (B.dim() == 2) {
        // Shared weight: fold every batch row into one GEMM, dB = A_flatᵀ dY_flat.
        const int64_t k = A.size(-1), n = dy.size(-1);
        db = kernel::matmul(kernel::reshape(A, {-1, k}), kernel::reshape(dy, {-1, n}), true, false);
      } else {
        db = kernel::sum_to(kernel::matmul(A, dy, true, false), B.shape());
      }
    }
    return Grads{da, db};
  });
  return y;
}

namespace {

void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) {
    throw std::invalid_argument(std::string(op) + ": input " + shape_str(x.shape()) + " does not match weight " +
                                shape_str(weight.shape()) + " ([out, in])");
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    throw std::invalid_argument(std::string(op) + ": bias " + shape_str(bias.shape()) + " for weight " +
                                shape_str(weight.shape()));
  }
}

// The gradients of y = x Wᵀ + b from dy over the rows (dy [N, out], rows = x as [N, in]):
// dx = dy W (in x's shape), dW = dyᵀ x, db = 1ᵀ dy; each only where needed.
Grads linear_grads(const Tensor& dy, const Tensor& rows, const Tensor& weight, const Shape& x_shape,
                   const Needs& need) {
  Tensor dx, dw, db;
  if (need[0]) dx = kernel::view(kernel::matmul(dy, weight), x_shape);
  if (need[1]) dw = kernel::matmul(dy, rows, true, false);
  if (need[2]) {
    // db = 1ᵀ dy as a GEMV: a column sum over dy's contiguous rows, where kernel::sum would first copy dy
    // transposed.
    const Tensor ones = Tensor::ones({1, dy.size(0)}, dy.dtype(), dy.device());
    db = kernel::view(kernel::matmul(ones, dy), {dy.size(1)});
  }
  return Grads{dx, dw, db};
}

Shape with_last(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace

// y = x Wᵀ + b over rows x_r = x[..., :];  dx = dy W,  dW = Σ_r dy_rᵀ x_r,  db = Σ_r dy_r
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear", x, weight, bias);
  const int64_t out = weight.size(0);
  Tensor rows = kernel::reshape(x, {-1, weight.size(1)});
  // The bias added by the GEMM (its epilogue on CUDA, β = 1 onto a copy of b elsewhere): no add pass.
  Tensor y = kernel::linear(rows, weight, bias, kernel::Activation::none).y;
  y = kernel::view(y, with_last(x.shape(), out));
  record("linear", {x, weight, bias}, {&y}, {rows, weight},
         [out, x_shape = x.shape()](const Grads& g, const Grads& s, const Needs& need) {
           return linear_grads(kernel::reshape(g[0], {-1, out}), s[0], s[1], x_shape, need);
         });
  return y;
}

// y = gelu(pre), pre = x Wᵀ + b, fused (kernel::linear with GELU);  dpre = dy ⊙ gelu'(pre), then linear's
// gradients from dpre. Saves pre and y, as gelu after linear would save its input and output.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear_gelu", x, weight, bias);
  const int64_t out = weight.size(0);
  Tensor rows = kernel::reshape(x, {-1, weight.size(1)});
  kernel::LinearOutput o = kernel::linear(rows, weight, bias, kernel::Activation::gelu);
  Tensor y = kernel::view(o.y, with_last(x.shape(), out));
  record(
      "linear_gelu", {x, weight, bias}, {&y}, {rows, weight, o.pre, o.y},
      [out, x_shape = x.shape()](const Grads& g, const Grads& s, const Needs& need) {
        const Tensor dpre = kernel::unary_backward(kernel::UnaryOp::gelu, kernel::reshape(g[0], {-1, out}), s[2], s[3]);
        return linear_grads(dpre, s[0], s[1], x_shape, need);
      });
  return y;
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "linear";
  s.summary = "y = x Wᵀ + b, weight [out, in], bias [out] (optional)";
  s.inputs = {{"x"}, {"weight"}, {"bias", OpInputKind::floating, true}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{linear(in[0], in[1], in[2])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 5}, gen, dtype), Tensor::randn({4, 5}, gen, dtype),
                 Tensor::randn({4}, gen, dtype)};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "linear_gelu";
  s.summary = "y = gelu(x Wᵀ + b) (tanh form), weight [out, in], bias [out] (optional); fused on CUDA in bf16";
  s.inputs = {{"x"}, {"weight"}, {"bias", OpInputKind::floating, true}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{linear_gelu(in[0], in[1], in[2])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 5}, gen, dtype), Tensor::randn({4, 5}, gen, dtype),
                 Tensor::randn({4}, gen, dtype)};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "matmul";
  s.summary = "y = a @ b over the last two dimensions, batch dimensions broadcast";
  s.inputs = {{"a"}, {"b"}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{matmul(in[0], in[1])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 1, 3, 5}, gen, dtype), Tensor::randn({3, 5, 4}, gen, dtype)};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
