// The training step, apart from the loop's bookkeeping (evaluation, logging, checkpoints: see
// training_run.h): one call of Trainer::step is one optimizer update —
//
//   for each of grad_accum micro-batches:  loss = model.loss(batch);  backward(loss)
//   g ← g / grad_accum                      (the mean over micro-batches)
//   gradient hook                           (where data-parallel training averages g across ranks, or
//                                            finishes averaging what it started during the last backward)
//   loss hook                               (where it averages the loss across ranks)
//   ‖g‖ = √Σ g², the global norm            (accumulated in double)
//   if loss or ‖g‖ is not finite:  g ← 0    (the update is dropped: weights and optimizer state stay)
//   g ← g · min(1, clip / ‖g‖)              (when grad_clip > 0)
//   optimizer.step(lr = schedule(step));  g ← 0
//
// A non-finite value is never applied, so a diverging step cannot spoil the weights; what the run does
// next (stop, or skip and go on) is train.on_nonfinite, in the loop (training_run.cpp).
//
// Micro-batch gradients of bf16 weights are summed in f32 (an F32GradAccumulator), where the autograd
// engine would add them in bf16. A sweep point or a test runs the same steps through this class.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layers/model/batch.h"
#include "layers/model/language_model.h"
#include "train/optim/optim.h"
#include "train/optim/schedule.h"

namespace seqlab {

// The step's options, TrainerOptions (grad_accum, grad_clip), are in optim/optim.h, where
// recipe/configs.h, below this folder, can make them.

struct StepResult {
  double loss = 0;       // mean of the micro-batches' losses
  double grad_norm = 0;  // the global gradient norm before clipping
  double lr = 0;         // the learning rate of the update
  // False when the loss or the gradient norm was not finite: nothing was updated.
  bool applied = true;
  // When not applied: the first parameter (in the model's order) whose gradient holds a value that is
  // not finite; "" when every gradient was finite (the loss alone was not).
  std::string nonfinite_gradient;
  // The model's training_metrics (the MoE blocks' aux_loss, ...), each the mean over the micro-batches
  // (and over the ranks, where the metrics hook averages them); empty for most models.
  std::vector<std::pair<std::string, double>> metrics;
};

class Trainer {
 public:
  // `model` on its device and in its training dtype; `optimizer` built over its parameters (after the
  // model was placed). Both must outlive the trainer.
  Trainer(LanguageModel& model, Optimizer& optimizer, const LrSchedule& schedule, const TrainerOptions& options);

  // Called with every parameter once the micro-batches' mean gradient is in place and before clipping.
  using GradientHook = std::function<void(const std::vector<Parameter>& params)>;
  void set_gradient_hook(GradientHook hook) { hook_ = std::move(hook); }
  // Called after the gradient hook with this process's mean loss over the micro-batches; what it returns
  // is the step's loss, checked for being finite (data-parallel training returns the average over the
  // ranks, so every rank reports, and decides on, the same loss).
  using LossHook = std::function<double(double loss)>;
  void set_loss_hook(LossHook hook) { loss_hook_ = std::move(hook); }
  // Called after the loss hook with each of the model's training metrics (mean over the micro-batches);
  // what it returns is logged (data-parallel training returns the average over the ranks).
  void set_metrics_hook(LossHook hook) { metrics_hook_ = std::move(hook); }
  // Around the backward of the step's last micro-batch: `start` with every parameter just before it (each
  // gradient is final once that backward has added its share: data parallelism starts averaging there),
  // `finish` right after it, before the mean over the micro-batches and the gradient hook (where data
  // parallelism waits for what it started). Not called when the micro-batch gradients of bf16 weights are
  // summed in f32 (final only after that sum).
  using LastBackwardHook = std::function<void(const std::vector<Parameter>& params)>;
  void set_last_backward_hooks(LastBackwardHook start, std::function<void()> finish) {
    last_backward_start_ = std::move(start);
    last_backward_finish_ = std::move(finish);
  }

  // Update number `step` (0-based: lr = schedule.lr_at(step)) over grad_accum micro-batches drawn
  // from `next_batch` (moved to the model's device here). The gradients are zero again afterwards.
  // A step whose loss or gradient norm is not finite changes nothing but the batches drawn (and the
  // dropout generator): StepResult::applied is false.
  StepResult step(int64_t step, const std::function<Batch()>& next_batch);

 private:
  LanguageModel& model_;
  Optimizer& optimizer_;
  LrSchedule schedule_;
  TrainerOptions options_;
  Device device_;
  std::optional<F32GradAccumulator> f32_sums_;
  GradientHook hook_;
  LossHook loss_hook_;
  LossHook metrics_hook_;
  LastBackwardHook last_backward_start_;
  std::function<void()> last_backward_finish_;
};

}  // namespace seqlab
