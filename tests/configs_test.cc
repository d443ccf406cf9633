// The recipe → config mapping's size checks (train/recipe/configs.h): the memory estimate against
// what one training step allocates on the CPU, and check_memory refusing a model that does not fit
// before anything is allocated, naming the key that makes it too big; train.dtype = "auto" resolving
// to bf16 exactly where the device has bf16 instructions.
#include "train/recipe/configs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tensor/kernels.h"
#include "train/loop/trainer.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

class ConfigsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("configs_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Recipe recipe(const std::string& text, const std::vector<std::string>& overrides = {}) {
    const fs::path file = dir_ / "r.toml";
    std::ofstream(file) << text;
    absl::StatusOr<Recipe> r = load_recipe(file.string(), overrides);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  fs::path dir_;
};

constexpr char kSmall[] = "[model]\nd_model = 32\nn_layers = 2\nn_heads = 4\n[train]\nbatch_size = 16\nseq_len = 32\n";

// The bytes one training step allocates on the CPU, from an empty model to after its update:
// weights, gradients, AdamW's moments and the activations the backward pass reads.
double measured_step_bytes(const Recipe& r, int64_t vocab) {
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().live_bytes;
  host.reset_peak();
  std::unique_ptr<LanguageModel> model = *build_model(r, vocab);
  Optimizer opt(optim_config(r), model->parameters());
  Trainer trainer(*model, opt, lr_schedule(r), trainer_options(r));
  for (int64_t step = 0; step < 2; ++step) {
    trainer.step(step, [&] {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < r.train.batch_size * r.train.seq_len; ++i) ids.push_back((i * 7 + step) % vocab);
      Tensor t = Tensor::from_indices(ids, {r.train.batch_size, r.train.seq_len});
      return Batch{t, t};
    });
  }
  return static_cast<double>(host.stats().peak_bytes - before);
}

TEST_F(ConfigsTest, AutoDtypeIsBf16WhereTheDeviceHasBf16Instructions) {
  const Recipe cpu = recipe(kSmall, {"train.device=cpu", "train.dtype=auto"});
  EXPECT_EQ(training_dtype(cpu), kernel::cpu_bf16_gemm_native() ? DType::bf16 : DType::f32)
      << kernel::cpu_bf16_gemm_config();
  // Widening forced (no bf16 instructions as far as the GEMMs go): auto falls back to f32.
  kernel::set_cpu_bf16_gemm_widened(true);
  EXPECT_EQ(training_dtype(cpu), DType::f32);
  kernel::set_cpu_bf16_gemm_widened(false);
  // An explicit dtype is what it says, whatever the device.
  EXPECT_EQ(training_dtype(recipe(kSmall, {"train.device=cpu", "train.dtype=bf16"})), DType::bf16);
  EXPECT_EQ(training_dtype(recipe(kSmall, {"train.device=cpu", "train.dtype=f32"})), DType::f32);
}

TEST_F(ConfigsTest, TheEstimateIsCloseToWhatAStepAllocates) {
  for (const std::string mixer : {"attention", "gla", "delta_net"}) {
    const Recipe r = recipe(kSmall, {"model.mixer=\"" + mixer + "\""});
    const MemoryEstimate e = *estimate_memory(r, 64);
    std::unique_ptr<LanguageModel> model = *build_model(r, 64);
    EXPECT_EQ(e.parameters, static_cast<double>(model->num_parameters())) << mixer;
    EXPECT_EQ(e.weights, 4 * e.parameters);
    EXPECT_EQ(e.gradients, 4 * e.parameters);
    EXPECT_EQ(e.optimizer, 8 * e.parameters);  // AdamW: two f32 moments
    model.reset();
    const double measured = measured_step_bytes(r, 64);
    // A lower estimate, so a refusal is never wrong, but of the right size.
    EXPECT_LE(e.training(), measured) << mixer;
    EXPECT_GE(e.training(), 0.4 * measured) << mixer << ": estimate " << e.training() << ", measured " << measured;
  }
}

TEST_F(ConfigsTest, AModelThatDoesNotFitIsRefusedNamingTheKey) {
  const int64_t kGiB = int64_t{1} << 30;
  struct Case {
    std::string set, key;
    bool training;
  };
  for (const Case& c : {Case{"model.d_model=1000000000", "model.d_model = 1000000000", false},
                        Case{"model.n_layers=100000", "model.n_layers = 100000", false},
                        Case{"model.vocab_size=1000000000", "model.vocab_size = 1000000000", false},
                        Case{"model.d_ff=999999999", "model.d_ff = 999999999", false},
                        Case{"train.batch_size=1000000", "train.batch_size = 1000000", true},
                        Case{"train.seq_len=10000000", "train.seq_len = 10000000", true}}) {
    const Recipe r = recipe("[model]\nd_model = 256\nn_heads = 4\n", {c.set});
    const absl::Status s = check_memory(r, 256, kGiB, c.training, "the host");
    ASSERT_FALSE(s.ok()) << c.set;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    const std::string m(s.message());
    EXPECT_EQ(m.rfind(r.source_path + ": " + c.key + " makes the model too big: ", 0), 0u) << m;
    EXPECT_NE(m.find("more than the 1 GiB available on the host (sizes are checked before anything is allocated)"),
              std::string::npos)
        << m;
    // What build_model does with it on this machine: refused the same way, nothing allocated.
    if (!c.training) {
      absl::StatusOr<std::unique_ptr<LanguageModel>> model = build_model(r, 256);
      ASSERT_FALSE(model.ok()) << c.set;
      EXPECT_NE(model.status().message().find(c.key + " makes the model too big"), std::string::npos);
    }
  }
  // What fits passes; an unknown amount of memory (-1) checks nothing.
  const Recipe small = recipe(kSmall);
  EXPECT_TRUE(check_memory(small, 64, kGiB, true, "the host").ok());
  EXPECT_TRUE(check_memory(recipe("", {"model.d_model=1000000000"}), 64, -1, true, "the host").ok());
}

}  // namespace
}  // namespace seqlab
