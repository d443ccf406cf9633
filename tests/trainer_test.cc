// Trainer::step, the step seam (train/loop/trainer.h): one update over grad_accum micro-batches equals
// the same steps written out by hand (mean loss, mean gradient, clipping, the optimizer at the
// schedule's lr), bit for bit; the gradient hook runs once per step, after the mean and before
// clipping, and what it does to the gradients is what the optimizer applies; bf16 weights with
// accumulation sum their micro-batch gradients in f32; the gradients are cleared after every step; a
// step whose gradient holds a NaN or an inf changes neither the weights nor the optimizer state, and
// names the first parameter whose gradient is not finite.
#include "train/loop/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kB = 2, kT = 6;

ModelConfig hybrid_config() {
  ModelConfig cfg;
  cfg.vocab_size = kV;
  cfg.d_model = 8;
  cfg.n_heads = 2;
  cfg.max_seq_len = 16;
  cfg.blocks = {{"gla", FfnKind::swiglu}, {"attention", FfnKind::gelu}};
  cfg.init_std = 0.2;
  return cfg;
}

// Micro-batch i: tokens and targets drawn from a fixed formula.
Batch micro_batch(int64_t i) {
  std::vector<int64_t> in, out;
  for (int64_t n = 0; n < kB * kT; ++n) {
    in.push_back((n * 3 + i * 5 + 1) % kV);
    out.push_back((n * 7 + i * 2 + 4) % kV);
  }
  return {Tensor::from_indices(in, {kB, kT}), Tensor::from_indices(out, {kB, kT})};
}

std::vector<std::vector<double>> weights_of(Decoder& model) {
  std::vector<std::vector<double>> out;
  for (const Parameter& p : model.parameters()) out.push_back(p.tensor->to_doubles());
  return out;
}

OptimConfig adamw() {
  OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  return c;
}

const LrSchedule kSchedule{ScheduleKind::cosine, 1e-2, 1, 10, 0.1};

TEST(Trainer, AStepIsTheStepsWrittenOut) {
  for (int64_t accum : {int64_t{1}, int64_t{3}}) {
    for (double clip : {0.0, 0.05}) {
      Generator ga(1), gb(1);
      Decoder a(hybrid_config(), ga), b(hybrid_config(), gb);
      Optimizer opt_a(adamw(), a.parameters()), opt_b(adamw(), b.parameters());
      Trainer trainer(a, opt_a, kSchedule, {accum, clip});
      for (int64_t step = 0; step < 3; ++step) {
        int64_t drawn = 0;
        const StepResult r = trainer.step(step, [&] { return micro_batch(step * accum + drawn++); });
        EXPECT_EQ(drawn, accum);
        // By hand: the mean of the micro-batches' losses and gradients, clipped, one update.
        double loss_sum = 0;
        for (int64_t m = 0; m < accum; ++m) {
          Tensor loss = b.loss(micro_batch(step * accum + m));
          backward(loss);
          loss_sum += loss.item();
        }
        std::vector<Parameter> params = b.parameters();
        if (accum > 1) scale_grads(params, 1.0 / static_cast<double>(accum));
        const double norm = clip_grad_norm(params, clip);  // the norm always; the clip when clip > 0
        opt_b.step(kSchedule.lr_at(step));
        opt_b.zero_grad();
        EXPECT_EQ(r.loss, loss_sum / static_cast<double>(accum)) << "accum " << accum << " step " << step;
        EXPECT_EQ(r.grad_norm, norm);
        EXPECT_EQ(r.lr, kSchedule.lr_at(step));
        EXPECT_EQ(weights_of(a), weights_of(b)) << "accum " << accum << " clip " << clip << " step " << step;
        for (const Parameter& p : a.parameters()) EXPECT_FALSE(grad_of(*p.tensor).defined()) << p.name;
      }
    }
  }
}

// The hook sees the mean gradient (before clipping) of every parameter, once per step; doubling the
// gradients there doubles the norm that clipping reports, and zeroing them leaves SGD without weight
// decay nothing to do.
TEST(Trainer, TheGradientHookRunsBetweenTheMeanAndTheClip) {
  Generator ga(2), gb(2);
  Decoder a(hybrid_config(), ga), b(hybrid_config(), gb);
  OptimConfig sgd;
  sgd.name = "sgd";
  sgd.weight_decay = 0;
  Optimizer opt_a(sgd, a.parameters()), opt_b(sgd, b.parameters());
  Trainer plain(a, opt_a, kSchedule, {2, 1e6});
  Trainer doubled(b, opt_b, kSchedule, {2, 1e6});
  int calls = 0;
  doubled.set_gradient_hook([&](const std::vector<Parameter>& params) {
    ++calls;
    EXPECT_EQ(params.size(), b.parameters().size());
    scale_grads(params, 2.0);
  });
  int64_t i = 0, j = 0;
  const StepResult ra = plain.step(0, [&] { return micro_batch(i++); });
  const StepResult rb = doubled.step(0, [&] { return micro_batch(j++); });
  EXPECT_EQ(calls, 1);
  EXPECT_NEAR(rb.grad_norm, 2 * ra.grad_norm, 1e-12 * ra.grad_norm);
  EXPECT_EQ(ra.loss, rb.loss);

  Generator gc(3);
  Decoder c(hybrid_config(), gc);
  Optimizer opt_c(sgd, c.parameters());
  Trainer zeroed(c, opt_c, kSchedule, {1, 0});
  zeroed.set_gradient_hook([](const std::vector<Parameter>& params) { scale_grads(params, 0.0); });
  const std::vector<std::vector<double>> before = weights_of(c);
  zeroed.step(0, [] { return micro_batch(0); });
  EXPECT_EQ(weights_of(c), before);
}

// The last-backward hooks run around the last micro-batch's backward alone: `start` before it (the first
// micro-batch's gradient already accumulated with 3 micro-batches), `finish` after it and before the
// gradient hook; the gradients `finish` sees are the sums over the micro-batches (the mean comes after).
TEST(Trainer, TheLastBackwardHooksRunAroundTheLastMicroBatchsBackward) {
  Generator ga(4);
  Decoder a(hybrid_config(), ga);
  Optimizer opt(adamw(), a.parameters());
  Trainer trainer(a, opt, kSchedule, {3, 0});
  std::vector<std::string> calls;
  int64_t drawn = 0;
  std::vector<double> at_finish;
  trainer.set_last_backward_hooks(
      [&](const std::vector<Parameter>& params) {
        calls.push_back("start after " + std::to_string(drawn) + " batches");
        EXPECT_TRUE(grad_of(*params.front().tensor).defined());  // two micro-batches' gradients so far
      },
      [&] {
        calls.push_back("finish");
        at_finish = grad_of(*a.parameters().front().tensor).to_doubles();
      });
  trainer.set_gradient_hook([&](const std::vector<Parameter>& params) {
    calls.push_back("gradient hook");
    const std::vector<double> mean = grad_of(*params.front().tensor).to_doubles();
    for (size_t i = 0; i < mean.size(); ++i) EXPECT_NEAR(mean[i] * 3, at_finish[i], 1e-6 * std::fabs(at_finish[i]));
  });
  trainer.step(0, [&] { return micro_batch(drawn++); });
  EXPECT_EQ(calls, (std::vector<std::string>{"start after 3 batches", "finish", "gradient hook"}));
}

// The loss hook sees the micro-batches' mean loss and its result is the step's loss, checked for being
// finite: a hook that returns NaN (a rank's non-finite loss, averaged over the ranks) drops the update.
TEST(Trainer, TheLossHookGivesTheStepsLossAndItsNonFiniteCheck) {
  Generator ga(2), gb(2);
  Decoder a(hybrid_config(), ga), b(hybrid_config(), gb);
  OptimConfig sgd;
  sgd.name = "sgd";
  sgd.weight_decay = 0;
  Optimizer opt_a(sgd, a.parameters()), opt_b(sgd, b.parameters());
  Trainer plain(a, opt_a, kSchedule, {2, 1e6});
  Trainer hooked(b, opt_b, kSchedule, {2, 1e6});
  double seen = 0;
  hooked.set_loss_hook([&](double loss) {
    seen = loss;
    return loss + 1;
  });
  int64_t i = 0, j = 0;
  const StepResult ra = plain.step(0, [&] { return micro_batch(i++); });
  const StepResult rb = hooked.step(0, [&] { return micro_batch(j++); });
  EXPECT_EQ(seen, ra.loss);
  EXPECT_EQ(rb.loss, ra.loss + 1);
  EXPECT_TRUE(rb.applied);

  hooked.set_loss_hook([](double) { return std::nan(""); });
  const std::vector<std::vector<double>> before = weights_of(b);
  const StepResult rc = hooked.step(1, [&] { return micro_batch(j++); });
  EXPECT_FALSE(rc.applied);
  EXPECT_EQ(rc.nonfinite_gradient, "");
  EXPECT_EQ(weights_of(b), before);
}

// A model with an MoE block: the step's metrics are the mean of its micro-batches' training_metrics,
// then what the metrics hook makes of each (data parallelism: the average over the ranks); a model
// without such blocks has none.
TEST(Trainer, TheStepsMetricsAreTheMicroBatchesMeanThroughTheHook) {
  ModelConfig cfg = hybrid_config();
  cfg.blocks[0].ffn = FfnKind::moe;
  cfg.moe.experts = 3;
  cfg.moe.d_ff = 8;
  cfg.moe.capacity_factor = 0.6;
  Generator ga(2), gb(2);
  Decoder a(cfg, ga), b(cfg, gb);
  a.to(cpu_device(), DType::f64);
  b.to(cpu_device(), DType::f64);
  OptimConfig sgd;
  sgd.name = "sgd";
  Optimizer opt_a(sgd, a.parameters()), opt_b(sgd, b.parameters());
  Trainer trainer(a, opt_a, kSchedule, {2, 0});
  trainer.set_metrics_hook([](double v) { return 10 * v; });
  int64_t i = 0;
  const StepResult r = trainer.step(0, [&] { return micro_batch(i++); });
  // The same micro-batches one at a time through the model b (equal to a before the step).
  b.set_training(true);
  std::vector<std::pair<std::string, double>> want;
  for (int64_t m = 0; m < 2; ++m) {
    b.loss(micro_batch(m));
    const auto got = b.training_metrics();
    if (m == 0) want = got;
    for (size_t k = 0; m > 0 && k < got.size(); ++k) want[k].second += got[k].second;
  }
  ASSERT_EQ(r.metrics.size(), 3u);
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(r.metrics[k].first, want[k].first);
    EXPECT_NEAR(r.metrics[k].second, 10 * want[k].second / 2, 1e-12) << want[k].first;
  }
  EXPECT_GT(r.metrics[2].second, 0.0);  // capacity 0.6 drops
  Generator gc(2);
  Decoder plain(hybrid_config(), gc);
  Optimizer opt_c(sgd, plain.parameters());
  Trainer plain_trainer(plain, opt_c, kSchedule, {1, 0});
  EXPECT_TRUE(plain_trainer.step(0, [&] { return micro_batch(0); }).metrics.empty());
}

// bf16 weights with grad_accum 2: the update equals that of the f32 sums of the micro-batches'
// gradients, which the trainer keeps (the engine alone would add them in bf16).
TEST(Trainer, Bf16AccumulationSumsInF32) {
  Generator ga(4), gb(4);
  Decoder a(hybrid_config(), ga), b(hybrid_config(), gb);
  a.to(cpu_device(), DType::bf16);
  b.to(cpu_device(), DType::bf16);
  Optimizer opt_a(adamw(), a.parameters()), opt_b(adamw(), b.parameters());
  Trainer trainer(a, opt_a, kSchedule, {2, 0});
  int64_t i = 0;
  trainer.step(0, [&] { return micro_batch(i++); });
  F32GradAccumulator sums(b.parameters());
  for (int64_t m = 0; m < 2; ++m) {
    backward(b.loss(micro_batch(m)));
    sums.add();
  }
  sums.finish();
  scale_grads(b.parameters(), 0.5);
  opt_b.step(kSchedule.lr_at(0));
  opt_b.zero_grad();
  EXPECT_EQ(weights_of(a), weights_of(b));
}

// The hook puts a value that is not finite into chosen gradients (after the mean, before the norm).
void poison(const std::vector<Parameter>& params, const std::vector<std::string>& names, float value) {
  for (const Parameter& p : params) {
    for (const std::string& name : names) {
      if (p.name == name) grad_of(*p.tensor).data<float>()[1] = value;
    }
  }
}

std::vector<std::vector<double>> state_of(const Optimizer& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(t.to_doubles());
  return out;
}

TEST(Trainer, ANonFiniteStepChangesNothingAndNamesTheFirstTensor) {
  Generator ga(6), gb(6);
  Decoder a(hybrid_config(), ga), b(hybrid_config(), gb);
  Optimizer opt_a(adamw(), a.parameters()), opt_b(adamw(), b.parameters());
  Trainer trainer(a, opt_a, kSchedule, {1, 1.0}), reference(b, opt_b, kSchedule, {1, 1.0});
  // One good step each, so the optimizer has state to keep.
  trainer.step(0, [] { return micro_batch(0); });
  reference.step(0, [] { return micro_batch(0); });
  const std::vector<std::vector<double>> weights = weights_of(a), state = state_of(opt_a);

  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    // Two poisoned tensors: the first in the model's order is named.
    trainer.set_gradient_hook([&](const std::vector<Parameter>& params) {
      poison(params, {"blocks.1.mlp.fc.weight", "blocks.0.mixer.q.weight"}, bad);
    });
    const StepResult r = trainer.step(1, [] { return micro_batch(1); });
    EXPECT_FALSE(r.applied);
    EXPECT_EQ(r.nonfinite_gradient, "blocks.0.mixer.q.weight");
    EXPECT_FALSE(std::isfinite(r.grad_norm));
    EXPECT_TRUE(std::isfinite(r.loss));
    EXPECT_EQ(weights_of(a), weights);
    EXPECT_EQ(state_of(opt_a), state);
    for (const Parameter& p : a.parameters()) EXPECT_FALSE(grad_of(*p.tensor).defined()) << p.name;
  }
  // The next good step is the step the reference takes: nothing of the skipped ones remained.
  trainer.set_gradient_hook(nullptr);
  const StepResult ra = trainer.step(1, [] { return micro_batch(1); });
  const StepResult rb = reference.step(1, [] { return micro_batch(1); });
  EXPECT_TRUE(ra.applied);
  EXPECT_TRUE(ra.nonfinite_gradient.empty());
  EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  EXPECT_EQ(weights_of(a), weights_of(b));
  EXPECT_EQ(state_of(opt_a), state_of(opt_b));
}

TEST(Trainer, RefusesNonsense) {
  Generator gen(5);
  Decoder model(hybrid_config(), gen);
  Optimizer opt(adamw(), model.parameters());
  EXPECT_THROW(Trainer(model, opt, kSchedule, {0, 0}), std::invalid_argument);
}

}  // namespace
}  // namespace seqlab
