// Optimizers (AdamW, SGD with momentum) over a model's named parameters, global gradient-norm
// clipping, and the optimizer state that checkpoints save and restore.
//
// Parameters are split into groups, each with its own lr scale and weight decay. By default matrices
// are decayed and biases, norm gains and embeddings are not (OptimConfig's decay_* flags move them
// into the decayed group). Weight decay is decoupled from the gradient: p ← p − lr·wd·p, then the
// optimizer's own update.
//
// Each parameter is updated by one fused in-place kernel that reads and writes p, g, m (and v) once
// (the slots and their CPU kernels are in src/tensor: tensor/slots/optim.h); on the CPU, AdamW updates
// every parameter in one call (adamw_multi_step_kernel: one parallel region, the same bits).
//
// Mixed precision: a bf16 parameter gets an f32 master copy, made when the optimizer is built. The
// update is computed on the master and the parameter becomes the master rounded to bf16, so small
// updates accumulate instead of vanishing under bf16's 8 significant bits. The masters are the
// weights that checkpoints save (master_weights()) and that load_state restores.
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "layers/module.h"
#include "tensor/tensor.h"

namespace seqlab {

struct OptimConfig {
  std::string name = "adamw";                    // adamw | sgd
  double lr = 3e-4;                              // the schedule's peak; step() takes the scheduled value
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // adamw
  double weight_decay = 0.1;                     // for the decayed group
  double momentum = 0.9;                         // sgd; 0: plain SGD without a momentum buffer
  bool nesterov = false;                         // sgd
  double grad_clip = 1.0;                        // max global gradient norm, for the loop's clip_grad_norm; 0: off
  bool decay_biases = false, decay_norms = false, decay_embeddings = false;
};

// OK, or InvalidArgument naming the first bad field (unknown name, negative lr, beta outside [0, 1), ...).
absl::Status validate(const OptimConfig& config);

struct ParamGroup {
  std::string name;
  double lr_scale = 1.0;  // the group's lr is step()'s lr times this
  double weight_decay = 0.0;
  std::vector<Parameter> params;
};

// Two groups, "decay" (weight_decay = config.weight_decay) and "no_decay" (0), in that order, each
// keeping the parameters' order: matrices decay; biases, norms and embeddings decay only when flagged.
std::vector<ParamGroup> default_param_groups(const std::vector<Parameter>& params, const OptimConfig& config);

class Optimizer {
 public:
  // Throws std::invalid_argument when validate(config) fails or a parameter name repeats.
  // State (zeros) is allocated here, on each parameter's device: build the optimizer after the
  // model has been moved to its device and dtype.
  Optimizer(const OptimConfig& config, const std::vector<Parameter>& params);
  Optimizer(const OptimConfig& config, std::vector<ParamGroup> groups);

  // One update of every parameter that has a gradient, with learning rate lr·group.lr_scale.
  // Parameters without a gradient are skipped and their state is left untouched.
  void step(double lr);
  void zero_grad();  // drops every parameter's gradient

  int64_t steps() const { return steps_; }  // calls to step() so far (restored by load_state)
  const OptimConfig& config() const { return config_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  // The state under stable names: "optim.step" (i64 scalar), and per parameter NAME
  //   adamw: "optim.exp_avg.NAME", "optim.exp_avg_sq.NAME", "optim.step.NAME" (its own update count,
  //          which drives its bias correction, since a parameter without a gradient is not updated);
  //   sgd:   "optim.momentum_buffer.NAME" (when momentum > 0).
  // The moment tensors are views of the live state (no copy): write them out before the next step.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Restores the state from a map that may also hold other entries (model weights): every name
  // above must be present with the same shape and dtype, and no other "optim." name may appear.
  // The f32 master of a bf16 parameter NAME is restored from the entry NAME (the saved weight,
  // which must then be present, of the parameter's shape, in f32). Nothing is changed unless
  // everything matches; the error names the first mismatch.
  absl::Status load_state(const std::map<std::string, Tensor>& state);

  // The f32 masters of the bf16 parameters, by parameter name (live views; empty without bf16).
  std::map<std::string, Tensor> master_weights() const;

 private:
  struct Slot {
    Parameter param;
    double lr_scale, weight_decay;
    Tensor m, v;          // adamw: exp_avg, exp_avg_sq; sgd: m is the momentum buffer (or undefined)
    Tensor master;        // f32 copy of a bf16 parameter (undefined otherwise)
    int64_t updates = 0;  // adamw: times this parameter was updated
  };
  bool adamw() const { return config_.name == "adamw"; }

  OptimConfig config_;
  std::vector<ParamGroup> groups_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

// Gradients of successive micro-batches summed in f32 for bf16 parameters (mixed precision with
// train.grad_accum > 1), where the autograd engine would add them in bf16: after each backward,
// add() moves every bf16 gradient into its f32 sum (and drops it, so the next backward starts fresh);
// finish() makes the sums the parameters' gradients (f32, which Optimizer::step takes for a bf16
// parameter) and starts over. Parameters of other dtypes are left to the engine.
class F32GradAccumulator {
 public:
  explicit F32GradAccumulator(const std::vector<Parameter>& params);
  void add();
  void finish();

 private:
  std::vector<Parameter> params_;  // the bf16 ones
  std::vector<Tensor> sums_;       // f32, undefined until a gradient arrives
};

// Global gradient norm √Σ‖g‖² over every parameter with a gradient (accumulated in double). When it
// is finite and max_norm > 0, scales every gradient in place by min(1, max_norm / (norm + 1e-6)).
// Returns the norm before scaling; a non-finite norm is returned with the gradients untouched.
double clip_grad_norm(const std::vector<Parameter>& params, double max_norm);
// g ← s·g in place for every parameter with a gradient (averaging over accumulated micro-steps).
void scale_grads(const std::vector<Parameter>& params, double s);

// How Trainer::step (loop/trainer.h) makes the gradient it updates with: the mean over grad_accum
// micro-batches (scale_grads, F32GradAccumulator), clipped to grad_clip (clip_grad_norm). Here, beside
// those, rather than in the loop, so that recipe/configs.h, below the loop, makes it from a recipe.
struct TrainerOptions {
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  double grad_clip = 0;    // max global gradient norm; 0: off
};

}  // namespace seqlab
