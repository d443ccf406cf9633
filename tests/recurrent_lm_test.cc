// RecurrentLm with each mixer (GLA, RetNet, linear attention, DeltaNet, Gated DeltaNet): decoding a
// prompt and then one token at a time, carrying the mixer states, gives the full forward's logits;
// float64 finite differences of the loss match backward for an element of every parameter; the
// parameter names are the documented dotted paths.
#include "layers/model/recurrent_lm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 13, kB = 2, kT = 11;
const std::vector<std::string> kMixers = {"gla", "retnet", "linear", "performer", "deltanet", "gated_deltanet"};

// "performer" stands for linear attention with FAVOR+ features.
RecurrentLmConfig tiny_config(const std::string& mixer) {
  RecurrentLmConfig cfg;
  cfg.vocab_size = kV;
  cfg.n_layers = 2;
  cfg.mixer = parse_mixer_kind(mixer == "performer" ? "linear" : mixer);
  if (mixer == "performer") {
    cfg.mixer_config.feature_map = "performer";
    cfg.mixer_config.feature_count = 6;
  }
  cfg.mixer_config.d_model = 8;
  cfg.mixer_config.n_heads = 2;
  cfg.mixer_config.chunk = 4;  // T = 11 spans three chunks, the last one partial
  cfg.mixer_config.gate_rank = 3;
  cfg.mixer_config.gate_temperature = 2;
  cfg.mixer_config.conv_size = 3;
  cfg.mixer_config.init_std = 0.3;  // large weights: every path carries a visible signal
  return cfg;
}

Tensor tokens() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < kB * kT; ++i) ids.push_back((i * 7 + 3) % kV);
  return Tensor::from_indices(ids, {kB, kT});
}

Tensor targets() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < kB * kT; ++i) ids.push_back((i * 5 + 1) % kV);
  return Tensor::from_indices(ids, {kB, kT});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

TEST(RecurrentLm, DecodingWithStatesMatchesTheFullForward) {
  for (const std::string& mixer : kMixers) {
    Generator gen(3);
    RecurrentLm model(tiny_config(mixer), gen);
    model.to(cpu_device(), DType::f64);
    NoGradGuard no_grad;
    model.set_training(false);
    const Tensor all = tokens();
    const Tensor full = model.forward(all);
    std::unique_ptr<DecodeState> state = model.new_decode_state();
    // A prompt of 6 tokens (chunkwise from a zero state, crossing a chunk boundary), then one at a time.
    std::vector<Tensor> parts = {model.forward_step(narrow(all, 1, 0, 6), *state)};
    for (int64_t t = 6; t < kT; ++t) parts.push_back(model.forward_step(narrow(all, 1, t, 1), *state));
    EXPECT_EQ(state->position, kT) << mixer;
    EXPECT_LE(max_abs_diff(concat(parts, 1), full), 1e-10) << mixer;
    EXPECT_GT(max_abs_diff(narrow(full, 1, 0, 1), narrow(full, 1, kT - 1, 1)), 1e-3) << mixer << ": logits vary";
  }
}

TEST(RecurrentLm, GradientMatchesFiniteDifferencesF64) {
  for (const std::string& mixer : kMixers) {
    RecurrentLmConfig cfg = tiny_config(mixer);
    cfg.dropout = mixer == "gla" ? 0.2 : 0.0;  // one mixer with dropout masks replayed per evaluation
    Generator gen(4);
    RecurrentLm model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    const std::string masks = model.dropout_generator().state();
    auto loss = [&] {
      model.dropout_generator().set_state(masks);
      return model.loss(tokens(), targets());
    };
    backward(loss());
    for (const Parameter& p : model.parameters()) {
      std::vector<double> grad = grad_of(*p.tensor).to_doubles();
      double* w = p.tensor->data<double>();
      const int64_t idx = p.tensor->numel() / 2;  // one element of every parameter
      const double h = 1e-5;
      NoGradGuard no_grad;
      const double saved = w[idx];
      w[idx] = saved + h;
      const double up = loss().item();
      w[idx] = saved - h;
      const double down = loss().item();
      w[idx] = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad[static_cast<size_t>(idx)];
      const double rel = std::abs(numeric - analytic) / std::max({std::abs(numeric), std::abs(analytic), 1e-3});
      EXPECT_LE(rel, 1e-6) << mixer << ": " << p.name << "[" << idx << "] numeric " << numeric << " analytic "
                           << analytic;
    }
  }
}

// Changing token t changes no logit before t, with chunks of 32 (GLA tiles them in sub-chunks of 16)
// over T = 45, so every path of the chunkwise forms is crossed: earlier chunks, earlier sub-chunks,
// the diagonal sub-chunk.
TEST(RecurrentLm, Causal) {
  constexpr int64_t T = 45;
  for (const std::string& mixer : kMixers) {
    RecurrentLmConfig cfg = tiny_config(mixer);
    cfg.mixer_config.chunk = 32;
    Generator gen(8);
    RecurrentLm model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    NoGradGuard no_grad;
    std::vector<int64_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = (i * 5 + 2) % kV;
    const Tensor base = model.forward(Tensor::from_indices(ids, {1, T}));
    for (int64_t t : {int64_t{3}, int64_t{17}, int64_t{33}, T - 1}) {
      std::vector<int64_t> changed = ids;
      changed[static_cast<size_t>(t)] = (changed[static_cast<size_t>(t)] + 1) % kV;
      const Tensor other = model.forward(Tensor::from_indices(changed, {1, T}));
      EXPECT_EQ(max_abs_diff(narrow(base, 1, 0, t), narrow(other, 1, 0, t)), 0.0) << mixer << ": token " << t;
      EXPECT_GT(max_abs_diff(narrow(base, 1, t, 1), narrow(other, 1, t, 1)), 1e-6) << mixer << ": token " << t;
    }
  }
}

TEST(RecurrentLm, ParameterNames) {
  Generator gen(1);
  RecurrentLm gla(tiny_config("gla"), gen);
  std::vector<std::string> names;
  for (const Parameter& p : gla.parameters()) names.push_back(p.name);
  for (const char* expected : {"wte.weight", "blocks.0.norm1.weight", "blocks.0.mixer.q.weight",
                               "blocks.0.mixer.gate_down.weight", "blocks.0.mixer.gate_up.bias",
                               "blocks.1.mlp.fc.weight", "blocks.1.mlp.gate.weight", "blocks.1.mlp.proj.weight",
                               "norm_f.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  Generator gen2(1);
  RecurrentLm gated(tiny_config("gated_deltanet"), gen2);
  names.clear();
  for (const Parameter& p : gated.parameters()) names.push_back(p.name);
  for (const char* expected : {"blocks.0.mixer.qkv.weight", "blocks.0.mixer.conv.weight", "blocks.0.mixer.beta.weight",
                               "blocks.0.mixer.decay.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  EXPECT_THROW(parse_mixer_kind("mamba"), std::invalid_argument);
}

}  // namespace
}  // namespace seqlab
