#include "train/export/hf_export.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>

#include <set>
#include <stdexcept>

#include "layers/mixer.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

// ------------------------------------------------------------------------------------------------
// Mapping tables: one per transformers class.
//
// An entry names a seqlab parameter, its transformers name and how its values are laid out there;
// "{i}" in both names stands for a block's index (the entry then applies to every block).

enum class Layout {
  same,        // the same [rows, cols] row-major: embeddings, norms, biases, nn.Linear weights [out, in]
  transposed,  // GPT-2's Conv1D keeps its weight as [in, out] (y = x W + b): seqlab's Linear [out, in]ᵀ
};

struct TensorMapping {
  const char* seqlab;
  const char* hf;
  Layout layout;
};

struct HfMapping {
  const char* architecture;
  std::vector<TensorMapping> model;  // once per model
  std::vector<TensorMapping> block;  // once per block
};

// GPT2LMHeadModel (transformers' modeling_gpt2.py). The block is pre-norm as seqlab's:
//   h = x + c_proj(attn(ln_1 x)),   y = h + mlp.c_proj(gelu_new(mlp.c_fc(ln_2 h)))
// with c_attn's output split as [q | k | v] and each of them as n_head heads of n_embd / n_head features,
// exactly as seqlab's qkv output is split (attention_mixer.cpp). Conv1D weights are [in, out]. lm_head is
// tied to transformer.wte and not stored.
const HfMapping kGpt2{
    "GPT2LMHeadModel",
    {
        {"wte.weight", "transformer.wte.weight", Layout::same},
        {"wpe.weight", "transformer.wpe.weight", Layout::same},
        {"norm_f.weight", "transformer.ln_f.weight", Layout::same},
        {"norm_f.bias", "transformer.ln_f.bias", Layout::same},
    },
    {
        {"blocks.{i}.norm1.weight", "transformer.h.{i}.ln_1.weight", Layout::same},
        {"blocks.{i}.norm1.bias", "transformer.h.{i}.ln_1.bias", Layout::same},
        {"blocks.{i}.mixer.qkv.weight", "transformer.h.{i}.attn.c_attn.weight", Layout::transposed},
        {"blocks.{i}.mixer.qkv.bias", "transformer.h.{i}.attn.c_attn.bias", Layout::same},
        {"blocks.{i}.mixer.proj.weight", "transformer.h.{i}.attn.c_proj.weight", Layout::transposed},
        {"blocks.{i}.mixer.proj.bias", "transformer.h.{i}.attn.c_proj.bias", Layout::same},
        {"blocks.{i}.norm2.weight", "transformer.h.{i}.ln_2.weight", Layout::same},
        {"blocks.{i}.norm2.bias", "transformer.h.{i}.ln_2.bias", Layout::same},
        {"blocks.{i}.mlp.fc.weight", "transformer.h.{i}.mlp.c_fc.weight", Layout::transposed},
        {"blocks.{i}.mlp.fc.bias", "transformer.h.{i}.mlp.c_fc.bias", Layout::same},
        {"blocks.{i}.mlp.proj.weight", "transformer.h.{i}.mlp.c_proj.weight", Layout::transposed},
        {"blocks.{i}.mlp.proj.bias", "transformer.h.{i}.mlp.c_proj.bias", Layout::same},
    },
};

// The encoder and encoder-decoder families slot in as one table (and one refusal list and config
// writer) each, dispatched on model.arch in hf_export below. What they need, from transformers'
// modeling_bert.py and modeling_t5.py:
//
// BertForMaskedLM (model.arch = "encoder"). Names: bert.embeddings.{word_embeddings, position_embeddings,
// token_type_embeddings}.weight, bert.embeddings.LayerNorm.{weight, bias};
// bert.encoder.layer.{i}.attention.self.{query, key, value}.{weight, bias},
// .attention.output.dense.*, .attention.output.LayerNorm.*, .intermediate.dense.*, .output.dense.*,
// .output.LayerNorm.*; the head cls.predictions.transform.dense.*, cls.predictions.transform.LayerNorm.*,
// cls.predictions.bias, with cls.predictions.decoder.weight tied to the word embeddings (not stored).
// All are nn.Linear ([out, in], Layout::same); seqlab's fused qkv [3C, C] needs a third layout that
// takes rows [kC, (k+1)C) for query, key and value. BERT is post-norm (x = LN(x + attn(x)), and a
// LayerNorm on the embeddings' sum): a pre-norm seqlab encoder does not map and is refused, as are
// RoPE, RMSNorm, no biases, grouped KV heads and a recurrent mixer. token_type_embeddings is added to
// every token even without segments: a seqlab encoder without segment embeddings exports one row of
// zeros (type_vocab_size = 1), which keeps the logits exact. config: hidden_act "gelu_new" for seqlab's
// tanh GELU ("gelu" is erf's), layer_norm_eps, max_position_embeddings = the position table's rows,
// intermediate_size = d_ff.
//
// T5ForConditionalGeneration (model.arch = "encoder_decoder"). Names: shared.weight (the encoder's and the
// decoder's embed_tokens are tied to it); encoder.block.{i}.layer.0.SelfAttention.{q, k, v, o}.weight,
// encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight [num_buckets, H] (block 0 only),
// encoder.block.{i}.layer.0.layer_norm.weight, .layer.1.DenseReluDense.{wi, wo}.weight (or wi_0, wi_1 for
// feed_forward_proj = "gated-gelu"), .layer.1.layer_norm.weight, encoder.final_layer_norm.weight; the
// decoder the same plus .layer.1.EncDecAttention.{q, k, v, o}.weight and its layer.1.layer_norm, the FFN
// moving to layer.2, and decoder.final_layer_norm.weight; lm_head.weight stored only when untied. T5 has
// no biases, RMSNorm without a mean (T5LayerNorm), no 1/√d_kv in its attention scores (seqlab's
// [model.attention] scale = 1 maps as it is; the default 1/√d_kv needs W_q / √d_kv, a fourth layout),
// relative position buckets, added to the scores (MixerInput::bias), instead of learned or rotary
// positions (a seqlab T5 without them is refused), and with tied embeddings it scales the decoder's output
// by d_model^−½ before lm_head (a seqlab model that does not is refused, or exported untied with
// lm_head = wte · d_model^−½).
// config: d_model, d_kv, d_ff, num_heads, num_layers, num_decoder_layers, relative_attention_num_buckets,
// relative_attention_max_distance, feed_forward_proj, layer_norm_epsilon, tie_word_embeddings,
// decoder_start_token_id and pad_token_id.

// ------------------------------------------------------------------------------------------------

// "block 2", "blocks 0-3", "blocks 0, 2, 5-7".
std::string block_list(const std::vector<size_t>& blocks) {
  std::vector<std::string> parts;
  for (size_t k = 0; k < blocks.size();) {
    size_t end = k;
    while (end + 1 < blocks.size() && blocks[end + 1] == blocks[end] + 1) ++end;
    parts.push_back(end == k ? absl::StrCat(blocks[k]) : absl::StrCat(blocks[k], "-", blocks[end]));
    k = end + 1;
  }
  return absl::StrCat(blocks.size() == 1 ? "block " : "blocks ", absl::StrJoin(parts, ", "));
}

// An option value as the recipe writes it.
std::string option_text(const MixerOptions& options, const OptionSpec& spec) {
  switch (spec.type) {
    case OptionType::integer: return absl::StrCat(options.integer(spec.key));
    case OptionType::number: return toml_number(options.number(spec.key));
    case OptionType::boolean: return options.boolean(spec.key) ? "true" : "false";
    case OptionType::text: return "\"" + options.text(spec.key) + "\"";
  }
  return "";
}

// What of a decoder GPT2LMHeadModel has no counterpart for, each with the recipe key that chose it.
std::vector<std::string> gpt2_mismatches(const Recipe& recipe, const DecoderConfig& cfg) {
  std::vector<std::string> out;
  // Mixers other than attention, in the order they first appear, each with its blocks.
  std::vector<std::string> mixers;
  std::map<std::string, std::vector<size_t>> mixer_blocks;
  std::vector<size_t> swiglu, no_ffn;
  for (size_t i = 0; i < cfg.blocks.size(); ++i) {
    const MixerSpec& spec = mixer_spec(cfg.blocks[i].mixer);
    if (spec.name != "attention") {
      if (!mixer_blocks.count(spec.name)) mixers.push_back(spec.name);
      mixer_blocks[spec.name].push_back(i);
    }
    if (cfg.blocks[i].ffn == FfnKind::swiglu) swiglu.push_back(i);
    if (cfg.blocks[i].ffn == FfnKind::none) no_ffn.push_back(i);
  }
  for (const std::string& m : mixers) {
    out.push_back(absl::StrCat(mixer_spec(m).traits.recurrent ? "the recurrent mixer '" : "the mixer '", m, "' in ",
                               block_list(mixer_blocks[m]), " (model.mixer, model.pattern)"));
  }
  if (!swiglu.empty()) out.push_back("SwiGLU FFNs in " + block_list(swiglu) + " (model.mlp, model.pattern)");
  if (!no_ffn.empty()) out.push_back("no FFN in " + block_list(no_ffn) + " (model.mlp, model.pattern)");
  if (cfg.positions == PositionKind::rope) out.push_back("rotary positions (model.positions = \"rope\")");
  if (cfg.positions == PositionKind::none) out.push_back("no position embedding (model.positions = \"none\")");
  if (cfg.norm == NormKind::rms_norm) out.push_back("RMSNorm (model.norm = \"rmsnorm\")");
  if (!cfg.bias) out.push_back("no biases (model.bias = false)");
  const int64_t kv_heads = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : cfg.n_heads;
  if (kv_heads != cfg.n_heads) {
    out.push_back(absl::StrCat("grouped key/value heads (model.n_kv_heads = ", kv_heads, " for ", cfg.n_heads,
                               " heads)"));
  }
  if (!recipe.model.tie_embeddings) out.push_back("an untied output projection (model.tie_embeddings = false)");
  // Attention's own options ([model.attention] scale, and any it gains later): GPT-2 has their defaults only.
  const MixerSpec& attention = mixer_spec("attention");
  auto set = cfg.mixer_options.find(attention.name);
  if (set != cfg.mixer_options.end()) {
    const MixerOptions defaults(attention.options);
    for (const OptionSpec& o : attention.options) {
      const std::string value = option_text(set->second, o), fallback = option_text(defaults, o);
      if (value != fallback) {
        out.push_back(
            absl::StrCat("model.attention.", o.key, " = ", value, " (GPT-2 has only its default, ", fallback, ")"));
      }
    }
  }
  return out;
}

// The elements of config.json, in the order written: each value is JSON text.
using JsonFields = std::vector<std::pair<std::string, std::string>>;

std::string json_object(const JsonFields& fields) {
  std::vector<std::string> lines;
  for (const auto& [key, value] : fields) lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  return "{\n" + absl::StrJoin(lines, ",\n") + "\n}\n";
}

// GPT2Config (transformers' configuration_gpt2.py). seqlab's GELU is the tanh form (ops_elementwise.cpp):
// "gelu_new". Dropout: seqlab drops the embeddings' sum, the attention output and the MLP output, as
// embd_pdrop and resid_pdrop do; it never drops attention probabilities (attn_pdrop = 0).
std::string gpt2_config(const DecoderConfig& cfg, int64_t n_positions, int64_t d_ff, const HfExportSource& source) {
  const std::string eot = source.eot ? absl::StrCat(*source.eot) : "null";
  const std::string dropout = toml_number(cfg.dropout);
  return json_object({
      {"architectures", "[\"GPT2LMHeadModel\"]"},
      {"model_type", "\"gpt2\""},
      {"vocab_size", absl::StrCat(cfg.vocab_size)},
      {"n_positions", absl::StrCat(n_positions)},
      {"n_embd", absl::StrCat(cfg.d_model)},
      {"n_layer", absl::StrCat(cfg.blocks.size())},
      {"n_head", absl::StrCat(cfg.n_heads)},
      {"n_inner", absl::StrCat(d_ff)},
      {"activation_function", "\"gelu_new\""},
      {"layer_norm_epsilon", toml_number(cfg.norm_eps)},
      {"initializer_range", toml_number(cfg.init_std)},
      {"embd_pdrop", dropout},
      {"resid_pdrop", dropout},
      {"attn_pdrop", "0.0"},
      {"scale_attn_weights", "true"},
      {"scale_attn_by_inverse_layer_idx", "false"},
      {"reorder_and_upcast_attn", "false"},
      {"tie_word_embeddings", "true"},
      {"bos_token_id", eot},
      {"eos_token_id", eot},
      {"use_cache", "true"},
      {"dtype", "\"float32\""},
  });
}

// The tensors of `model` under the names of `mapping`, in `layout`: every parameter mapped, every entry
// of the table used (for each of the model's blocks), else InvalidArgument naming what is left over.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> mapped_tensors(LanguageModel& model,
                                                                           const HfMapping& mapping,
                                                                           size_t n_blocks,
                                                                           const std::string& where) {
  struct Target {
    std::string hf;
    Layout layout;
  };
  std::map<std::string, Target> by_seqlab;
  for (const TensorMapping& m : mapping.model) by_seqlab[m.seqlab] = {m.hf, m.layout};
  for (size_t i = 0; i < n_blocks; ++i) {
    const std::string index = absl::StrCat(i);
    for (const TensorMapping& m : mapping.block) {
      by_seqlab[absl::StrReplaceAll(m.seqlab, {{"{i}", index}})] = {absl::StrReplaceAll(m.hf, {{"{i}", index}}),
                                                                      m.layout};
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> used;
  for (const Parameter& p : model.parameters()) {
    auto it = by_seqlab.find(p.name);
    if (it == by_seqlab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the model's parameter ", p.name, " has no counterpart in ",
                                                     mapping.architecture));
    }
    used.insert(p.name);
    // f32 on the CPU, whatever the model's device and dtype.
    Tensor t = kernel::to_dtype(kernel::to_device(*p.tensor, cpu_device()), DType::f32);
    if (it->second.layout == Layout::transposed) t = kernel::transpose(t, 0, 1);
    out.emplace_back(it->second.hf, kernel::contiguous(t));
  }
  for (const auto& [name, target] : by_seqlab) {
    if (!used.count(name)) {
      // The table and the model disagree: the checks of the mismatches should have refused the model.
      throw std::logic_error(absl::StrCat("hf_export: ", mapping.architecture, "'s table maps ", name,
                                          ", which the model lacks"));
    }
  }
  return out;
}

absl::StatusOr<HfExport> gpt2_export(const Recipe& recipe, const Decoder& decoder, LanguageModel& model,
                                     const HfExportSource& source) {
  const DecoderConfig& cfg = decoder.config();
  const std::string where = recipe.source_path.empty() ? recipe.name : recipe.source_path;
  const std::vector<std::string> mismatches = gpt2_mismatches(recipe, cfg);
  if (!mismatches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": transformers' GPT2LMHeadModel cannot hold this model: ", absl::StrJoin(mismatches, ", "),
        "; GPT-2 is causal softmax attention with a GELU MLP in every block, LayerNorm, biases, learned positions, "
        "full key/value heads and the tied output embedding"));
  }
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> tensors =
      mapped_tensors(model, kGpt2, cfg.blocks.size(), where);
  if (!tensors.ok()) return tensors.status();
  HfExport e;
  e.architecture = kGpt2.architecture;
  // The sizes as the weights have them: wpe's rows are the positions, c_fc's columns the MLP's width.
  int64_t n_positions = 0, d_ff = 0;
  for (const auto& [name, t] : *tensors) {
    if (name == "transformer.wpe.weight") n_positions = t.shape()[0];
    if (name == "transformer.h.0.mlp.c_fc.weight") d_ff = t.shape()[1];
  }
  e.config_json = gpt2_config(cfg, n_positions, d_ff, source);
  e.tensors = *std::move(tensors);
  e.metadata = {{"format", "pt"},
                {"seqlab_run_id", source.run_id},
                {"seqlab_checkpoint", source.checkpoint},
                {"seqlab_step", absl::StrCat(source.step)}};
  return e;
}

}  // namespace

absl::StatusOr<HfExport> hf_export(const Recipe& recipe, LanguageModel& model, const HfExportSource& source) {
  const std::string where = recipe.source_path.empty() ? recipe.name : recipe.source_path;
  if (recipe.model.arch == "decoder") {
    const auto* decoder = dynamic_cast<const Decoder*>(&model);
    if (decoder == nullptr) throw std::logic_error("hf_export: model.arch = \"decoder\" but the model is no Decoder");
    return gpt2_export(recipe, *decoder, model, source);
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": model.arch = \"", recipe.model.arch,
                                                 "\" has no transformers export yet (only \"decoder\": GPT2LMHeadModel)"));
}

}  // namespace seqlab
