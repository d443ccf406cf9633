#include "train/export/hf_export.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>

#include <set>
#include <stdexcept>

#include "layers/mixer.h"
#include "layers/model/decoder.h"
#include "layers/model/encoder.h"
#include "layers/model/encoder_decoder.h"
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
// exactly as seqlab's qkv output is split (attention_mixer.cpp). Conv1D weights are [in, out]. A tied
// lm_head is transformer.wte and not stored (tie_word_embeddings); an untied one is an nn.Linear without
// bias, [vocab, n_embd] as seqlab's lm_head.
HfMapping gpt2_mapping(const ModelConfig& cfg) {
  HfMapping m{
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
  if (!cfg.tie_embeddings) m.model.push_back({"lm_head.weight", "lm_head.weight", Layout::same});
  return m;
}

// The encoder and encoder-decoder kinds (layers/model/encoder.h, encoder_decoder.h) slot in as one mapping
// function, one list of mismatches and one config writer each, dispatched on the model's kind in hf_export
// below; until they are written, those kinds are refused. What each needs, from transformers'
// modeling_bert.py and modeling_t5.py (a third and a fourth Layout: rows [k·C, (k+1)·C) of a fused
// projection, for splitting qkv and kv):
//
// BertForMaskedLM (model.arch = "encoder"; BertForPreTraining when next_sentence, whose cls.seq_relationship
// is nsp.* and bert.pooler.dense is pooler.*). wte → bert.embeddings.word_embeddings, wpe →
// bert.embeddings.position_embeddings, segment → bert.embeddings.token_type_embeddings (segments = 0: BERT
// still adds token_type_embeddings[0] to every token, so export one row of zeros, type_vocab_size = 1),
// norm_in → bert.embeddings.LayerNorm; per block i, bert.encoder.layer.{i}: mixer.qkv rows [0, C), [C, 2C),
// [2C, 3C) → attention.self.{query, key, value} (weights and biases), mixer.proj → attention.output.dense,
// norm1 → attention.output.LayerNorm, mlp.fc → intermediate.dense, mlp.proj → output.dense, norm2 →
// output.LayerNorm; head.dense → cls.predictions.transform.dense, head.norm →
// cls.predictions.transform.LayerNorm, head.bias → cls.predictions.bias, lm_head (untied) →
// cls.predictions.decoder.weight (tied: not stored). All nn.Linear, [out, in] as seqlab's. Mismatches:
// pre-norm blocks (BERT is post-norm: norm_placement = "post"), RMSNorm, no biases, a FFN other than GELU,
// rotary, sinusoidal, relative or no positions, grouped KV heads, a recurrent mixer, attention options.
// config: hidden_act "gelu_new" (seqlab's tanh GELU; BERT's "gelu" is erf's), hidden_size,
// num_hidden_layers, num_attention_heads, intermediate_size = d_ff, max_position_embeddings = wpe's rows,
// type_vocab_size, layer_norm_eps, hidden_dropout_prob = dropout, attention_probs_dropout_prob = 0,
// tie_word_embeddings, pad_token_id. The check feeds both the same rows with their attention_mask.
//
// T5ForConditionalGeneration (model.arch = "encoder_decoder"). wte → shared (T5's encoder.embed_tokens and
// decoder.embed_tokens are tied to it); per encoder block i, encoder.block.{i}: norm1 →
// layer.0.layer_norm, mixer.qkv rows → layer.0.SelfAttention.{q, k, v}, mixer.proj → layer.0.SelfAttention.o,
// norm2 → layer.1.layer_norm, mlp.fc → layer.1.DenseReluDense.wi (relu; geglu: fc → wi_0, gate → wi_1),
// mlp.proj → layer.1.DenseReluDense.wo; encoder.relative_bias [buckets, H] →
// encoder.block.0.layer.0.SelfAttention.relative_attention_bias (the same [buckets, H]); encoder.norm_f →
// encoder.final_layer_norm. The decoder the same under decoder.*, with cross_norm → layer.1.layer_norm,
// cross.q → layer.1.EncDecAttention.q, cross.kv rows [0, C), [C, 2C) → EncDecAttention.{k, v}, cross.proj →
// EncDecAttention.o, and the FFN in layer.2; lm_head (untied, T5 v1.1) → lm_head. seqlab's T5 matches T5's
// arithmetic where it maps: RMSNorm without a mean (T5LayerNorm), no biases, [model.attention] scale = 1
// (T5's scores have no 1/√d_kv), bucketed relative positions with T5's bucketing, and the tied output
// scaled by d_model^−½. Mismatches: biases, LayerNorm, post-norm, positions other than relative, another
// scale, GELU or SwiGLU FFNs (T5 has relu and gated-gelu), grouped KV heads, a recurrent mixer. config:
// d_model, d_kv = d_model / n_heads, d_ff, num_heads, num_layers, num_decoder_layers,
// relative_attention_num_buckets, relative_attention_max_distance, feed_forward_proj ("relu" or
// "gated-gelu", whose gelu_new is seqlab's tanh GELU), layer_norm_epsilon, dropout_rate,
// tie_word_embeddings, decoder_start_token_id and pad_token_id.

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

// A FFN kind other than GPT-2's GELU MLP, as a refusal names it.
const char* ffn_refusal(FfnKind kind) {
  switch (kind) {
    case FfnKind::swiglu: return "SwiGLU FFNs";
    case FfnKind::geglu: return "GEGLU FFNs";
    case FfnKind::relu: return "ReLU FFNs";
    case FfnKind::none: return "no FFN";
    case FfnKind::gelu: break;
  }
  return "";
}

// What of a decoder GPT2LMHeadModel has no counterpart for, each with the recipe key that chose it.
std::vector<std::string> gpt2_mismatches(const ModelConfig& cfg) {
  std::vector<std::string> out;
  // Mixers other than attention and FFNs other than GELU, in the order they first appear, with their blocks.
  std::vector<std::string> mixers;
  std::map<std::string, std::vector<size_t>> mixer_blocks;
  std::vector<FfnKind> ffns;
  std::map<FfnKind, std::vector<size_t>> ffn_blocks;
  for (size_t i = 0; i < cfg.blocks.size(); ++i) {
    const MixerSpec& spec = mixer_spec(cfg.blocks[i].mixer);
    if (spec.name != "attention") {
      if (!mixer_blocks.count(spec.name)) mixers.push_back(spec.name);
      mixer_blocks[spec.name].push_back(i);
    }
    const FfnKind ffn = cfg.blocks[i].ffn;
    if (ffn != FfnKind::gelu) {
      if (!ffn_blocks.count(ffn)) ffns.push_back(ffn);
      ffn_blocks[ffn].push_back(i);
    }
  }
  for (const std::string& m : mixers) {
    out.push_back(absl::StrCat(mixer_spec(m).traits.recurrent ? "the recurrent mixer '" : "the mixer '", m, "' in ",
                               block_list(mixer_blocks[m]), " (model.mixer, model.pattern)"));
  }
  for (FfnKind f : ffns) {
    out.push_back(absl::StrCat(ffn_refusal(f), " in ", block_list(ffn_blocks[f]), " (model.mlp, model.pattern)"));
  }
  switch (cfg.positions) {
    case PositionKind::learned: break;
    case PositionKind::rope: out.push_back("rotary positions (model.positions = \"rope\")"); break;
    case PositionKind::sinusoidal: out.push_back("sinusoidal positions (model.positions = \"sinusoidal\")"); break;
    case PositionKind::relative: out.push_back("a relative position bias (model.positions = \"relative\")"); break;
    case PositionKind::none: out.push_back("no position embedding (model.positions = \"none\")"); break;
  }
  if (cfg.norm == NormKind::rms_norm) out.push_back("RMSNorm (model.norm = \"rmsnorm\")");
  if (cfg.norm_placement == NormPlacement::post) out.push_back("post-norm blocks (model.norm_placement = \"post\")");
  if (!cfg.bias) out.push_back("no biases (model.bias = false)");
  const int64_t kv_heads = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : cfg.n_heads;
  if (kv_heads != cfg.n_heads) {
    out.push_back(absl::StrCat("grouped key/value heads (model.n_kv_heads = ", kv_heads, " for ", cfg.n_heads,
                               " heads)"));
  }
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
std::string gpt2_config(const ModelConfig& cfg, int64_t n_positions, int64_t d_ff, const HfExportSource& source) {
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
      {"tie_word_embeddings", cfg.tie_embeddings ? "true" : "false"},
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

absl::StatusOr<HfExport> gpt2_export(const Decoder& decoder, LanguageModel& model, const std::string& where,
                                     const HfExportSource& source) {
  const ModelConfig& cfg = decoder.config();
  const std::vector<std::string> mismatches = gpt2_mismatches(cfg);
  if (!mismatches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": transformers' GPT2LMHeadModel cannot hold this model: ", absl::StrJoin(mismatches, ", "),
        "; GPT-2 is causal softmax attention with a GELU MLP in every pre-norm block, LayerNorm, biases, learned "
        "positions and full key/value heads"));
  }
  const HfMapping mapping = gpt2_mapping(cfg);
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> tensors =
      mapped_tensors(model, mapping, cfg.blocks.size(), where);
  if (!tensors.ok()) return tensors.status();
  HfExport e;
  e.architecture = mapping.architecture;
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
  if (const auto* decoder = dynamic_cast<const Decoder*>(&model)) return gpt2_export(*decoder, model, where, source);
  // The encoder's and the encoder-decoder's tables are designed above, not written yet.
  const char* planned = dynamic_cast<const Encoder*>(&model)          ? "BertForMaskedLM"
                        : dynamic_cast<const EncoderDecoder*>(&model) ? "T5ForConditionalGeneration"
                                                                      : "";
  return absl::InvalidArgumentError(absl::StrCat(where, ": model.arch = \"", recipe.model.arch,
                                                 "\" has no transformers export yet",
                                                 *planned ? absl::StrCat(" (", planned, "'s mapping is not written)") : "",
                                                 "; only decoders export, as GPT2LMHeadModel"));
}

}  // namespace seqlab
