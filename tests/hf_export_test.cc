// The transformers export's mapping (train/export/hf_export.h), without transformers: GPT-2's names and
// layouts (Conv1D weights transposed, every other tensor as it is, a tied lm_head not stored, an untied one
// stored as it is), values copied exactly and in f32 from a bf16 model, config.json's sizes taken from the
// weights, the one-line refusals naming every setting GPT2LMHeadModel cannot hold (attention's options
// included). BERT's (BertForMaskedLM): the fused qkv split by rows into query, key and value, the
// next-sentence head left out, the output bias under cls.predictions.bias (and cls.predictions.decoder.bias
// too when untied), a row of zeros for the token types without segments, its refusals. T5's
// (T5ForConditionalGeneration): qkv and cross attention's kv split by rows, each stack's relative bias in
// its block 0, the FFN as wi (ReLU) or wi_0 and wi_1 (GEGLU), stacks of different depths, a tied or
// stored lm_head, its refusals. tests/hf_export_test.py loads real exports in transformers.
#include "train/export/hf_export.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "layers/model/decoder.h"
#include "layers/model/model_config.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kV = 11, kC = 8, kL = 2, kH = 2, kT = 5;

struct Exported {
  absl::StatusOr<HfExport> result;
  std::map<std::string, Tensor> seqlab;  // the model's parameters, by name
};

Exported export_of(const ModelConfig& cfg, const Recipe& recipe = Recipe(), HfExportSource source = {},
                   bool bf16 = false) {
  Generator gen(3);
  std::unique_ptr<LanguageModel> model = make_model(cfg, gen);
  if (bf16) model->to(cpu_device(), DType::bf16);
  Exported e;
  for (const Parameter& p : model->parameters()) e.seqlab.emplace(p.name, kernel::contiguous(*p.tensor));
  e.result = hf_export(recipe, *model, source);
  return e;
}

std::map<std::string, Tensor> by_name(const HfExport& e) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : e.tensors) out.emplace(name, t);
  return out;
}

double at(const Tensor& t, int64_t i, int64_t j) {
  return kernel::to_dtype(t, DType::f64).data<double>()[i * t.shape()[1] + j];
}

TEST(HfExportTest, Gpt2NamesLayoutsAndValues) {
  ModelConfig cfg = gpt2_config(kV, kC, kL, kH, kT);
  cfg.d_ff = 12;  // n_inner, not 4·d_model
  HfExportSource source;
  source.run_id = "abc";
  source.checkpoint = "ckpt_0000007.safetensors";
  source.step = 7;
  source.eot = 10;
  const Exported e = export_of(cfg, Recipe(), source);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  EXPECT_EQ(e.result->architecture, "GPT2LMHeadModel");
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  EXPECT_EQ(hf.size(), 4u + kL * 12u);  // wte wpe ln_f×2, and per block two norms×2, c_attn×2, c_proj×2, MLP×4
  EXPECT_EQ(hf.count("lm_head.weight"), 0u);
  for (const auto& [name, t] : hf) EXPECT_EQ(t.dtype(), DType::f32) << name;

  // Conv1D weights are [in, out]: the transpose of seqlab's Linear [out, in], value for value.
  const std::map<std::string, std::string> transposed = {
      {"blocks.1.mixer.qkv.weight", "transformer.h.1.attn.c_attn.weight"},
      {"blocks.1.mixer.proj.weight", "transformer.h.1.attn.c_proj.weight"},
      {"blocks.0.mlp.fc.weight", "transformer.h.0.mlp.c_fc.weight"},
      {"blocks.0.mlp.proj.weight", "transformer.h.0.mlp.c_proj.weight"}};
  for (const auto& [ours, theirs] : transposed) {
    const Tensor& a = e.seqlab.at(ours);
    const Tensor& b = hf.at(theirs);
    ASSERT_EQ(b.shape(), (Shape{a.shape()[1], a.shape()[0]})) << theirs;
    for (int64_t i = 0; i < a.shape()[0]; ++i) {
      for (int64_t j = 0; j < a.shape()[1]; ++j) ASSERT_EQ(at(a, i, j), at(b, j, i)) << theirs;
    }
  }
  EXPECT_EQ(hf.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{kC, 3 * kC}));
  EXPECT_EQ(hf.at("transformer.h.0.mlp.c_fc.weight").shape(), (Shape{kC, 12}));
  // Everything else keeps its layout.
  const std::map<std::string, std::string> same = {{"wte.weight", "transformer.wte.weight"},
                                                   {"wpe.weight", "transformer.wpe.weight"},
                                                   {"blocks.1.norm2.bias", "transformer.h.1.ln_2.bias"},
                                                   {"blocks.0.mixer.qkv.bias", "transformer.h.0.attn.c_attn.bias"},
                                                   {"norm_f.weight", "transformer.ln_f.weight"}};
  for (const auto& [ours, theirs] : same) {
    const Tensor a = kernel::reshape(e.seqlab.at(ours), {1, -1}), b = kernel::reshape(hf.at(theirs), {1, -1});
    ASSERT_EQ(e.seqlab.at(ours).shape(), hf.at(theirs).shape()) << theirs;
    for (int64_t j = 0; j < a.shape()[1]; ++j) ASSERT_EQ(at(a, 0, j), at(b, 0, j)) << theirs;
  }

  const std::string& config = e.result->config_json;
  for (const char* field : {"\"vocab_size\": 11", "\"n_positions\": 5", "\"n_embd\": 8", "\"n_layer\": 2",
                            "\"n_head\": 2", "\"n_inner\": 12", "\"activation_function\": \"gelu_new\"",
                            "\"layer_norm_epsilon\": 1e-5", "\"tie_word_embeddings\": true", "\"bos_token_id\": 10",
                            "\"eos_token_id\": 10", "\"attn_pdrop\": 0.0"}) {
    EXPECT_NE(config.find(field), std::string::npos) << field << " not in\n" << config;
  }
  EXPECT_EQ(e.result->metadata.at("format"), "pt");
  EXPECT_EQ(e.result->metadata.at("seqlab_step"), "7");
  EXPECT_EQ(e.result->metadata.at("seqlab_run_id"), "abc");
}

TEST(HfExportTest, NoEndOfTextIsNullAndDropoutIsCarried) {
  ModelConfig cfg = gpt2_config(kV, kC, 1, kH, kT);
  cfg.dropout = 0.25;
  const Exported e = export_of(cfg);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const std::string& config = e.result->config_json;
  for (const char* field : {"\"bos_token_id\": null", "\"eos_token_id\": null", "\"embd_pdrop\": 0.25",
                            "\"resid_pdrop\": 0.25", "\"n_inner\": 32"}) {
    EXPECT_NE(config.find(field), std::string::npos) << field << " not in\n" << config;
  }
}

TEST(HfExportTest, Bf16ModelExportsItsValuesInF32) {
  const Exported e = export_of(gpt2_config(kV, kC, 1, kH, kT), Recipe(), {}, /*bf16=*/true);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const Tensor wte = by_name(*e.result).at("transformer.wte.weight");
  EXPECT_EQ(wte.dtype(), DType::f32);
  const Tensor& ours = e.seqlab.at("wte.weight");
  EXPECT_EQ(ours.dtype(), DType::bf16);
  for (int64_t i = 0; i < kV; ++i) {
    for (int64_t j = 0; j < kC; ++j) ASSERT_EQ(at(ours, i, j), at(wte, i, j));
  }
}

// The refusal of `cfg`: one line that holds every expected piece.
void expect_refused(const ModelConfig& cfg, const std::vector<std::string>& pieces, const Recipe& recipe = Recipe()) {
  const Exported e = export_of(cfg, recipe);
  ASSERT_FALSE(e.result.ok());
  EXPECT_EQ(e.result.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(e.result.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("GPT2LMHeadModel cannot hold this model"), std::string::npos) << message;
  for (const std::string& piece : pieces) EXPECT_NE(message.find(piece), std::string::npos) << piece << " not in: " << message;
}

TEST(HfExportTest, RefusesWhatGpt2CannotHoldNamingEverySetting) {
  ModelConfig cfg = gpt2_config(kV, kC, 3, kH, kT);
  cfg.positions = PositionKind::rope;
  cfg.norm = NormKind::rms_norm;
  cfg.bias = false;
  cfg.n_kv_heads = 1;
  cfg.blocks[1] = BlockSpec{"gla", FfnKind::swiglu};
  cfg.blocks[2] = BlockSpec{"attention", FfnKind::none};
  expect_refused(cfg, {"the recurrent mixer 'gla' in block 1 ", "SwiGLU FFNs in block 1 ", "no FFN in block 2 ",
                       "rotary positions (model.positions = \"rope\")", "RMSNorm (model.norm = \"rmsnorm\")",
                       "no biases (model.bias = false)", "grouped key/value heads (model.n_kv_heads = 1 for 2 heads)"});

  cfg = gpt2_config(kV, kC, 4, kH, kT);
  for (size_t i : {0, 2, 3}) cfg.blocks[i].mixer = "retention";
  cfg.positions = PositionKind::none;
  expect_refused(cfg, {"the recurrent mixer 'retention' in blocks 0, 2-3 ", "no position embedding"});

  cfg = gpt2_config(kV, kC, 2, kH, kT);
  cfg.norm_placement = NormPlacement::post;
  cfg.positions = PositionKind::sinusoidal;
  cfg.blocks[0].ffn = FfnKind::relu;
  cfg.blocks[1].ffn = FfnKind::geglu;
  expect_refused(cfg, {"post-norm blocks (model.norm_placement = \"post\")", "ReLU FFNs in block 0 ",
                       "GEGLU FFNs in block 1 ", "sinusoidal positions (model.positions = \"sinusoidal\")"});
}

TEST(HfExportTest, RefusesAttentionOptionsOtherThanTheirDefaults) {
  ModelConfig cfg = gpt2_config(kV, kC, 1, kH, kT);
  MixerOptions options(mixer_spec("attention").options);
  options.set("scale", 0.5);
  cfg.mixer_options["attention"] = options;
  expect_refused(cfg, {"model.attention.scale = 0.5 (GPT-2 has only its default, 0.0)"});
  // The defaults, given explicitly, export.
  cfg.mixer_options["attention"] = MixerOptions(mixer_spec("attention").options);
  EXPECT_TRUE(export_of(cfg).result.ok());
}

TEST(HfExportTest, UntiedOutputProjectionIsStored) {
  ModelConfig cfg = gpt2_config(kV, kC, 1, kH, kT);
  cfg.tie_embeddings = false;
  const Exported e = export_of(cfg);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  ASSERT_EQ(hf.count("lm_head.weight"), 1u);
  const Tensor& ours = e.seqlab.at("lm_head.weight");
  ASSERT_EQ(hf.at("lm_head.weight").shape(), (Shape{kV, kC}));
  for (int64_t i = 0; i < kV; ++i) {
    for (int64_t j = 0; j < kC; ++j) ASSERT_EQ(at(ours, i, j), at(hf.at("lm_head.weight"), i, j));
  }
  EXPECT_NE(e.result->config_json.find("\"tie_word_embeddings\": false"), std::string::npos) << e.result->config_json;
}

// ---- BERT ----

// BERT's block (recipes/bert_small.toml): bidirectional attention, post-norm LayerNorm, GELU, biases,
// learned positions, two segments.
ModelConfig bert_config() {
  ModelConfig cfg = gpt2_config(kV, kC, kL, kH, kT);
  cfg.kind = ModelKind::encoder;
  cfg.norm_placement = NormPlacement::post;
  cfg.segments = 2;
  cfg.norm_eps = 1e-12;
  return cfg;
}

// Rows [part·n, (part+1)·n) of `fused` ([parts·n, cols] or [parts·n]) equal `piece`, value for value.
void expect_rows(const Tensor& fused, int part, int parts, const Tensor& piece, const std::string& name) {
  const Tensor a = kernel::reshape(fused, {fused.shape()[0], -1});
  const Tensor b = kernel::reshape(piece, {piece.shape()[0], -1});
  const int64_t n = a.shape()[0] / parts;
  ASSERT_EQ(b.shape(), (Shape{n, a.shape()[1]})) << name;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < a.shape()[1]; ++j) ASSERT_EQ(at(a, part * n + i, j), at(b, i, j)) << name;
  }
}

void expect_same(const Tensor& ours, const Tensor& theirs, const std::string& name) {
  ASSERT_EQ(ours.shape(), theirs.shape()) << name;
  expect_rows(ours, 0, 1, theirs, name);
}

void expect_fields(const std::string& config, const std::vector<std::string>& fields) {
  for (const std::string& field : fields) EXPECT_NE(config.find(field), std::string::npos) << field << " not in\n" << config;
}

TEST(HfExportTest, BertNamesLayoutsAndValues) {
  ModelConfig cfg = bert_config();
  cfg.next_sentence = true;
  HfExportSource source;
  source.pad = 9;
  const Exported e = export_of(cfg, Recipe(), source);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  EXPECT_EQ(e.result->architecture, "BertForMaskedLM");
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  // Embeddings (word, position, token type, LayerNorm ×2), the head (dense ×2, LayerNorm ×2, bias) and per
  // layer 16: query, key, value, output dense, intermediate, output, each weight and bias, two LayerNorms ×2.
  EXPECT_EQ(hf.size(), 5u + 5u + kL * 16u);
  for (const auto& [name, t] : hf) {
    EXPECT_EQ(name.rfind("cls.predictions.decoder", 0), std::string::npos) << name << ": tied, not stored";
    EXPECT_EQ(name.find("pooler"), std::string::npos) << name << ": BertForMaskedLM has no pooler";
    EXPECT_EQ(name.find("seq_relationship"), std::string::npos) << name;
    EXPECT_EQ(t.dtype(), DType::f32) << name;
  }
  const char* parts[] = {"query", "key", "value"};
  for (int i = 0; i < kL; ++i) {
    const std::string layer = "bert.encoder.layer." + std::to_string(i) + ".";
    const std::string block = "blocks." + std::to_string(i) + ".";
    for (int k = 0; k < 3; ++k) {
      const std::string self = layer + "attention.self." + parts[k];
      expect_rows(e.seqlab.at(block + "mixer.qkv.weight"), k, 3, hf.at(self + ".weight"), self + ".weight");
      expect_rows(e.seqlab.at(block + "mixer.qkv.bias"), k, 3, hf.at(self + ".bias"), self + ".bias");
    }
    expect_same(e.seqlab.at(block + "mixer.proj.weight"), hf.at(layer + "attention.output.dense.weight"), "proj");
    expect_same(e.seqlab.at(block + "norm1.weight"), hf.at(layer + "attention.output.LayerNorm.weight"), "norm1");
    expect_same(e.seqlab.at(block + "mlp.fc.weight"), hf.at(layer + "intermediate.dense.weight"), "fc");
    expect_same(e.seqlab.at(block + "mlp.proj.bias"), hf.at(layer + "output.dense.bias"), "proj bias");
    expect_same(e.seqlab.at(block + "norm2.bias"), hf.at(layer + "output.LayerNorm.bias"), "norm2");
  }
  EXPECT_EQ(hf.at("bert.encoder.layer.0.attention.self.query.weight").shape(), (Shape{kC, kC}));
  const std::map<std::string, std::string> same = {
      {"wte.weight", "bert.embeddings.word_embeddings.weight"},
      {"wpe.weight", "bert.embeddings.position_embeddings.weight"},
      {"segment.weight", "bert.embeddings.token_type_embeddings.weight"},
      {"norm_in.bias", "bert.embeddings.LayerNorm.bias"},
      {"head.dense.weight", "cls.predictions.transform.dense.weight"},
      {"head.norm.weight", "cls.predictions.transform.LayerNorm.weight"},
      {"head.bias", "cls.predictions.bias"}};
  for (const auto& [ours, theirs] : same) expect_same(e.seqlab.at(ours), hf.at(theirs), theirs);
  expect_fields(e.result->config_json,
                {"\"vocab_size\": 11", "\"hidden_size\": 8", "\"num_hidden_layers\": 2", "\"num_attention_heads\": 2",
                 "\"intermediate_size\": 32", "\"hidden_act\": \"gelu_new\"", "\"max_position_embeddings\": 5",
                 "\"type_vocab_size\": 2", "\"layer_norm_eps\": 1e-12", "\"pad_token_id\": 9",
                 "\"attention_probs_dropout_prob\": 0.0", "\"tie_word_embeddings\": true"});
}

TEST(HfExportTest, BertUntiedStoresTheDecoderAndItsBias) {
  ModelConfig cfg = bert_config();
  cfg.tie_embeddings = false;
  cfg.d_ff = 12;
  const Exported e = export_of(cfg);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  // transformers ties neither the decoder nor its bias when untied: the bias it adds is decoder.bias.
  expect_same(e.seqlab.at("lm_head.weight"), hf.at("cls.predictions.decoder.weight"), "decoder.weight");
  expect_same(e.seqlab.at("head.bias"), hf.at("cls.predictions.decoder.bias"), "decoder.bias");
  expect_same(e.seqlab.at("head.bias"), hf.at("cls.predictions.bias"), "bias");
  expect_fields(e.result->config_json, {"\"tie_word_embeddings\": false", "\"intermediate_size\": 12",
                                        "\"pad_token_id\": null"});
}

TEST(HfExportTest, BertWithoutSegmentsAddsAZeroTokenType) {
  ModelConfig cfg = bert_config();
  cfg.segments = 0;
  const Exported e = export_of(cfg);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const Tensor types = by_name(*e.result).at("bert.embeddings.token_type_embeddings.weight");
  ASSERT_EQ(types.shape(), (Shape{1, kC}));
  for (int64_t j = 0; j < kC; ++j) EXPECT_EQ(at(types, 0, j), 0.0);
  expect_fields(e.result->config_json, {"\"type_vocab_size\": 1"});
}

// The refusal of `cfg` by `architecture`: one line that holds every expected piece and none of `absent`.
void expect_refused_by(const ModelConfig& cfg, const std::string& architecture, const std::vector<std::string>& pieces,
                       const std::vector<std::string>& absent = {}) {
  const Exported e = export_of(cfg);
  ASSERT_FALSE(e.result.ok());
  EXPECT_EQ(e.result.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(e.result.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find(architecture + " cannot hold this model"), std::string::npos) << message;
  for (const std::string& piece : pieces) EXPECT_NE(message.find(piece), std::string::npos) << piece << " not in: " << message;
  for (const std::string& piece : absent) EXPECT_EQ(message.find(piece), std::string::npos) << piece << " in: " << message;
}

TEST(HfExportTest, RefusesWhatBertCannotHoldNamingEverySetting) {
  ModelConfig cfg = bert_config();
  cfg.norm_placement = NormPlacement::pre;
  cfg.norm = NormKind::rms_norm;
  cfg.bias = false;
  cfg.positions = PositionKind::rope;
  cfg.n_kv_heads = 1;
  cfg.blocks[1].ffn = FfnKind::swiglu;
  expect_refused_by(cfg, "BertForMaskedLM",
                    {"SwiGLU FFNs in block 1 (model.mlp, model.pattern)", "rotary positions (model.positions = \"rope\")",
                     "RMSNorm (model.norm = \"rmsnorm\")", "pre-norm blocks (model.norm_placement = \"pre\")",
                     "no biases (model.bias = false)", "grouped key/value heads (model.n_kv_heads = 1 for 2 heads)"});
  cfg = bert_config();
  cfg.positions = PositionKind::sinusoidal;
  MixerOptions options(mixer_spec("attention").options);
  options.set("scale", 1.0);
  cfg.mixer_options["attention"] = options;
  expect_refused_by(cfg, "BertForMaskedLM",
                    {"sinusoidal positions (model.positions = \"sinusoidal\")",
                     "model.attention.scale = 1.0 (BERT has only its default, 0.0)"},
                    {"post-norm blocks ("});
}

// ---- T5 ----

// T5's block (recipes/t5_small.toml): pre-norm RMSNorm, ReLU, no biases, relative positions, unscaled
// scores; a decoder one block deeper than the encoder.
ModelConfig t5_config(FfnKind ffn = FfnKind::relu) {
  ModelConfig cfg;
  cfg.kind = ModelKind::encoder_decoder;
  cfg.vocab_size = kV;
  cfg.d_model = kC;
  cfg.n_heads = kH;
  cfg.max_seq_len = kT;
  cfg.blocks.assign(kL, BlockSpec{"attention", ffn});
  cfg.decoder_blocks.assign(kL + 1, BlockSpec{"attention", ffn});
  cfg.positions = PositionKind::relative;
  cfg.relative_buckets = 8;
  cfg.relative_max_distance = 20;
  cfg.norm = NormKind::rms_norm;
  cfg.norm_eps = 1e-6;
  cfg.bias = false;
  MixerOptions options(mixer_spec("attention").options);
  options.set("scale", 1.0);
  cfg.mixer_options["attention"] = options;
  return cfg;
}

TEST(HfExportTest, T5NamesLayoutsAndValues) {
  HfExportSource source;
  source.pad = 7;
  source.eos = 8;
  const Exported e = export_of(t5_config(), Recipe(), source);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  EXPECT_EQ(e.result->architecture, "T5ForConditionalGeneration");
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  // shared, two relative tables, two final norms; per encoder block q k v o, two norms, wi wo (8); per
  // decoder block those and the cross attention's norm, q k v o (13).
  EXPECT_EQ(hf.size(), 5u + kL * 8u + (kL + 1) * 13u);
  EXPECT_EQ(hf.count("lm_head.weight"), 0u);
  const char* parts[] = {"q", "k", "v"};
  for (const std::string stack : {"encoder", "decoder"}) {
    const size_t blocks = stack == "encoder" ? kL : kL + 1;
    for (size_t i = 0; i < blocks; ++i) {
      const std::string hb = stack + ".block." + std::to_string(i) + ".";
      const std::string sb = stack + ".blocks." + std::to_string(i) + ".";
      for (int k = 0; k < 3; ++k) {
        const std::string name = hb + "layer.0.SelfAttention." + parts[k] + ".weight";
        expect_rows(e.seqlab.at(sb + "mixer.qkv.weight"), k, 3, hf.at(name), name);
      }
      expect_same(e.seqlab.at(sb + "mixer.proj.weight"), hf.at(hb + "layer.0.SelfAttention.o.weight"), "o");
      expect_same(e.seqlab.at(sb + "norm1.weight"), hf.at(hb + "layer.0.layer_norm.weight"), "norm1");
      const std::string ffn = hb + (stack == "encoder" ? "layer.1." : "layer.2.");
      expect_same(e.seqlab.at(sb + "norm2.weight"), hf.at(ffn + "layer_norm.weight"), "norm2");
      expect_same(e.seqlab.at(sb + "mlp.fc.weight"), hf.at(ffn + "DenseReluDense.wi.weight"), "wi");
      expect_same(e.seqlab.at(sb + "mlp.proj.weight"), hf.at(ffn + "DenseReluDense.wo.weight"), "wo");
      // Only block 0 of each stack holds the table, which the stack's other blocks reuse.
      EXPECT_EQ(hf.count(hb + "layer.0.SelfAttention.relative_attention_bias.weight"), i == 0 ? 1u : 0u);
      if (stack == "decoder") {
        const std::string cross = hb + "layer.1.";
        expect_same(e.seqlab.at(sb + "cross_norm.weight"), hf.at(cross + "layer_norm.weight"), "cross_norm");
        expect_same(e.seqlab.at(sb + "cross.q.weight"), hf.at(cross + "EncDecAttention.q.weight"), "q");
        expect_rows(e.seqlab.at(sb + "cross.kv.weight"), 0, 2, hf.at(cross + "EncDecAttention.k.weight"), "k");
        expect_rows(e.seqlab.at(sb + "cross.kv.weight"), 1, 2, hf.at(cross + "EncDecAttention.v.weight"), "v");
        expect_same(e.seqlab.at(sb + "cross.proj.weight"), hf.at(cross + "EncDecAttention.o.weight"), "o");
      }
    }
    expect_same(e.seqlab.at(stack + ".relative_bias.weight"),
                hf.at(stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight"), "relative bias");
    expect_same(e.seqlab.at(stack + ".norm_f.weight"), hf.at(stack + ".final_layer_norm.weight"), "final norm");
  }
  EXPECT_EQ(hf.at("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").shape(), (Shape{8, kH}));
  expect_same(e.seqlab.at("wte.weight"), hf.at("shared.weight"), "shared");
  expect_fields(e.result->config_json,
                {"\"vocab_size\": 11", "\"d_model\": 8", "\"d_kv\": 4", "\"d_ff\": 32", "\"num_layers\": 2",
                 "\"num_decoder_layers\": 3", "\"num_heads\": 2", "\"relative_attention_num_buckets\": 8",
                 "\"relative_attention_max_distance\": 20", "\"layer_norm_epsilon\": 1e-6",
                 "\"feed_forward_proj\": \"relu\"", "\"tie_word_embeddings\": true", "\"pad_token_id\": 7",
                 "\"decoder_start_token_id\": 7", "\"eos_token_id\": 8"});
}

TEST(HfExportTest, T5GegluUntiedIsVersion11) {
  ModelConfig cfg = t5_config(FfnKind::geglu);
  cfg.tie_embeddings = false;
  const Exported e = export_of(cfg);
  ASSERT_TRUE(e.result.ok()) << e.result.status();
  const std::map<std::string, Tensor> hf = by_name(*e.result);
  // gelu_new(wi_0 x) ⊙ wi_1 x = seqlab's gelu(fc x) ⊙ gate x.
  expect_same(e.seqlab.at("encoder.blocks.1.mlp.fc.weight"), hf.at("encoder.block.1.layer.1.DenseReluDense.wi_0.weight"),
              "wi_0");
  expect_same(e.seqlab.at("decoder.blocks.2.mlp.gate.weight"),
              hf.at("decoder.block.2.layer.2.DenseReluDense.wi_1.weight"), "wi_1");
  EXPECT_EQ(hf.count("encoder.block.0.layer.1.DenseReluDense.wi.weight"), 0u);
  expect_same(e.seqlab.at("lm_head.weight"), hf.at("lm_head.weight"), "lm_head");
  expect_fields(e.result->config_json, {"\"feed_forward_proj\": \"gated-gelu\"", "\"tie_word_embeddings\": false",
                                        "\"d_ff\": 64", "\"pad_token_id\": null", "\"eos_token_id\": null"});
}

TEST(HfExportTest, RefusesWhatT5CannotHoldNamingEverySetting) {
  ModelConfig cfg = t5_config();
  cfg.mixer_options.clear();  // the default scale, 1/√D
  cfg.norm = NormKind::layer_norm;
  cfg.bias = true;
  cfg.positions = PositionKind::learned;
  cfg.norm_placement = NormPlacement::post;
  cfg.n_kv_heads = 1;
  cfg.blocks[0].ffn = FfnKind::swiglu;
  cfg.decoder_blocks[2].ffn = FfnKind::none;
  expect_refused_by(cfg, "T5ForConditionalGeneration",
                    {"SwiGLU FFNs in encoder block 0 (model.mlp, model.pattern)",
                     "no FFN in decoder block 2 (model.mlp, model.pattern)",
                     "learned positions (model.positions = \"learned\")", "LayerNorm (model.norm = \"layernorm\")",
                     "post-norm blocks (model.norm_placement = \"post\")", "biases (model.bias = true)",
                     "grouped key/value heads (model.n_kv_heads = 1 for 2 heads)",
                     "model.attention.scale = 0.0 (T5 has only 1.0)"});
  // One feed_forward_proj for both stacks: ReLU beside GEGLU is refused, naming where each is.
  cfg = t5_config();
  cfg.decoder_blocks[1].ffn = FfnKind::geglu;
  expect_refused_by(cfg, "T5ForConditionalGeneration",
                    {"ReLU FFNs in encoder blocks 0-1 and decoder blocks 0, 2 beside GEGLU FFNs in decoder block 1 "
                     "(model.mlp, model.pattern: T5 has one feed_forward_proj)"},
                    {"model.attention.scale"});
}

}  // namespace
}  // namespace seqlab
