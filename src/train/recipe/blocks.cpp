// Parsing model.pattern and resolving the "auto" block settings (blocks.h).
#include "train/recipe/blocks.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <optional>

#include "train/recipe/edit_distance.h"

namespace seqlab {

std::vector<std::string> mixer_choices() {
  // The first choice is the default: GPT's softmax attention.
  std::vector<std::string> names = {"attention"};
  for (const MixerSpec* m : registered_mixers()) {
    if (m->name != "attention") names.push_back(m->name);
  }
  return names;
}

std::map<std::string, std::string> mixer_value_aliases() {
  std::map<std::string, std::string> aliases;
  for (const MixerSpec* m : registered_mixers()) {
    for (const std::string& a : m->aliases) aliases[a] = m->name;
  }
  return aliases;
}

namespace {

std::optional<FfnKind> parse_ffn(const std::string& name) {
  if (name == "gelu") return FfnKind::gelu;
  if (name == "swiglu") return FfnKind::swiglu;
  if (name == "none") return FfnKind::none;
  if (name == "relu") return FfnKind::relu;
  if (name == "geglu") return FfnKind::geglu;
  if (name == "moe") return FfnKind::moe;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<BlockSpec>> pattern_blocks(const std::string& pattern, FfnKind default_ffn) {
  std::vector<BlockSpec> out;
  for (absl::string_view item : absl::StrSplit(pattern, absl::ByAnyChar(" ,\t"), absl::SkipEmpty())) {
    std::string text(item), mixer = text;
    int64_t repeats = 1;
    FfnKind ffn = default_ffn;
    if (size_t star = mixer.find('*'); star != std::string::npos) {
      if (!absl::SimpleAtoi(mixer.substr(star + 1), &repeats) || repeats < 1 || repeats > 100000) {
        return absl::InvalidArgumentError(absl::StrCat("model.pattern: \"", text, "\" must end in *N with N ≥ 1"));
      }
      mixer = mixer.substr(0, star);
    }
    if (size_t colon = mixer.find(':'); colon != std::string::npos) {
      const std::string name = mixer.substr(colon + 1);
      std::optional<FfnKind> kind = parse_ffn(name);
      if (!kind) {
        return absl::InvalidArgumentError(absl::StrCat("model.pattern: \"", text, "\" names the FFN \"", name,
                                                       "\"; the FFNs are gelu, swiglu, relu, geglu, moe, none"));
      }
      ffn = *kind;
      mixer = mixer.substr(0, colon);
    }
    const MixerSpec* spec = find_mixer(mixer);
    if (spec == nullptr) {
      std::vector<std::string> candidates = mixer_choices();
      for (const auto& [old_name, name] : mixer_value_aliases()) candidates.push_back(old_name);
      std::string hint = nearest(mixer, candidates);
      if (const MixerSpec* near_spec = find_mixer(hint)) hint = near_spec->name;
      return absl::InvalidArgumentError(absl::StrCat("model.pattern: unknown mixer \"", mixer, "\" in \"", text, "\"",
                                                     hint.empty() ? "" : " (did you mean \"" + hint + "\"?)",
                                                     "; mixers: ", mixer_names()));
    }
    for (int64_t i = 0; i < repeats; ++i) out.push_back({spec->name, ffn});
  }
  return out;
}

absl::Status resolve_conventions(RecipeModel& m) {
  absl::StatusOr<std::vector<BlockSpec>> items = pattern_blocks(m.pattern.empty() ? m.mixer : m.pattern, FfnKind::none);
  if (!items.ok()) return items.status();
  std::vector<std::string> mixers;
  for (const BlockSpec& b : *items) mixers.push_back(b.mixer);
  const ModelKind kind = m.arch == "encoder"           ? ModelKind::encoder
                         : m.arch == "encoder_decoder" ? ModelKind::encoder_decoder
                                                       : ModelKind::decoder;
  const ModelConventions c = model_conventions(kind, mixers);
  const bool recurrent = kind == ModelKind::decoder && c.positions == PositionKind::none && c.norm == NormKind::rms_norm;
  const bool keep_old_meaning = m.flat_mixer_keys && recurrent;
  if (m.norm == "auto" || keep_old_meaning) m.norm = c.norm == NormKind::layer_norm ? "layernorm" : "rmsnorm";
  if (m.mlp == "auto" || keep_old_meaning) m.mlp = ffn_kind_name(c.ffn);
  if (m.positions == "auto" || keep_old_meaning) m.positions = position_kind_name(c.positions);
  if (!m.bias || keep_old_meaning) m.bias = c.bias;
  if (m.norm_placement == "auto") m.norm_placement = c.placement == NormPlacement::post ? "post" : "pre";
  return absl::OkStatus();
}

const std::vector<std::string>& convention_keys() {
  static const std::vector<std::string> keys = {"model.mlp", "model.norm", "model.positions", "model.bias",
                                                "model.norm_placement"};
  return keys;
}

const char* position_kind_name(PositionKind kind) {
  switch (kind) {
    case PositionKind::learned: return "learned";
    case PositionKind::rope: return "rope";
    case PositionKind::none: return "none";
    case PositionKind::sinusoidal: return "sinusoidal";
    case PositionKind::relative: return "relative";
  }
  return "";
}

absl::StatusOr<std::vector<BlockSpec>> block_pattern(const RecipeModel& m) {
  std::optional<FfnKind> ffn = parse_ffn(m.mlp);
  if (!ffn) return absl::InvalidArgumentError("model.mlp = \"" + m.mlp + "\" is not resolved to an FFN");
  absl::StatusOr<std::vector<BlockSpec>> items = pattern_blocks(m.pattern.empty() ? m.mixer : m.pattern, *ffn);
  if (!items.ok()) return items.status();
  if (items->empty()) return absl::InvalidArgumentError("model.pattern names no block");
  const int64_t period = static_cast<int64_t>(items->size());
  if (m.n_layers % period != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.pattern has ", period, " blocks, which do not divide model.n_layers = ",
                                                   m.n_layers, " (a pattern repeats to fill n_layers)"));
  }
  std::vector<BlockSpec> blocks;
  for (int64_t i = 0; i < m.n_layers; ++i) blocks.push_back((*items)[static_cast<size_t>(i % period)]);
  return blocks;
}

}  // namespace seqlab
