#include "layers/module.h"

#include <stdexcept>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::matrix: return "matrix";
    case ParamRole::bias: return "bias";
    case ParamRole::norm: return "norm";
    case ParamRole::embedding: return "embedding";
  }
  return "?";
}

Tensor& Module::add_parameter(const std::string& name, Tensor value, ParamRole role) {
  for (const Entry& e : params_) {
    if (e.name == name) throw std::logic_error("parameter '" + name + "' registered twice");
  }
  set_requires_grad(value, true);
  params_.push_back(Entry{name, std::make_unique<Tensor>(std::move(value)), role});
  return *params_.back().tensor;
}

void Module::collect(const std::string& prefix, std::vector<Parameter>* out) {
  for (Entry& e : params_) out->push_back(Parameter{prefix + e.name, e.tensor.get(), e.role});
  for (auto& [name, child] : children_) child->collect(name.empty() ? prefix : prefix + name + ".", out);
}

std::vector<Parameter> Module::parameters() {
  std::vector<Parameter> out;
  collect("", &out);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (const Parameter& p : parameters()) n += p.tensor->numel();
  return n;
}

void Module::zero_grad() {
  for (const Parameter& p : parameters()) clear_grad(*p.tensor);
}

void Module::set_training(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->set_training(on);
}

void Module::to(Device device, DType dtype) {
  for (const Parameter& p : parameters()) {
    Tensor moved = kernel::clone(kernel::to_device(kernel::to_dtype(*p.tensor, dtype), device));
    set_requires_grad(moved, true);
    *p.tensor = moved;
  }
}

}  // namespace seqlab
