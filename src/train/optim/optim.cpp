#include "train/optim/optim.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "tensor/slots/optim.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {

std::string describe(const Tensor& t) {
  return absl::StrCat(shape_str(t.shape()), " ", dtype_name(t.dtype()), " on ", t.device().str());
}

// Optimizer state is kept in f64 for f64 parameters and in f32 otherwise.
DType state_dtype(DType param) { return param == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

absl::Status validate(const OptimConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("optim: " + what); };
  if (c.name != "adamw" && c.name != "sgd") return bad("unknown optimizer '" + c.name + "' (choices: adamw, sgd)");
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) return bad(absl::StrCat("lr must be a finite number >= 0, got ", c.lr));
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad(absl::StrCat("beta1 must be in [0, 1), got ", c.beta1));
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad(absl::StrCat("beta2 must be in [0, 1), got ", c.beta2));
  if (!(c.eps > 0)) return bad(absl::StrCat("eps must be > 0, got ", c.eps));
  if (!(c.weight_decay >= 0)) return bad(absl::StrCat("weight_decay must be >= 0, got ", c.weight_decay));
  if (!(c.momentum >= 0 && c.momentum < 1)) return bad(absl::StrCat("momentum must be in [0, 1), got ", c.momentum));
  if (c.nesterov && c.momentum == 0) return bad("nesterov needs momentum > 0");
  if (!(c.grad_clip >= 0)) return bad(absl::StrCat("grad_clip must be >= 0 (0: off), got ", c.grad_clip));
  return absl::OkStatus();
}

std::vector<ParamGroup> default_param_groups(const std::vector<Parameter>& params, const OptimConfig& config) {
  ParamGroup decay{"decay", 1.0, config.weight_decay, {}};
  ParamGroup no_decay{"no_decay", 1.0, 0.0, {}};
  for (const Parameter& p : params) {
    bool decayed = p.role == ParamRole::matrix || (p.role == ParamRole::bias && config.decay_biases) ||
                   (p.role == ParamRole::norm && config.decay_norms) ||
                   (p.role == ParamRole::embedding && config.decay_embeddings);
    (decayed ? decay : no_decay).params.push_back(p);
  }
  return {decay, no_decay};
}

// ------------------------------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(const OptimConfig& config, const std::vector<Parameter>& params)
    : Optimizer(config, default_param_groups(params, config)) {}

Optimizer::Optimizer(const OptimConfig& config, std::vector<ParamGroup> groups)
    : config_(config), groups_(std::move(groups)) {
  absl::Status ok = validate(config_);
  if (!ok.ok()) throw std::invalid_argument(std::string(ok.message()));
  std::set<std::string> names;
  std::set<const Tensor*> tensors;
  for (const ParamGroup& group : groups_) {
    if (!(group.lr_scale >= 0) || !(group.weight_decay >= 0)) {
      throw std::invalid_argument("optimizer: group '" + group.name + "' needs lr_scale >= 0 and weight_decay >= 0");
    }
    for (const Parameter& p : group.params) {
      const Tensor& t = *p.tensor;
      if (!names.insert(p.name).second || !tensors.insert(p.tensor).second) {
        throw std::invalid_argument("optimizer: parameter '" + p.name + "' is listed twice");
      }
      if (!t.defined() || !is_floating(t.dtype()) || !t.is_contiguous()) {
        throw std::invalid_argument("optimizer: parameter '" + p.name +
                                    "' must be a defined, contiguous floating tensor");
      }
      Slot s{p, group.lr_scale, group.weight_decay, Tensor(), Tensor(), Tensor(), 0};
      DType sd = state_dtype(t.dtype());
      if (t.dtype() == DType::bf16) s.master = kernel::to_dtype(t, DType::f32);
      if (adamw()) {
        s.m = Tensor::zeros(t.shape(), sd, t.device());
        s.v = Tensor::zeros(t.shape(), sd, t.device());
      } else if (config_.momentum > 0) {
        s.m = Tensor::zeros(t.shape(), sd, t.device());
      }
      slots_.push_back(std::move(s));
    }
  }
}

void Optimizer::step(double lr) {
  // AdamW on the CPU: every parameter's update in one call of the multi-tensor kernel, the same bits as
  // one adamw_step_kernel per parameter (which other devices still run), with one parallel region.
  std::vector<kernel::AdamWTensors> batched;
  const bool batch = adamw() && kernel::adamw_multi_step_kernel.has(DeviceType::CPU);
  for (Slot& s : slots_) {
    const Tensor& p = *s.param.tensor;
    Tensor g = grad_of(p);
    if (!g.defined()) continue;
    const bool f32_sum = s.master.defined() && g.dtype() == DType::f32;  // from an F32GradAccumulator
    if (g.shape() != p.shape() || (g.dtype() != p.dtype() && !f32_sum) || g.device() != p.device()) {
      throw std::invalid_argument("optimizer: gradient of '" + s.param.name + "' is " + describe(g) +
                                  " but the parameter is " + describe(p));
    }
    if (!p.is_contiguous() ||
        (s.m.defined() && (s.m.device() != p.device() || s.m.dtype() != state_dtype(p.dtype())))) {
      throw std::logic_error("optimizer: parameter '" + s.param.name + "' changed layout, device or dtype (" +
                             describe(p) + ") after the optimizer was built");
    }
    g = kernel::contiguous(g);
    const double group_lr = lr * s.lr_scale;
    if (adamw()) {
      ++s.updates;
      const double t = static_cast<double>(s.updates);
      kernel::AdamWStep a{group_lr,
                  s.weight_decay,
                  config_.beta1,
                  config_.beta2,
                  config_.eps,
                  1.0 - std::pow(config_.beta1, t),
                  1.0 - std::pow(config_.beta2, t)};
      if (batch && p.device().is_cpu()) {
        batched.push_back({a, p, g, s.m, s.v, s.master});
      } else {
        kernel::adamw_step_kernel(p.device(), a, p, g, s.m, s.v, s.master);
      }
    } else {
      kernel::SgdStep a{group_lr, s.weight_decay, config_.momentum, config_.nesterov};
      kernel::sgd_step_kernel(p.device(), a, p, g, s.m, s.master);
    }
  }
  if (!batched.empty()) kernel::adamw_multi_step_kernel(cpu_device(), batched);
  ++steps_;
}

void Optimizer::zero_grad() {
  for (Slot& s : slots_) clear_grad(*s.param.tensor);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("optim.step", Tensor::scalar(static_cast<double>(steps_), DType::i64));
  for (const Slot& s : slots_) {
    if (adamw()) {
      out.emplace_back("optim.exp_avg." + s.param.name, s.m);
      out.emplace_back("optim.exp_avg_sq." + s.param.name, s.v);
      out.emplace_back("optim.step." + s.param.name, Tensor::scalar(static_cast<double>(s.updates), DType::i64));
    } else if (s.m.defined()) {
      out.emplace_back("optim.momentum_buffer." + s.param.name, s.m);
    }
  }
  return out;
}

absl::Status Optimizer::load_state(const std::map<std::string, Tensor>& state) {
  const std::vector<std::pair<std::string, Tensor>> expected = state_tensors();
  std::set<std::string> known;
  for (const auto& [name, mine] : expected) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state: '", name, "' is missing (was it saved by a ",
                                                     "different optimizer or model? this one is ", config_.name, ")"));
    }
    const Tensor& t = it->second;
    if (!t.defined() || t.shape() != mine.shape() || t.dtype() != mine.dtype()) {
      std::string found = t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "undefined";
      return absl::InvalidArgumentError(absl::StrCat("optimizer state: '", name, "' is ", found, " but ",
                                                     shape_str(mine.shape()), " ", dtype_name(mine.dtype()),
                                                     " is expected"));
    }
    if (mine.dtype() == DType::i64 && t.item() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state: '", name, "' is negative (", t.item(), ")"));
    }
  }
  for (const Slot& s : slots_) {
    if (!s.master.defined()) continue;
    auto it = state.find(s.param.name);
    if (it == state.end() || !it->second.defined() || it->second.shape() != s.master.shape() ||
        it->second.dtype() != DType::f32) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state: the f32 master weight of bf16 parameter '",
                                                     s.param.name, "' needs the saved weight '", s.param.name, "' ",
                                                     shape_str(s.master.shape()), " f32"));
    }
  }
  for (const auto& [name, t] : state) {
    if (absl::StartsWith(name, "optim.") && !known.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state: unexpected '", name, "' (no such state in this ",
                                                     config_.name, " optimizer and model)"));
    }
  }
  // Everything matches: now restore.
  steps_ = state.at("optim.step").to_indices()[0];
  for (Slot& s : slots_) {
    if (s.master.defined()) kernel::copy_(s.master, state.at(s.param.name));
    if (adamw()) {
      kernel::copy_(s.m, state.at("optim.exp_avg." + s.param.name));
      kernel::copy_(s.v, state.at("optim.exp_avg_sq." + s.param.name));
      s.updates = state.at("optim.step." + s.param.name).to_indices()[0];
    } else if (s.m.defined()) {
      kernel::copy_(s.m, state.at("optim.momentum_buffer." + s.param.name));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, Tensor> Optimizer::master_weights() const {
  std::map<std::string, Tensor> out;
  for (const Slot& s : slots_) {
    if (s.master.defined()) out.emplace(s.param.name, s.master);
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// f32 sums of micro-batch gradients

F32GradAccumulator::F32GradAccumulator(const std::vector<Parameter>& params) {
  for (const Parameter& p : params) {
    if (p.tensor->dtype() == DType::bf16) params_.push_back(p);
  }
  sums_.resize(params_.size());
}

void F32GradAccumulator::add() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_of(*params_[i].tensor);
    if (!g.defined()) continue;
    Tensor g32 = kernel::to_dtype(g, DType::f32);
    sums_[i] = sums_[i].defined() ? kernel::binary(kernel::BinaryOp::add, sums_[i], g32) : kernel::contiguous(g32);
    clear_grad(*params_[i].tensor);
  }
}

void F32GradAccumulator::finish() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (sums_[i].defined()) set_grad(*params_[i].tensor, sums_[i]);
    sums_[i] = Tensor();
  }
}

// ------------------------------------------------------------------------------------------------
// Gradient clipping and scaling

namespace {

// Each parameter's gradient once, even if a tensor is listed under two names.
std::vector<Tensor*> unique_with_grad(const std::vector<Parameter>& params) {
  std::set<Tensor*> seen;
  std::vector<Tensor*> out;
  for (const Parameter& p : params) {
    if (grad_of(*p.tensor).defined() && seen.insert(p.tensor).second) out.push_back(p.tensor);
  }
  return out;
}

}  // namespace

double clip_grad_norm(const std::vector<Parameter>& params, double max_norm) {
  std::vector<Tensor> grads;
  for (Tensor* p : unique_with_grad(params)) grads.push_back(grad_of(*p));
  const double norm = std::sqrt(kernel::squared_norm(grads));
  if (!std::isfinite(norm) || !(max_norm > 0)) return norm;
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0) scale_grads(params, scale);
  return norm;
}

void scale_grads(const std::vector<Parameter>& params, double s) {
  std::vector<Tensor> on_cpu;  // scaled together, in one call of the multi-tensor kernel
  const bool batch = kernel::scale_inplace_multi_kernel.has(DeviceType::CPU);
  for (Tensor* p : unique_with_grad(params)) {
    Tensor g = grad_of(*p);
    if (!g.is_contiguous()) {
      g = kernel::contiguous(g);
      set_grad(*p, g);
    }
    if (batch && g.device().is_cpu()) {
      on_cpu.push_back(g);
    } else {
      kernel::scale_inplace_kernel(g.device(), g, s);
    }
  }
  if (!on_cpu.empty()) kernel::scale_inplace_multi_kernel(cpu_device(), on_cpu, s);
}

}  // namespace seqlab
