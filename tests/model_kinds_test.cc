// The model kinds beyond the decoder (layers/model/encoder.h, encoder_decoder.h) and the options every
// kind shares (model_config.h): parameter counts from the configuration equal the built models', the
// float64 gradient of every parameter matches central differences (BERT with padding, segments and the
// next-sentence head; T5 with relative positions, padded sources and cross attention), an encoder sees
// its whole row and ignores padding, an encoder-decoder decoded token by token (encoder once, KV caches,
// cross attention's keys and values computed once) gives its full forward's logits, and configurations
// a kind cannot take are refused naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "layers/model/encoder.h"
#include "layers/model/encoder_decoder.h"
#include "layers/model/model_config.h"
#include "model_gradcheck.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 13, kC = 8, kH = 2, kB = 2, kT = 7;

ModelConfig bert(bool pre_norm = false) {
  ModelConfig cfg;
  cfg.kind = ModelKind::encoder;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_heads = kH;
  cfg.max_seq_len = 16;
  cfg.blocks.assign(2, BlockSpec{"attention", FfnKind::gelu});
  cfg.norm = NormKind::layer_norm;
  cfg.norm_placement = pre_norm ? NormPlacement::pre : NormPlacement::post;
  cfg.bias = true;
  cfg.positions = PositionKind::learned;
  cfg.segments = 2;
  cfg.next_sentence = true;
  cfg.init_std = 0.3;
  return cfg;
}

ModelConfig t5(FfnKind ffn = FfnKind::relu) {
  ModelConfig cfg;
  cfg.kind = ModelKind::encoder_decoder;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_heads = kH;
  cfg.max_seq_len = 16;
  cfg.blocks.assign(2, BlockSpec{"attention", ffn});
  cfg.norm = NormKind::rms_norm;
  cfg.positions = PositionKind::relative;
  cfg.relative_buckets = 6;
  cfg.relative_max_distance = 5;
  cfg.init_std = 0.3;
  MixerOptions unscaled(mixer_spec("attention").options);
  unscaled.set("scale", 1.0);
  cfg.mixer_options.emplace("attention", unscaled);
  return cfg;
}

Tensor ids(const std::vector<int64_t>& v, int64_t B, int64_t T) { return Tensor::from_indices(v, {B, T}, DType::i64); }
Tensor row_lengths(const std::vector<int64_t>& v) {
  return Tensor::from_indices(v, {static_cast<int64_t>(v.size())}, DType::i64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// A masked-LM batch: row 0 full, row 1 padded after 4 tokens; two segments; a few scored positions.
Batch mlm_batch() {
  Batch b(ids({1, 4, 7, 2, 9, 3, 5, 1, 8, 6, 2, 0, 0, 0}, kB, kT),
          ids({-100, 5, -100, -100, 11, -100, 3, -100, 2, -100, 12, -100, -100, -100}, kB, kT));
  b.lengths = row_lengths({7, 4});
  b.segment_ids = ids({0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0}, kB, kT);
  b.sequence_targets = Tensor::from_indices({0, 1}, {kB}, DType::i64);
  return b;
}

// A span-corruption batch: sources of 7 and 5 tokens, targets of 5 and 3.
Batch seq2seq_batch() {
  Batch b(ids({1, 4, 7, 2, 9, 3, 5, 8, 6, 2, 10, 11, 0, 0}, kB, kT));
  b.lengths = row_lengths({7, 5});
  b.decoder_inputs = ids({0, 12, 4, 7, 11, 0, 12, 6, 0, 0}, kB, 5);
  b.decoder_targets = ids({12, 4, 7, 11, 1, 12, 6, 1, -100, -100}, kB, 5);
  b.decoder_lengths = row_lengths({5, 3});
  return b;
}

// Every parameter's middle element and, for `more`, several elements of the named ones (dropout masks
// replayed).
void expect_gradients_match(const ModelConfig& cfg, const Batch& batch, const std::string& what,
                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& more = {}) {
  Generator gen(5);
  std::unique_ptr<LanguageModel> model = make_model(cfg, gen);
  model->to(cpu_device(), DType::f64);
  std::vector<std::pair<std::string, std::vector<int64_t>>> checked = more;
  for (const Parameter& p : model->parameters()) checked.push_back({p.name, {p.tensor->numel() / 2}});
  const std::string masks = model->dropout_generator().state();
  expect_parameter_gradients_match(
      *model,
      [&] {
        model->dropout_generator().set_state(masks);
        return model->loss(batch);
      },
      checked, what);
}

TEST(ModelKinds, ParameterCountsFromTheConfigurationAreTheBuiltModels) {
  std::vector<std::pair<std::string, ModelConfig>> cases = {{"bert", bert()}, {"bert pre-norm", bert(true)}, {"t5", t5()}};
  ModelConfig plain = bert();
  plain.segments = 0;
  plain.next_sentence = false;
  plain.tie_embeddings = false;
  plain.positions = PositionKind::sinusoidal;
  cases.push_back({"encoder without segments, untied, sinusoidal", plain});
  ModelConfig v11 = t5(FfnKind::geglu);
  v11.tie_embeddings = false;
  v11.decoder_blocks.assign(3, BlockSpec{"attention", FfnKind::geglu});
  cases.push_back({"t5 v1.1 with a deeper decoder", v11});
  ModelConfig learned = t5();
  learned.positions = PositionKind::learned;
  learned.n_kv_heads = 1;
  cases.push_back({"encoder_decoder with learned positions, MQA", learned});
  ModelConfig gpt = gpt2_config(kV, kC, 2, kH, 16);
  gpt.tie_embeddings = false;
  gpt.positions = PositionKind::relative;
  cases.push_back({"decoder, untied, relative", gpt});
  for (const auto& [name, cfg] : cases) {
    Generator gen(1);
    std::unique_ptr<LanguageModel> model = make_model(cfg, gen);
    EXPECT_EQ(model_parameter_count(cfg), static_cast<double>(model->num_parameters())) << name;
  }
}

TEST(ModelKinds, ParameterNamesOfEachKind) {
  Generator gen(1);
  std::unique_ptr<LanguageModel> enc = make_model(bert(), gen);
  std::vector<std::string> names;
  for (const Parameter& p : enc->parameters()) names.push_back(p.name);
  const std::vector<std::string> first = {"wte.weight", "segment.weight", "wpe.weight", "norm_in.weight", "norm_in.bias",
                                          "blocks.0.norm1.weight"};
  ASSERT_GE(names.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + static_cast<long>(first.size())), first);
  for (const char* n : {"head.dense.weight", "head.norm.weight", "head.bias", "pooler.weight", "nsp.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  std::unique_ptr<LanguageModel> ed = make_model(t5(), gen);
  names.clear();
  for (const Parameter& p : ed->parameters()) names.push_back(p.name);
  for (const char* n : {"wte.weight", "encoder.relative_bias.weight", "encoder.blocks.1.mlp.proj.weight",
                        "encoder.norm_f.weight", "decoder.relative_bias.weight", "decoder.blocks.0.cross.q.weight",
                        "decoder.blocks.0.cross.kv.weight", "decoder.blocks.0.cross_norm.weight", "decoder.norm_f.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());  // tied
}

TEST(ModelKinds, EncoderGradientMatchesFiniteDifferencesF64) {
  expect_gradients_match(bert(), mlm_batch(), "bert", {{"blocks.0.mixer.qkv.weight", {0, 40, 90, 150, 191}}});
  ModelConfig pre = bert(true);
  pre.positions = PositionKind::relative;
  pre.relative_buckets = 6;
  pre.relative_max_distance = 4;
  pre.dropout = 0.2;
  expect_gradients_match(pre, mlm_batch(), "encoder, pre-norm, relative positions, dropout",
                         {{"relative_bias.weight", {0, 3, 5, 7, 11}}});
}

TEST(ModelKinds, EncoderDecoderGradientMatchesFiniteDifferencesF64) {
  expect_gradients_match(t5(), seq2seq_batch(), "t5",
                         {{"encoder.relative_bias.weight", {0, 2, 5, 9, 11}},
                          {"decoder.relative_bias.weight", {0, 1, 4, 10}},
                          {"decoder.blocks.1.cross.kv.weight", {0, 33, 70, 127}}});
  ModelConfig v11 = t5(FfnKind::geglu);
  v11.tie_embeddings = false;
  expect_gradients_match(v11, seq2seq_batch(), "t5 v1.1 (geglu, untied)");
}

// Bidirectional: the first token's output depends on the last; padding: a padded row gives, at its valid
// positions, the logits of the same row alone, whatever the padding holds.
TEST(ModelKinds, AnEncoderSeesItsWholeRowAndIgnoresPadding) {
  for (const bool pre : {false, true}) {
    ModelConfig cfg = bert(pre);
    cfg.next_sentence = false;
    Generator gen(3);
    std::unique_ptr<LanguageModel> model = make_model(cfg, gen);
    model->set_training(false);
    NoGradGuard no_grad;
    Batch a(ids({1, 4, 7, 2, 9}, 1, 5)), b(ids({1, 4, 7, 2, 3}, 1, 5));
    EXPECT_GT(max_abs_diff(narrow(model->logits(a), 1, 0, 1), narrow(model->logits(b), 1, 0, 1)), 1e-4);
    Batch alone(ids({1, 4, 7}, 1, 3));
    Batch padded(ids({1, 4, 7, 9, 9, 2, 5}, 1, 7));
    padded.lengths = row_lengths({3});
    Batch other_padding(ids({1, 4, 7, 0, 3, 3, 3}, 1, 7));
    other_padding.lengths = row_lengths({3});
    const Tensor want = model->logits(alone);
    EXPECT_LE(max_abs_diff(narrow(model->logits(padded), 1, 0, 3), want), 1e-5) << "pre " << pre;
    EXPECT_LE(max_abs_diff(narrow(model->logits(other_padding), 1, 0, 3), want), 1e-5) << "pre " << pre;
  }
}

// The encoder runs once; each decoder token continues the KV caches; cross attention's keys and values
// are computed at the first step: the logits equal the full forward's, for padded sources too.
TEST(ModelKinds, EncoderDecoderDecodingMatchesTheFullForward) {
  for (const PositionKind positions : {PositionKind::relative, PositionKind::learned}) {
    ModelConfig cfg = t5();
    cfg.positions = positions;
    Generator gen(4);
    auto model = std::unique_ptr<EncoderDecoder>(static_cast<EncoderDecoder*>(make_model(cfg, gen).release()));
    model->to(cpu_device(), DType::f64);
    model->set_training(false);
    NoGradGuard no_grad;
    const Batch batch = seq2seq_batch();
    const Tensor full = model->logits(batch);
    std::unique_ptr<DecodeState> state = model->new_decode_state();
    model->encode(batch.inputs, batch.lengths, *state);
    std::vector<Tensor> parts = {model->forward_step(narrow(batch.decoder_inputs, 1, 0, 2), *state)};
    for (int64_t t = 2; t < 5; ++t) parts.push_back(model->forward_step(narrow(batch.decoder_inputs, 1, t, 1), *state));
    EXPECT_EQ(state->position, 5);
    EXPECT_LE(max_abs_diff(concat(parts, 1), full), 1e-12);
    // What the state holds is what model_state_size counts (5 target tokens over a source of 7).
    auto& s = dynamic_cast<EncoderDecoderState&>(*state);
    double held = 0;
    for (const BlockState& b : s.blocks) held += b.mixer->size() + b.cross->size();
    EXPECT_EQ(held, 2 * (2.0 * 5 * kC) + 2 * (2.0 * 7 * kC));  // self caches of 5, cross of 7, per layer
    EXPECT_EQ(model_state_size(cfg, 7), 2 * (2.0 * 7 * kC) * 2);  // a source and a target of 7
  }
}

// A decoder with T5's relative bias (causal buckets) or sinusoidal positions decodes like its full forward.
TEST(ModelKinds, DecoderPositionsRelativeAndSinusoidalDecode) {
  for (const PositionKind positions : {PositionKind::relative, PositionKind::sinusoidal}) {
    ModelConfig cfg = gpt2_config(kV, kC, 2, kH, 16);
    cfg.positions = positions;
    cfg.relative_buckets = 6;
    cfg.relative_max_distance = 4;
    cfg.init_std = 0.3;
    Generator gen(6);
    Decoder model(cfg, gen);
    model.to(cpu_device(), DType::f64);
    NoGradGuard no_grad;
    const Tensor tokens = ids({1, 4, 7, 2, 9, 3, 5, 8, 6, 2, 10, 11, 0, 3}, kB, kT);
    const Tensor full = model.logits({tokens});
    std::unique_ptr<DecodeState> state = model.new_decode_state();
    std::vector<Tensor> parts = {model.forward_step(narrow(tokens, 1, 0, 3), *state)};
    for (int64_t t = 3; t < kT; ++t) parts.push_back(model.forward_step(narrow(tokens, 1, t, 1), *state));
    EXPECT_LE(max_abs_diff(concat(parts, 1), full), 1e-12) << static_cast<int>(positions);
  }
}

TEST(ModelKinds, ConfigurationsAKindCannotTakeAreRefused) {
  auto message = [](const ModelConfig& cfg) {
    try {
      Generator gen(1);
      make_model(cfg, gen);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const MixerSpec* m : registered_mixers()) {
    if (m->traits.bidirectional) continue;
    ModelConfig cfg = bert();
    cfg.blocks[1].mixer = m->name;
    EXPECT_EQ(message(cfg), "encoder: mixer '" + m->name + "' is causal only, but an encoder's blocks see the whole "
                                                            "row (use a bidirectional mixer: attention)");
  }
  ModelConfig segments = t5();
  segments.segments = 2;
  EXPECT_EQ(message(segments), "encoder_decoder: segments and the next-sentence head belong to an encoder");
  ModelConfig stacks = bert();
  stacks.decoder_blocks = stacks.blocks;
  EXPECT_EQ(message(stacks), "encoder: decoder_blocks belong to an encoder_decoder");
  Generator gen(2);
  std::unique_ptr<LanguageModel> enc = make_model(bert(), gen);
  EXPECT_FALSE(enc->can_decode());
  EXPECT_THROW(enc->new_decode_state(), std::logic_error);
  Batch with_decoder = mlm_batch();
  with_decoder.decoder_inputs = with_decoder.inputs;
  EXPECT_THROW(enc->logits(with_decoder), std::invalid_argument);
  std::unique_ptr<LanguageModel> ed = make_model(t5(), gen);
  EXPECT_THROW(ed->logits(mlm_batch()), std::invalid_argument);  // no decoder_inputs
}

}  // namespace
}  // namespace seqlab
