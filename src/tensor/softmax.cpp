// Softmax and log-softmax entry points. Kernels only ever see the last dimension of a contiguous
// tensor, viewed as [rows, cols]; other dimensions are moved last by the autograd op.
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

void check_input(const Tensor& x, const char* op) {
  if (!x.defined() || !is_floating(x.dtype()) || x.dim() < 1) {
    throw std::invalid_argument(std::string(op) + ": expected a floating tensor of at least 1 dimension, got " +
                                (x.defined() ? dtype_name(x.dtype()) + std::string(" ") + shape_str(x.shape())
                                             : std::string("an undefined tensor")));
  }
}

Tensor forward(const Tensor& x, bool log, const char* op) {
  check_input(x, op);
  Tensor in = contiguous(x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  softmax_kernel(x.device(), in, log, y);
  return y;
}

Tensor backward(const Tensor& dy, const Tensor& y, bool log, const char* op) {
  check_input(y, op);
  if (!dy.defined() || dy.shape() != y.shape() || dy.dtype() != y.dtype() || dy.device() != y.device()) {
    throw std::invalid_argument(std::string(op) + ": gradient " + (dy.defined() ? shape_str(dy.shape()) : "undefined") +
                                " does not match output " + shape_str(y.shape()) + " " + dtype_name(y.dtype()));
  }
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  softmax_backward_kernel(y.device(), contiguous(dy), contiguous(y), log, dx);
  return dx;
}

}  // namespace

Tensor softmax(const Tensor& x) { return forward(x, false, "softmax"); }
Tensor log_softmax(const Tensor& x) { return forward(x, true, "log_softmax"); }
Tensor softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, false, "softmax backward"); }
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, true, "log_softmax backward"); }

}  // namespace seqlab::kernel
