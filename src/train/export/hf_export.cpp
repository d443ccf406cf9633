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
// "{i}" in both names stands for a block's index (the entry then applies to every block of its stack).
// A seqlab parameter may have several entries (BERT's untied output bias is stored twice, see below);
// every transformers name has one.

enum class Layout {
  same,        // the same [rows, cols] row-major: embeddings, norms, biases, nn.Linear weights [out, in]
  transposed,  // GPT-2's Conv1D keeps its weight as [in, out] (y = x W + b): seqlab's Linear [out, in]ᵀ
  rows,        // rows [part·n, (part+1)·n) of a fused projection's weight [parts·n, in] (or bias [parts·n]):
               // seqlab's qkv = [q | k | v] and cross attention's kv = [k | v], split into nn.Linear's
};

struct TensorMapping {
  std::string seqlab;
  std::string hf;
  Layout layout = Layout::same;
  int part = 0, parts = 1;  // Layout::rows only
};

// The entries of one stack's blocks: `count` blocks, {i} = 0 … count − 1.
struct BlockTable {
  std::vector<TensorMapping> entries;
  size_t count = 0;
};

struct HfMapping {
  const char* architecture;
  std::vector<TensorMapping> model;  // once per model
  std::vector<BlockTable> stacks;    // once per block of each stack
  // seqlab parameters the class has no place for, left out on purpose (BERT's next-sentence head in
  // BertForMaskedLM); every other parameter must be mapped.
  std::vector<std::string> omitted;
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
      {{{
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
        cfg.blocks.size()}},
      {},
  };
  if (!cfg.tie_embeddings) m.model.push_back({"lm_head.weight", "lm_head.weight", Layout::same});
  return m;
}

// The weight and the bias of a seqlab Linear under one nn.Linear's name (the bias only with model.bias).
void add_linear(std::vector<TensorMapping>& out, const std::string& seqlab, const std::string& hf, bool bias,
                Layout layout = Layout::same, int part = 0, int parts = 1) {
  out.push_back({seqlab + ".weight", hf + ".weight", layout, part, parts});
  if (bias) out.push_back({seqlab + ".bias", hf + ".bias", layout, part, parts});
}

// BertForMaskedLM (transformers' modeling_bert.py). BERT's block is post-norm as seqlab's with
// model.norm_placement = "post":
//   x = LayerNorm(word + token_type + position),  then per layer
//   h = attention.output.LayerNorm(x + attention.output.dense(attn(query x, key x, value x)))
//   y = output.LayerNorm(h + output.dense(act(intermediate.dense h)))
//   logits = decoder(transform.LayerNorm(act(transform.dense y)))
// with query, key and value each H heads of C / H features: the rows [0, C), [C, 2C), [2C, 3C) of
// seqlab's fused qkv (weights and biases), whose output is split the same way. Scores are scaled by
// 1/√(C/H), seqlab's default. The output layer cls.predictions.decoder is tied to the word embeddings
// (tie_word_embeddings: not stored) and its bias to cls.predictions.bias (head.bias), as transformers
// 5.x ties them (BertForMaskedLM._tied_weights_keys). Untied (tie_word_embeddings false), transformers
// ties neither — the bias it adds is then cls.predictions.decoder.bias —, so head.bias is stored under
// both names and lm_head under cls.predictions.decoder.weight, as its own save_pretrained writes an
// untied model. BertForMaskedLM has no pooler and no next-sentence classifier: seqlab's pooler.* and
// nsp.* (data.next_sentence) are left out.
HfMapping bert_mapping(const ModelConfig& cfg) {
  HfMapping m{"BertForMaskedLM", {}, {}, {}};
  m.model = {
      {"wte.weight", "bert.embeddings.word_embeddings.weight"},
      {"wpe.weight", "bert.embeddings.position_embeddings.weight"},
      {"norm_in.weight", "bert.embeddings.LayerNorm.weight"},
      {"norm_in.bias", "bert.embeddings.LayerNorm.bias"},
      {"head.dense.weight", "cls.predictions.transform.dense.weight"},
      {"head.dense.bias", "cls.predictions.transform.dense.bias"},
      {"head.norm.weight", "cls.predictions.transform.LayerNorm.weight"},
      {"head.norm.bias", "cls.predictions.transform.LayerNorm.bias"},
      {"head.bias", "cls.predictions.bias"},
  };
  // Without segments seqlab adds no token-type embedding, BERT always adds row 0 of its table: one row
  // of zeros is added by bert_export, not mapped.
  if (cfg.segments > 0) m.model.push_back({"segment.weight", "bert.embeddings.token_type_embeddings.weight"});
  if (!cfg.tie_embeddings) {
    m.model.push_back({"lm_head.weight", "cls.predictions.decoder.weight"});
    m.model.push_back({"head.bias", "cls.predictions.decoder.bias"});
  }
  BlockTable blocks;
  blocks.count = cfg.blocks.size();
  const std::string layer = "bert.encoder.layer.{i}.";
  const char* qkv[] = {"query", "key", "value"};
  for (int part = 0; part < 3; ++part) {
    add_linear(blocks.entries, "blocks.{i}.mixer.qkv", layer + "attention.self." + qkv[part], true, Layout::rows,
               part, 3);
  }
  add_linear(blocks.entries, "blocks.{i}.mixer.proj", layer + "attention.output.dense", true);
  add_linear(blocks.entries, "blocks.{i}.norm1", layer + "attention.output.LayerNorm", true);
  add_linear(blocks.entries, "blocks.{i}.mlp.fc", layer + "intermediate.dense", true);
  add_linear(blocks.entries, "blocks.{i}.mlp.proj", layer + "output.dense", true);
  add_linear(blocks.entries, "blocks.{i}.norm2", layer + "output.LayerNorm", true);
  m.stacks.push_back(std::move(blocks));
  if (cfg.next_sentence) m.omitted = {"pooler.weight", "pooler.bias", "nsp.weight", "nsp.bias"};
  return m;
}

// T5ForConditionalGeneration (transformers' modeling_t5.py). T5's block is pre-norm as seqlab's, with
// RMSNorm (T5LayerNorm: x / √(mean(x²) + ε) · g), no biases and unscaled scores:
//   encoder block:  x += SelfAttention(layer.0.layer_norm x) (+ the stack's relative bias)
//                   x += DenseReluDense(layer.1.layer_norm x)
//   decoder block:  x += SelfAttention(layer.0.layer_norm x) (causal, + the decoder's relative bias)
//                   x += EncDecAttention(layer.1.layer_norm x, encoder output)
//                   x += DenseReluDense(layer.2.layer_norm x)
//   each stack ends in final_layer_norm; logits = lm_head(y · d_model^−½) tied, lm_head(y) untied.
// q, k, v are the rows of seqlab's qkv ([q | k | v]); EncDecAttention's k, v the rows of cross.kv
// ([k | v]). The FFN: wi, wo for relu (proj(relu(fc x))); wi_0, wi_1, wo for gated-gelu
// (wo(gelu_new(wi_0 x) ⊙ wi_1 x) = seqlab's GEGLU proj(gelu(fc x) ⊙ gate x)). Each stack's relative
// bias table [buckets, H] belongs to its block 0's SelfAttention (has_relative_attention_bias), which
// the other blocks reuse as seqlab's stack shares its table. shared is the embedding of both stacks
// (their embed_tokens are tied to it and not stored); lm_head is tied to it too, except with
// tie_word_embeddings false (T5 v1.1), when lm_head is stored (see t5_config).
// The FFN kind of every block of both stacks (t5_mismatches refuses a model with two kinds).
FfnKind t5_ffn(const ModelConfig& cfg) { return cfg.blocks.empty() ? FfnKind::relu : cfg.blocks.front().ffn; }

HfMapping t5_mapping(const ModelConfig& cfg) {
  HfMapping m{"T5ForConditionalGeneration", {}, {}, {}};
  m.model = {
      {"wte.weight", "shared.weight"},
      {"encoder.relative_bias.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"},
      {"encoder.norm_f.weight", "encoder.final_layer_norm.weight"},
      {"decoder.relative_bias.weight", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"},
      {"decoder.norm_f.weight", "decoder.final_layer_norm.weight"},
  };
  if (!cfg.tie_embeddings) m.model.push_back({"lm_head.weight", "lm_head.weight"});
  // The FFN's entries under `layer` (layer.1 in the encoder, layer.2 in the decoder).
  auto add_ffn = [&](std::vector<TensorMapping>& out, const std::string& seqlab, const std::string& layer,
                     FfnKind kind) {
    out.push_back({seqlab + "norm2.weight", layer + "layer_norm.weight"});
    if (kind == FfnKind::geglu) {
      out.push_back({seqlab + "mlp.fc.weight", layer + "DenseReluDense.wi_0.weight"});
      out.push_back({seqlab + "mlp.gate.weight", layer + "DenseReluDense.wi_1.weight"});
    } else {
      out.push_back({seqlab + "mlp.fc.weight", layer + "DenseReluDense.wi.weight"});
    }
    out.push_back({seqlab + "mlp.proj.weight", layer + "DenseReluDense.wo.weight"});
  };
  auto add_self = [&](std::vector<TensorMapping>& out, const std::string& seqlab, const std::string& hf) {
    out.push_back({seqlab + "norm1.weight", hf + "layer.0.layer_norm.weight"});
    const char* qkv[] = {"q", "k", "v"};
    for (int part = 0; part < 3; ++part) {
      out.push_back({seqlab + "mixer.qkv.weight", hf + "layer.0.SelfAttention." + qkv[part] + ".weight", Layout::rows,
                     part, 3});
    }
    out.push_back({seqlab + "mixer.proj.weight", hf + "layer.0.SelfAttention.o.weight"});
  };
  BlockTable encoder, decoder;
  encoder.count = cfg.blocks.size();
  add_self(encoder.entries, "encoder.blocks.{i}.", "encoder.block.{i}.");
  add_ffn(encoder.entries, "encoder.blocks.{i}.", "encoder.block.{i}.layer.1.", t5_ffn(cfg));
  decoder.count = cfg.decoder_blocks.size();
  add_self(decoder.entries, "decoder.blocks.{i}.", "decoder.block.{i}.");
  const std::string cross = "decoder.block.{i}.layer.1.";
  decoder.entries.push_back({"decoder.blocks.{i}.cross_norm.weight", cross + "layer_norm.weight"});
  decoder.entries.push_back({"decoder.blocks.{i}.cross.q.weight", cross + "EncDecAttention.q.weight"});
  decoder.entries.push_back({"decoder.blocks.{i}.cross.kv.weight", cross + "EncDecAttention.k.weight", Layout::rows, 0, 2});
  decoder.entries.push_back({"decoder.blocks.{i}.cross.kv.weight", cross + "EncDecAttention.v.weight", Layout::rows, 1, 2});
  decoder.entries.push_back({"decoder.blocks.{i}.cross.proj.weight", cross + "EncDecAttention.o.weight"});
  add_ffn(decoder.entries, "decoder.blocks.{i}.", "decoder.block.{i}.layer.2.", t5_ffn(cfg));
  m.stacks.push_back(std::move(encoder));
  m.stacks.push_back(std::move(decoder));
  return m;
}

// ------------------------------------------------------------------------------------------------
// What a class cannot hold.

// "block 2", "blocks 0-3", "blocks 0, 2, 5-7" (with `stack`: "encoder block 2", ...).
std::string block_list(const std::vector<size_t>& blocks, const std::string& stack = "") {
  std::vector<std::string> parts;
  for (size_t k = 0; k < blocks.size();) {
    size_t end = k;
    while (end + 1 < blocks.size() && blocks[end + 1] == blocks[end] + 1) ++end;
    parts.push_back(end == k ? absl::StrCat(blocks[k]) : absl::StrCat(blocks[k], "-", blocks[end]));
    k = end + 1;
  }
  return absl::StrCat(stack.empty() ? "" : stack + " ", blocks.size() == 1 ? "block " : "blocks ",
                      absl::StrJoin(parts, ", "));
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

// An FFN kind as a refusal names it.
const char* ffn_refusal(FfnKind kind) {
  switch (kind) {
    case FfnKind::swiglu: return "SwiGLU FFNs";
    case FfnKind::geglu: return "GEGLU FFNs";
    case FfnKind::relu: return "ReLU FFNs";
    case FfnKind::none: return "no FFN";
    case FfnKind::gelu: return "GELU MLPs";
    case FfnKind::moe: return "mixture-of-experts FFNs";
  }
  return "";
}

// A position kind as a refusal names it, with its recipe key.
const char* positions_refusal(PositionKind kind) {
  switch (kind) {
    case PositionKind::learned: return "learned positions (model.positions = \"learned\")";
    case PositionKind::rope: return "rotary positions (model.positions = \"rope\")";
    case PositionKind::sinusoidal: return "sinusoidal positions (model.positions = \"sinusoidal\")";
    case PositionKind::relative: return "a relative position bias (model.positions = \"relative\")";
    case PositionKind::none: return "no position embedding (model.positions = \"none\")";
  }
  return "";
}

// What a transformers class's block is made of, for the mismatches below.
struct ClassNeeds {
  const char* name;              // as the messages name the class: "GPT-2", "BERT", "T5"
  std::set<FfnKind> ffns;        // the FFNs it has
  PositionKind positions;
  NormKind norm;
  NormPlacement placement;
  bool bias;
  // [model.attention] options whose value must differ from their default, with that value; every other
  // option must keep its default.
  std::map<std::string, double> attention;
};

// One stack's blocks, as the mismatches name them ("" for a model of one stack).
struct StackBlocks {
  std::string name;
  const std::vector<BlockSpec>* blocks;
};

// What of `cfg` the class `needs` describes has no counterpart for, each with the recipe key that chose
// it: mixers other than attention and FFNs the class lacks (each with its blocks, in the order they first
// appear), positions, norm, its placement, biases, grouped key/value heads, attention's options.
std::vector<std::string> mismatches(const ModelConfig& cfg, const std::vector<StackBlocks>& stacks,
                                    const ClassNeeds& needs) {
  std::vector<std::string> out;
  for (const StackBlocks& stack : stacks) {
    std::vector<std::string> mixers;
    std::map<std::string, std::vector<size_t>> mixer_blocks;
    std::vector<FfnKind> ffns;
    std::map<FfnKind, std::vector<size_t>> ffn_blocks;
    for (size_t i = 0; i < stack.blocks->size(); ++i) {
      const MixerSpec& spec = mixer_spec((*stack.blocks)[i].mixer);
      if (spec.name != "attention") {
        if (!mixer_blocks.count(spec.name)) mixers.push_back(spec.name);
        mixer_blocks[spec.name].push_back(i);
      }
      const FfnKind ffn = (*stack.blocks)[i].ffn;
      if (!needs.ffns.count(ffn)) {
        if (!ffn_blocks.count(ffn)) ffns.push_back(ffn);
        ffn_blocks[ffn].push_back(i);
      }
    }
    for (const std::string& m : mixers) {
      out.push_back(absl::StrCat(mixer_spec(m).traits.recurrent ? "the recurrent mixer '" : "the mixer '", m, "' in ",
                                 block_list(mixer_blocks[m], stack.name), " (model.mixer, model.pattern)"));
    }
    for (FfnKind f : ffns) {
      out.push_back(
          absl::StrCat(ffn_refusal(f), " in ", block_list(ffn_blocks[f], stack.name), " (model.mlp, model.pattern)"));
    }
  }
  if (cfg.shared_attention_every > 0) {
    out.push_back(absl::StrCat("a shared attention block after every ", cfg.shared_attention_every,
                               " blocks (model.shared_attention_every)"));
  }
  if (cfg.positions != needs.positions) out.push_back(positions_refusal(cfg.positions));
  if (cfg.norm != needs.norm) {
    out.push_back(cfg.norm == NormKind::rms_norm ? "RMSNorm (model.norm = \"rmsnorm\")"
                                                 : "LayerNorm (model.norm = \"layernorm\")");
  }
  if (cfg.norm_placement != needs.placement) {
    out.push_back(cfg.norm_placement == NormPlacement::post ? "post-norm blocks (model.norm_placement = \"post\")"
                                                            : "pre-norm blocks (model.norm_placement = \"pre\")");
  }
  if (cfg.bias != needs.bias) out.push_back(cfg.bias ? "biases (model.bias = true)" : "no biases (model.bias = false)");
  const int64_t kv_heads = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : cfg.n_heads;
  if (kv_heads != cfg.n_heads) {
    out.push_back(absl::StrCat("grouped key/value heads (model.n_kv_heads = ", kv_heads, " for ", cfg.n_heads,
                               " heads)"));
  }
  // Attention's own options ([model.attention] scale, and any it gains later): the class has their
  // defaults only, except those it names.
  const MixerSpec& attention = mixer_spec("attention");
  const MixerOptions options = options_of(cfg, attention);
  MixerOptions wanted(attention.options);
  for (const auto& [key, value] : needs.attention) wanted.set(key, value);
  for (const OptionSpec& o : attention.options) {
    const std::string value = option_text(options, o), fallback = option_text(wanted, o);
    if (value == fallback) continue;
    out.push_back(needs.attention.count(o.key)
                      ? absl::StrCat("model.attention.", o.key, " = ", value, " (", needs.name, " has only ", fallback, ")")
                      : absl::StrCat("model.attention.", o.key, " = ", value, " (", needs.name,
                                     " has only its default, ", fallback, ")"));
  }
  return out;
}

// GPT-2: causal softmax attention with a GELU MLP in every pre-norm block, LayerNorm, biases, learned
// positions and full key/value heads.
std::vector<std::string> gpt2_mismatches(const ModelConfig& cfg) {
  return mismatches(cfg, {{"", &cfg.blocks}},
                    {"GPT-2", {FfnKind::gelu}, PositionKind::learned, NormKind::layer_norm, NormPlacement::pre, true, {}});
}

// BERT: the same block post-norm, bidirectional.
std::vector<std::string> bert_mismatches(const ModelConfig& cfg) {
  return mismatches(cfg, {{"", &cfg.blocks}},
                    {"BERT", {FfnKind::gelu}, PositionKind::learned, NormKind::layer_norm, NormPlacement::post, true, {}});
}

// T5: pre-norm RMSNorm, no biases, relative positions, unscaled scores, and one FFN kind for both stacks
// (config.json's feed_forward_proj): relu, or GEGLU (gated-gelu).
std::vector<std::string> t5_mismatches(const ModelConfig& cfg) {
  std::vector<std::string> out =
      mismatches(cfg, {{"encoder", &cfg.blocks}, {"decoder", &cfg.decoder_blocks}},
                 {"T5", {FfnKind::relu, FfnKind::geglu}, PositionKind::relative, NormKind::rms_norm, NormPlacement::pre,
                  false, {{"scale", 1.0}}});
  std::map<FfnKind, std::vector<std::string>> kinds;  // relu and geglu, where they are
  for (const auto& [name, blocks] : {std::pair{"encoder", &cfg.blocks}, std::pair{"decoder", &cfg.decoder_blocks}}) {
    std::map<FfnKind, std::vector<size_t>> where;
    for (size_t i = 0; i < blocks->size(); ++i) {
      const FfnKind f = (*blocks)[i].ffn;
      if (f == FfnKind::relu || f == FfnKind::geglu) where[f].push_back(i);
    }
    for (const auto& [f, list] : where) kinds[f].push_back(block_list(list, name));
  }
  if (kinds.size() > 1) {
    out.push_back(absl::StrCat("ReLU FFNs in ", absl::StrJoin(kinds[FfnKind::relu], " and "), " beside GEGLU FFNs in ",
                               absl::StrJoin(kinds[FfnKind::geglu], " and "),
                               " (model.mlp, model.pattern: T5 has one feed_forward_proj)"));
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// config.json

// The elements of config.json, in the order written: each value is JSON text.
using JsonFields = std::vector<std::pair<std::string, std::string>>;

std::string json_object(const JsonFields& fields) {
  std::vector<std::string> lines;
  for (const auto& [key, value] : fields) lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  return "{\n" + absl::StrJoin(lines, ",\n") + "\n}\n";
}

std::string json_id(const std::optional<int32_t>& id) { return id ? absl::StrCat(*id) : "null"; }

// The width of the FFNs, as Block sizes it.
int64_t d_ff_of(const ModelConfig& cfg, FfnKind kind) { return cfg.d_ff > 0 ? cfg.d_ff : ffn_d_ff(kind, cfg.d_model); }

// GPT2Config (transformers' configuration_gpt2.py). seqlab's GELU is the tanh form (ops_elementwise.cpp):
// "gelu_new". Dropout: seqlab drops the embeddings' sum, the attention output and the MLP output, as
// embd_pdrop and resid_pdrop do; it never drops attention probabilities (attn_pdrop = 0).
std::string gpt2_config(const ModelConfig& cfg, int64_t n_positions, int64_t d_ff, const HfExportSource& source) {
  const std::string eot = json_id(source.eot);
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

// BertConfig (transformers' configuration_bert.py). hidden_act "gelu_new": seqlab's tanh GELU (BERT's
// "gelu" is erf's), in the FFN and the masked-LM head's transform alike. Dropout: seqlab drops the
// embeddings after their norm and each branch before its add, as hidden_dropout_prob does; no attention
// probabilities (attention_probs_dropout_prob = 0). type_vocab_size: model.segments, or 1 (a row of
// zeros) without segments.
std::string bert_config(const ModelConfig& cfg, const HfExportSource& source) {
  return json_object({
      {"architectures", "[\"BertForMaskedLM\"]"},
      {"model_type", "\"bert\""},
      {"vocab_size", absl::StrCat(cfg.vocab_size)},
      {"hidden_size", absl::StrCat(cfg.d_model)},
      {"num_hidden_layers", absl::StrCat(cfg.blocks.size())},
      {"num_attention_heads", absl::StrCat(cfg.n_heads)},
      {"intermediate_size", absl::StrCat(d_ff_of(cfg, FfnKind::gelu))},
      {"hidden_act", "\"gelu_new\""},
      {"hidden_dropout_prob", toml_number(cfg.dropout)},
      {"attention_probs_dropout_prob", "0.0"},
      {"max_position_embeddings", absl::StrCat(cfg.max_seq_len)},
      {"type_vocab_size", absl::StrCat(cfg.segments > 0 ? cfg.segments : 1)},
      {"initializer_range", toml_number(cfg.init_std)},
      {"layer_norm_eps", toml_number(cfg.norm_eps)},
      {"pad_token_id", json_id(source.pad)},
      {"is_decoder", "false"},
      {"tie_word_embeddings", cfg.tie_embeddings ? "true" : "false"},
      {"dtype", "\"float32\""},
  });
}

// T5Config (transformers' configuration_t5.py). feed_forward_proj "gated-gelu" makes transformers' act
// gelu_new, seqlab's tanh GELU. d_kv = d_model / n_heads. decoder_start_token_id = pad_token_id = [PAD]
// (seqlab's span-corruption decoder inputs start with it), eos_token_id = [EOS]. tie_word_embeddings
// false (T5 v1.1): transformers 5.x's T5Config reads it as "do not scale the decoder's output by
// d_model^−½" (scale_decoder_outputs) and keeps tie_word_embeddings true, and from_pretrained leaves
// lm_head untied because the file stores it with values other than shared's (tie_weights keeps both
// when both are present and differ). dropout_rate: seqlab's dropout (it drops the embeddings and each
// branch before its add; T5 also drops inside the FFN, attention probabilities and after the final
// norm, which only matters when training in transformers).
std::string t5_config(const ModelConfig& cfg, const HfExportSource& source) {
  const FfnKind ffn = t5_ffn(cfg);
  return json_object({
      {"architectures", "[\"T5ForConditionalGeneration\"]"},
      {"model_type", "\"t5\""},
      {"vocab_size", absl::StrCat(cfg.vocab_size)},
      {"d_model", absl::StrCat(cfg.d_model)},
      {"d_kv", absl::StrCat(cfg.d_model / cfg.n_heads)},
      {"d_ff", absl::StrCat(d_ff_of(cfg, ffn))},
      {"num_layers", absl::StrCat(cfg.blocks.size())},
      {"num_decoder_layers", absl::StrCat(cfg.decoder_blocks.size())},
      {"num_heads", absl::StrCat(cfg.n_heads)},
      {"relative_attention_num_buckets", absl::StrCat(cfg.relative_buckets)},
      {"relative_attention_max_distance", absl::StrCat(cfg.relative_max_distance)},
      {"dropout_rate", toml_number(cfg.dropout)},
      {"layer_norm_epsilon", toml_number(cfg.norm_eps)},
      {"feed_forward_proj", ffn == FfnKind::geglu ? "\"gated-gelu\"" : "\"relu\""},
      {"is_encoder_decoder", "true"},
      {"tie_word_embeddings", cfg.tie_embeddings ? "true" : "false"},
      {"pad_token_id", json_id(source.pad)},
      {"decoder_start_token_id", json_id(source.pad)},
      {"eos_token_id", json_id(source.eos)},
      {"use_cache", "true"},
      {"dtype", "\"float32\""},
  });
}

// ------------------------------------------------------------------------------------------------

// The tensors of `model` under the names of `mapping`, in their layouts: every parameter mapped or
// omitted on purpose, every entry of the table used (for each block of its stack), else InvalidArgument
// naming what is left over.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> mapped_tensors(LanguageModel& model,
                                                                           const HfMapping& mapping,
                                                                           const std::string& where) {
  struct Target {
    std::string hf;
    Layout layout;
    int part, parts;
  };
  std::map<std::string, std::vector<Target>> by_seqlab;
  for (const TensorMapping& m : mapping.model) by_seqlab[m.seqlab].push_back({m.hf, m.layout, m.part, m.parts});
  for (const BlockTable& stack : mapping.stacks) {
    for (size_t i = 0; i < stack.count; ++i) {
      const std::string index = absl::StrCat(i);
      for (const TensorMapping& m : stack.entries) {
        by_seqlab[absl::StrReplaceAll(m.seqlab, {{"{i}", index}})].push_back(
            {absl::StrReplaceAll(m.hf, {{"{i}", index}}), m.layout, m.part, m.parts});
      }
    }
  }
  const std::set<std::string> omitted(mapping.omitted.begin(), mapping.omitted.end());
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> used;
  for (const Parameter& p : model.parameters()) {
    if (omitted.count(p.name)) {
      used.insert(p.name);
      continue;
    }
    auto it = by_seqlab.find(p.name);
    if (it == by_seqlab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the model's parameter ", p.name, " has no counterpart in ",
                                                     mapping.architecture));
    }
    used.insert(p.name);
    // f32 on the CPU, whatever the model's device and dtype.
    const Tensor t = kernel::to_dtype(kernel::to_device(*p.tensor, cpu_device()), DType::f32);
    for (const Target& target : it->second) {
      Tensor v = t;
      if (target.layout == Layout::transposed) v = kernel::transpose(t, 0, 1);
      if (target.layout == Layout::rows) {
        const int64_t rows = t.shape()[0];
        if (rows % target.parts != 0) {
          throw std::logic_error(absl::StrCat("hf_export: ", p.name, " has ", rows, " rows, not ", target.parts,
                                              " equal parts for ", target.hf));
        }
        const int64_t n = rows / target.parts;
        v = kernel::narrow(t, 0, target.part * n, n);
      }
      out.emplace_back(target.hf, kernel::contiguous(v));
    }
  }
  for (const auto& [name, target] : by_seqlab) {
    if (!used.count(name)) {
      // The table and the model disagree: the checks of the mismatches should have refused the model.
      throw std::logic_error(absl::StrCat("hf_export: ", mapping.architecture, "'s table maps ", name,
                                          ", which the model lacks"));
    }
  }
  for (const std::string& name : omitted) {
    if (!used.count(name)) {
      throw std::logic_error(absl::StrCat("hf_export: ", mapping.architecture, "'s table leaves out ", name,
                                          ", which the model lacks"));
    }
  }
  return out;
}

std::map<std::string, std::string> export_metadata(const HfExportSource& source) {
  return {{"format", "pt"},
          {"seqlab_run_id", source.run_id},
          {"seqlab_checkpoint", source.checkpoint},
          {"seqlab_step", absl::StrCat(source.step)}};
}

// The refusal of a model `architecture` cannot hold: one line naming each mismatch, then what the class is.
absl::Status refusal(const std::string& where, const char* architecture, const std::vector<std::string>& mismatches,
                     const char* what_it_is) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": transformers' ", architecture,
                                                 " cannot hold this model: ", absl::StrJoin(mismatches, ", "), "; ",
                                                 what_it_is));
}

absl::StatusOr<HfExport> gpt2_export(const Decoder& decoder, LanguageModel& model, const std::string& where,
                                     const HfExportSource& source) {
  const ModelConfig& cfg = decoder.config();
  const std::vector<std::string> mismatches = gpt2_mismatches(cfg);
  if (!mismatches.empty()) {
    return refusal(where, "GPT2LMHeadModel", mismatches,
                   "GPT-2 is causal softmax attention with a GELU MLP in every pre-norm block, LayerNorm, biases, "
                   "learned positions and full key/value heads");
  }
  const HfMapping mapping = gpt2_mapping(cfg);
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> tensors = mapped_tensors(model, mapping, where);
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
  e.metadata = export_metadata(source);
  return e;
}

absl::StatusOr<HfExport> bert_export(const Encoder& encoder, LanguageModel& model, const std::string& where,
                                     const HfExportSource& source) {
  const ModelConfig& cfg = encoder.config();
  const std::vector<std::string> mismatches = bert_mismatches(cfg);
  if (!mismatches.empty()) {
    return refusal(where, "BertForMaskedLM", mismatches,
                   "BERT is bidirectional softmax attention with a GELU MLP in every post-norm block, LayerNorm, "
                   "biases, learned positions and full key/value heads");
  }
  const HfMapping mapping = bert_mapping(cfg);
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> tensors = mapped_tensors(model, mapping, where);
  if (!tensors.ok()) return tensors.status();
  HfExport e;
  e.architecture = mapping.architecture;
  e.config_json = bert_config(cfg, source);
  e.tensors = *std::move(tensors);
  if (cfg.segments == 0) {
    // BERT adds token_type_embeddings[0] to every token; seqlab without segments adds nothing.
    e.tensors.emplace_back("bert.embeddings.token_type_embeddings.weight", Tensor::zeros({1, cfg.d_model}));
  }
  e.metadata = export_metadata(source);
  return e;
}

absl::StatusOr<HfExport> t5_export(const EncoderDecoder& t5, LanguageModel& model, const std::string& where,
                                   const HfExportSource& source) {
  const ModelConfig& cfg = t5.config();
  const std::vector<std::string> mismatches = t5_mismatches(cfg);
  if (!mismatches.empty()) {
    return refusal(where, "T5ForConditionalGeneration", mismatches,
                   "T5 is softmax attention with unscaled scores ([model.attention] scale = 1) and a ReLU or GEGLU "
                   "FFN in every pre-norm block, RMSNorm, no biases, a relative position bias and full key/value "
                   "heads");
  }
  const HfMapping mapping = t5_mapping(cfg);
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> tensors = mapped_tensors(model, mapping, where);
  if (!tensors.ok()) return tensors.status();
  HfExport e;
  e.architecture = mapping.architecture;
  e.config_json = t5_config(cfg, source);
  e.tensors = *std::move(tensors);
  e.metadata = export_metadata(source);
  return e;
}

}  // namespace

absl::StatusOr<HfExport> hf_export(const Recipe& recipe, LanguageModel& model, const HfExportSource& source) {
  const std::string where = recipe.source_path.empty() ? recipe.name : recipe.source_path;
  if (const auto* decoder = dynamic_cast<const Decoder*>(&model)) return gpt2_export(*decoder, model, where, source);
  if (const auto* encoder = dynamic_cast<const Encoder*>(&model)) return bert_export(*encoder, model, where, source);
  if (const auto* t5 = dynamic_cast<const EncoderDecoder*>(&model)) return t5_export(*t5, model, where, source);
  return absl::InvalidArgumentError(absl::StrCat(where, ": model.arch = \"", recipe.model.arch,
                                                 "\" has no transformers export"));
}

}  // namespace seqlab
