// Training under sequence parallelism, data parallelism and both (src/layers/sequence_parallel.h,
// src/train/launch/data_parallel.h): a GPT model (learned positions, softmax attention) and a GLA model,
// in f64, trained for 5 steps of the same global batch by one process, by SP = 2, by DP = 2 and by
// DP = 2 × SP = 2 rank processes over Gloo. Every rank's step losses (averaged over the ranks, as the
// trainer reports them) and final weights equal the one process's within 1e-10 relative.
//
// The ranks are wired as training_run.cpp wires them: ranks r·sp … r·sp + sp − 1 form data-parallel rank r's
// sequence-parallel group (a communicator of their own, through the job's store under a prefix); the
// gradients and the loss are averaged over every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "dist/communicator.h"
#include "layers/model/decoder.h"
#include "layers/sequence_parallel.h"
#include "rank_processes.h"
#include "train/launch/data_parallel.h"
#include "train/loop/trainer.h"

namespace seqlab {
namespace {

using testing::joined;
using testing::run_ranks;

constexpr int64_t kV = 13, kB = 4, kT = 16, kSteps = 5;

ModelConfig config(const std::string& mixer) {
  ModelConfig cfg;
  cfg.vocab_size = kV;
  cfg.d_model = 8;
  cfg.n_heads = 2;
  cfg.max_seq_len = kT;
  cfg.blocks = {{mixer, FfnKind::gelu}, {mixer, FfnKind::gelu}};
  cfg.positions = mixer == "attention" ? PositionKind::learned : PositionKind::none;
  cfg.norm = NormKind::layer_norm;
  cfg.init_std = 0.2;
  return cfg;
}

// The global batch of step s: kB rows of kT tokens and their targets, from a fixed formula.
Batch global_batch(int64_t s) {
  std::vector<int64_t> in, out;
  for (int64_t n = 0; n < kB * kT; ++n) {
    in.push_back((n * 5 + s * 3 + n / 7) % kV);
    out.push_back((n * 2 + s * 7 + 1) % kV);
  }
  return {Tensor::from_indices(in, {kB, kT}, DType::i32), Tensor::from_indices(out, {kB, kT}, DType::i32)};
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<double>> weights;
};

OptimConfig adamw() {
  OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  return c;
}
const LrSchedule kSchedule{ScheduleKind::cosine, 1e-2, 2, kSteps, 0.1};

// Trains kSteps steps; `rows` picks this rank's batch from the global one.
Run train(const std::string& mixer, Trainer::GradientHook hook, Trainer::LossHook loss_hook,
          const std::function<Batch(const Batch&)>& rows, const SequenceGroup* group) {
  Generator gen(3);
  Decoder model(config(mixer), gen);
  model.to(cpu_device(), DType::f64);
  Optimizer opt(adamw(), model.parameters());
  Trainer trainer(model, opt, kSchedule, {1, 1.0});
  if (hook) trainer.set_gradient_hook(hook);
  if (loss_hook) trainer.set_loss_hook(loss_hook);
  Run run;
  for (int64_t s = 0; s < kSteps; ++s) {
    SequenceParallelScope scope(group);
    run.losses.push_back(trainer.step(s, [&] { return rows(global_batch(s)); }).loss);
  }
  for (const Parameter& p : model.parameters()) run.weights.push_back(p.tensor->to_doubles());
  return run;
}

void require_close(double got, double want, const std::string& what) {
  if (!(std::fabs(got - want) <= 1e-10 * std::max(std::fabs(want), 1e-300))) {
    char line[160];
    std::snprintf(line, sizeof line, ": %.17g against one process's %.17g", got, want);
    throw std::runtime_error(what + line);
  }
}

void grid(const std::string& mixer, int world, int sp) {
  const Run ref = train(mixer, nullptr, nullptr, [](const Batch& b) { return b; }, nullptr);
  const int dp_size = world / sp;
  const auto failures = run_ranks(
      world,
      [&](int rank, const std::string& folder) {
        const auto store = dist::open_file_store(folder);
        auto comm = dist::make_communicator(cpu_device(), store, rank, world, std::chrono::seconds(20));
        const int dp_rank = rank / sp, sp_rank = rank % sp;
        std::unique_ptr<dist::Communicator> sp_comm;
        std::unique_ptr<SequenceGroup> group;
        if (sp > 1) {
          sp_comm = dist::make_communicator(cpu_device(), dist::prefixed_store(store, "sp" + std::to_string(dp_rank)),
                                            sp_rank, sp, std::chrono::seconds(20));
          group = std::make_unique<SequenceGroup>(*sp_comm);
        }
        DataParallel dp(*comm, kGradientBucketElements, dp_size);
        const Run got = train(
            mixer, [&](const std::vector<Parameter>& p) { dp.average_gradients(p); },
            [&](double loss) { return dp.average(loss); },
            [&](const Batch& b) {
              const int64_t n = kB / dp_size;
              Batch mine(narrow(b.inputs, 0, dp_rank * n, n), narrow(b.targets, 0, dp_rank * n, n));
              return group ? Batch(sequence_take_local(mine.inputs, *group), sequence_take_local(mine.targets, *group))
                           : mine;
            },
            group.get());
        const std::string what = mixer + " world " + std::to_string(world) + " sp " + std::to_string(sp) + " rank " +
                                 std::to_string(rank);
        for (int64_t s = 0; s < kSteps; ++s) require_close(got.losses[s], ref.losses[s], what + " loss of step " + std::to_string(s + 1));
        for (size_t i = 0; i < ref.weights.size(); ++i) {
          for (size_t j = 0; j < ref.weights[i].size(); ++j) {
            require_close(got.weights[i][j], ref.weights[i][j], what + " weight " + std::to_string(i));
          }
        }
      },
      std::chrono::seconds(120));
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(SequenceParallelTraining, GptUnderSp2Dp2AndBoth) {
  grid("attention", 2, 2);
  grid("attention", 2, 1);
  grid("attention", 4, 2);
}

TEST(SequenceParallelTraining, GlaUnderSp2Dp2AndBoth) {
  grid("gla", 2, 2);
  grid("gla", 2, 1);
  grid("gla", 4, 2);
}

}  // namespace
}  // namespace seqlab
