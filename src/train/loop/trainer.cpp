#include "train/loop/trainer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "autograd/variable.h"
#include "tensor/slots/optim.h"

namespace seqlab {
namespace {

// The name of the first parameter whose gradient's squared norm (accumulated in double, so finite
// values cannot overflow it) is not finite: one that holds an inf or a NaN. "" when there is none.
std::string first_nonfinite_gradient(const std::vector<Parameter>& params) {
  for (const Parameter& p : params) {
    const Tensor g = grad_of(*p.tensor);
    if (g.defined() && !std::isfinite(kernel::squared_norm(g))) return p.name;
  }
  return "";
}

}  // namespace

Trainer::Trainer(LanguageModel& model, Optimizer& optimizer, const LrSchedule& schedule, const TrainerOptions& options)
    : model_(model), optimizer_(optimizer), schedule_(schedule), options_(options) {
  if (options_.grad_accum < 1) throw std::invalid_argument("trainer: grad_accum must be at least 1");
  const std::vector<Parameter> params = model_.parameters();
  if (params.empty()) throw std::invalid_argument("trainer: the model has no parameters");
  device_ = params.front().tensor->device();
  const bool bf16 = std::any_of(params.begin(), params.end(),
                                [](const Parameter& p) { return p.tensor->dtype() == DType::bf16; });
  if (options_.grad_accum > 1 && bf16) f32_sums_.emplace(params);
}

StepResult Trainer::step(int64_t step, const std::function<Batch()>& next_batch) {
  double loss_sum = 0;
  std::vector<std::pair<std::string, double>> metrics;
  for (int64_t micro = 0; micro < options_.grad_accum; ++micro) {
    Tensor loss = model_.loss(next_batch().to(device_));
    const std::vector<std::pair<std::string, double>> m = model_.training_metrics();
    if (micro == 0) metrics = m;
    for (size_t i = 0; micro > 0 && i < m.size() && i < metrics.size(); ++i) metrics[i].second += m[i].second;
    const bool around = micro == options_.grad_accum - 1 && last_backward_start_ && !f32_sums_;
    if (around) last_backward_start_(model_.parameters());
    backward(loss);
    if (around && last_backward_finish_) last_backward_finish_();
    if (f32_sums_) f32_sums_->add();
    loss_sum += loss.item();
  }
  if (f32_sums_) f32_sums_->finish();
  std::vector<Parameter> params = model_.parameters();
  if (options_.grad_accum > 1) scale_grads(params, 1.0 / static_cast<double>(options_.grad_accum));
  if (hook_) hook_(params);
  StepResult r;
  r.loss = loss_sum / static_cast<double>(options_.grad_accum);
  if (loss_hook_) r.loss = loss_hook_(r.loss);
  for (auto& [name, value] : metrics) {
    value /= static_cast<double>(options_.grad_accum);
    if (metrics_hook_) value = metrics_hook_(value);
  }
  r.metrics = std::move(metrics);
  r.lr = schedule_.lr_at(step);
  // The norm, and the clip when grad_clip > 0 (a non-finite norm leaves the gradients as they are).
  r.grad_norm = clip_grad_norm(params, options_.grad_clip);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.applied = false;
    r.nonfinite_gradient = first_nonfinite_gradient(params);
    optimizer_.zero_grad();
    return r;
  }
  optimizer_.step(r.lr);
  optimizer_.zero_grad();
  return r;
}

}  // namespace seqlab
