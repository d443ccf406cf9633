// Recipe loading and validation. The schema below is the only place a key is named: its section,
// type, default, allowed values, doc and the struct member that stores it. Loading, the resolved
// recipe and docs/recipes.md all walk it, so they cannot disagree with one another.
#include "train/recipe/recipe.h"
#include "train/recipe/blocks.h"
#include "train/recipe/edit_distance.h"
#include "train/common/atomic_file.h"
#include "train/data/masked_lm.h"
#include "train/data/span_corruption.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace seqlab {
namespace {

namespace fs = std::filesystem;

// kSwitch: true, false, or the string "auto" (held as a bool or as the string in a Value).
// kIntegerList: a TOML array of integers, each within the key's bounds (one integer reads as a list of one).
enum class KeyType { kInteger, kNumber, kBoolean, kString, kSwitch, kIntegerList };
using IntegerList = std::vector<int64_t>;
// A key's value; the alternative held always matches the key's KeyType. The first four are a mixer
// option's OptionValue (layers/mixer.h); lists exist only in the recipe's own sections.
using Value = std::variant<int64_t, double, bool, std::string, IntegerList>;

Value from_option(const OptionValue& v) {
  return std::visit([](const auto& x) { return Value(x); }, v);
}
OptionValue to_option(const Value& v) {
  return std::visit(
      [](const auto& x) -> OptionValue {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, IntegerList>) {
          throw std::logic_error("recipe: a mixer option cannot hold a list");
        } else {
          return x;
        }
      },
      v);
}

// The interval allowed for an integer or number key; an open end excludes its bound.
struct Bounds {
  double lo = -HUGE_VAL, hi = HUGE_VAL;
  bool lo_open = false, hi_open = false;
};
Bounds at_least(double lo) { return {lo, HUGE_VAL, false, false}; }
Bounds above(double lo) { return {lo, HUGE_VAL, true, false}; }
Bounds closed(double lo, double hi) { return {lo, hi, false, false}; }
Bounds closed_open(double lo, double hi) { return {lo, hi, false, true}; }
Bounds open_closed(double lo, double hi) { return {lo, hi, true, false}; }
Bounds open_open(double lo, double hi) { return {lo, hi, true, true}; }

struct KeySpec {
  std::string section, key;
  KeyType type;
  Value default_value;
  Bounds bounds;                     // integer and number keys; each element of an integer list
  std::vector<std::string> choices;  // string keys: the allowed values; empty: any text
  std::string doc;
  std::function<Value(const Recipe&)> get;
  std::function<void(Recipe&, const Value&)> set;
  // String keys: older values still accepted, each read as its canonical choice ("gpt" → "decoder").
  std::map<std::string, std::string> value_aliases;
  // An older spelling of other keys (model.chunk_size for [model.<mixer>] chunk_size): accepted and
  // documented as such, never written into a resolved recipe.
  bool older_spelling = false;

  std::string name() const { return section + "." + key; }
};

struct SectionSpec {
  std::string name, doc;
  std::string mixer;                 // [model.<mixer>]: the mixer whose options it holds
  std::vector<std::string> aliases;  // older names of the section ([model.retnet])
  std::string ffn;                   // [model.moe]: the FFN kind whose options it holds
};

// A rule between keys. `keys` are the keys it involves; an error points at the first of them that
// the recipe sets. `violation` returns "" when the rule holds, else the message.
struct CrossCheck {
  std::string rule;  // for the docs
  std::vector<std::string> keys;
  std::function<std::string(const Recipe&)> violation;
};

struct Schema {
  std::vector<SectionSpec> sections;
  std::vector<KeySpec> keys;
  std::vector<CrossCheck> checks;
};

// Adds the keys of one section, storing each in a member of the section's struct.
template <class S>
class SectionBuilder {
 public:
  SectionBuilder(Schema& schema, const char* name, S Recipe::*section, const char* doc)
      : schema_(schema), name_(name), section_(section) {
    schema.sections.push_back({name, doc, "", {}, ""});
  }
  SectionBuilder& integer(const char* key, int64_t S::*field, int64_t def, Bounds bounds, const char* doc) {
    return add(key, KeyType::kInteger, field, def, bounds, {}, doc);
  }
  SectionBuilder& number(const char* key, double S::*field, double def, Bounds bounds, const char* doc) {
    return add(key, KeyType::kNumber, field, def, bounds, {}, doc);
  }
  SectionBuilder& boolean(const char* key, bool S::*field, bool def, const char* doc) {
    return add(key, KeyType::kBoolean, field, def, {}, {}, doc);
  }
  SectionBuilder& text(const char* key, std::string S::*field, std::string def, const char* doc) {
    return add(key, KeyType::kString, field, std::move(def), {}, {}, doc);
  }
  // A list of integers, each in `each`; empty by default.
  SectionBuilder& integer_list(const char* key, IntegerList S::*field, Bounds each, const char* doc) {
    return add(key, KeyType::kIntegerList, field, IntegerList(), each, {}, doc);
  }
  // The first choice is the default.
  SectionBuilder& choice(const char* key, std::string S::*field, std::vector<std::string> choices, const char* doc,
                         std::map<std::string, std::string> value_aliases = {}) {
    std::string def = choices.front();
    add(key, KeyType::kString, field, std::move(def), {}, std::move(choices), doc);
    schema_.keys.back().value_aliases = std::move(value_aliases);
    return *this;
  }
  // true, false or "auto" (the default), held as nullopt for "auto".
  SectionBuilder& switch_auto(const char* key, std::optional<bool> S::*field, const char* doc) {
    S Recipe::*section = section_;
    schema_.keys.push_back({name_, key, KeyType::kSwitch, Value(std::string("auto")), {}, {}, doc,
                            [section, field](const Recipe& r) {
                              const std::optional<bool>& v = (r.*section).*field;
                              return v ? Value(*v) : Value(std::string("auto"));
                            },
                            [section, field](Recipe& r, const Value& v) {
                              (r.*section).*field =
                                  std::holds_alternative<bool>(v) ? std::optional<bool>(std::get<bool>(v)) : std::nullopt;
                            },
                            {},
                            false});
    return *this;
  }

 private:
  template <class T>
  SectionBuilder& add(const char* key, KeyType type, T S::*field, T def, Bounds bounds,
                      std::vector<std::string> choices, const char* doc) {
    S Recipe::*section = section_;
    schema_.keys.push_back({name_, key, type, Value(std::move(def)), bounds, std::move(choices), doc,
                            [section, field](const Recipe& r) { return Value((r.*section).*field); },
                            [section, field](Recipe& r, const Value& v) { (r.*section).*field = std::get<T>(v); },
                            {},
                            false});
    return *this;
  }

  Schema& schema_;
  std::string name_;
  S Recipe::*section_;
};

// ---- the mixers' keys: [model.<mixer>] sub-tables from the mixer registry (layers/mixer.h) ----

// The options of `mixer` in a recipe, its spec's defaults until set.
MixerOptions& mixer_options(Recipe& r, const MixerSpec& mixer) {
  return r.model.mixers.try_emplace(mixer.name, MixerOptions(mixer.options)).first->second;
}

Value option_value(const Recipe& r, const MixerSpec& mixer, const std::string& key) {
  auto it = r.model.mixers.find(mixer.name);
  return from_option(it != r.model.mixers.end() ? it->second.values().at(key)
                                                : MixerOptions(mixer.options).values().at(key));
}

KeySpec option_key(const std::string& section, const OptionSpec& o) {
  KeySpec k;
  k.section = section;
  k.key = o.key;
  switch (o.type) {
    case OptionType::integer: k.type = KeyType::kInteger; break;
    case OptionType::number: k.type = KeyType::kNumber; break;
    case OptionType::boolean: k.type = KeyType::kBoolean; break;
    case OptionType::text: k.type = KeyType::kString; break;
  }
  k.default_value = from_option(o.default_value);
  k.bounds = {o.min, o.max, o.min_open, o.max_open};
  k.choices = o.choices;
  k.doc = o.doc;
  return k;
}

// The options that the separate GPT and recurrent models read from [model] before mixers had
// sub-tables; each now sets the option of that name in every mixer that has one.
const char* const kFlatMixerKeys[] = {"chunk_size", "gate_rank", "gate_temperature",
                                      "conv_size", "feature_map", "feature_count"};

void add_mixer_sections(Schema& s) {
  for (const MixerSpec* m : registered_mixers()) {
    if (m->options.empty()) continue;
    const std::string section = "model." + m->name;
    std::vector<std::string> aliases;
    for (const std::string& a : m->aliases) aliases.push_back("model." + a);
    s.sections.push_back({section,
                          absl::StrCat("Options of the ", m->name, " mixer (", m->summary, "; ", m->doc,
                                       "), read where a block uses it."),
                          m->name, aliases, ""});
    for (const OptionSpec& o : m->options) {
      KeySpec k = option_key(section, o);
      k.get = [m, key = o.key](const Recipe& r) { return option_value(r, *m, key); };
      k.set = [m, key = o.key](Recipe& r, const Value& v) { mixer_options(r, *m).set(key, to_option(v)); };
      s.keys.push_back(std::move(k));
    }
  }
  for (const char* flat : kFlatMixerKeys) {
    std::vector<const MixerSpec*> owners;
    const OptionSpec* first = nullptr;
    for (const MixerSpec* m : registered_mixers()) {
      for (const OptionSpec& o : m->options) {
        if (o.key != flat) continue;
        owners.push_back(m);
        if (first == nullptr) first = &o;
      }
    }
    if (first == nullptr) continue;
    KeySpec k = option_key("model", *first);
    std::vector<std::string> tables;
    for (const MixerSpec* m : owners) tables.push_back("[model." + m->name + "]");
    k.doc = absl::StrCat("older spelling of ", flat, " in ", absl::StrJoin(tables, ", "), ": sets it in each");
    k.older_spelling = true;
    k.get = [owner = owners.front(), key = std::string(flat)](const Recipe& r) { return option_value(r, *owner, key); };
    k.set = [owners, key = std::string(flat)](Recipe& r, const Value& v) {
      for (const MixerSpec* m : owners) mixer_options(r, *m).set(key, to_option(v));
      r.model.flat_mixer_keys = true;
    };
    s.keys.push_back(std::move(k));
  }
}

// [model.moe]: the mixture-of-experts FFN's keys, read where a block's FFN is moe.
template <class T>
KeySpec moe_key(const char* key, KeyType type, T RecipeMoe::*field, Value def, Bounds bounds,
                std::vector<std::string> choices, const char* doc) {
  KeySpec k;
  k.section = "model.moe";
  k.key = key;
  k.type = type;
  k.default_value = std::move(def);
  k.bounds = bounds;
  k.choices = std::move(choices);
  k.doc = doc;
  k.get = [field](const Recipe& r) { return Value(r.model.moe.*field); };
  k.set = [field](Recipe& r, const Value& v) { r.model.moe.*field = std::get<T>(v); };
  return k;
}

void add_moe_section(Schema& s) {
  s.sections.push_back({"model.moe",
                        "The mixture-of-experts FFN (model.mlp = \"moe\", or :moe after a mixer in model.pattern; "
                        "docs/hybrids.md), read where a block's FFN is moe.",
                        "", {}, "moe"});
  s.keys.push_back(moe_key("experts", KeyType::kInteger, &RecipeMoe::experts, Value(int64_t{8}), at_least(1), {},
                           "expert FFNs per MoE block"));
  s.keys.push_back(moe_key("top_k", KeyType::kInteger, &RecipeMoe::top_k, Value(int64_t{2}), at_least(1), {},
                           "experts each token is sent to (at most experts)"));
  s.keys.push_back(moe_key("capacity_factor", KeyType::kNumber, &RecipeMoe::capacity_factor, Value(1.25),
                           at_least(0), {},
                           "in training an expert takes at most ceil(capacity_factor · tokens · top_k / experts) "
                           "of a batch's assignments, the rest dropped (the residual carries them); 0: no limit"));
  s.keys.push_back(moe_key("expert", KeyType::kString, &RecipeMoe::expert, Value(std::string("swiglu")), {},
                           {"swiglu", "gelu", "relu", "geglu"}, "the FFN of every expert"));
  s.keys.push_back(moe_key("d_ff", KeyType::kInteger, &RecipeMoe::d_ff, Value(int64_t{0}), at_least(0), {},
                           "hidden width of each expert; 0: model.d_ff, else the expert FFN's default"));
  s.keys.push_back(moe_key("aux_loss_weight", KeyType::kNumber, &RecipeMoe::aux_loss_weight, Value(0.01),
                           at_least(0), {},
                           "weight of the load-balancing loss E · Σ_e f_e P_e (Switch) added to the objective; "
                           "logged as aux_loss"));
  s.keys.push_back(moe_key("router_weights", KeyType::kString, &RecipeMoe::router_weights,
                           Value(std::string("renormalized")), {}, {"renormalized", "softmax"},
                           "renormalized: the top_k probabilities divided by their sum (Mixtral); softmax: the "
                           "router's probabilities as they are (Switch, Jamba)"));
}

// The value of a key as a resolved recipe writes it, when that differs from the schema's default; ""
// when the key holds its default (a resolved recipe writes every key, so "set" cannot mean "written").
// Defined below with the schema.
std::string changed_value(const Recipe& r, const std::string& name);

// The rules of data.objective (docs/training.md, "Objectives").
void add_objective_checks(Schema& s) {
  // A key of one objective set in a recipe of another would be silently ignored.
  const std::pair<const char*, const char*> own_keys[] = {{"data.mask_fraction", "masked_lm"},
                                                          {"data.next_sentence", "masked_lm"},
                                                          {"data.noise_density", "span_corruption"},
                                                          {"data.mean_span_length", "span_corruption"}};
  for (const auto& [key, objective] : own_keys) {
    s.checks.push_back(
        {absl::StrCat(key, " is set only for data.objective = \"", objective, "\""),
         {key, "data.objective"},
         [key = std::string(key), objective = std::string(objective)](const Recipe& r) {
           if (r.data.objective == objective) return std::string();
           const std::string value = changed_value(r, key);
           if (value.empty()) return std::string();
           return absl::StrCat(key, " = ", value, " is read only for data.objective = \"", objective,
                               "\"; data.objective = \"", r.data.objective, "\" does not use it: leave it out");
         }});
  }
  s.checks.push_back(
      {"data.objective = \"masked_lm\" or \"span_corruption\" reads text: data.source = \"text\" or \"shards\"",
       {"data.objective", "data.source"},
       [](const Recipe& r) {
         if (r.data.objective == "lm" || r.data.source == "text" || r.data.source == "shards") return std::string();
         return absl::StrCat("data.objective = \"", r.data.objective,
                             "\" makes its rows from text (data.source = \"text\" or \"shards\"); data.source = \"",
                             r.data.source, "\" is a synthetic task with inputs and targets of its own");
       }});
  // The shortest row each objective can make: masked_lm's [CLS] A [SEP] B [SEP], span_corruption's
  // kept token, sentinel and [EOS].
  auto shortest = [](const Recipe& r) -> std::pair<int64_t, const char*> {
    if (r.data.objective == "masked_lm") return {kMaskedLmMinSeqLen, "[CLS] A [SEP] B [SEP] with a token each"};
    if (r.data.objective == "span_corruption") return {kSpanCorruptionMinSeqLen, "a kept token, a sentinel and [EOS]"};
    return {1, ""};
  };
  s.checks.push_back(
      {absl::StrCat("data.objective = \"masked_lm\" needs train.seq_len ≥ ", kMaskedLmMinSeqLen,
                    ", \"span_corruption\" ≥ ", kSpanCorruptionMinSeqLen, "; each eval.seq_len too"),
       {"train.seq_len", "eval.seq_len", "data.objective"},
       [shortest](const Recipe& r) {
         const auto [least, why] = shortest(r);
         if (r.train.seq_len < least) {
           return absl::StrCat("data.objective = \"", r.data.objective, "\" needs train.seq_len ≥ ", least, " (", why,
                               "); train.seq_len = ", r.train.seq_len, " is shorter");
         }
         for (size_t i = 0; i < r.eval.seq_len.size(); ++i) {
           if (r.eval.seq_len[i] >= least) continue;
           return absl::StrCat("data.objective = \"", r.data.objective, "\" needs each eval.seq_len ≥ ", least, " (",
                               why, "); eval.seq_len[", i, "] = ", r.eval.seq_len[i], " is shorter");
         }
         return std::string();
       }});
  // The vocabulary holds the sentinels that rows of train.seq_len need (span_corruption.h): a longer row
  // would need more, and a vocabulary sized by evaluation lengths would change with them.
  s.checks.push_back(
      {"eval.seq_len stays within train.seq_len with data.objective = \"span_corruption\" (its sentinels are "
       "counted for train.seq_len)",
       {"eval.seq_len", "data.objective", "train.seq_len"},
       [](const Recipe& r) {
         if (r.data.objective != "span_corruption") return std::string();
         for (size_t i = 0; i < r.eval.seq_len.size(); ++i) {
           if (r.eval.seq_len[i] <= r.train.seq_len) continue;
           return absl::StrCat("eval.seq_len[", i, "] = ", r.eval.seq_len[i], " is longer than train.seq_len = ",
                               r.train.seq_len, ": data.objective = \"span_corruption\" has sentinels for the noise "
                               "spans of rows up to train.seq_len only");
         }
         return std::string();
       }});
  s.checks.push_back(
      {"parallel.sp = 1 with data.objective = \"masked_lm\" or \"span_corruption\"",
       {"parallel.sp", "data.objective"},
       [](const Recipe& r) {
         if (r.parallel.sp == 1 || r.data.objective == "lm") return std::string();
         return absl::StrCat("parallel.sp = ", r.parallel.sp, " splits windows of the token stream; data.objective = \"",
                             r.data.objective, "\" makes padded rows of its own: leave parallel.sp at 1 (--nproc ",
                             "still trains data-parallel)");
       }});
  // model.arch and data.objective go together: masked_lm trains an encoder (model.arch = "encoder"),
  // span_corruption an encoder-decoder ("encoder_decoder"), lm a decoder.
  s.checks.push_back(
      {"data.objective fits model.arch: lm a decoder, masked_lm an encoder, span_corruption an encoder_decoder",
       {"data.objective", "model.arch"},
       [](const Recipe& r) {
         const std::string want = r.data.objective == "masked_lm"         ? "encoder"
                                  : r.data.objective == "span_corruption" ? "encoder_decoder"
                                                                          : "decoder";
         if (r.model.arch == want) return std::string();
         return absl::StrCat("data.objective = \"", r.data.objective, "\" trains model.arch = \"", want,
                             "\", but model.arch = \"", r.model.arch, "\"");
       }});
  // The masked-LM rows carry sentences A and B as segment ids 0 and 1.
  s.checks.push_back({"data.objective = \"masked_lm\" needs model.segments ≥ 2 (sentences A and B)",
                      {"data.objective", "model.segments"},
                      [](const Recipe& r) {
                        if (r.data.objective != "masked_lm" || r.model.segments >= 2) return std::string();
                        return absl::StrCat("data.objective = \"masked_lm\" gives each token the segment of its ",
                                            "sentence (A: 0, B: 1): model.segments must be at least 2, got ",
                                            r.model.segments);
                      }});
}

Schema build_schema() {
  Schema s;
  SectionBuilder<RecipeModel>(s, "model", &Recipe::model,
                              "The network: its family, sizes and blocks (a mixer and an FFN each).")
      .choice("arch", &RecipeModel::arch, {"decoder", "encoder", "encoder_decoder"},
              "model kind (docs/models.md): decoder, a decoder-only language model (GPT, the recurrent LMs, "
              "hybrids); encoder, a bidirectional encoder with a masked-LM head (BERT); encoder_decoder, an "
              "encoder and a decoder that cross-attends to it (T5)",
              {{"gpt", "decoder"}})
      .choice("mixer", &RecipeModel::mixer, mixer_choices(),
              "how every block mixes tokens (unless model.pattern says otherwise): causal softmax attention, "
              "or a recurrence (docs/variants/); each mixer's options are in [model.<mixer>] below",
              mixer_value_aliases())
      .text("pattern", &RecipeModel::pattern, "",
            "per-layer blocks: mixer names separated by spaces or commas, each optionally with :FFN (gelu, "
            "swiglu, relu, geglu, moe, none) and *N repeats, e.g. \"gla*3 attention\"; shorter than n_layers it repeats; \"\": "
            "model.mixer in every layer")
      .integer("vocab_size", &RecipeModel::vocab_size, 0, at_least(0), "vocabulary size; 0: the tokenizer's")
      .integer("d_model", &RecipeModel::d_model, 256, at_least(1), "width of the residual stream")
      .integer("n_layers", &RecipeModel::n_layers, 4, at_least(1),
               "number of blocks (encoder_decoder: of the encoder; see decoder_layers)")
      .integer("decoder_layers", &RecipeModel::decoder_layers, 0, at_least(0),
               "encoder_decoder: blocks of the decoder stack, each with cross attention; 0: n_layers")
      .integer("n_heads", &RecipeModel::n_heads, 4, at_least(1), "heads of every mixer; must divide d_model")
      .integer("n_kv_heads", &RecipeModel::n_kv_heads, 0, at_least(0),
               "key/value heads of attention (grouped-query attention); 0: n_heads; must divide n_heads")
      .integer("d_ff", &RecipeModel::d_ff, 0, at_least(0),
               "hidden width of the FFNs; 0: 4·d_model for gelu, the multiple of 64 nearest 8/3·d_model for swiglu")
      .choice("mlp", &RecipeModel::mlp, {"auto", "gelu", "swiglu", "relu", "geglu", "none", "moe"},
              "the FFN of every block (a pattern may name others): gelu or relu (two matrices), swiglu or geglu "
              "(gated, three: T5 v1.1's is geglu), moe (a mixture of experts, [model.moe]) or none; auto: a decoder gelu when every block is attention "
              "(GPT-2), swiglu otherwise; an encoder gelu (BERT); an encoder_decoder relu (T5)")
      .choice("norm", &RecipeModel::norm, {"auto", "layernorm", "rmsnorm"},
              "the norms of every block; auto: a decoder layernorm when every block is attention, rmsnorm "
              "otherwise; an encoder layernorm (BERT); an encoder_decoder rmsnorm (T5)")
      .choice("norm_placement", &RecipeModel::norm_placement, {"auto", "pre", "post"},
              "pre: a norm before each sub-layer and one after the stack (GPT-2, T5); post: a norm after each "
              "residual add and one on the embeddings (BERT); auto: post for an encoder, pre otherwise")
      .number("norm_eps", &RecipeModel::norm_eps, 1e-5, above(0), "added to the variance inside the norms")
      .choice("positions", &RecipeModel::positions, {"auto", "learned", "sinusoidal", "rope", "relative", "none"},
              "positions: absolute embeddings added to the input (learned, or sinusoidal: the fixed sines and "
              "cosines of the Transformer paper), rotary (rope: attention rotates q and k), relative (T5's "
              "learned bias on attention scores by bucketed distance, one table per stack) or none; auto: a "
              "decoder learned when every block is attention, none otherwise (recurrences order the tokens); "
              "an encoder learned (BERT); an encoder_decoder relative (T5)")
      .number("rope_base", &RecipeModel::rope_base, 10000.0, above(0), "base of the rotary frequencies (rope)")
      .integer("relative_buckets", &RecipeModel::relative_buckets, 32, at_least(2),
               "positions = relative: buckets of distance (half per direction in a bidirectional stack)")
      .integer("relative_max_distance", &RecipeModel::relative_max_distance, 128, at_least(1),
               "positions = relative: distances from here on share the last bucket")
      .integer("segments", &RecipeModel::segments, 0, at_least(0),
               "encoder: rows of the segment (token type) embedding, 2 for BERT's sentences A and B; 0: none")
      .switch_auto("bias", &RecipeModel::bias,
                   "biases in attention's and the FFNs' linear layers; auto: a decoder true when every block is "
                   "attention (GPT-2), false otherwise; an encoder true (BERT); an encoder_decoder false (T5)")
      .boolean("tie_embeddings", &RecipeModel::tie_embeddings, true,
               "the output projection shares the token embedding matrix (T5 then scales the decoder's output by "
               "d_model^-1/2); false: its own lm_head")
      .number("dropout", &RecipeModel::dropout, 0.0, closed_open(0, 1), "dropout probability")
      .number("init_std", &RecipeModel::init_std, 0.02, above(0), "standard deviation of the initial weights")
      .integer("shared_attention_every", &RecipeModel::shared_attention_every, 0, at_least(0),
               "Zamba's shared attention block (decoder): after every k-th block one attention block with an FFN "
               "whose weights all its uses share, each use with its own input projection of [stream, embedding] "
               "(docs/hybrids.md); 0: none");
  add_mixer_sections(s);
  add_moe_section(s);

  SectionBuilder<RecipeData>(s, "data", &Recipe::data,
                             "Where the tokens come from, a corpus or a synthetic task, and what a corpus trains "
                             "(data.objective).")
      .choice("source", &RecipeData::source, {"text", "shards", "mqar", "copy", "selective_copy", "induction"},
              "text: files tokenized on first use; shards: prepared .bin token shards; the rest: synthetic tasks")
      .text("path", &RecipeData::path, "/usr/share/games/fortunes",
            "text: a file or a folder of files; shards: a folder of .bin shards")
      .choice("format", &RecipeData::format, {"auto", "text", "jsonl", "fortune"},
              "layout of text files: auto (guessed per file), text, jsonl (one JSON object per line), "
              "fortune (documents separated by lines holding %)")
      .text("jsonl_field", &RecipeData::jsonl_field, "text", "the JSON field holding a document (jsonl)")
      .choice("tokenizer", &RecipeData::tokenizer, {"byte", "bpe"},
              "byte: the 256 byte values; bpe: the merges in tokenizer_path")
      .text("tokenizer_path", &RecipeData::tokenizer_path, "",
            "text: the BPE merges file, required when tokenizer = \"bpe\"; shards without meta.json (llm.c's): "
            "llm.c's tokenizer file (gpt2_tokenizer.bin) that decodes samples (\"\": samples print token ids)")
      .integer("vocab_size", &RecipeData::vocab_size, 0, closed(0, 65536),
               "shards without meta.json (llm.c's): every token id is below it; 0: the tokenizer file's count, "
               "else GPT-2's 50257 (model.vocab_size may be larger, e.g. llm.c's padded 50304)")
      .number("val_fraction", &RecipeData::val_fraction, 0.05, open_closed(0, 0.5),
              "share of the data held out for evaluation")
      .text("cache_dir", &RecipeData::cache_dir, "data/cache", "where prepared token shards are written")
      .choice("objective", &RecipeData::objective, {"lm", "masked_lm", "span_corruption"},
              "what the text trains (docs/training.md, \"Objectives\"): lm, the next token of windows of the "
              "token stream (decoder models); masked_lm, BERT's masked tokens in rows [CLS] A [SEP] B [SEP] of "
              "one document each (encoder models); span_corruption, T5's noise spans replaced by sentinels in "
              "the encoder's input and predicted by the decoder (encoder-decoder models). masked_lm and "
              "span_corruption add their special tokens to the tokenizer's vocabulary")
      .number("mask_fraction", &RecipeData::mask_fraction, 0.15, open_closed(0, 1),
              "masked_lm: the share of a row's text tokens to predict, round(fraction · tokens) and at least "
              "one; of those 80% read [MASK], 10% a random token, 10% themselves")
      .boolean("next_sentence", &RecipeData::next_sentence, false,
               "masked_lm: half the rows take B from another document, and each row's next-sentence label "
               "(0: B follows A, 1: B is random) is its sequence target")
      .number("noise_density", &RecipeData::noise_density, 0.15, open_open(0, 1),
              "span_corruption: the share of a row's raw tokens that are noise, round(raw · density)")
      .number("mean_span_length", &RecipeData::mean_span_length, 3.0, at_least(1),
              "span_corruption: the mean length of a noise span (spans = round(noise / mean)); with "
              "noise_density it sets how many raw tokens fill train.seq_len and how many sentinels the "
              "vocabulary holds")
      .integer("task_vocab", &RecipeData::task_vocab, 64, at_least(2), "synthetic tasks: number of distinct symbols")
      .integer("task_num_pairs", &RecipeData::task_num_pairs, 8, at_least(1), "mqar: key-value pairs per sequence")
      .choice("task_mqar_layout", &RecipeData::task_mqar_layout, {"packed", "zoology"},
              "mqar: packed, every query right after the pairs and blanks after them; zoology, Zoology's "
              "definition (Arora et al. 2023): distinct values too, the queries at power-law gaps over the rest "
              "of the sequence and random tokens between them, so a longer sequence puts queries further away")
      .number("task_mqar_power", &RecipeData::task_mqar_power, 0.01, open_closed(0, 1),
              "mqar, zoology layout: a in P(query in slot g) ∝ (g+1)^(a-1); Zoology's 0.01 favours short gaps, "
              "1 is uniform")
      .integer("task_copy_len", &RecipeData::task_copy_len, 16, at_least(1),
               "copy, selective_copy: tokens to be copied");

  SectionBuilder<RecipeTrain>(s, "train", &Recipe::train, "The step loop.")
      .integer("steps", &RecipeTrain::steps, 1000, at_least(1), "optimizer steps")
      .integer("batch_size", &RecipeTrain::batch_size, 8, at_least(1), "sequences per micro-batch")
      .integer("seq_len", &RecipeTrain::seq_len, 256, at_least(1), "tokens per sequence")
      .integer("seed", &RecipeTrain::seed, 1337, at_least(0),
               "the run's one seed: initialisation, data order, dropout")
      .integer("grad_accum", &RecipeTrain::grad_accum, 1, at_least(1), "micro-batches per optimizer step")
      .choice("device", &RecipeTrain::device, {"auto", "cpu", "cuda"}, "auto: CUDA when a GPU is usable, else the CPU")
      .choice("dtype", &RecipeTrain::dtype, {"f32", "bf16", "auto"},
              "bf16: mixed precision (bf16 weights and activations; f32 master weights, optimizer state, "
              "statistics and loss), its GEMMs on bf16 instructions (a GPU's tensor cores; on the CPU "
              "AVX512-BF16 or AMX through oneDNN, else widened to f32: slower than f32); auto: bf16 where "
              "the run's device has bf16 instructions, f32 elsewhere (the run says which)")
      .choice("on_nonfinite", &RecipeTrain::on_nonfinite, {"stop", "skip"},
              "a step whose loss or gradient norm is not finite is never applied; stop: save the state before "
              "it and exit with code 3, naming the step and the first tensor whose gradient is not finite; "
              "skip: drop that update, count it in metrics.jsonl (skipped) and go on")
      .integer("max_skipped", &RecipeTrain::max_skipped, 10, at_least(1),
               "on_nonfinite = \"skip\": stop as \"stop\" does after this many skipped updates in a row");

  SectionBuilder<RecipeOptim>(s, "optim", &Recipe::optim, "The optimizer and the learning-rate schedule.")
      .choice("name", &RecipeOptim::name, {"adamw", "sgd"}, "optimizer")
      .number("lr", &RecipeOptim::lr, 1e-3, above(0), "peak learning rate")
      .number("beta1", &RecipeOptim::beta1, 0.9, closed_open(0, 1), "AdamW: decay of the first moment")
      .number("beta2", &RecipeOptim::beta2, 0.95, closed_open(0, 1), "AdamW: decay of the second moment")
      .number("eps", &RecipeOptim::eps, 1e-8, above(0), "AdamW: added to the root of the second moment")
      .number("weight_decay", &RecipeOptim::weight_decay, 0.1, at_least(0),
              "decoupled weight decay on matrices (see the decay_* keys for the rest)")
      .number("momentum", &RecipeOptim::momentum, 0.9, closed_open(0, 1), "SGD: momentum")
      .boolean("nesterov", &RecipeOptim::nesterov, false, "SGD: Nesterov momentum")
      .number("grad_clip", &RecipeOptim::grad_clip, 1.0, at_least(0), "clip the global gradient norm to this; 0: off")
      .choice("schedule", &RecipeOptim::schedule, {"cosine", "linear", "constant"},
              "after warm-up: decay to min_lr_ratio·lr at the last step (cosine, linear) or stay at lr")
      .integer("warmup_steps", &RecipeOptim::warmup_steps, 30, at_least(0),
               "steps of linear warm-up to lr; a longer warm-up than train.steps is cut to train.steps")
      .number("min_lr_ratio", &RecipeOptim::min_lr_ratio, 0.1, closed(0, 1), "final learning rate as a fraction of lr")
      .boolean("decay_norms", &RecipeOptim::decay_norms, false, "weight decay on norm gains too")
      .boolean("decay_biases", &RecipeOptim::decay_biases, false, "weight decay on biases too")
      .boolean("decay_embeddings", &RecipeOptim::decay_embeddings, false, "weight decay on embeddings too");

  SectionBuilder<RecipeParallel>(s, "parallel", &Recipe::parallel, "Processes and threads.")
      .integer("threads", &RecipeParallel::threads, 0, at_least(0), "CPU threads per process; 0: all cores (a rank of --nproc N: cores / N)")
      .integer("sp", &RecipeParallel::sp, 1, at_least(1),
               "ranks that share each sequence (sequence parallelism, docs/distributed.md): `--nproc N` makes "
               "N/sp data-parallel groups of sp ranks, each rank holding train.seq_len/sp tokens of every sequence")
      .boolean("overlap", &RecipeParallel::overlap, true,
               "with several ranks on the CPU: average each bucket of gradients as soon as the backward has "
               "finished it, while the backward goes on; false: all of them after the backward");

  SectionBuilder<RecipeLog>(s, "log", &Recipe::log, "Metrics, evaluation, samples and the run directory.")
      .integer("every", &RecipeLog::every, 10, at_least(1), "steps between training-loss lines")
      .integer("eval_every", &RecipeLog::eval_every, 100, at_least(1), "steps between evaluations on held-out data")
      .integer("eval_batches", &RecipeLog::eval_batches, 20, at_least(1), "batches per evaluation")
      .integer("sample_every", &RecipeLog::sample_every, 200, at_least(0), "steps between generated samples; 0: never")
      .integer("sample_tokens", &RecipeLog::sample_tokens, 128, at_least(1), "tokens per sample")
      .text("sample_prompt", &RecipeLog::sample_prompt, "", "text the samples continue (\"\": none)")
      .number("sample_temperature", &RecipeLog::sample_temperature, 0.8, at_least(0),
              "sampling temperature; 0: greedy")
      .choice("progress", &RecipeLog::progress, {"auto", "bar", "plain"},
              "auto: a progress bar on a terminal, plain lines otherwise")
      .text("out_dir", &RecipeLog::out_dir, "",
            "run directory: metrics, samples, checkpoints, the resolved recipe; \"\": runs/<recipe name>");

  SectionBuilder<RecipeEval>(
      s, "eval", &Recipe::eval,
      "Evaluation at other lengths than training (docs/scaling.md, length extrapolation). At every evaluation "
      "(log.eval_every) the model is scored at train.seq_len, as val_loss, val_acc, ...; each length L of "
      "eval.seq_len adds the same fields named val_loss@L, val_acc@L, ... (at L = train.seq_len the very same "
      "values). A text or shard corpus is scored on validation windows of L + 1 tokens, a synthetic task on "
      "examples its generator makes at length L. Every length sees about the tokens of train.seq_len: "
      "log.eval_batches batches of max(1, floor(train.batch_size · train.seq_len / L)) sequences each. "
      "Evaluation runs on rank 0 alone, outside sequence parallelism (parallel.sp), so any length goes; attention "
      "models take the longest length as their context (samples too). Learned positions have no embedding past "
      "train.seq_len: with them, the lengths stop there.")
      .integer_list("seq_len", &RecipeEval::seq_len, at_least(1),
                    "lengths (tokens per sequence) to score the model at besides train.seq_len, e.g. [256, 1024]; "
                    "one integer is a list of one; []: train.seq_len only");

  SectionBuilder<RecipeCheckpoint>(s, "checkpoint", &Recipe::checkpoint, "Saving and resuming.")
      .integer("every", &RecipeCheckpoint::every, 200, at_least(0), "steps between checkpoints; 0: only at the end")
      .integer("keep", &RecipeCheckpoint::keep, 3, at_least(1), "how many of the latest checkpoints are kept")
      .boolean("save_on_signal", &RecipeCheckpoint::save_on_signal, true,
               "save a checkpoint before exiting on SIGINT or SIGTERM");

  s.checks = {
      {"model.n_heads divides model.d_model",
       {"model.n_heads", "model.d_model"},
       [](const Recipe& r) {
         const RecipeModel& m = r.model;
         if (m.d_model % m.n_heads == 0) return std::string();
         return absl::StrCat("model.n_heads = ", m.n_heads, " must divide model.d_model = ", m.d_model);
       }},
      {"model.n_kv_heads, when set, divides model.n_heads",
       {"model.n_kv_heads", "model.n_heads"},
       [](const Recipe& r) {
         const RecipeModel& m = r.model;
         if (m.n_kv_heads == 0 || m.n_heads % m.n_kv_heads == 0) return std::string();
         return absl::StrCat("model.n_kv_heads = ", m.n_kv_heads, " must divide model.n_heads = ", m.n_heads);
       }},
      // Rotary embeddings turn pairs of channels, so a head needs an even number of them.
      {"model.positions = \"rope\" needs an even head size, model.d_model / model.n_heads",
       {"model.positions", "model.d_model", "model.n_heads"},
       [](const Recipe& r) {
         const RecipeModel& m = r.model;
         if (m.positions != "rope" || m.d_model % m.n_heads != 0 || (m.d_model / m.n_heads) % 2 == 0) return std::string();
         return absl::StrCat("model.positions = \"rope\" needs an even head size, but model.d_model / model.n_heads = ",
                             m.d_model, " / ", m.n_heads, " = ", m.d_model / m.n_heads);
       }},
      {"data.tokenizer = \"bpe\" needs data.tokenizer_path",
       {"data.tokenizer", "data.tokenizer_path"},
       [](const Recipe& r) {
         if (r.data.tokenizer != "bpe" || !r.data.tokenizer_path.empty()) return std::string();
         return std::string("data.tokenizer = \"bpe\" needs data.tokenizer_path (the BPE merges file)");
       }},
      {"data.vocab_size is set only for data.source = \"shards\"",
       {"data.vocab_size", "data.source"},
       [](const Recipe& r) {
         if (r.data.vocab_size == 0 || r.data.source == "shards") return std::string();
         return absl::StrCat("data.vocab_size = ", r.data.vocab_size, " is read only for data.source = \"shards\" ",
                             "(a folder without meta.json); data.source = \"", r.data.source,
                             "\" has its own vocabulary: leave it at 0");
       }},
      {"model.vocab_size, when set, holds the byte tokenizer's 256 tokens (data.source = \"text\")",
       {"model.vocab_size", "data.tokenizer", "data.source"},
       [](const Recipe& r) {
         // Shard folders name their own tokenizer; build_model checks model.vocab_size against their vocabulary.
         if (r.data.source != "text" || r.data.tokenizer != "byte" || r.model.vocab_size == 0 ||
             r.model.vocab_size >= 256) {
           return std::string();
         }
         return absl::StrCat("model.vocab_size = ", r.model.vocab_size,
                             " is too small for data.tokenizer = \"byte\" (256 tokens); 0 takes the tokenizer's");
       }},
      {"train.seq_len splits into 2·parallel.sp chunks (sequence parallelism's zig-zag layout)",
       {"parallel.sp", "train.seq_len"},
       [](const Recipe& r) {
         if (r.train.seq_len % (2 * r.parallel.sp) == 0) return std::string();
         return absl::StrCat("parallel.sp = ", r.parallel.sp, " needs train.seq_len divisible by 2·sp = ",
                             2 * r.parallel.sp, " (each rank holds 2 of the sequence's 2·sp chunks); train.seq_len = ",
                             r.train.seq_len, " is not");
       }},
      {"model.segments is read only by an encoder",
       {"model.segments", "model.arch"},
       [](const Recipe& r) {
         if (r.model.segments == 0 || r.model.arch == "encoder") return std::string();
         return absl::StrCat("model.segments = ", r.model.segments, " is read only by model.arch = \"encoder\" (",
                             "BERT's sentence embedding); model.arch = \"", r.model.arch, "\" has no segments");
       }},
      {"model.decoder_layers is read only by an encoder_decoder",
       {"model.decoder_layers", "model.arch"},
       [](const Recipe& r) {
         if (r.model.decoder_layers == 0 || r.model.arch == "encoder_decoder") return std::string();
         return absl::StrCat("model.decoder_layers = ", r.model.decoder_layers, " is read only by model.arch = ",
                             "\"encoder_decoder\"; model.arch = \"", r.model.arch, "\" has one stack of n_layers");
       }},
      {"model.relative_buckets and model.relative_max_distance are read only with model.positions = \"relative\"",
       {"model.relative_buckets", "model.relative_max_distance", "model.positions"},
       [](const Recipe& r) {
         const Recipe defaults;
         if (r.model.positions == "relative" || (r.model.relative_buckets == defaults.model.relative_buckets &&
                                                  r.model.relative_max_distance == defaults.model.relative_max_distance)) {
           return std::string();
         }
         return absl::StrCat("model.relative_buckets and model.relative_max_distance are read only with ",
                             "model.positions = \"relative\"; model.positions = \"", r.model.positions, "\"");
       }},
      {"parallel.sp > 1 trains decoder models only (ring attention and state passing are causal)",
       {"parallel.sp", "model.arch"},
       [](const Recipe& r) {
         if (r.parallel.sp == 1 || r.model.arch == "decoder") return std::string();
         return absl::StrCat("parallel.sp = ", r.parallel.sp, " trains model.arch = \"decoder\" only: ring ",
                             "attention is causal and has no cross attention; model.arch = \"", r.model.arch,
                             "\" trains with parallel.sp = 1 (data parallelism with --nproc still works)");
       }},
      {"eval.seq_len names each length once",
       {"eval.seq_len"},
       [](const Recipe& r) {
         const IntegerList& l = r.eval.seq_len;
         for (size_t i = 0; i < l.size(); ++i) {
           for (size_t j = 0; j < i; ++j) {
             if (l[i] == l[j]) return absl::StrCat("eval.seq_len[", i, "] = ", l[i], " repeats eval.seq_len[", j, "]");
           }
         }
         return std::string();
       }},
      // A learned position table has train.seq_len rows, all trained. Sizing it to the longest eval length
      // instead would make the parameter count, the weights' initial draws and the checkpoint's shapes depend
      // on an evaluation setting, for rows that training never reaches; so longer lengths are refused.
      {"eval.seq_len stays within train.seq_len with model.positions = \"learned\" (no embedding past it)",
       {"eval.seq_len", "model.positions", "train.seq_len"},
       [](const Recipe& r) {
         if (r.model.positions != "learned") return std::string();
         const IntegerList& l = r.eval.seq_len;
         for (size_t i = 0; i < l.size(); ++i) {
           if (l[i] <= r.train.seq_len) continue;
           return absl::StrCat("eval.seq_len[", i, "] = ", l[i], " is longer than train.seq_len = ", r.train.seq_len,
                               ": model.positions = \"learned\" has embeddings for ", r.train.seq_len,
                               " positions only; score longer sequences with model.positions = \"rope\" or \"none\"");
         }
         return std::string();
       }},
      {"model.moe.top_k is at most model.moe.experts",
       {"model.moe.top_k", "model.moe.experts"},
       [](const Recipe& r) {
         if (r.model.moe.top_k <= r.model.moe.experts) return std::string();
         return absl::StrCat("model.moe.top_k = ", r.model.moe.top_k, " must be at most model.moe.experts = ",
                             r.model.moe.experts);
       }},
      {"the MoE FFN and the shared attention block belong to decoder models trained with parallel.sp = 1",
       {"model.mlp", "model.pattern", "model.shared_attention_every", "model.arch", "parallel.sp"},
       [](const Recipe& r) {
         bool moe = false;
         if (auto blocks = block_pattern(r.model); blocks.ok()) {
           for (const BlockSpec& b : *blocks) moe = moe || b.ffn == FfnKind::moe;
         }
         const std::string what = moe ? "a block with the MoE FFN" : "model.shared_attention_every > 0";
         if (!moe && r.model.shared_attention_every == 0) return std::string();
         if (r.model.arch != "decoder") {
           return absl::StrCat(what, " is built into model.arch = \"decoder\" only; model.arch = \"", r.model.arch, "\"");
         }
         if (r.parallel.sp > 1) {
           return absl::StrCat(what, " trains with parallel.sp = 1 (data parallelism with --nproc works); parallel.sp = ",
                               r.parallel.sp);
         }
         return std::string();
       }},
  };
  add_objective_checks(s);
  return s;
}

const Schema& schema() {
  static const Schema s = build_schema();
  return s;
}

// The canonical name of a section or of an older name of one ("model.retnet" → "model.retention");
// "" when there is none.
std::string canonical_section(const std::string& name) {
  for (const SectionSpec& s : schema().sections) {
    if (s.name == name) return s.name;
    for (const std::string& a : s.aliases) {
      if (a == name) return s.name;
    }
  }
  return "";
}

bool is_section(const std::string& name) { return !canonical_section(name).empty(); }

const KeySpec* find_key(const std::string& section, const std::string& key) {
  const std::string canonical = canonical_section(section);
  for (const KeySpec& k : schema().keys) {
    if (k.section == canonical && k.key == key) return &k;
  }
  return nullptr;
}

// ---- text: numbers, strings and values as TOML writes them ----

// The shortest text that reads back as the same double, always with a '.' or exponent so that
// TOML reads a float.
std::string format_number(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  // "3e-04" reads better as "3e-4".
  size_t e = s.find('e');
  if (e != std::string::npos) {
    size_t digits = s.find_first_not_of("+-", e + 1);
    size_t first = s.find_first_not_of('0', digits);
    s.erase(digits, std::min(first, s.size() - 1) - digits);
  }
  return s;
}

// A TOML basic string: escapes keep it on one line, so it also suits one-line error messages.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string format_value(const Value& v) {
  struct {
    std::string operator()(int64_t i) const { return absl::StrCat(i); }
    std::string operator()(double d) const { return format_number(d); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(const IntegerList& l) const { return "[" + absl::StrJoin(l, ", ") + "]"; }
  } visitor;
  return std::visit(visitor, v);
}

std::string changed_value(const Recipe& r, const std::string& name) {
  const size_t dot = name.rfind('.');
  const KeySpec* k = find_key(name.substr(0, dot), name.substr(dot + 1));
  if (k == nullptr) throw std::logic_error("recipe: a rule names the unknown key " + name);
  const std::string value = format_value(k->get(r));
  return value == format_value(k->default_value) ? "" : value;
}

// A bound as the user wrote it: integers without a fraction.
std::string format_bound(double x) {
  return x == std::floor(x) && std::fabs(x) < 1e15 ? absl::StrCat(static_cast<int64_t>(x)) : format_number(x);
}

// The interval, e.g. "≥ 1", "> 0", "in [0, 1)"; "" when any value goes.
std::string describe_bounds(const Bounds& b) {
  bool has_lo = std::isfinite(b.lo), has_hi = std::isfinite(b.hi);
  if (has_lo && has_hi) {
    return absl::StrCat("in ", b.lo_open ? "(" : "[", format_bound(b.lo), ", ", format_bound(b.hi), b.hi_open ? ")" : "]");
  }
  if (has_lo) return absl::StrCat(b.lo_open ? "> " : "≥ ", format_bound(b.lo));
  if (has_hi) return absl::StrCat(b.hi_open ? "< " : "≤ ", format_bound(b.hi));
  return "";
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::vector<std::string> quoted;
  for (const std::string& c : choices) quoted.push_back(quote(c));
  return absl::StrJoin(quoted, ", ");
}

// What a key accepts, as the end of "KEY must be ...".
std::string describe_allowed(const KeySpec& k) {
  std::string range = describe_bounds(k.bounds);
  switch (k.type) {
    case KeyType::kInteger: return range.empty() ? "an integer" : "an integer " + range;
    case KeyType::kNumber: return range.empty() ? "a number" : "a number " + range;
    case KeyType::kBoolean: return "true or false";
    case KeyType::kSwitch: return "true, false or \"auto\"";
    case KeyType::kString: return k.choices.empty() ? "a string" : "one of " + join_choices(k.choices);
    case KeyType::kIntegerList: return range.empty() ? "a list of integers" : "a list of integers " + range;
  }
  return "";
}

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::kInteger: return "integer";
    case KeyType::kNumber: return "number";
    case KeyType::kBoolean: return "boolean";
    case KeyType::kSwitch: return "boolean or \"auto\"";
    case KeyType::kString: return "string";
    case KeyType::kIntegerList: return "list of integers";
  }
  return "";
}

// A TOML value as "got ..." names it, e.g. `a string "ten"`.
std::string describe_node(const toml::node& n) {
  if (auto s = n.as_string()) return "a string " + quote(s->get());
  if (auto i = n.as_integer()) return absl::StrCat("an integer ", i->get());
  if (auto d = n.as_floating_point()) return "a floating-point number " + format_number(d->get());
  if (auto b = n.as_boolean()) return b->get() ? "a boolean true" : "a boolean false";
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  return "a date or time";
}

// ---- did you mean ----

// The known key nearest to section.key, searching every section (a key in the wrong section is a
// common slip); on equal distance the key's own section wins. nullptr when nothing is near.
const KeySpec* suggest_key(const std::string& section, const std::string& key) {
  const KeySpec* best = nullptr;
  size_t best_score = SIZE_MAX, d = 0;
  for (const KeySpec& k : schema().keys) {
    if (!near_miss(key, k.key, &d)) continue;
    size_t score = 2 * d + (k.section == section ? 0 : 1);
    if (score < best_score) best = &k, best_score = score;
  }
  return best;
}

// The sections directly under `parent` ("": the top-level ones), by name.
std::string section_names(const std::string& parent = "") {
  std::vector<std::string> names;
  for (const SectionSpec& s : schema().sections) {
    const size_t dot = s.name.rfind('.');
    if ((dot == std::string::npos ? std::string() : s.name.substr(0, dot)) == parent) names.push_back(s.name);
  }
  return absl::StrJoin(names, ", ");
}

std::string unknown_section_message(const std::string& name) {
  std::string best;
  size_t best_d = SIZE_MAX, d = 0;
  for (const SectionSpec& s : schema().sections) {
    if (near_miss(name, s.name, &d) && d < best_d) best = s.name, best_d = d;
  }
  if (!best.empty()) return absl::StrCat("unknown section [", name, "] (did you mean [", best, "]?)");
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos) {
    const std::string parent = name.substr(0, dot);
    return absl::StrCat("unknown section [", name, "] ([", parent, "] has the sub-tables ", section_names(parent),
                        ": one per mixer", parent == "model" ? ", and the MoE FFN's" : "", ")");
  }
  return absl::StrCat("unknown section [", name, "] (sections: ", section_names(), ")");
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  std::string message = absl::StrCat("unknown key ", section, ".", key);
  if (const KeySpec* k = suggest_key(section, key)) return absl::StrCat(message, " (did you mean ", k->name(), "?)");
  std::vector<std::string> keys;
  for (const KeySpec& k : schema().keys) {
    if (k.section == section) keys.push_back(k.key);
  }
  return absl::StrCat(message, " ([", section, "] has ", absl::StrJoin(keys, ", "), ")");
}

// ---- values ----

// Checks a value of the key's type against its range or choices: "" when allowed, else the message.
std::string check_value(const KeySpec& k, const Value& v) {
  std::string must = absl::StrCat(k.name(), " must be ", describe_allowed(k), ", got ");
  if (k.type == KeyType::kIntegerList) {
    // The element is named by its index, as the user counts in the file: eval.seq_len[2].
    const IntegerList& list = std::get<IntegerList>(v);
    const Bounds& b = k.bounds;
    for (size_t i = 0; i < list.size(); ++i) {
      const double x = static_cast<double>(list[i]);
      if ((b.lo_open ? x > b.lo : x >= b.lo) && (b.hi_open ? x < b.hi : x <= b.hi)) continue;
      return absl::StrCat(k.name(), "[", i, "] must be an integer ", describe_bounds(b), ", got ", list[i]);
    }
    return "";
  }
  if (k.type == KeyType::kInteger || k.type == KeyType::kNumber) {
    double x = k.type == KeyType::kInteger ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
    const Bounds& b = k.bounds;
    bool ok = std::isfinite(x) && (b.lo_open ? x > b.lo : x >= b.lo) && (b.hi_open ? x < b.hi : x <= b.hi);
    if (!ok) return must + format_value(v);
  }
  if (k.type == KeyType::kSwitch && std::holds_alternative<std::string>(v) && std::get<std::string>(v) != "auto") {
    return must + quote(std::get<std::string>(v));
  }
  if (k.type == KeyType::kString && !k.choices.empty()) {
    const std::string& s = std::get<std::string>(v);
    if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end() && !k.value_aliases.count(s)) {
      std::vector<std::string> candidates = k.choices;  // older values count, suggested as their current one
      for (const auto& [old_value, value] : k.value_aliases) candidates.push_back(old_value);
      std::string hint = nearest(s, candidates);
      if (auto alias = k.value_aliases.find(hint); alias != k.value_aliases.end()) hint = alias->second;
      return must + quote(s) + (hint.empty() ? "" : " (did you mean " + quote(hint) + "?)");
    }
  }
  return "";
}

// An older value of a choice key read as its canonical choice ("gpt" → "decoder"); others unchanged.
Value canonical_value(const KeySpec& k, const Value& v) {
  if (!std::holds_alternative<std::string>(v)) return v;
  auto it = k.value_aliases.find(std::get<std::string>(v));
  return it != k.value_aliases.end() ? Value(it->second) : v;
}

// Converts a TOML value to the key's type (integers are accepted for numbers) and checks it.
// On failure `error` is set and the returned value is meaningless.
Value to_value(const KeySpec& k, const toml::node& n, std::string* error) {
  std::optional<Value> v;
  switch (k.type) {
    case KeyType::kInteger:
      if (auto i = n.as_integer()) v = i->get();
      break;
    case KeyType::kNumber:
      if (auto d = n.as_floating_point()) v = d->get();
      if (auto i = n.as_integer()) v = static_cast<double>(i->get());
      break;
    case KeyType::kBoolean:
      if (auto b = n.as_boolean()) v = b->get();
      break;
    case KeyType::kString:
      if (auto s = n.as_string()) v = s->get();
      break;
    case KeyType::kSwitch:
      if (auto b = n.as_boolean()) v = b->get();
      if (auto s = n.as_string()) v = s->get();
      break;
    case KeyType::kIntegerList:
      if (auto i = n.as_integer()) v = IntegerList{i->get()};  // one length needs no brackets
      if (auto a = n.as_array()) {
        IntegerList list;
        for (size_t i = 0; i < a->size(); ++i) {
          const toml::node& e = *a->get(i);
          if (!e.is_integer()) {
            std::string range = describe_bounds(k.bounds);
            *error = absl::StrCat(k.name(), "[", i, "] must be an integer", range.empty() ? "" : " " + range, ", got ",
                                  describe_node(e));
            return {};
          }
          list.push_back(*e.value<int64_t>());
        }
        v = std::move(list);
      }
      break;
  }
  if (!v) {
    *error = absl::StrCat(k.name(), " must be ", describe_allowed(k), ", got ", describe_node(n));
    return {};
  }
  *error = check_value(k, *v);
  return canonical_value(k, *v);
}

// ---- loading ----

// The first problem in reading order: the one the user meets first when reading the file.
class FirstError {
 public:
  void add(const toml::source_region& where, std::string message) {
    auto pos = std::make_pair(where.begin.line, where.begin.column);
    if (message_.empty() || pos < pos_) pos_ = pos, message_ = std::move(message), has_line_ = where.begin.line > 0;
  }
  bool empty() const { return message_.empty(); }
  std::string text(const std::string& path) const {
    return has_line_ ? absl::StrCat(path, ":", pos_.first, ": ", message_) : absl::StrCat(path, ": ", message_);
  }

 private:
  std::pair<toml::source_index, toml::source_index> pos_{};
  std::string message_;
  bool has_line_ = false;
};

// Where each key set by the recipe came from ("FILE:LINE" or "--set k=v"), for cross-key messages.
using Origins = std::map<std::string, std::string>;

// Reads one section; its sub-tables ([model.gla] inside [model]) after its own keys, so that a mixer's
// option set in its table wins over the older flat spelling in [model].
void read_section(const std::string& path, const std::string& section, const toml::table& table, Recipe& recipe,
                  Origins& origins, FirstError& errors) {
  for (bool tables : {false, true}) {
    for (const auto& [key, node] : table) {
      std::string name(key.str());
      const KeySpec* k = find_key(section, name);
      if (node.is_table() != tables) continue;
      if (tables && !k) {
        const std::string sub = section + "." + name;
        if (is_section(sub)) {
          read_section(path, sub, *node.as_table(), recipe, origins, errors);
        } else if (!section_names(section).empty()) {
          errors.add(key.source(), unknown_section_message(sub));
        } else {
          errors.add(key.source(), unknown_key_message(section, name));  // a section without sub-tables
        }
        continue;
      }
      if (!k) {
        errors.add(key.source(), unknown_key_message(section, name));
        continue;
      }
      std::string error;
      Value v = to_value(*k, node, &error);
      if (!error.empty()) {
        errors.add(node.source(), error);
        continue;
      }
      k->set(recipe, v);
      origins[k->name()] = absl::StrCat(path, ":", node.source().begin.line);
    }
  }
}

// Reads the file's sections into `recipe`; returns the first problem's message, or "".
std::string read_file(const std::string& path, const toml::table& root, Recipe& recipe, Origins& origins) {
  FirstError errors;
  for (const auto& [key, node] : root) {
    std::string name(key.str());
    if (!is_section(name)) {
      if (node.is_table()) {
        errors.add(key.source(), unknown_section_message(name));
      } else if (const KeySpec* k = suggest_key("", name)) {
        errors.add(key.source(), absl::StrCat(name, " is outside any section (did you mean ", k->name(), " under [",
                                              k->section, "]?)"));
      } else {
        errors.add(key.source(), absl::StrCat(name, " is outside any section (sections: ", section_names(), ")"));
      }
      continue;
    }
    if (!node.is_table()) {
      errors.add(key.source(), absl::StrCat(name, " must be a section [", name, "], got ", describe_node(node)));
      continue;
    }
    read_section(path, name, *node.as_table(), recipe, origins, errors);
  }
  return errors.empty() ? "" : errors.text(path);
}

// Parses TEXT as a TOML value; nullopt when it is not one.
std::optional<toml::table> parse_toml_value(const std::string& text) {
  try {
    toml::table t = toml::parse("v = " + text);
    if (t.size() == 1 && t.contains("v")) return t;  // not "1\nother = 2"
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

// Applies one "section.key=value" override; returns the message of a problem, or "".
std::string apply_override(const std::string& assignment, Recipe& recipe, Origins& origins) {
  std::string where = "--set " + assignment;
  size_t eq = assignment.find('=');
  std::string name(absl::StripAsciiWhitespace(assignment.substr(0, eq)));
  size_t dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos) {
    std::string hint;
    if (eq != std::string::npos) {
      if (const KeySpec* k = suggest_key("", name)) hint = " (did you mean " + k->name() + "?)";
    }
    return absl::StrCat(where, ": expected section.key=value", hint);
  }
  // The key follows the last dot: model.gla.chunk_size is chunk_size in [model.gla].
  dot = name.rfind('.');
  std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  if (!is_section(section)) return absl::StrCat(where, ": ", unknown_section_message(section));
  const KeySpec* k = find_key(section, key);
  if (!k) return absl::StrCat(where, ": ", unknown_key_message(section, key));

  std::string raw = assignment.substr(eq + 1), error;
  std::optional<toml::table> parsed = parse_toml_value(raw);
  // A list key also takes its elements without brackets (--set eval.seq_len=256,1024), which a shell
  // leaves alone, where [256,1024] is a glob pattern to it.
  if (!parsed && k->type == KeyType::kIntegerList) parsed = parse_toml_value("[" + raw + "]");
  const toml::node* node = parsed ? parsed->get("v") : nullptr;
  Value v;
  const bool takes_text = k->type == KeyType::kString || (k->type == KeyType::kSwitch && !(node && node->is_boolean()));
  if (takes_text && !(node && node->is_string())) {
    // A bare word or path (cosine, data/x.txt, auto) is not TOML; string keys take the text as written.
    v = raw;
    error = check_value(*k, v);
    v = canonical_value(*k, v);
  } else if (!node) {
    error = absl::StrCat(k->name(), " must be ", describe_allowed(*k), ", got ", raw.empty() ? "nothing" : raw);
    // Digits that TOML could not read are an integer too large for it, which "must be an integer" alone
    // would not explain.
    const absl::string_view number = absl::StripAsciiWhitespace(raw);
    absl::string_view digits = number;
    const bool negative = absl::ConsumePrefix(&digits, "-");
    if (!negative) absl::ConsumePrefix(&digits, "+");
    if ((k->type == KeyType::kInteger || k->type == KeyType::kIntegerList) && !digits.empty() &&
        std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
      absl::StrAppend(&error, ", beyond the 64 bits of a TOML integer (", negative ? "at least -2^63" : "at most 2^63 - 1", ")");
    }
  } else {
    v = to_value(*k, *node, &error);
  }
  if (!error.empty()) return absl::StrCat(where, ": ", error);
  k->set(recipe, v);
  origins[k->name()] = where;
  return "";
}

// The cross-key rules; the message starts where the first involved key was set.
std::string check_across_keys(const std::string& path, const Recipe& recipe, const Origins& origins) {
  for (const CrossCheck& c : schema().checks) {
    std::string message = c.violation(recipe);
    if (message.empty()) continue;
    for (const std::string& key : c.keys) {
      auto it = origins.find(key);
      if (it != origins.end()) return absl::StrCat(it->second, ": ", message);
    }
    return absl::StrCat(path, ": ", message);
  }
  return "";
}

// Messages are one line whatever the input held.
absl::Status invalid(std::string message) {
  return absl::InvalidArgumentError(absl::StrReplaceAll(message, {{"\r", " "}, {"\n", " "}}));
}

}  // namespace

Recipe::Recipe() {
  for (const KeySpec& k : schema().keys) {
    if (!k.older_spelling) k.set(*this, k.default_value);
  }
}

namespace {

// What the model asks of its mixers against what each declares (MixerTraits): sequence parallelism under
// parallel.sp > 1. One message naming the key, the mixer and what it lacks; "" when all is well.
std::string check_mixer_traits(const std::string& path, const Recipe& r, const Origins& origins) {
  auto where = [&](const char* key) {
    auto it = origins.find(key);
    return it != origins.end() ? it->second : path;
  };
  const absl::StatusOr<std::vector<BlockSpec>> blocks = block_pattern(r.model);
  if (!blocks.ok()) return "";  // reported with the blocks
  for (const BlockSpec& b : *blocks) {
    const MixerSpec& spec = mixer_spec(b.mixer);
    if (r.model.arch != "decoder" && !spec.traits.bidirectional) {
      const char* key = origins.count("model.pattern") ? "model.pattern" : "model.mixer";
      return absl::StrCat(where(key), ": model.arch = \"", r.model.arch, "\" needs bidirectional blocks, but mixer '",
                          spec.name, "' is causal only (attention is bidirectional)");
    }
    if (r.parallel.sp > 1 && !spec.traits.sequence_parallel) {
      return absl::StrCat(where("parallel.sp"), ": parallel.sp = ", r.parallel.sp, " needs every block to run sequence-",
                          "parallel, but mixer '", spec.name, "' has no sequence-parallel form; use parallel.sp = 1");
    }
  }
  return "";
}

// load_recipe and load_recipe_text past the TOML syntax: the schema, the overrides, the blocks, the rules
// between keys. `path` names the recipe in messages.
absl::StatusOr<Recipe> load_parsed_recipe(const toml::table& root, const std::string& path,
                                          const std::vector<std::string>& overrides) {
  Recipe recipe;
  recipe.name = fs::path(path).stem().string();
  recipe.source_path = path;
  Origins origins;
  if (std::string error = read_file(path, root, recipe, origins); !error.empty()) return invalid(error);
  for (const std::string& assignment : overrides) {
    if (std::string error = apply_override(assignment, recipe, origins); !error.empty()) return invalid(error);
  }
  // The blocks: "auto" settings resolved from the model's mixers, the pattern checked against n_layers.
  absl::Status blocks = resolve_conventions(recipe.model);
  if (blocks.ok()) blocks = block_pattern(recipe.model).status();
  if (!blocks.ok()) {
    std::string where = path;
    for (const char* key : {"model.pattern", "model.n_layers", "model.mixer"}) {
      if (auto it = origins.find(key); it != origins.end()) {
        where = it->second;
        break;
      }
    }
    return invalid(absl::StrCat(where, ": ", blocks.message()));
  }
  if (std::string error = check_across_keys(path, recipe, origins); !error.empty()) return invalid(error);
  if (std::string error = check_mixer_traits(path, recipe, origins); !error.empty()) return invalid(error);
  return recipe;
}

absl::Status toml_syntax_error(const std::string& path, const toml::parse_error& e) {
  return invalid(absl::StrCat(path, ":", e.source().begin.line, ":", e.source().begin.column,
                              ": TOML syntax error: ", std::string(e.description())));
}

}  // namespace

absl::StatusOr<Recipe> load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return absl::NotFoundError("recipe not found: " + path);
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return toml_syntax_error(path, e);
  }
  return load_parsed_recipe(root, path, overrides);
}

absl::StatusOr<Recipe> load_recipe_text(const std::string& text, const std::string& path,
                                        const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return toml_syntax_error(path, e);
  }
  return load_parsed_recipe(root, path, overrides);
}

std::string resolved_recipe_name(const std::string& text) {
  // The first line as resolved_recipe_toml writes it: # Recipe "NAME" resolved[ from SOURCE]: ...
  const std::string head = "# Recipe \"";
  if (text.rfind(head, 0) != 0) return "";
  const size_t end = text.find("\" resolved", head.size());
  if (end == std::string::npos || text.find('\n') < end) return "";
  return text.substr(head.size(), end - head.size());
}

std::string resolved_recipe_toml(const Recipe& recipe) {
  // The run directory is written out, so a copy of this file loaded from elsewhere (where its stem
  // differs) still writes to the same place.
  Recipe r = recipe;
  r.log.out_dir = recipe.run_dir();
  std::string out = absl::StrCat("# Recipe \"", r.name, "\" resolved", r.source_path.empty() ? "" : " from " + r.source_path,
                                 ": every key with its final value.\n",
                                 "# Loading this file again reproduces the run; docs/recipes.md describes each key.\n");
  // The options of the mixers the model uses (all of them if the pattern does not parse).
  std::set<std::string> used;
  if (auto items = pattern_blocks(r.model.pattern.empty() ? r.model.mixer : r.model.pattern, FfnKind::none); items.ok()) {
    for (const BlockSpec& b : *items) used.insert(b.mixer);
  } else {
    for (const MixerSpec* m : registered_mixers()) used.insert(m->name);
  }
  // Zamba's shared block is an attention block: its options are read too.
  if (r.model.shared_attention_every > 0) used.insert("attention");
  // The MoE options where a block's FFN is moe.
  bool moe = false;
  if (auto blocks = block_pattern(r.model); blocks.ok()) {
    for (const BlockSpec& b : *blocks) moe = moe || b.ffn == FfnKind::moe;
  }
  for (const SectionSpec& section : schema().sections) {
    if (!section.mixer.empty() && !used.count(section.mixer)) continue;
    if (section.ffn == "moe" && !moe) continue;
    std::vector<std::pair<std::string, std::string>> lines;  // (key = value, doc)
    size_t width = 0;
    for (const KeySpec& k : schema().keys) {
      if (k.section != section.name || k.older_spelling) continue;
      lines.emplace_back(k.key + " = " + format_value(k.get(r)), k.doc);
      width = std::max(width, lines.back().first.size());
    }
    absl::StrAppend(&out, "\n[", section.name, "]\n");
    for (const auto& [assignment, doc] : lines) {
      absl::StrAppend(&out, assignment, std::string(width - assignment.size(), ' '), "  # ", doc, "\n");
    }
  }
  return out;
}

std::string toml_number(double x) { return format_number(x); }

std::vector<std::pair<std::string, std::string>> recipe_values(const Recipe& recipe) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const KeySpec& k : schema().keys) {
    if (k.older_spelling) continue;
    // log.out_dir as the run directory it names ("" and "runs/<name>" are the same folder).
    out.emplace_back(k.name(), k.name() == "log.out_dir" ? quote(recipe.run_dir()) : format_value(k.get(recipe)));
  }
  return out;
}

std::vector<RecipeDifference> recipe_differences(const Recipe& a, const Recipe& b,
                                                 const std::vector<std::string>& ignored) {
  const std::vector<std::pair<std::string, std::string>> va = recipe_values(a), vb = recipe_values(b);
  std::vector<RecipeDifference> out;
  for (size_t i = 0; i < va.size(); ++i) {
    if (va[i].second == vb[i].second) continue;
    if (std::find(ignored.begin(), ignored.end(), va[i].first) != ignored.end()) continue;
    out.push_back({va[i].first, va[i].second, vb[i].second});
  }
  return out;
}

absl::Status write_resolved_recipe(const Recipe& recipe, const std::string& dir) {
  return cli::write_file_atomically((fs::path(dir) / "recipe.toml").string(), resolved_recipe_toml(recipe));
}

std::string recipe_reference_markdown() {
  std::string out =
      "# Recipes\n"
      "\n"
      "<!-- Generated from the schema in src/train/recipe/recipe.cpp by `seqlab recipe --doc`; a test keeps them equal. -->\n"
      "\n"
      "A recipe is one TOML file that describes a run: the model, the data, the step loop, the optimizer,\n"
      "parallelism, logging and checkpoints, one section each. Every key is optional and takes the default\n"
      "below when absent, so a recipe holds only what differs; `recipes/gpt_small.toml` is an example.\n"
      "Integers are accepted where a number is expected.\n"
      "\n"
      "The model is a stack of blocks, each a token mixer and a feed-forward network (FFN): `model.mixer`\n"
      "puts one mixer in every block, `model.pattern` lists them per layer (a hybrid: `pattern = \"gla*3\n"
      "attention\"`). Each mixer's own options sit in a sub-table named after it, `[model.gla]`, read only\n"
      "when a block uses that mixer; `recipes/hybrid_small.toml` is an example. `model.norm`, `model.mlp`,\n"
      "`model.bias` and `model.positions` default to `\"auto\"`: GPT-2's choices when every block is\n"
      "attention, the recurrent models' otherwise; the resolved recipe shows what they became.\n"
      "\n"
      "`--set section.key=value` (repeatable, applied in order after the file) overrides any key:\n"
      "`./train recipes/gpt_small.toml --set optim.lr=3e-4 --set optim.schedule=linear`, or\n"
      "`--set model.gla.chunk_size=32` for a key of a sub-table. The value is read\n"
      "as a TOML value (`3e-4`, `true`, `\"a b\"`, `[256, 1024]`); for a string key, text that is not a TOML\n"
      "string is taken as written, so `--set data.path=corpus/books` needs no quotes, and a list key takes its\n"
      "elements without brackets too, `--set eval.seq_len=256,1024` (a shell reads `[...]` as a pattern).\n"
      "\n"
      "Every key is checked before anything runs. An unknown section or key (with a did-you-mean for near\n"
      "misses, across sections too), a value of the wrong type, out of range or not among the choices, or a\n"
      "broken rule between keys ends the run with exit code 2 and one line that names the file and line (or\n"
      "the override), the key and what it allows:\n"
      "\n"
      "```\n"
      "recipes/x.toml:7: train.steps must be an integer ≥ 1, got a string \"ten\"\n"
      "recipes/x.toml:3: unknown key train.step (did you mean train.steps?)\n"
      "--set optim.schedule=cosin: optim.schedule must be one of \"cosine\", \"linear\", \"constant\", "
      "got \"cosin\" (did you mean \"cosine\"?)\n"
      "```\n"
      "\n"
      "`seqlab recipe check FILE [--set section.key=value]...` validates a recipe and prints it resolved:\n"
      "every key with its final value and its meaning as a comment. The trainer writes the same text into\n"
      "the run directory as `recipe.toml`; loading that file again reproduces the run.\n";
  auto cell = [](const std::string& s) { return absl::StrReplaceAll(s, {{"|", "\\|"}}); };
  for (const SectionSpec& section : schema().sections) {
    absl::StrAppend(&out, "\n## [", section.name, "]\n\n", section.doc, "\n\n",
                    "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
    for (const KeySpec& k : schema().keys) {
      if (k.section != section.name || k.older_spelling) continue;
      std::string allowed;
      if (k.type == KeyType::kBoolean) {
        allowed = "true, false";
      } else if (k.type == KeyType::kSwitch) {
        allowed = "true, false, `\"auto\"`";
      } else if (k.type == KeyType::kIntegerList) {
        allowed = describe_bounds(k.bounds);
        allowed = allowed.empty() ? "any" : "each " + allowed;
      } else if (k.type == KeyType::kString) {
        std::vector<std::string> choices;
        for (const std::string& c : k.choices) choices.push_back("`" + quote(c) + "`");
        allowed = choices.empty() ? "any text" : absl::StrJoin(choices, ", ");
      } else {
        allowed = describe_bounds(k.bounds);
        if (allowed.empty()) allowed = "any";
        if (allowed.rfind("in ", 0) == 0) allowed = allowed.substr(3);  // a bare interval in a table
      }
      absl::StrAppend(&out, "| `", k.key, "` | ", type_name(k.type), " | `", cell(format_value(k.default_value)),
                      "` | ", cell(allowed), " | ", cell(k.doc), " |\n");
    }
  }
  absl::StrAppend(&out, "\n## Rules between keys\n\n");
  for (const CrossCheck& c : schema().checks) absl::StrAppend(&out, "- ", c.rule, "\n");
  absl::StrAppend(&out,
                  "\n## Older spellings\n\n"
                  "Recipes written for earlier versions of seqlab keep working: these keys and values are read as\n"
                  "their current form and never written into a resolved recipe. A recipe that sets a mixer option in\n"
                  "[model] keeps the meaning it had then: a model of recurrent blocks takes the recurrent models'\n"
                  "conventions (rmsnorm, swiglu, no biases, no positions) whatever model.norm, model.mlp, model.bias\n"
                  "and model.positions say.\n\n"
                  "| older | now |\n|---|---|\n");
  for (const KeySpec& k : schema().keys) {
    if (k.older_spelling) absl::StrAppend(&out, "| `", k.name(), "` | ", cell(k.doc), " |\n");
    for (const auto& [old_value, value] : k.value_aliases) {
      absl::StrAppend(&out, "| `", k.name(), " = ", quote(old_value), "` | `", k.name(), " = ", quote(value), "` |\n");
    }
  }
  for (const SectionSpec& section : schema().sections) {
    for (const std::string& a : section.aliases) absl::StrAppend(&out, "| `[", a, "]` | `[", section.name, "]` |\n");
  }
  return out;
}

}  // namespace seqlab
