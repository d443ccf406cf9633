// The step profile (src/tensor/profile.h): what it counts and how it adds up, never how fast anything
// is. A toy of GEMMs shows its GEMMs; a kernel that calls GEMMs through the slot is counted once, with
// its GEMMs as nested time; linear_kernel's parts are counted as themselves; bf16 stand-ins are timed
// apart from the kernel they serve; off, nothing is recorded; and over a GPT training step the kernels'
// sum stays within the measured wall time and the report's categories add up to it.
#include "tensor/profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>

#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"
#include "train/optim/optim.h"

namespace seqlab {

// A kernel that runs two GEMMs and a fill through their slots, as a variant's kernel does.
SEQLAB_DECLARE_KERNEL(profile_test_outer_kernel, void (*)(const Tensor& a, const Tensor& out));

namespace {

void outer_cpu(const Tensor& a, const Tensor& out) {
  Tensor p = kernel::matmul(a, a);
  kernel::matmul(p, a, false, false, Tensor());
  kernel::fill_(out, 1.0);
}
SEQLAB_REGISTER_KERNEL(profile_test_outer_kernel, DeviceType::CPU, &outer_cpu);

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::map<std::string, profile::SlotTotals> by_name(const profile::Snapshot& s) {
  std::map<std::string, profile::SlotTotals> out;
  for (const profile::SlotTotals& t : s.slots) out[t.name] = t;
  return out;
}

// Σ of the categories' ms_per_step in the report's JSON.
double category_sum(const std::string& json) {
  const std::string cats = json.substr(json.find("\"categories\""), json.find("\"slots\"") - json.find("\"categories\""));
  std::regex ms("\"ms_per_step\": ([0-9.eE+-]+)");
  double sum = 0;
  for (auto it = std::sregex_iterator(cats.begin(), cats.end(), ms); it != std::sregex_iterator(); ++it) {
    sum += std::strtod((*it)[1].str().c_str(), nullptr);
  }
  return sum;
}

double json_field(const std::string& json, const std::string& key) {
  std::smatch m;
  const std::regex re("\"" + key + "\": ([0-9.eE+-]+)");
  EXPECT_TRUE(std::regex_search(json, m, re)) << key << " in " << json;
  return std::strtod(m[1].str().c_str(), nullptr);
}

TEST(Profile, OffByDefaultAndRecordsNothingWhileOff) {
  EXPECT_FALSE(profile::enabled());
  Generator gen(1);
  Tensor a = Tensor::randn({64, 64}, gen);
  profile::start();
  profile::stop();
  kernel::matmul(a, a);
  EXPECT_TRUE(profile::snapshot().slots.empty());
}

TEST(Profile, GemmHeavyToyShowsGemm) {
  Generator gen(2);
  Tensor a = Tensor::randn({256, 256}, gen), b = Tensor::randn({256, 256}, gen);
  Tensor small = Tensor::randn({16}, gen);
  const auto t0 = std::chrono::steady_clock::now();
  profile::start();
  for (int i = 0; i < 4; ++i) kernel::matmul(a, b);
  kernel::binary(kernel::BinaryOp::add, small, small);
  profile::stop();
  const double wall = seconds_since(t0);
  const profile::Snapshot s = profile::snapshot();
  auto slots = by_name(s);
  ASSERT_TRUE(slots.count("gemm_kernel"));
  EXPECT_EQ(slots["gemm_kernel"].calls, 4);
  EXPECT_EQ(slots["gemm_kernel"].category, "gemm");
  ASSERT_TRUE(slots.count("binary_kernel"));
  EXPECT_EQ(slots["binary_kernel"].calls, 1);
  EXPECT_EQ(slots["binary_kernel"].category, "elementwise");
  EXPECT_EQ(s.slots.front().name, "gemm_kernel");  // 4 GEMMs of 256³ against one add of 16 values
  EXPECT_LE(s.kernel_seconds(), wall);
  const std::string t = profile::table(s, wall, 1);
  EXPECT_NE(t.find("gemm_kernel"), std::string::npos) << t;
  EXPECT_NE(t.find("framework"), std::string::npos) << t;
}

TEST(Profile, NestedSlotCallsCountOnceWithTheirGemmShare) {
  Generator gen(3);
  Tensor a = Tensor::randn({96, 96}, gen), out = Tensor::empty({8});
  profile::start();
  profile_test_outer_kernel(cpu_device(), a, out);
  profile::stop();
  auto slots = by_name(profile::snapshot());
  ASSERT_EQ(slots.size(), 1u) << "only the outermost call is counted";
  const profile::SlotTotals& t = slots.at("profile_test_outer_kernel");
  EXPECT_EQ(t.calls, 1);
  EXPECT_EQ(t.category, "other");  // declared in a test, not under src/tensor/slots/
  EXPECT_GT(t.nested_gemm_seconds, 0.0);
  EXPECT_EQ(out.to_doubles()[3], 1.0);
}

// linear is one outermost call (its GEMM nested in it, then its own bias and GELU pass), in "gemm".
TEST(Profile, LinearIsOneCallWithItsGemmNested) {
  Generator gen(4);
  Tensor x = Tensor::randn({32, 24}, gen), w = Tensor::randn({40, 24}, gen), bias = Tensor::randn({40}, gen);
  profile::start();
  kernel::linear(x, w, bias, kernel::Activation::gelu);
  profile::stop();
  auto slots = by_name(profile::snapshot());
  ASSERT_EQ(slots.size(), 1u) << "the GEMM inside linear is not an outermost call";
  const profile::SlotTotals& t = slots.at("linear_kernel");
  EXPECT_EQ(t.calls, 1);
  EXPECT_EQ(t.category, "gemm");
  EXPECT_GT(t.nested_gemm_seconds, 0.0);
}

TEST(Profile, Bf16StandInsAreTimedApart) {
  Generator gen(5);
  Tensor a = kernel::to_dtype(Tensor::randn({64, 33}, gen), DType::bf16);
  // cumsum is one of the kernels that still reach bf16 through the f32 stand-ins (most of a step's
  // kernels take bf16 themselves: tests/bf16_cpu_test.cc).
  Tensor unprofiled = kernel::cumsum(a, 1);
  const auto t0 = std::chrono::steady_clock::now();
  profile::start();
  Tensor profiled = kernel::cumsum(a, 1);
  profile::stop();
  const double wall = seconds_since(t0);
  const profile::Snapshot s = profile::snapshot();
  auto slots = by_name(s);
  ASSERT_TRUE(slots.count("bf16 widen") && slots.count("bf16 round") && slots.count("cumsum_kernel"));
  EXPECT_EQ(slots["bf16 widen"].calls, 1);
  EXPECT_EQ(slots["bf16 round"].calls, 1);
  EXPECT_EQ(slots["bf16 widen"].category, "bf16 stand-ins");
  EXPECT_EQ(slots["cumsum_kernel"].calls, 1);
  EXPECT_FALSE(slots.count("copy_kernel")) << "the conversions' copies are inside them";
  EXPECT_LE(s.kernel_seconds(), wall);
  // Timing changes nothing computed.
  EXPECT_EQ(profiled.to_doubles(), unprofiled.to_doubles());
}

TEST(Profile, Categories) {
  EXPECT_EQ(profile::category_of("gemm_kernel", "tensor/kernels.h"), "gemm");
  EXPECT_EQ(profile::category_of("attention_forward_kernel", "x/tensor/slots/attention/attention.h"),
            "attention/variant");
  EXPECT_EQ(profile::category_of("gla_backward_kernel", "x/tensor/slots/scan/gla.h"), "attention/variant");
  EXPECT_EQ(profile::category_of("adamw_step_kernel", "x/tensor/slots/optim.h"), "optimizer");
  EXPECT_EQ(profile::category_of("sum_squares_kernel", "x/tensor/slots/optim.h"), "optimizer");
  EXPECT_EQ(profile::category_of("add_layer_norm_kernel", "x/tensor/kernels.h"), "norm");
  EXPECT_EQ(profile::category_of("rms_norm_backward_kernel", "x/tensor/kernels.h"), "norm");
  EXPECT_EQ(profile::category_of("where_kernel", "x/tensor/kernels.h"), "elementwise");
  EXPECT_EQ(profile::category_of("fill_kernel", "x/tensor/kernels.h"), "memory");
  EXPECT_EQ(profile::category_of("cross_entropy_backward_kernel", "x/tensor/kernels.h"), "loss/softmax/embedding");
  EXPECT_EQ(profile::category_of("embedding_kernel", "x/tensor/kernels.h"), "loss/softmax/embedding");
  EXPECT_EQ(profile::category_of("bf16 round", "tensor/dispatch.h"), "bf16 stand-ins");
  for (const std::string& c : {"gemm", "attention/variant", "norm", "elementwise", "optimizer", "memory",
                               "bf16 stand-ins", "loss/softmax/embedding", "other", "framework"}) {
    EXPECT_NE(std::find(profile::categories().begin(), profile::categories().end(), c), profile::categories().end())
        << c;
  }
}

// Steps of a small GPT (f32, then bf16): every kernel call is in the profile once, so their sum stays
// within the wall time; the report's categories, framework included, add up to the wall time.
void check_training_steps(DType dtype) {
  const ModelConfig cfg = gpt2_config(64, 32, 2, 2, 16);
  Generator gen(6);
  Decoder model(cfg, gen);
  if (dtype != DType::f32) model.to(cpu_device(), dtype);
  OptimConfig oc;
  Optimizer opt(oc, model.parameters());
  std::vector<int64_t> ids;
  for (int i = 0; i < 3 * 17; ++i) ids.push_back(static_cast<int64_t>(gen.next_u64() % 64));
  Tensor all = Tensor::from_indices(ids, {3, 17});
  Tensor inputs = kernel::contiguous(kernel::narrow(all, 1, 0, 16));
  Tensor targets = kernel::contiguous(kernel::narrow(all, 1, 1, 16));
  auto step = [&] {
    Tensor l = model.loss({inputs, targets});
    opt.zero_grad();
    backward(l);
    opt.step(1e-3);
  };
  step();
  const auto t0 = std::chrono::steady_clock::now();
  profile::start();
  for (int i = 0; i < 2; ++i) step();
  profile::stop();
  const double wall = seconds_since(t0);
  const profile::Snapshot s = profile::snapshot();
  auto slots = by_name(s);
  EXPECT_LE(s.kernel_seconds(), wall);
  for (const char* name : {"gemm_kernel", "attention_forward_kernel", "attention_backward_kernel",
                           "cross_entropy_kernel", "embedding_kernel"}) {
    EXPECT_TRUE(slots.count(name)) << name;
  }
  EXPECT_EQ(slots["attention_forward_kernel"].calls, 2 * static_cast<int64_t>(cfg.blocks.size()));
  EXPECT_EQ(slots["attention_forward_kernel"].category, "attention/variant");
  bool optimizer = false;
  for (const profile::SlotTotals& t : s.slots) optimizer |= t.category == "optimizer";
  EXPECT_TRUE(optimizer);
  // Every kernel of a GPT step takes bf16 itself now: no f32 stand-ins are made (tests/bf16_cpu_test.cc).
  if (dtype == DType::bf16) EXPECT_FALSE(slots.count("bf16 widen") || slots.count("bf16 round"));
  const std::string json = profile::json(s, wall, 2);
  EXPECT_NEAR(category_sum(json), json_field(json, "wall_ms_per_step"), 1e-3) << json;
  EXPECT_NEAR(json_field(json, "wall_ms_per_step"), 1000.0 * wall / 2, 1e-3);
}

TEST(Profile, TrainingStepAddsUpF32) { check_training_steps(DType::f32); }
TEST(Profile, TrainingStepAddsUpBf16) { check_training_steps(DType::bf16); }

}  // namespace
}  // namespace seqlab
