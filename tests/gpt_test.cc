// The GPT model: parameter names and count against a hand count, logits shape, the loss of an
// untrained model (≈ log V), KV-cache decoding against the full forward, a float64
// finite-difference check of d loss / d wte, and plain SGD reducing the loss on a fixed batch.
#include "layers/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kC = 12, kL = 2, kH = 3, kT = 5, kB = 2, kMaxLen = 16;

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
    cfg.learned_positions = false;
    cfg.bias = false;
  }
  return cfg;
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

TEST(Gpt, IncrementalDecodingMatchesFullForward) {
  for (int64_t hk : {int64_t{3}, int64_t{1}}) {
    for (bool swiglu : {false, true}) {
      Generator gen(3);
      GptConfig cfg = small_config(hk, swiglu);
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
      EXPECT_LE(worst, 1e-5) << "kv heads " << hk << " swiglu " << swiglu;
    }
  }
}

TEST(Gpt, PositionsBeyondMaxSeqLenThrow) {
  Generator gen(4);
  Gpt model(small_config(3, false), gen);
  NoGradGuard no_grad;
  GptCache cache;
  cache.position = kMaxLen - 2;
  EXPECT_THROW(model.forward_incremental(tokens_batch(), cache), std::invalid_argument);
}

// Central differences of the float64 loss against backward's d loss / d wte (which collects
// both the input embedding's and the tied output's contributions).
TEST(Gpt, WteGradientMatchesFiniteDifferencesF64) {
  for (bool swiglu : {false, true}) {
    Generator gen(5);
    GptConfig cfg = small_config(swiglu ? 1 : 3, swiglu);
    cfg.init_std = 0.3;
    Gpt model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    Tensor* wte = model.parameters()[0].tensor;
    ASSERT_EQ(wte->dtype(), DType::f64);
    model.loss(tokens_batch(), targets_batch()).backward();
    std::vector<double> grad = wte->grad().to_doubles();
    double* w = wte->data<double>();
    const double h = 1e-5;
    for (int64_t idx : {int64_t{0}, int64_t{13}, int64_t{50}, int64_t{87}, int64_t{131}}) {
      NoGradGuard no_grad;
      const double saved = w[idx];
      w[idx] = saved + h;
      const double up = model.loss(tokens_batch(), targets_batch()).item();
      w[idx] = saved - h;
      const double down = model.loss(tokens_batch(), targets_batch()).item();
      w[idx] = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad[static_cast<size_t>(idx)];
      // relative error |n − a| / max(|n|, |a|, 1e-3)
      const double rel = std::abs(numeric - analytic) / std::max({std::abs(numeric), std::abs(analytic), 1e-3});
      EXPECT_LE(rel, 1e-6) << "element " << idx << " numeric " << numeric << " analytic " << analytic;
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
    loss.backward();
    NoGradGuard no_grad;
    for (const Parameter& p : model.parameters()) {
      Tensor g = p.tensor->grad();
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
