// The GPT model: parameter names and count against a hand count, logits shape, the loss of an
// untrained model (≈ log V), KV-cache decoding against the full forward (learned, rotary and no
// positions), float64 finite-difference checks of the loss gradient (with rotary positions and
// with dropout masks replayed from the generator's state), dropout in training and eval mode,
// and plain SGD reducing the loss on a fixed batch.
#include "layers/model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kC = 12, kL = 2, kH = 3, kT = 5, kB = 2, kMaxLen = 16;

// GELU/LayerNorm/bias with learned positions, or SwiGLU/RMSNorm without bias or positions;
// `positions` overrides the position kind.
GptConfig small_config(int64_t kv_heads, bool swiglu) {
  GptConfig cfg;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_layers = kL;
  cfg.n_heads = kH;
  cfg.n_kv_heads = kv_heads;
  cfg.max_seq_len = kMaxLen;
  if (swiglu) {
    cfg.swiglu = true;
    cfg.norm = NormKind::rms_norm;
    cfg.positions = PositionKind::none;
    cfg.bias = false;
  }
  return cfg;
}

GptConfig small_config(int64_t kv_heads, bool swiglu, PositionKind positions) {
  GptConfig cfg = small_config(kv_heads, swiglu);
  cfg.positions = positions;
  return cfg;
}

const char* name_of(PositionKind p) {
  return p == PositionKind::learned ? "learned" : p == PositionKind::rope ? "rope" : "none";
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

Tensor tokens_batch() { return Tensor::from_indices({1, 4, 7, 2, 9, 3, 3, 10, 0, 5}, {kB, kT}, DType::i64); }
Tensor targets_batch() { return Tensor::from_indices({4, 7, 2, 9, 6, 3, 10, 0, 5, -100}, {kB, kT}, DType::i64); }

TEST(Gpt, ParameterNamesAndCount) {
  for (int64_t hk : {int64_t{3}, int64_t{1}}) {
    Generator gen(1);
    Gpt model(small_config(hk, false), gen);
    const int64_t D = kC / kH, F = 4 * kC, qkv_out = (kH + 2 * hk) * D;
    std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
    int64_t count = kV * kC + kMaxLen * kC + 2 * kC;  // wte, wpe, ln_f
    for (int64_t i = 0; i < kL; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      for (const char* n : {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                            "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
                            "mlp.proj.weight", "mlp.proj.bias"}) {
        expected.push_back(b + n);
      }
      count += 2 * kC + (kC * qkv_out + qkv_out) + (kC * kC + kC) + 2 * kC + (kC * F + F) + (F * kC + kC);
    }
    expected.push_back("ln_f.weight");
    expected.push_back("ln_f.bias");
    std::vector<std::string> names;
    for (const Parameter& p : model.parameters()) names.push_back(p.name);
    EXPECT_EQ(names, expected) << "kv heads " << hk;
    EXPECT_EQ(model.num_parameters(), count) << "kv heads " << hk;
  }
  // SwiGLU without bias or positions: fc, gate, proj per MLP; RMSNorm gains only.
  Generator gen(1);
  Gpt model(small_config(1, true), gen);
  const int64_t D = kC / kH, F = 4 * kC;
  const int64_t per_block = kC + kC * (kH + 2) * D + kC * kC + kC + 3 * kC * F;
  EXPECT_EQ(model.num_parameters(), kV * kC + kL * per_block + kC);
  EXPECT_EQ(model.parameters()[3].name, "blocks.0.attn.proj.weight");

  // Rotary and absent positions add no parameters: the learned model less wpe.
  Generator g_learned(1);
  Gpt learned(small_config(3, false), g_learned);
  for (PositionKind p : {PositionKind::rope, PositionKind::none}) {
    Generator g(1);
    Gpt other(small_config(3, false, p), g);
    EXPECT_EQ(other.num_parameters(), learned.num_parameters() - kMaxLen * kC) << name_of(p);
    EXPECT_EQ(other.parameters()[0].name, "wte.weight");
    EXPECT_EQ(other.parameters()[1].name, "blocks.0.ln1.weight") << name_of(p);
  }
}

TEST(Gpt, ConfigErrors) {
  Generator gen(1);
  GptConfig odd_head = small_config(1, false, PositionKind::rope);
  odd_head.d_model = 9;  // head size 3
  try {
    Gpt model(odd_head, gen);
    ADD_FAILURE() << "no error for an odd rotary head size";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("even head size"), std::string::npos) << e.what();
  }
  GptConfig bad_base = small_config(3, false, PositionKind::rope);
  bad_base.rope_base = 0;
  EXPECT_THROW(Gpt(bad_base, gen), std::invalid_argument);
  for (double p : {-0.1, 1.0}) {
    GptConfig bad_dropout = small_config(3, false);
    bad_dropout.dropout = p;
    EXPECT_THROW(Gpt(bad_dropout, gen), std::invalid_argument) << p;
  }
}

TEST(Gpt, LogitsShapeAndInitialLoss) {
  for (bool swiglu : {false, true}) {
    Generator gen(2);
    Gpt model(small_config(swiglu ? 1 : 3, swiglu), gen);
    Tensor logits = model.forward(tokens_batch());
    EXPECT_EQ(logits.shape(), (Shape{kB, kT, kV}));
    Tensor i32_logits = model.forward(to_dtype(tokens_batch(), DType::i32));
    EXPECT_EQ(i32_logits.shape(), (Shape{kB, kT, kV}));
    const double loss = model.loss(tokens_batch(), targets_batch()).item();
    EXPECT_NEAR(loss, std::log(static_cast<double>(kV)), 0.1) << "swiglu " << swiglu;
  }
}

// With rotary positions this checks that new tokens are rotated at their true positions (the cache
// position), not from 0: a wrong start changes their scores against the cached keys.
TEST(Gpt, IncrementalDecodingMatchesFullForward) {
  for (PositionKind positions : {PositionKind::learned, PositionKind::rope, PositionKind::none})
  for (int64_t hk : {int64_t{3}, int64_t{1}}) {
    for (bool swiglu : {false, true}) {
      Generator gen(3);
      GptConfig cfg = small_config(hk, swiglu, positions);
      cfg.init_std = 0.3;  // large enough that attention is far from uniform
      Gpt model(cfg, gen);
      NoGradGuard no_grad;
      Tensor tokens = tokens_batch();
      Tensor full = model.forward(tokens);
      GptCache cache;
      std::vector<Tensor> parts = {model.forward_incremental(narrow(tokens, 1, 0, 3), cache)};
      EXPECT_EQ(cache.position, 3);
      for (int64_t t = 3; t < kT; ++t) parts.push_back(model.forward_incremental(narrow(tokens, 1, t, 1), cache));
      EXPECT_EQ(cache.position, kT);
      ASSERT_EQ(cache.k.size(), static_cast<size_t>(kL));
      EXPECT_EQ(cache.k[0].shape(), (Shape{kB, kT, hk, kC / kH}));
      Tensor inc = concat(parts, 1);
      ASSERT_EQ(inc.shape(), full.shape());
      std::vector<double> a = inc.to_doubles(), b = full.to_doubles();
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      EXPECT_LE(worst, 1e-5) << name_of(positions) << " kv heads " << hk << " swiglu " << swiglu;
    }
  }
}

// Rotary positions change the model: the same weights without positions give other logits from
// the second position on.
TEST(Gpt, RotaryPositionsChangeTheOutput) {
  GptConfig cfg = small_config(1, false, PositionKind::rope);
  cfg.init_std = 0.3;
  Generator g1(8), g2(8);
  Gpt rope_model(cfg, g1);
  cfg.positions = PositionKind::none;
  Gpt plain(cfg, g2);
  NoGradGuard no_grad;
  Tensor a = rope_model.forward(tokens_batch()), b = plain.forward(tokens_batch());
  // Position 0 is rotated by 0 (the identity): the first token's logits agree.
  EXPECT_LE(max_abs_diff(narrow(a, 1, 0, 1), narrow(b, 1, 0, 1)), 1e-6);
  EXPECT_GT(max_abs_diff(narrow(a, 1, 1, kT - 1), narrow(b, 1, 1, kT - 1)), 1e-3);
}

TEST(Gpt, PositionsBeyondMaxSeqLenThrow) {
  Generator gen(4);
  Gpt model(small_config(3, false), gen);
  NoGradGuard no_grad;
  GptCache cache;
  cache.position = kMaxLen - 2;
  EXPECT_THROW(model.forward_incremental(tokens_batch(), cache), std::invalid_argument);
}

Tensor* parameter(Gpt& model, const std::string& name) {
  for (const Parameter& p : model.parameters()) {
    if (p.name == name) return p.tensor;
  }
  ADD_FAILURE() << "no parameter " << name;
  return nullptr;
}

// Central differences of the float64 loss against backward's gradient, for elements of wte
// (which collects both the input embedding's and the tied output's contributions) and of the first
// block's qkv weight (whose q and k rows reach the loss through the rotation under rope). With
// dropout in training mode every loss evaluation replays the same masks by restoring the
// dropout generator's state first.
void expect_gradients_match(GptConfig cfg, bool training, const std::string& what) {
  Generator gen(5);
  cfg.init_std = 0.3;
  Gpt model(cfg, gen);
  model.to(cpu_device(), DType::f64);
  model.set_training(training);
  const std::string masks = model.dropout_generator().state();
  auto loss = [&] {
    model.dropout_generator().set_state(masks);
    return model.loss(tokens_batch(), targets_batch());
  };
  backward(loss());
  // wte is [11, 12]; qkv.weight is [(H + 2 Hk) D, 12] with rows [0, 12) for q, then k, then v
  // (Hk = 1: k rows 12–15, v rows 16–19), so these elements reach q, k and v.
  const std::vector<std::pair<const char*, std::vector<int64_t>>> checked = {
      {"wte.weight", {0, 13, 50, 87, 131}}, {"blocks.0.attn.qkv.weight", {0, 50, 131, 150, 185, 200, 230}}};
  for (const auto& [name, elements] : checked) {
    Tensor* p = parameter(model, name);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(p->dtype(), DType::f64);
    std::vector<double> grad = grad_of(*p).to_doubles();
    double* w = p->data<double>();
    const double h = 1e-5;
    for (int64_t idx : elements) {
      NoGradGuard no_grad;
      const double saved = w[idx];
      w[idx] = saved + h;
      const double up = loss().item();
      w[idx] = saved - h;
      const double down = loss().item();
      w[idx] = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad[static_cast<size_t>(idx)];
      // relative error |n − a| / max(|n|, |a|, 1e-3)
      const double rel = std::abs(numeric - analytic) / std::max({std::abs(numeric), std::abs(analytic), 1e-3});
      EXPECT_LE(rel, 1e-6) << what << ": " << name << " element " << idx << " numeric " << numeric << " analytic "
                           << analytic;
    }
  }
}

TEST(Gpt, GradientMatchesFiniteDifferencesF64) {
  expect_gradients_match(small_config(3, false), true, "learned");
  expect_gradients_match(small_config(1, true), true, "swiglu, no positions");
  expect_gradients_match(small_config(3, false, PositionKind::rope), true, "rope");
  expect_gradients_match(small_config(1, true, PositionKind::rope), true, "rope, swiglu, mqa");
  GptConfig dropped = small_config(3, false, PositionKind::rope);
  dropped.dropout = 0.25;
  expect_gradients_match(dropped, true, "rope with dropout (training)");
  expect_gradients_match(dropped, false, "rope with dropout (eval)");
}

// Eval mode: dropout is the identity, so the output is deterministic and equals the dropout = 0
// model with the same weights, and the generator is not touched. Training mode: masks differ from
// call to call, are replayed exactly from a saved generator state, and follow dropout_seed.
TEST(Gpt, Dropout) {
  GptConfig cfg = small_config(3, false, PositionKind::rope);
  cfg.init_std = 0.1;
  Generator g0(9), g1(9);
  Gpt plain(cfg, g0);
  cfg.dropout = 0.3;
  cfg.dropout_seed = 21;
  Gpt model(cfg, g1);
  NoGradGuard no_grad;
  plain.set_training(false);
  model.set_training(false);
  const Tensor reference = plain.forward(tokens_batch());
  const std::string before = model.dropout_generator().state();
  Tensor e1 = model.forward(tokens_batch()), e2 = model.forward(tokens_batch());
  EXPECT_EQ(max_abs_diff(e1, reference), 0.0);
  EXPECT_EQ(max_abs_diff(e2, reference), 0.0);
  EXPECT_EQ(model.dropout_generator().state(), before);
  // dropout = 0 in training mode draws nothing either.
  plain.set_training(true);
  EXPECT_EQ(max_abs_diff(plain.forward(tokens_batch()), reference), 0.0);

  model.set_training(true);
  Tensor t1 = model.forward(tokens_batch());
  const std::string between = model.dropout_generator().state();
  Tensor t2 = model.forward(tokens_batch());
  EXPECT_NE(between, before);
  EXPECT_GT(max_abs_diff(t1, t2), 1e-3);
  EXPECT_GT(max_abs_diff(t1, reference), 1e-3);
  // Resuming from a saved state replays the masks bit for bit (what a checkpoint relies on).
  model.dropout_generator().set_state(between);
  EXPECT_EQ(max_abs_diff(model.forward(tokens_batch()), t2), 0.0);
  model.dropout_generator().set_state(before);
  EXPECT_EQ(max_abs_diff(model.forward(tokens_batch()), t1), 0.0);
  // The seed decides the masks: the same seed gives the same first forward, another seed not.
  for (uint64_t seed : {uint64_t{21}, uint64_t{22}}) {
    Generator g(9);
    cfg.dropout_seed = seed;
    Gpt other(cfg, g);
    const double diff = max_abs_diff(other.forward(tokens_batch()), t1);
    if (seed == 21) {
      EXPECT_EQ(diff, 0.0);
    } else {
      EXPECT_GT(diff, 1e-3);
    }
  }
}

// p ← p − 0.1 · ∇p for 30 steps on one fixed batch halves the loss.
TEST(Gpt, PlainSgdReducesLoss) {
  Generator gen(6);
  GptConfig cfg = small_config(3, false);
  cfg.init_std = 0.1;
  Gpt model(cfg, gen);
  const Tensor tokens = tokens_batch(), targets = targets_batch();
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    model.zero_grad();
    Tensor loss = model.loss(tokens, targets);
    if (step == 0) first = loss.item();
    backward(loss);
    NoGradGuard no_grad;
    for (const Parameter& p : model.parameters()) {
      Tensor g = grad_of(*p.tensor);
      ASSERT_TRUE(g.defined()) << p.name;
      kernel::copy_(*p.tensor, kernel::binary(kernel::BinaryOp::sub, *p.tensor,
                                              kernel::scalar_op(kernel::ScalarOp::mul, g, 0.1)));
    }
  }
  {
    NoGradGuard no_grad;
    last = model.loss(tokens, targets).item();
  }
  EXPECT_LE(last, 0.5 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace seqlab
