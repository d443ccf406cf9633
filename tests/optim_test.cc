// Optimizers, clipping and schedules: two AdamW and SGD steps against numbers worked out by hand
// (in exact decimal arithmetic), weight-decay groups, skipped parameters, the clipping factor, the
// schedules at their key steps, and a save → load → next step that matches bit for bit.
#include "train/optim/optim.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "train/checkpoint/safetensors.h"
#include "tensor/slots/optim.h"
#include "train/optim/schedule.h"

namespace seqlab {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

Tensor leaf(const std::vector<double>& v, DType dtype = DType::f64) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype);
  set_requires_grad(t, true);
  return t;
}

void set_grad(Tensor& t, const std::vector<double>& g) { set_grad(t, Tensor::from_vector(g, t.shape(), t.dtype())); }

void expect_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-14) {
  std::vector<double> got = t.to_doubles();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

std::map<std::string, Tensor> state_map(const Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : opt.state_tensors()) out.emplace(name, t);
  return out;
}

OptimConfig adamw_config() {
  OptimConfig c;
  c.name = "adamw";
  c.lr = 123.0;  // step()'s argument is what counts
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  return c;
}

OptimConfig sgd_config(bool nesterov) {
  OptimConfig c;
  c.name = "sgd";
  c.momentum = 0.9;
  c.nesterov = nesterov;
  c.weight_decay = 0.1;
  return c;
}

// p = [1, −2], lr 0.1, wd 0.1, β = (0.9, 0.99), ε = 1e−8; g1 = [0.5, −1], g2 = [−0.25, 2].
// Step 1: p ← 0.99·p; m = [0.05, −0.1], v = [0.0025, 0.01], m̂ = g, √v̂ = |g|, so each p moves by
// 0.1·g/(|g| + ε). Step 2: m = [0.02, 0.11], v = [0.0031, 0.0499], bc1 = 0.19, bc2 = 0.0199.
TEST(AdamW, TwoStepsMatchTheHandComputation) {
  Tensor w = leaf({1.0, -2.0});
  Optimizer opt(adamw_config(), {Parameter{"w", &w, ParamRole::matrix}});
  set_grad(w, {0.5, -1.0});
  opt.step(0.1);
  expect_near(w, {0.890000002, -1.880000001});
  set_grad(w, {-0.25, 2.0});
  opt.step(0.1);
  expect_near(w, {0.85443005974793347, -1.8977607720926054});
  EXPECT_EQ(opt.steps(), 2);

  std::map<std::string, Tensor> state = state_map(opt);
  expect_near(state.at("optim.exp_avg.w"), {0.02, 0.11});
  expect_near(state.at("optim.exp_avg_sq.w"), {0.0031, 0.0499});
  EXPECT_EQ(state.at("optim.step.w").item(), 2);
  EXPECT_EQ(state.at("optim.step").item(), 2);
  EXPECT_EQ(state.at("optim.exp_avg.w").dtype(), DType::f64);  // f64 parameters keep f64 moments
}

TEST(AdamW, F32ParametersKeepF32Moments) {
  Tensor w = leaf({1.0, -2.0}, DType::f32);
  Optimizer opt(adamw_config(), {Parameter{"w", &w, ParamRole::matrix}});
  set_grad(w, {0.5, -1.0});
  opt.step(0.1);
  expect_near(w, {0.890000002, -1.880000001}, 1e-6);
  for (const auto& [name, t] : opt.state_tensors()) {
    if (name != "optim.step" && name != "optim.step.w") {
      EXPECT_EQ(t.dtype(), DType::f32) << name;
    }
  }
}

// Same p, g, lr and wd. Momentum: b1 = g1, b2 = 0.9·g1 + g2 = [0.2, 1.1]; step d = b.
// Nesterov: d = g + 0.9·b, i.e. [0.95, −1.9] then [−0.07, 2.99].
TEST(Sgd, TwoStepsMatchTheHandComputation) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "momentum");
    Tensor w = leaf({1.0, -2.0});
    Optimizer opt(sgd_config(nesterov), {Parameter{"w", &w, ParamRole::matrix}});
    set_grad(w, {0.5, -1.0});
    opt.step(0.1);
    expect_near(w, nesterov ? std::vector<double>{0.895, -1.79} : std::vector<double>{0.94, -1.88});
    set_grad(w, {-0.25, 2.0});
    opt.step(0.1);
    expect_near(w, nesterov ? std::vector<double>{0.89305, -2.0711} : std::vector<double>{0.9106, -1.9712});
    auto state = opt.state_tensors();
    ASSERT_EQ(state.size(), 2u);
    EXPECT_EQ(state[1].first, "optim.momentum_buffer.w");
    expect_near(state[1].second, {0.2, 1.1});
  }
}

TEST(Sgd, WithoutMomentumHasNoBuffer) {
  OptimConfig c = sgd_config(false);
  c.momentum = 0;
  c.weight_decay = 0;
  Tensor w = leaf({1.0, -2.0});
  Optimizer opt(c, {Parameter{"w", &w, ParamRole::matrix}});
  set_grad(w, {0.5, -1.0});
  opt.step(0.5);
  expect_near(w, {0.75, -1.5});
  ASSERT_EQ(opt.state_tensors().size(), 1u);  // only optim.step
}

TEST(Sgd, Bf16ParametersAreUpdatedThroughF32) {
  OptimConfig c = sgd_config(false);
  c.weight_decay = 0;
  Tensor w = leaf({1.0, -2.0}, DType::bf16);
  Optimizer opt(c, {Parameter{"w", &w, ParamRole::matrix}});
  set_grad(w, {0.5, -1.0});
  opt.step(0.5);
  expect_near(w, {0.75, -1.5}, 0);
  EXPECT_EQ(opt.state_tensors()[1].second.dtype(), DType::f32);
}

// Zero gradients isolate the decay: AdamW's update is 0 / (0 + ε) = 0, so p ← (1 − lr·wd)·p.
struct FourRoles {
  Tensor w = leaf({1.0}), b = leaf({1.0}), g = leaf({1.0}), e = leaf({1.0});
  std::vector<Parameter> params() {
    return {{"w", &w, ParamRole::matrix},
            {"b", &b, ParamRole::bias},
            {"g", &g, ParamRole::norm},
            {"e", &e, ParamRole::embedding}};
  }
  std::vector<double> after_one_step(const OptimConfig& c) {
    Optimizer opt(c, params());
    for (Tensor* t : {&w, &b, &g, &e}) set_grad(*t, {0.0});
    opt.step(0.5);
    return {w.item(), b.item(), g.item(), e.item()};
  }
};

TEST(Optimizer, DecayGoesOnlyToTheDecayedGroupUnlessFlagged) {
  OptimConfig c = adamw_config();
  c.weight_decay = 0.2;  // decayed: 1 − 0.5·0.2 = 0.9
  EXPECT_EQ(FourRoles().after_one_step(c), (std::vector<double>{0.9, 1.0, 1.0, 1.0}));
  c.decay_biases = true;
  EXPECT_EQ(FourRoles().after_one_step(c), (std::vector<double>{0.9, 0.9, 1.0, 1.0}));
  c.decay_norms = true;
  EXPECT_EQ(FourRoles().after_one_step(c), (std::vector<double>{0.9, 0.9, 0.9, 1.0}));
  c.decay_biases = c.decay_norms = false;
  c.decay_embeddings = true;
  EXPECT_EQ(FourRoles().after_one_step(c), (std::vector<double>{0.9, 1.0, 1.0, 0.9}));
  c = sgd_config(false);
  c.weight_decay = 0.2;
  EXPECT_EQ(FourRoles().after_one_step(c), (std::vector<double>{0.9, 1.0, 1.0, 1.0}));

  FourRoles f;
  std::vector<ParamGroup> groups = default_param_groups(f.params(), c);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "decay");
  EXPECT_EQ(groups[0].weight_decay, 0.2);
  ASSERT_EQ(groups[0].params.size(), 1u);
  EXPECT_EQ(groups[0].params[0].name, "w");
  EXPECT_EQ(groups[1].name, "no_decay");
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(groups[1].params.size(), 3u);
}

TEST(Optimizer, GroupLrScaleMultipliesTheStepLr) {
  OptimConfig c = sgd_config(false);
  c.momentum = 0;
  c.weight_decay = 0;
  Tensor a = leaf({1.0}), b = leaf({1.0});
  Optimizer opt(c, std::vector<ParamGroup>{{"fast", 1.0, 0.0, {{"a", &a, ParamRole::matrix}}},
                                           {"slow", 0.25, 0.0, {{"b", &b, ParamRole::matrix}}}});
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step(0.5);
  EXPECT_EQ(a.item(), 0.5);
  EXPECT_EQ(b.item(), 0.875);
}

TEST(Optimizer, SkipsParametersWithoutGradientAndKeepsTheirState) {
  Tensor a = leaf({1.0, -2.0}), b = leaf({3.0, 4.0});
  Optimizer opt(adamw_config(), {Parameter{"a", &a, ParamRole::matrix}, Parameter{"b", &b, ParamRole::matrix}});
  set_grad(a, {0.5, -1.0});
  opt.step(0.1);
  expect_near(a, {0.890000002, -1.880000001});
  EXPECT_EQ(b.to_doubles(), (std::vector<double>{3.0, 4.0}));
  std::map<std::string, Tensor> state = state_map(opt);
  EXPECT_EQ(state.at("optim.exp_avg.b").to_doubles(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(state.at("optim.exp_avg_sq.b").to_doubles(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(state.at("optim.step.b").item(), 0);
  EXPECT_EQ(state.at("optim.step.a").item(), 1);

  // b's first update is a first update: bias correction with t = 1, as for a fresh optimizer.
  opt.zero_grad();
  EXPECT_FALSE(grad_of(a).defined());
  set_grad(b, {0.5, -1.0});
  opt.step(0.1);
  expect_near(a, {0.890000002, -1.880000001});
  expect_near(b, {3.0 * 0.99 - 0.1 * 0.5 / (0.5 + 1e-8), 4.0 * 0.99 + 0.1 * 1.0 / (1.0 + 1e-8)});
  EXPECT_EQ(opt.steps(), 2);
}

TEST(Optimizer, RejectsBadConfigs) {
  OptimConfig c;
  c.name = "adam";
  EXPECT_TRUE(contains(std::string(validate(c).message()), "unknown optimizer 'adam'"));
  Tensor w = leaf({1.0});
  EXPECT_THROW(Optimizer(c, {Parameter{"w", &w, ParamRole::matrix}}), std::invalid_argument);
  c = OptimConfig();
  c.beta2 = 1.0;
  EXPECT_TRUE(contains(std::string(validate(c).message()), "beta2"));
  c = sgd_config(true);
  c.momentum = 0;
  EXPECT_TRUE(contains(std::string(validate(c).message()), "nesterov"));
  EXPECT_TRUE(validate(OptimConfig()).ok());
  EXPECT_THROW(Optimizer(OptimConfig(), {Parameter{"w", &w, ParamRole::matrix}, Parameter{"w", &w, ParamRole::bias}}),
               std::invalid_argument);
}

TEST(Optimizer, RejectsAGradientOfAnotherDtype) {
  Tensor w = leaf({1.0, 2.0});
  Optimizer opt(adamw_config(), {Parameter{"w", &w, ParamRole::matrix}});
  set_grad(w, Tensor::zeros({2}, DType::f32));
  try {
    opt.step(0.1);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "'w'")) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------
// The multi-tensor AdamW step (adamw_multi_step_kernel, which Optimizer::step calls on the CPU) against
// one adamw_step_kernel per parameter: the same bits in p, m, v and the master, for f64, f32 and bf16
// parameters (with a bf16 gradient or an f32 sum of micro-batch gradients), with sizes that put thread
// boundaries inside tensors and tensors smaller than a thread's share, over three steps.

struct AdamWCase {
  DType param, grad;
  int64_t n;
};

TEST(AdamWMulti, SameBitsAsOneKernelPerParameter) {
  const std::vector<AdamWCase> cases = {{DType::f64, DType::f64, 7},      {DType::f32, DType::f32, 1},
                                        {DType::f32, DType::f32, 20011},  {DType::bf16, DType::bf16, 3},
                                        {DType::bf16, DType::f32, 9000},  {DType::f32, DType::f32, 65537},
                                        {DType::bf16, DType::bf16, 33333}, {DType::f64, DType::f64, 12000}};
  Generator gen(11);
  struct State {
    Tensor p, m, v, w;
  };
  auto make = [&](const AdamWCase& c) {
    State s;
    s.p = kernel::to_dtype(Tensor::randn({c.n}, gen), c.param);
    const DType sd = c.param == DType::f64 ? DType::f64 : DType::f32;
    s.m = Tensor::zeros({c.n}, sd);
    s.v = Tensor::zeros({c.n}, sd);
    if (c.param == DType::bf16) s.w = kernel::to_dtype(s.p, DType::f32);
    return s;
  };
  std::vector<State> one, multi;
  for (const AdamWCase& c : cases) {
    one.push_back(make(c));
    multi.push_back({kernel::clone(one.back().p), kernel::clone(one.back().m), kernel::clone(one.back().v),
                     one.back().w.defined() ? kernel::clone(one.back().w) : Tensor()});
  }
  for (int t = 1; t <= 3; ++t) {
    std::vector<kernel::AdamWTensors> entries;
    for (size_t j = 0; j < cases.size(); ++j) {
      const Tensor g = kernel::to_dtype(Tensor::randn({cases[j].n}, gen, DType::f64, 0.3), cases[j].grad);
      // Per-group settings differ per tensor: lr and decay from the index, bias corrections from t.
      kernel::AdamWStep a{1e-2 * static_cast<double>(j + 1), j % 2 ? 0.1 : 0.0, 0.9, 0.95, 1e-8,
                          1.0 - std::pow(0.9, t), 1.0 - std::pow(0.95, t)};
      kernel::adamw_step_kernel(cpu_device(), a, one[j].p, g, one[j].m, one[j].v, one[j].w);
      entries.push_back({a, multi[j].p, g, multi[j].m, multi[j].v, multi[j].w});
    }
    kernel::adamw_multi_step_kernel(cpu_device(), entries);
    for (size_t j = 0; j < cases.size(); ++j) {
      SCOPED_TRACE("step " + std::to_string(t) + ", tensor " + std::to_string(j));
      EXPECT_TRUE(same_bits(one[j].p, multi[j].p));
      EXPECT_TRUE(same_bits(one[j].m, multi[j].m));
      EXPECT_TRUE(same_bits(one[j].v, multi[j].v));
      if (one[j].w.defined()) EXPECT_TRUE(same_bits(one[j].w, multi[j].w));
    }
  }
  // The update moved every tensor (the comparison above is not of untouched values).
  EXPECT_FALSE(same_bits(one[2].m, Tensor::zeros({cases[2].n}, DType::f32)));
}

// The gradient norm and clip over many tensors in one call each, against the per-tensor kernels: the same
// bits for f64, f32 and bf16, with tensors of several sum blocks (2^15 elements), of none and of one.
TEST(GradNormMulti, SameBitsAsOneKernelPerTensor) {
  Generator gen(12);
  std::vector<Tensor> xs = {Tensor::randn({70001}, gen, DType::f64), Tensor::randn({5}, gen),
                            kernel::to_dtype(Tensor::randn({40000}, gen), DType::bf16), Tensor::empty({0}),
                            Tensor::randn({32768}, gen), kernel::to_dtype(Tensor::randn({3}, gen), DType::bf16)};
  Tensor sums = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::f64);
  kernel::sum_squares_multi_kernel(cpu_device(), xs, sums);
  for (size_t j = 0; j < xs.size(); ++j) {
    Tensor one = Tensor::empty({1}, DType::f64);
    kernel::sum_squares_kernel(cpu_device(), xs[j], one);
    const double a = one.to_doubles()[0], b = sums.to_doubles()[j];
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "tensor " << j << ": " << a << " vs " << b;
  }
  EXPECT_GT(sums.to_doubles()[0], 60000.0);  // Σ of 70001 squares of N(0, 1) draws: the sums are real
  std::vector<Tensor> each, together;
  for (const Tensor& x : xs) {
    each.push_back(kernel::clone(x));
    together.push_back(kernel::clone(x));
  }
  for (const Tensor& x : each) kernel::scale_inplace_kernel(cpu_device(), x, 0.3711);
  kernel::scale_inplace_multi_kernel(cpu_device(), together, 0.3711);
  for (size_t j = 0; j < xs.size(); ++j) {
    EXPECT_TRUE(same_bits(each[j], together[j])) << "tensor " << j;
    if (xs[j].numel() > 0) EXPECT_FALSE(same_bits(each[j], xs[j])) << "tensor " << j << " was scaled";
  }
}

TEST(AdamWMulti, RefusesABf16ParameterWithoutMaster) {
  Tensor p = Tensor::zeros({4}, DType::bf16), g = Tensor::zeros({4}, DType::bf16);
  Tensor m = Tensor::zeros({4}), v = Tensor::zeros({4});
  try {
    kernel::adamw_multi_step_kernel(cpu_device(), {{kernel::AdamWStep{}, p, g, m, v, Tensor()}});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "no f32 master")) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------
// Clipping and scaling

TEST(ClipGradNorm, ReturnsTheNormAndScalesToMaxNorm) {
  Tensor a = leaf({3.0, 0.0}), b = leaf({0.0}), c = leaf({1.0});
  std::vector<Parameter> params = {
      {"a", &a, ParamRole::matrix}, {"b", &b, ParamRole::bias}, {"c", &c, ParamRole::norm}};
  set_grad(a, {3.0, 0.0});
  set_grad(b, {-4.0});  // c has no gradient and counts for nothing
  EXPECT_EQ(clip_grad_norm(params, 10.0), 5.0);
  EXPECT_EQ(grad_of(a).to_doubles(), (std::vector<double>{3.0, 0.0}));  // below max_norm: untouched
  EXPECT_EQ(clip_grad_norm(params, 0.0), 5.0);                        // 0: off
  EXPECT_EQ(grad_of(b).to_doubles(), (std::vector<double>{-4.0}));

  EXPECT_EQ(clip_grad_norm(params, 1.0), 5.0);
  const double k = 1.0 / (5.0 + 1e-6);
  expect_near(grad_of(a), {3.0 * k, 0.0}, 1e-16);
  expect_near(grad_of(b), {-4.0 * k}, 1e-16);
  EXPECT_FALSE(grad_of(c).defined());
  EXPECT_NEAR(clip_grad_norm(params, 1.0), 1.0, 1e-6);

  // f32 gradients are summed in double: 2^20 equal elements x have norm 1024·x to double precision.
  Tensor big = Tensor::zeros({1 << 20}, DType::f32);
  set_requires_grad(big, true);
  set_grad(big, Tensor::full({1 << 20}, 1e-3, DType::f32));
  const double x = static_cast<float>(1e-3);
  // (A running f32 sum would give 1.0273.)
  EXPECT_NEAR(clip_grad_norm({{"big", &big, ParamRole::matrix}}, 0.0), 1024 * x, 1e-12);
}

// squared_norm over several tensors: each tensor's sum as squared_norm gives it alone, added in the order
// given (the same bits), strided views made contiguous, nothing for an empty list.
TEST(SquaredNorm, AddsEachTensorsSumInOrder) {
  Generator gen(5);
  const Tensor a = Tensor::randn({1000}, gen, DType::f32), b = Tensor::randn({3, 70000}, gen, DType::f64),
               c = Tensor::randn({40, 30}, gen, DType::f32);
  const Tensor ct = kernel::transpose(c, 0, 1);  // a strided view
  const double want = (kernel::squared_norm(a) + kernel::squared_norm(b)) + kernel::squared_norm(kernel::contiguous(ct));
  EXPECT_EQ(kernel::squared_norm(std::vector<Tensor>{a, b, ct}), want);
  EXPECT_EQ(kernel::squared_norm(std::vector<Tensor>{}), 0.0);
  EXPECT_EQ(kernel::squared_norm(Tensor::zeros({0}, DType::f32)), 0.0);
  EXPECT_EQ(kernel::squared_norm(Tensor::from_vector({3.0, -4.0}, {2}, DType::f32)), 25.0);
}

TEST(ClipGradNorm, NonFiniteNormIsReturnedWithoutScaling) {
  Tensor a = leaf({0.0, 0.0}), b = leaf({0.0});
  std::vector<Parameter> params = {{"a", &a, ParamRole::matrix}, {"b", &b, ParamRole::bias}};
  set_grad(a, {std::numeric_limits<double>::infinity(), 1.0});
  set_grad(b, {2.0});
  EXPECT_TRUE(std::isinf(clip_grad_norm(params, 1.0)));
  EXPECT_EQ(grad_of(b).to_doubles(), std::vector<double>{2.0});
  set_grad(a, {std::nan(""), 1.0});
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0)));
  EXPECT_EQ(grad_of(b).to_doubles(), std::vector<double>{2.0});
}

TEST(ScaleGrads, ScalesEveryGradientInPlaceOnce) {
  Tensor a = leaf({0.0, 0.0}), b = leaf({0.0});
  set_grad(a, {2.0, -6.0});
  Tensor a_grad = grad_of(a);
  // a listed twice (a tied weight) is still scaled once; b has no gradient.
  scale_grads({{"a", &a, ParamRole::matrix}, {"tied", &a, ParamRole::embedding}, {"b", &b, ParamRole::bias}}, 0.25);
  EXPECT_EQ(a_grad.to_doubles(), (std::vector<double>{0.5, -1.5}));
  EXPECT_FALSE(grad_of(b).defined());
}

// ------------------------------------------------------------------------------------------------
// Schedules: lr 1, 10 warmup steps, 110 steps, floor 0.1.

LrSchedule schedule(ScheduleKind kind) { return LrSchedule{kind, 1.0, 10, 110, 0.1}; }

TEST(Schedule, WarmupIsLinearFromTheFirstStep) {
  for (ScheduleKind k : {ScheduleKind::cosine, ScheduleKind::linear, ScheduleKind::constant}) {
    SCOPED_TRACE(schedule_name(k));
    EXPECT_DOUBLE_EQ(schedule(k).lr_at(0), 0.1);
    EXPECT_DOUBLE_EQ(schedule(k).lr_at(4), 0.5);
    EXPECT_DOUBLE_EQ(schedule(k).lr_at(9), 1.0);   // the last warmup step reaches the peak
    EXPECT_DOUBLE_EQ(schedule(k).lr_at(10), 1.0);  // and decay starts from it
  }
}

TEST(Schedule, CosineDecaysToTheFloor) {
  LrSchedule s = schedule(ScheduleKind::cosine);
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.1 + 0.45 * (1 + std::sqrt(0.5)));  // a quarter of the way
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55);                               // half way
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);
}

TEST(Schedule, LinearDecaysToTheFloor) {
  LrSchedule s = schedule(ScheduleKind::linear);
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.775);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);
}

TEST(Schedule, ConstantStaysAtThePeak) {
  LrSchedule s = schedule(ScheduleKind::constant);
  EXPECT_EQ(s.lr_at(35), 1.0);
  EXPECT_EQ(s.lr_at(60), 1.0);
  EXPECT_EQ(s.lr_at(110), 1.0);
}

TEST(Schedule, NoWarmupStartsAtThePeakAndParsesNames) {
  LrSchedule s{ScheduleKind::cosine, 2.0, 0, 100, 0.0};
  EXPECT_EQ(s.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 1.0);
  EXPECT_EQ(s.lr_at(100), 0.0);
  EXPECT_EQ(*parse_schedule_kind("linear"), ScheduleKind::linear);
  EXPECT_TRUE(contains(std::string(parse_schedule_kind("step").status().message()), "unknown schedule 'step'"));
  EXPECT_TRUE(validate(s).ok());
  s.min_lr_ratio = 1.5;
  EXPECT_TRUE(contains(std::string(validate(s).message()), "min_lr_ratio"));
}

// ------------------------------------------------------------------------------------------------
// State: save, load into a fresh optimizer, continue bit for bit.

struct Model {
  Tensor w, b;
  explicit Model(uint64_t seed) {
    Generator gen(seed);
    w = Tensor::randn({3, 5}, gen, DType::f32);
    b = Tensor::randn({5}, gen, DType::f32);
    set_requires_grad(w, true);
    set_requires_grad(b, true);
  }
  std::vector<Parameter> params() {
    return {{"blocks.0.w", &w, ParamRole::matrix}, {"blocks.0.b", &b, ParamRole::bias}};
  }
  void set_grads(Generator& gen) {
    set_grad(w, Tensor::randn(w.shape(), gen, DType::f32));
    set_grad(b, Tensor::randn(b.shape(), gen, DType::f32));
  }
};


TEST(OptimizerState, SaveLoadContinuesBitForBit) {
  const std::string path = ::testing::TempDir() + "/optim_state_" + std::to_string(::getpid()) + ".safetensors";
  for (std::string name : {"adamw", "sgd"}) {
    SCOPED_TRACE(name);
    OptimConfig c = name == "adamw" ? adamw_config() : sgd_config(true);
    Model a(7);
    Optimizer opt_a(c, a.params());
    Generator grads(11);
    for (int i = 0; i < 3; ++i) {
      a.set_grads(grads);
      opt_a.step(0.01 * (i + 1));
    }
    // A checkpoint: weights and optimizer state in one file.
    std::vector<std::pair<std::string, Tensor>> ckpt = opt_a.state_tensors();
    for (const Parameter& p : a.params()) ckpt.emplace_back(p.name, *p.tensor);
    ASSERT_TRUE(write_safetensors(path, ckpt).ok());
    absl::StatusOr<SafetensorsContents> file = read_safetensors(path);
    ASSERT_TRUE(file.ok()) << file.status();

    Model b(99);  // different weights, restored from the file
    for (const Parameter& p : b.params()) kernel::copy_(*p.tensor, file->tensors.at(p.name));
    Optimizer opt_b(c, b.params());
    absl::Status loaded = opt_b.load_state(file->tensors);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(opt_b.steps(), 3);

    Generator next(5);
    a.set_grads(next);
    set_grad(b.w, kernel::clone(grad_of(a.w)));
    set_grad(b.b, kernel::clone(grad_of(a.b)));
    opt_a.step(0.04);
    opt_b.step(0.04);
    EXPECT_TRUE(same_bits(a.w, b.w));
    EXPECT_TRUE(same_bits(a.b, b.b));
    auto sa = opt_a.state_tensors(), sb = opt_b.state_tensors();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_TRUE(same_bits(sa[i].second, sb[i].second)) << sa[i].first;
    }
  }
  std::filesystem::remove(path);
}

TEST(OptimizerState, NamesAreStable) {
  Model m(1);
  std::vector<std::string> names;
  for (const auto& [name, t] : Optimizer(adamw_config(), m.params()).state_tensors()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"optim.step", "optim.exp_avg.blocks.0.w", "optim.exp_avg_sq.blocks.0.w",
                                             "optim.step.blocks.0.w", "optim.exp_avg.blocks.0.b",
                                             "optim.exp_avg_sq.blocks.0.b", "optim.step.blocks.0.b"}));
}

TEST(OptimizerState, LoadReportsTheFirstMismatchAndChangesNothing) {
  Model m(1);
  Optimizer saved(adamw_config(), m.params());
  Generator gen(2);
  m.set_grads(gen);
  saved.step(0.1);
  std::map<std::string, Tensor> good;
  for (auto& [name, t] : saved.state_tensors()) good.emplace(name, kernel::clone(t));
  good.emplace("blocks.0.w", m.w);  // other entries of a checkpoint are ignored

  Optimizer fresh(adamw_config(), m.params());
  auto error = [&](const std::map<std::string, Tensor>& state) {
    return std::string(fresh.load_state(state).message());
  };

  std::map<std::string, Tensor> missing = good;
  missing.erase("optim.exp_avg_sq.blocks.0.b");
  std::string e = error(missing);
  EXPECT_TRUE(contains(e, "'optim.exp_avg_sq.blocks.0.b' is missing")) << e;

  std::map<std::string, Tensor> wrong_shape = good;
  wrong_shape["optim.exp_avg.blocks.0.w"] = Tensor::zeros({5, 3});
  e = error(wrong_shape);
  EXPECT_TRUE(contains(e, "'optim.exp_avg.blocks.0.w' is [5, 3] f32 but [3, 5] f32 is expected")) << e;

  std::map<std::string, Tensor> wrong_dtype = good;
  wrong_dtype["optim.exp_avg.blocks.0.b"] = Tensor::zeros({5}, DType::f64);
  e = error(wrong_dtype);
  EXPECT_TRUE(contains(e, "'optim.exp_avg.blocks.0.b' is [5] f64 but [5] f32 is expected")) << e;

  std::map<std::string, Tensor> extra = good;
  extra["optim.exp_avg.blocks.1.w"] = Tensor::zeros({3, 5});
  e = error(extra);
  EXPECT_TRUE(contains(e, "unexpected 'optim.exp_avg.blocks.1.w'")) << e;

  Optimizer sgd(sgd_config(false), m.params());
  e = std::string(sgd.load_state(good).message());
  EXPECT_TRUE(contains(e, "'optim.momentum_buffer.blocks.0.w' is missing")) << e;

  // None of the failures changed anything; the good state then loads.
  EXPECT_EQ(fresh.steps(), 0);
  for (const auto& [name, t] : fresh.state_tensors()) EXPECT_EQ(t.to_doubles(), std::vector<double>(t.numel(), 0.0));
  ASSERT_TRUE(fresh.load_state(good).ok());
  EXPECT_EQ(fresh.steps(), 1);
  for (const auto& [name, t] : fresh.state_tensors()) EXPECT_TRUE(same_bits(t, good.at(name))) << name;
}

}  // namespace
}  // namespace seqlab
