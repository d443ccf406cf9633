// The transformers export's mapping (train/export/hf_export.h), without transformers: GPT-2's names and
// layouts (Conv1D weights transposed, every other tensor as it is, a tied lm_head not stored, an untied one
// stored as it is), values copied exactly and in f32 from a bf16 model, config.json's sizes taken from the
// weights, the one-line refusals naming every setting GPT2LMHeadModel cannot hold (attention's options
// included), and the refusal of the kinds whose tables are not written (an encoder). tests/hf_export_test.py loads real exports in transformers.
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

TEST(HfExportTest, RefusesAnEncoder) {
  // BERT's block: bidirectional attention, post-norm LayerNorm, GELU, biases, learned positions.
  ModelConfig cfg = gpt2_config(kV, kC, 1, kH, kT);
  cfg.kind = ModelKind::encoder;
  cfg.norm_placement = NormPlacement::post;
  Recipe recipe;
  recipe.model.arch = "encoder";
  const Exported e = export_of(cfg, recipe);
  ASSERT_FALSE(e.result.ok());
  const std::string message(e.result.status().message());
  EXPECT_NE(message.find("model.arch = \"encoder\" has no transformers export yet (BertForMaskedLM's mapping is "
                         "not written)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace seqlab
