// The gradient accessors of Tensor (declared in src/tensor/tensor.h).
#include <stdexcept>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

bool Tensor::requires_grad() const { return meta_ && meta_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool on) {
  if (on && !is_floating(dtype_)) {
    throw std::invalid_argument(std::string("only floating tensors can require grad, not ") + dtype_name(dtype_));
  }
  if (meta_ && meta_->grad_fn) {
    throw std::invalid_argument("set_requires_grad on a non-leaf tensor (computed by '" + meta_->grad_fn->name +
                                "'); detach() it first");
  }
  if (!meta_) meta_ = std::make_shared<AutogradMeta>();
  meta_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return meta_ ? meta_->grad : Tensor(); }

void Tensor::zero_grad() {
  if (meta_) meta_->grad = Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined() && g.shape() != shape_) {
    throw std::invalid_argument("set_grad: gradient " + shape_str(g.shape()) + " for a tensor " + shape_str(shape_));
  }
  if (!meta_) meta_ = std::make_shared<AutogradMeta>();
  meta_->grad = g;
}

void Tensor::backward() const { seqlab::backward({*this}, {Tensor()}, false); }

void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
  seqlab::backward({*this}, {grad_output}, retain_graph);
}

}  // namespace seqlab
