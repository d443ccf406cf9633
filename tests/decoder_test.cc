// The block-built decoder (layers/model/decoder.h), for every registered mixer and for hybrids:
// parameter names and counts against a hand count (GPT-2 and a recurrent LM), logits shape and the
// loss of an untrained model (≈ log V), decoding a prompt and then one token at a time against the
// full forward (learned, rotary and no positions; GQA; every mixer and a hybrid), causality across
// chunk boundaries, float64 finite differences of the loss gradient (with dropout masks replayed from
// the generator's state), dropout in training and eval mode, plain SGD reducing the loss, the
// general batch (lengths, loss weights, fields a decoder refuses) and configuration errors.
#include "layers/model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "model_gradcheck.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kC = 12, kL = 2, kH = 3, kT = 5, kB = 2, kMaxLen = 16;

// A GPT: every block attention. GELU/LayerNorm/bias with learned positions, or SwiGLU/RMSNorm without
// bias or positions; `positions` overrides the position kind.
ModelConfig gpt_config(int64_t kv_heads, bool swiglu, PositionKind positions) {
  ModelConfig cfg;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_heads = kH;
  cfg.n_kv_heads = kv_heads;
  cfg.max_seq_len = kMaxLen;
  const FfnKind ffn = swiglu ? FfnKind::swiglu : FfnKind::gelu;
  cfg.blocks.assign(kL, BlockSpec{"attention", ffn});
  cfg.norm = swiglu ? NormKind::rms_norm : NormKind::layer_norm;
  cfg.bias = !swiglu;
  cfg.positions = positions;
  return cfg;
}

ModelConfig gpt_config(int64_t kv_heads, bool swiglu) {
  return gpt_config(kv_heads, swiglu, swiglu ? PositionKind::none : PositionKind::learned);
}

// Tiny options for every mixer: chunks of 4 (T = 11 spans three chunks, the last one partial), small
// gate ranks, few random features.
std::map<std::string, MixerOptions> tiny_options() {
  std::map<std::string, MixerOptions> out;
  for (const MixerSpec* m : registered_mixers()) {
    MixerOptions o(m->options);
    for (const auto& [key, value] : o.values()) {
      if (key == "chunk_size") o.set(key, int64_t{4});
      if (key == "gate_rank") o.set(key, int64_t{3});
      if (key == "gate_temperature") o.set(key, 2.0);
      if (key == "conv_size") o.set(key, int64_t{3});
      if (key == "feature_count") o.set(key, int64_t{6});
    }
    out.emplace(m->name, o);
  }
  return out;
}

// A stack of `blocks` with the recurrent LMs' conventions (RMSNorm, SwiGLU, no bias, no positions),
// d_model 8 in 2 heads, large initial weights so every path carries a visible signal.
ModelConfig stack_config(const std::vector<BlockSpec>& blocks) {
  ModelConfig cfg;
  cfg.vocab_size = 13;
  cfg.d_model = 8;
  cfg.n_heads = 2;
  cfg.max_seq_len = 64;
  cfg.blocks = blocks;
  cfg.mixer_options = tiny_options();
  cfg.init_std = 0.3;
  return cfg;
}

// Every registered mixer in both blocks, linear attention also with Performer's features, and hybrids.
std::vector<std::pair<std::string, ModelConfig>> stacks() {
  std::vector<std::pair<std::string, ModelConfig>> out;
  for (const MixerSpec* m : registered_mixers()) {
    out.emplace_back(m->name, stack_config({{m->name, FfnKind::swiglu}, {m->name, FfnKind::swiglu}}));
  }
  ModelConfig performer = stack_config({{"linear_attention", FfnKind::swiglu}, {"linear_attention", FfnKind::gelu}});
  performer.mixer_options.at("linear_attention").set("feature_map", std::string("performer"));
  out.emplace_back("performer", performer);
  out.emplace_back("hybrid gla/attention",
                   stack_config({{"gla", FfnKind::swiglu}, {"attention", FfnKind::none}, {"gla", FfnKind::gelu}}));
  ModelConfig rope = stack_config({{"delta_net", FfnKind::none}, {"attention", FfnKind::swiglu}});
  rope.positions = PositionKind::rope;
  out.emplace_back("hybrid delta_net/attention with rope", rope);
  return out;
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

Tensor ramp(int64_t B, int64_t T, int64_t vocab, int64_t a, int64_t b) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back((i * a + b) % vocab);
  return Tensor::from_indices(ids, {B, T});
}

std::vector<std::string> names_of(Decoder& model) {
  std::vector<std::string> names;
  for (const Parameter& p : model.parameters()) names.push_back(p.name);
  return names;
}

TEST(Decoder, GptParameterNamesAndCount) {
  for (int64_t hk : {int64_t{3}, int64_t{1}}) {
    Generator gen(1);
    Decoder model(gpt_config(hk, false), gen);
    const int64_t D = kC / kH, F = 4 * kC, qkv_out = (kH + 2 * hk) * D;
    std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
    int64_t count = kV * kC + kMaxLen * kC + 2 * kC;  // wte, wpe, norm_f
    for (int64_t i = 0; i < kL; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      for (const char* n : {"norm1.weight", "norm1.bias", "mixer.qkv.weight", "mixer.qkv.bias", "mixer.proj.weight",
                            "mixer.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc.weight", "mlp.fc.bias",
                            "mlp.proj.weight", "mlp.proj.bias"}) {
        expected.push_back(b + n);
      }
      count += 2 * kC + (kC * qkv_out + qkv_out) + (kC * kC + kC) + 2 * kC + (kC * F + F) + (F * kC + kC);
    }
    expected.push_back("norm_f.weight");
    expected.push_back("norm_f.bias");
    EXPECT_EQ(names_of(model), expected) << "kv heads " << hk;
    EXPECT_EQ(model.num_parameters(), count) << "kv heads " << hk;
  }
  // SwiGLU without bias or positions: fc, gate, proj per MLP of ffn_d_ff(swiglu, 12) = 64; RMSNorm gains.
  Generator gen(1);
  Decoder model(gpt_config(1, true), gen);
  const int64_t D = kC / kH, F = ffn_d_ff(FfnKind::swiglu, kC);
  EXPECT_EQ(F, 64);
  const int64_t per_block = kC + kC * (kH + 2) * D + kC * kC + kC + 3 * kC * F;
  EXPECT_EQ(model.num_parameters(), kV * kC + kL * per_block + kC);
  EXPECT_EQ(model.parameters()[3].name, "blocks.0.mixer.proj.weight");

  // Rotary and absent positions add no parameters: the learned model less wpe.
  Generator g_learned(1);
  Decoder learned(gpt_config(3, false), g_learned);
  for (PositionKind p : {PositionKind::rope, PositionKind::none}) {
    Generator g(1);
    Decoder other(gpt_config(3, false, p), g);
    EXPECT_EQ(other.num_parameters(), learned.num_parameters() - kMaxLen * kC);
    EXPECT_EQ(other.parameters()[1].name, "blocks.0.norm1.weight");
  }
}

TEST(Decoder, RecurrentAndHybridParameterNames) {
  Generator gen(1);
  Decoder hybrid(stack_config({{"gla", FfnKind::swiglu}, {"attention", FfnKind::none}, {"gated_delta_net", FfnKind::gelu}}),
                 gen);
  const std::vector<std::string> names = names_of(hybrid);
  for (const char* expected :
       {"wte.weight", "blocks.0.norm1.weight", "blocks.0.mixer.q.weight", "blocks.0.mixer.gate_down.weight",
        "blocks.0.mixer.gate_up.bias", "blocks.0.mlp.fc.weight", "blocks.0.mlp.gate.weight", "blocks.0.mlp.proj.weight",
        "blocks.1.mixer.qkv.weight", "blocks.1.mixer.proj.weight", "blocks.2.mixer.qkv.weight",
        "blocks.2.mixer.conv.weight", "blocks.2.mixer.beta.weight", "blocks.2.mixer.decay.weight",
        "blocks.2.mlp.fc.weight", "norm_f.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  // Block 1 has no FFN: no norm2 and no mlp; block 2's GELU MLP has no gate; no biases anywhere but the
  // mixers' own gate biases.
  for (const char* absent : {"blocks.1.norm2.weight", "blocks.1.mlp.fc.weight", "blocks.2.mlp.gate.weight",
                             "blocks.1.mixer.qkv.bias", "wpe.weight"}) {
    EXPECT_EQ(std::find(names.begin(), names.end(), absent), names.end()) << absent;
  }
  EXPECT_EQ(hybrid.max_context(), 64);  // attention bounds the context
  Generator gen2(1);
  Decoder recurrent(stack_config({{"gla", FfnKind::swiglu}}), gen2);
  EXPECT_EQ(recurrent.max_context(), 0);  // unbounded
}

// model_parameter_count, what recipes are checked with before anything is allocated, equals the
// built model's count: GPTs (learned, rotary, GQA, SwiGLU), every mixer's stack and the hybrids, with
// d_ff given, biases, LayerNorm and blocks without an FFN.
TEST(Decoder, ParameterCountWithoutBuilding) {
  std::vector<std::pair<std::string, ModelConfig>> configs = stacks();
  configs.emplace_back("gpt", gpt_config(3, false));
  configs.emplace_back("gpt gqa swiglu", gpt_config(1, true));
  configs.emplace_back("gpt rope", gpt_config(3, false, PositionKind::rope));
  ModelConfig mixed = stack_config({{"gla", FfnKind::none}, {"attention", FfnKind::gelu}, {"delta_net", FfnKind::swiglu}});
  mixed.d_ff = 20;
  mixed.bias = true;
  mixed.norm = NormKind::layer_norm;
  mixed.positions = PositionKind::learned;
  configs.emplace_back("mixed", mixed);
  for (const auto& [name, cfg] : configs) {
    Generator gen(1);
    Decoder model(cfg, gen);
    EXPECT_EQ(model_parameter_count(cfg), static_cast<double>(model.num_parameters())) << name;
  }
  // Sizes no memory holds are counted, not built: 12·L·d² for a GPT of d = 10⁶ and 10⁵ layers.
  ModelConfig huge = gpt_config(3, false);
  huge.d_model = 999999;
  huge.blocks.assign(100000, BlockSpec{"attention", FfnKind::gelu});
  EXPECT_NEAR(model_parameter_count(huge), 12.0 * 1e5 * 999999.0 * 999999.0, 1e-3 * 12.0 * 1e5 * 1e12);
  huge.n_heads = 2;  // does not divide d_model (odd): refused as the constructor refuses it
  EXPECT_THROW(model_parameter_count(huge), std::invalid_argument);
}

TEST(Decoder, ConfigErrorsNameWhatIsWrong) {
  auto error_of = [](const ModelConfig& cfg) -> std::string {
    Generator gen(1);
    try {
      Decoder model(cfg, gen);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig odd_head = gpt_config(1, false, PositionKind::rope);
  odd_head.d_model = 9;  // head size 3
  EXPECT_NE(error_of(odd_head).find("even head size"), std::string::npos) << error_of(odd_head);
  ModelConfig bad_base = gpt_config(3, false, PositionKind::rope);
  bad_base.rope_base = 0;
  EXPECT_NE(error_of(bad_base).find("rope_base"), std::string::npos);
  for (double p : {-0.1, 1.0}) {
    ModelConfig bad_dropout = gpt_config(3, false);
    bad_dropout.dropout = p;
    EXPECT_NE(error_of(bad_dropout).find("dropout"), std::string::npos) << p;
  }
  ModelConfig unknown = stack_config({{"hyena", FfnKind::swiglu}});
  EXPECT_NE(error_of(unknown).find("unknown mixer 'hyena'"), std::string::npos) << error_of(unknown);
  EXPECT_NE(error_of(unknown).find("gla"), std::string::npos) << "lists the mixers: " << error_of(unknown);
  ModelConfig heads = stack_config({{"gla", FfnKind::swiglu}});
  heads.n_heads = 3;
  EXPECT_NE(error_of(heads).find("not divisible by n_heads"), std::string::npos) << error_of(heads);
  ModelConfig kv = gpt_config(2, false);
  EXPECT_NE(error_of(kv).find("n_kv_heads"), std::string::npos) << error_of(kv);
  ModelConfig no_len = gpt_config(3, false);
  no_len.max_seq_len = 0;
  EXPECT_NE(error_of(no_len).find("max_seq_len"), std::string::npos) << error_of(no_len);
}

TEST(Decoder, LogitsShapeAndInitialLoss) {
  for (bool swiglu : {false, true}) {
    Generator gen(2);
    Decoder model(gpt_config(swiglu ? 1 : 3, swiglu), gen);
    Tensor logits = model.logits({tokens_batch()});
    EXPECT_EQ(logits.shape(), (Shape{kB, kT, kV}));
    Tensor i32_logits = model.logits({to_dtype(tokens_batch(), DType::i32)});
    EXPECT_EQ(i32_logits.shape(), (Shape{kB, kT, kV}));
    const double loss = model.loss({tokens_batch(), targets_batch()}).item();
    EXPECT_NEAR(loss, std::log(static_cast<double>(kV)), 0.1) << "swiglu " << swiglu;
  }
}

// With rotary positions this checks that new tokens are rotated at their true positions (the cache
// position), not from 0: a wrong start changes their scores against the cached keys.
TEST(Decoder, GptDecodingMatchesFullForward) {
  for (PositionKind positions : {PositionKind::learned, PositionKind::rope, PositionKind::none}) {
    for (int64_t hk : {int64_t{3}, int64_t{1}}) {
      for (bool swiglu : {false, true}) {
        Generator gen(3);
        ModelConfig cfg = gpt_config(hk, swiglu, positions);
        cfg.init_std = 0.3;  // large enough that attention is far from uniform
        Decoder model(cfg, gen);
        NoGradGuard no_grad;
        Tensor tokens = tokens_batch();
        Tensor full = model.logits({tokens});
        std::unique_ptr<DecodeState> state = model.new_decode_state();
        std::vector<Tensor> parts = {model.forward_step(narrow(tokens, 1, 0, 3), *state)};
        EXPECT_EQ(state->position, 3);
        for (int64_t t = 3; t < kT; ++t) parts.push_back(model.forward_step(narrow(tokens, 1, t, 1), *state));
        EXPECT_EQ(state->position, kT);
        const auto& blocks = dynamic_cast<DecoderState&>(*state).blocks;
        ASSERT_EQ(blocks.size(), static_cast<size_t>(kL));
        EXPECT_EQ(blocks[0].mixer->size(), static_cast<double>(2 * kT * hk * (kC / kH)));  // its keys and values
        EXPECT_LE(max_abs_diff(concat(parts, 1), full), 1e-5) << "kv heads " << hk << " swiglu " << swiglu;
      }
    }
  }
}

// Every mixer and the hybrids: a prompt of 6 tokens (chunkwise from a zero state, crossing a chunk
// boundary), then one token at a time, carrying each block's state, gives the full forward's logits.
TEST(Decoder, DecodingWithStatesMatchesTheFullForward) {
  constexpr int64_t T = 11;
  for (auto& [name, cfg] : stacks()) {
    Generator gen(3);
    Decoder model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    NoGradGuard no_grad;
    model.set_training(false);
    const Tensor all = ramp(kB, T, cfg.vocab_size, 7, 3);
    const Tensor full = model.logits({all});
    std::unique_ptr<DecodeState> state = model.new_decode_state();
    std::vector<Tensor> parts = {model.forward_step(narrow(all, 1, 0, 6), *state)};
    for (int64_t t = 6; t < T; ++t) parts.push_back(model.forward_step(narrow(all, 1, t, 1), *state));
    EXPECT_EQ(state->position, T) << name;
    EXPECT_LE(max_abs_diff(concat(parts, 1), full), 1e-10) << name;
    EXPECT_GT(max_abs_diff(narrow(full, 1, 0, 1), narrow(full, 1, T - 1, 1)), 1e-3) << name << ": logits vary";
  }
}

// Changing token t changes no logit before t, with chunks of 32 (GLA tiles them in sub-chunks of 16)
// over T = 45, so every path of the chunkwise forms is crossed: earlier chunks, earlier sub-chunks,
// the diagonal sub-chunk.
TEST(Decoder, Causal) {
  constexpr int64_t T = 45;
  for (auto& [name, cfg] : stacks()) {
    for (auto& [mixer, options] : cfg.mixer_options) {
      if (options.values().count("chunk_size")) options.set("chunk_size", int64_t{32});
    }
    Generator gen(8);
    Decoder model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    NoGradGuard no_grad;
    std::vector<int64_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = (i * 5 + 2) % cfg.vocab_size;
    const Tensor base = model.logits({Tensor::from_indices(ids, {1, T})});
    for (int64_t t : {int64_t{3}, int64_t{17}, int64_t{33}, T - 1}) {
      std::vector<int64_t> changed = ids;
      changed[static_cast<size_t>(t)] = (changed[static_cast<size_t>(t)] + 1) % cfg.vocab_size;
      const Tensor other = model.logits({Tensor::from_indices(changed, {1, T})});
      EXPECT_EQ(max_abs_diff(narrow(base, 1, 0, t), narrow(other, 1, 0, t)), 0.0) << name << ": token " << t;
      EXPECT_GT(max_abs_diff(narrow(base, 1, t, 1), narrow(other, 1, t, 1)), 1e-6) << name << ": token " << t;
    }
  }
}

// Central differences of the float64 loss against backward's gradient for `elements` of each named
// parameter (all parameters, one element each, when `checked` is empty). With dropout in training mode
// every loss evaluation replays the same masks by restoring the dropout generator's state first.
void expect_gradients_match(ModelConfig cfg, bool training, const std::string& what, const Batch& batch,
                            std::vector<std::pair<std::string, std::vector<int64_t>>> checked = {}) {
  Generator gen(5);
  Decoder model(cfg, gen);
  model.to(cpu_device(), DType::f64);
  model.set_training(training);
  const std::string masks = model.dropout_generator().state();
  expect_parameter_gradients_match(
      model,
      [&] {
        model.dropout_generator().set_state(masks);
        return model.loss(batch);
      },
      std::move(checked), what);
}

TEST(Decoder, GptGradientMatchesFiniteDifferencesF64) {
  // wte is [11, 12]; qkv.weight is [(H + 2 Hk) D, 12] with rows [0, 12) for q, then k, then v
  // (Hk = 1: k rows 12–15, v rows 16–19), so these elements reach q, k and v.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> checked = {
      {"wte.weight", {0, 13, 50, 87, 131}}, {"blocks.0.mixer.qkv.weight", {0, 50, 131, 150, 185, 200, 230}}};
  const Batch batch{tokens_batch(), targets_batch()};
  auto big = [](ModelConfig c) {
    c.init_std = 0.3;
    return c;
  };
  expect_gradients_match(big(gpt_config(3, false)), true, "learned", batch, checked);
  expect_gradients_match(big(gpt_config(1, true)), true, "swiglu, no positions", batch, checked);
  expect_gradients_match(big(gpt_config(3, false, PositionKind::rope)), true, "rope", batch, checked);
  expect_gradients_match(big(gpt_config(1, true, PositionKind::rope)), true, "rope, swiglu, mqa", batch, checked);
  ModelConfig dropped = big(gpt_config(3, false, PositionKind::rope));
  dropped.dropout = 0.25;
  expect_gradients_match(dropped, true, "rope with dropout (training)", batch, checked);
  expect_gradients_match(dropped, false, "rope with dropout (eval)", batch, checked);
}

TEST(Decoder, EveryMixerGradientMatchesFiniteDifferencesF64) {
  constexpr int64_t T = 11;
  const Batch batch{ramp(kB, T, 13, 7, 3), ramp(kB, T, 13, 5, 1)};
  for (auto& [name, cfg] : stacks()) {
    if (name == "gla") cfg.dropout = 0.2;  // one stack with dropout masks replayed per evaluation
    expect_gradients_match(cfg, true, name, batch);
  }
}

// The batch's lengths and loss weights, through the loss and its gradient.
TEST(Decoder, LengthsAndLossWeights) {
  constexpr int64_t T = 11;
  ModelConfig cfg = stack_config({{"gla", FfnKind::swiglu}, {"attention", FfnKind::gelu}});
  Generator gen(6);
  Decoder model(cfg, gen);
  model.to(cpu_device(), DType::f64);
  const Tensor inputs = ramp(kB, T, 13, 7, 3), targets = ramp(kB, T, 13, 5, 1);
  // Lengths 4 and 11: the first row's positions 4.. are not scored, the same as targets of -100 there.
  Batch with_lengths{inputs, targets};
  with_lengths.lengths = Tensor::from_indices({4, 11}, {2}, DType::i64);
  std::vector<int64_t> masked = targets.to_indices();
  for (int64_t t = 4; t < T; ++t) masked[static_cast<size_t>(t)] = kIgnoreIndex;
  const Batch explicit_mask{inputs, Tensor::from_indices(masked, {kB, T})};
  {
    NoGradGuard no_grad;
    EXPECT_EQ(model.loss(with_lengths).item(), model.loss(explicit_mask).item());
    EXPECT_NE(model.loss(with_lengths).item(), model.loss({inputs, targets}).item());
  }
  // Weights: Σ w·ℓ / Σ w. Weights of 1 give the plain mean; doubling every weight changes nothing;
  // a weight of 0 leaves a position out.
  Batch ones{inputs, targets};
  ones.loss_weights = Tensor::ones({kB, T}, DType::f64);
  Batch twos = ones;
  twos.loss_weights = Tensor::full({kB, T}, 2.0, DType::f64);
  std::vector<double> w(static_cast<size_t>(kB * T), 1.0);
  for (int64_t t = 4; t < T; ++t) w[static_cast<size_t>(t)] = 0.0;
  Batch zeros{inputs, targets};
  zeros.loss_weights = Tensor::from_vector(w, {kB, T}, DType::f64);
  {
    NoGradGuard no_grad;
    const double plain = model.loss({inputs, targets}).item();
    EXPECT_NEAR(model.loss(ones).item(), plain, 1e-14);
    EXPECT_NEAR(model.loss(twos).item(), plain, 1e-14);
    EXPECT_NEAR(model.loss(zeros).item(), model.loss(explicit_mask).item(), 1e-14);
  }
  // The gradient of a weighted loss, by finite differences, with unequal weights.
  Batch weighted{inputs, targets};
  std::vector<double> uneven;
  for (int64_t i = 0; i < kB * T; ++i) uneven.push_back(0.25 + 0.1 * static_cast<double>(i % 7));
  weighted.loss_weights = Tensor::from_vector(uneven, {kB, T}, DType::f64);
  weighted.lengths = Tensor::from_indices({9, 6}, {2}, DType::i64);
  expect_gradients_match(cfg, true, "weighted loss with lengths", weighted);
}

TEST(Decoder, RefusesBatchFieldsItCannotUse) {
  Generator gen(7);
  Decoder model(gpt_config(3, false), gen);
  auto error_of = [&](const Batch& b) -> std::string {
    try {
      model.loss(b);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  Batch seq2seq{tokens_batch(), targets_batch()};
  seq2seq.decoder_inputs = tokens_batch();
  seq2seq.decoder_targets = targets_batch();
  EXPECT_NE(error_of(seq2seq).find("decoder_inputs"), std::string::npos) << error_of(seq2seq);
  Batch segments{tokens_batch(), targets_batch()};
  segments.segment_ids = Tensor::zeros({kB, kT}, DType::i64);
  EXPECT_NE(error_of(segments).find("segment_ids"), std::string::npos) << error_of(segments);
  Batch long_length{tokens_batch(), targets_batch()};
  long_length.lengths = Tensor::from_indices({3, 9}, {2}, DType::i64);
  EXPECT_NE(error_of(long_length).find("lengths[1] = 9"), std::string::npos) << error_of(long_length);
  EXPECT_NE(error_of(Batch{}).find("no inputs"), std::string::npos) << error_of(Batch{});
}

// Rotary positions change the model: the same weights without positions give other logits from
// the second position on.
TEST(Decoder, RotaryPositionsChangeTheOutput) {
  ModelConfig cfg = gpt_config(1, false, PositionKind::rope);
  cfg.init_std = 0.3;
  Generator g1(8), g2(8);
  Decoder rope_model(cfg, g1);
  cfg.positions = PositionKind::none;
  Decoder plain(cfg, g2);
  NoGradGuard no_grad;
  Tensor a = rope_model.logits({tokens_batch()}), b = plain.logits({tokens_batch()});
  // Position 0 is rotated by 0 (the identity): the first token's logits agree.
  EXPECT_LE(max_abs_diff(narrow(a, 1, 0, 1), narrow(b, 1, 0, 1)), 1e-6);
  EXPECT_GT(max_abs_diff(narrow(a, 1, 1, kT - 1), narrow(b, 1, 1, kT - 1)), 1e-3);
}

TEST(Decoder, PositionsBeyondMaxSeqLenThrow) {
  Generator gen(4);
  Decoder model(gpt_config(3, false), gen);
  NoGradGuard no_grad;
  std::unique_ptr<DecodeState> state = model.new_decode_state();
  state->position = kMaxLen - 2;
  EXPECT_THROW(model.forward_step(tokens_batch(), *state), std::invalid_argument);
}

// Eval mode: dropout is the identity, so the output is deterministic and equals the dropout = 0
// model with the same weights, and the generator is not touched. Training mode: masks differ from
// call to call, are replayed exactly from a saved generator state, and follow dropout_seed.
TEST(Decoder, Dropout) {
  ModelConfig cfg = gpt_config(3, false, PositionKind::rope);
  cfg.init_std = 0.1;
  Generator g0(9), g1(9);
  Decoder plain(cfg, g0);
  cfg.dropout = 0.3;
  cfg.dropout_seed = 21;
  Decoder model(cfg, g1);
  NoGradGuard no_grad;
  plain.set_training(false);
  model.set_training(false);
  const Tensor reference = plain.logits({tokens_batch()});
  const std::string before = model.dropout_generator().state();
  Tensor e1 = model.logits({tokens_batch()}), e2 = model.logits({tokens_batch()});
  EXPECT_EQ(max_abs_diff(e1, reference), 0.0);
  EXPECT_EQ(max_abs_diff(e2, reference), 0.0);
  EXPECT_EQ(model.dropout_generator().state(), before);
  // dropout = 0 in training mode draws nothing either.
  plain.set_training(true);
  EXPECT_EQ(max_abs_diff(plain.logits({tokens_batch()}), reference), 0.0);

  model.set_training(true);
  Tensor t1 = model.logits({tokens_batch()});
  const std::string between = model.dropout_generator().state();
  Tensor t2 = model.logits({tokens_batch()});
  EXPECT_NE(between, before);
  EXPECT_GT(max_abs_diff(t1, t2), 1e-3);
  EXPECT_GT(max_abs_diff(t1, reference), 1e-3);
  // Resuming from a saved state replays the masks bit for bit (what a checkpoint relies on).
  model.dropout_generator().set_state(between);
  EXPECT_EQ(max_abs_diff(model.logits({tokens_batch()}), t2), 0.0);
  model.dropout_generator().set_state(before);
  EXPECT_EQ(max_abs_diff(model.logits({tokens_batch()}), t1), 0.0);
  // The seed decides the masks: the same seed gives the same first forward, another seed not.
  for (uint64_t seed : {uint64_t{21}, uint64_t{22}}) {
    Generator g(9);
    cfg.dropout_seed = seed;
    Decoder other(cfg, g);
    const double diff = max_abs_diff(other.logits({tokens_batch()}), t1);
    if (seed == 21) {
      EXPECT_EQ(diff, 0.0);
    } else {
      EXPECT_GT(diff, 1e-3);
    }
  }
}

// p ← p − 0.1 · ∇p for 30 steps on one fixed batch halves the loss, for a GPT and for a hybrid.
TEST(Decoder, PlainSgdReducesLoss) {
  ModelConfig gpt = gpt_config(3, false);
  gpt.init_std = 0.1;
  ModelConfig hybrid = stack_config({{"gla", FfnKind::swiglu}, {"attention", FfnKind::swiglu}});
  hybrid.vocab_size = kV;
  hybrid.init_std = 0.1;
  for (const ModelConfig& cfg : {gpt, hybrid}) {
    Generator gen(6);
    Decoder model(cfg, gen);
    const Batch batch{tokens_batch(), targets_batch()};
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      model.zero_grad();
      Tensor loss = model.loss(batch);
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
      last = model.loss(batch).item();
    }
    EXPECT_LE(last, 0.5 * first) << cfg.blocks[0].mixer << ": first " << first << " last " << last;
  }
}

TEST(Decoder, ConventionsFollowTheMixers) {
  const ModelConventions gpt = model_conventions(ModelKind::decoder, {"attention", "attention"});
  EXPECT_EQ(gpt.norm, NormKind::layer_norm);
  EXPECT_EQ(gpt.ffn, FfnKind::gelu);
  EXPECT_TRUE(gpt.bias);
  EXPECT_EQ(gpt.positions, PositionKind::learned);
  for (const std::vector<std::string>& mixers : {std::vector<std::string>{"gla"},
                                                 std::vector<std::string>{"gla", "attention"}}) {
    const ModelConventions c = model_conventions(ModelKind::decoder, mixers);
    EXPECT_EQ(c.norm, NormKind::rms_norm);
    EXPECT_EQ(c.ffn, FfnKind::swiglu);
    EXPECT_FALSE(c.bias);
    EXPECT_EQ(c.positions, PositionKind::none);
  }
}

}  // namespace
}  // namespace seqlab
