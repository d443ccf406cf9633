// Elementwise entry points: argument checks, broadcasting and output allocation. The arithmetic
// is in src/tensor/elementwise_math.h, run by src/tensor/cpu/elementwise.cpp and src/cuda/elementwise.cu.
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::square: return "square";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::silu: return "silu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::relu: return "relu";
    case UnaryOp::elu: return "elu";
    case UnaryOp::softplus: return "softplus";
  }
  return "?";
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
  }
  return "?";
}

namespace {

void check_float(const Tensor& x, const char* op) {
  if (!x.defined()) throw std::invalid_argument(std::string(op) + ": undefined tensor");
  if (!is_floating(x.dtype())) {
    throw std::invalid_argument(std::string(op) + ": expected a floating tensor, got " + dtype_name(x.dtype()));
  }
}

void check_same(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(op) + ": dtypes differ (" + dtype_name(a.dtype()) + " and " +
                                dtype_name(b.dtype()) + ")");
  }
  if (a.device() != b.device()) {
    throw std::invalid_argument(std::string(op) + ": devices differ (" + a.device().str() + " and " +
                                b.device().str() + ")");
  }
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, double alpha) {
  check_float(x, unary_name(op));
  Tensor in = contiguous(x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_kernel(x.device(), op, in, alpha, out);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y, double alpha) {
  check_float(dy, unary_name(op));
  check_same(dy, x, unary_name(op));
  check_same(dy, y, unary_name(op));
  if (dy.shape() != x.shape() || y.shape() != x.shape()) {
    throw std::invalid_argument(std::string(unary_name(op)) + " backward: shapes differ");
  }
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_backward_kernel(x.device(), op, contiguous(dy), contiguous(x), contiguous(y), alpha, dx);
  return dx;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  check_float(a, binary_name(op));
  check_same(a, b, binary_name(op));
  Shape shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  binary_kernel(a.device(), op, expand(a, shape), expand(b, shape), out);
  return out;
}

Tensor scalar_op(ScalarOp op, const Tensor& x, double s) {
  check_float(x, "scalar op");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  scalar_kernel(x.device(), op, contiguous(x), s, out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same(a, b, "where");
  if (cond.device() != a.device()) throw std::invalid_argument("where: condition is on another device");
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape()), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  where_kernel(a.device(), expand(cond, shape), expand(a, shape), expand(b, shape), out);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const size_t lead = x.shape().size() - shape.size();
  if (x.shape().size() < shape.size()) {
    throw std::invalid_argument("sum_to: cannot reduce " + shape_str(x.shape()) + " to " + shape_str(shape));
  }
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  Tensor reduced = dims.empty() ? x : sum(x, dims, /*keepdim=*/true);
  return reshape(reduced, shape);
}

}  // namespace seqlab::kernel
