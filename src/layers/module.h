// Module: owns named parameters and submodules. Parameter names are stable dotted paths
// ("blocks.0.attn.qkv.weight") used by checkpoints and optimiser groups.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace seqlab {

// What a parameter is, which decides its defaults elsewhere (weight decay applies to matrices,
// not to biases, norm gains or embeddings unless configured).
enum class ParamRole { matrix, bias, norm, embedding };
const char* param_role_name(ParamRole role);

struct Parameter {
  std::string name;
  Tensor* tensor;  // owned by its module; stable for the module's lifetime
  ParamRole role;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its submodules, in registration order.
  std::vector<Parameter> parameters();
  int64_t num_parameters();
  void zero_grad();
  // Training mode (dropout on); propagates to submodules.
  void set_training(bool on);
  bool training() const { return training_; }
  // Moves and converts every parameter (gradients are dropped).
  void to(Device device, DType dtype);

 protected:
  // Registers a leaf parameter (requires grad) and returns it.
  Tensor& add_parameter(const std::string& name, Tensor value, ParamRole role);
  // Registers a submodule; its parameters are named "<name>.<theirs>", or just theirs when `name` is
  // empty (a part that lends its names to its owner: a model's block stack).
  template <class M>
  M& add_module(const std::string& name, std::unique_ptr<M> module) {
    M& ref = *module;
    children_.emplace_back(name, std::move(module));
    return ref;
  }

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Tensor> tensor;
    ParamRole role;
  };
  void collect(const std::string& prefix, std::vector<Parameter>* out);
  std::vector<Entry> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace seqlab
