#include "layers/mixer.h"

#include <algorithm>
#include <stdexcept>

namespace seqlab {

// ---- options ----

OptionSpec OptionSpec::integer(std::string key, int64_t def, int64_t min, std::string doc) {
  OptionSpec s;
  s.key = std::move(key);
  s.type = OptionType::integer;
  s.default_value = def;
  s.min = static_cast<double>(min);
  s.doc = std::move(doc);
  return s;
}

OptionSpec OptionSpec::number(std::string key, double def, double min, bool min_open, std::string doc) {
  OptionSpec s;
  s.key = std::move(key);
  s.type = OptionType::number;
  s.default_value = def;
  s.min = min;
  s.min_open = min_open;
  s.doc = std::move(doc);
  return s;
}

OptionSpec OptionSpec::choice(std::string key, std::vector<std::string> choices, std::string doc) {
  OptionSpec s;
  s.key = std::move(key);
  s.type = OptionType::text;
  s.default_value = choices.front();
  s.choices = std::move(choices);
  s.doc = std::move(doc);
  return s;
}

MixerOptions::MixerOptions(const std::vector<OptionSpec>& specs) {
  for (const OptionSpec& s : specs) values_[s.key] = s.default_value;
}

const OptionValue& MixerOptions::at(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw std::logic_error("mixer option '" + key + "' is not in the mixer's spec");
  return it->second;
}

int64_t MixerOptions::integer(const std::string& key) const { return std::get<int64_t>(at(key)); }
double MixerOptions::number(const std::string& key) const { return std::get<double>(at(key)); }
bool MixerOptions::boolean(const std::string& key) const { return std::get<bool>(at(key)); }
const std::string& MixerOptions::text(const std::string& key) const { return std::get<std::string>(at(key)); }

void MixerOptions::set(const std::string& key, const OptionValue& value) {
  auto it = values_.find(key);
  if (it == values_.end()) throw std::invalid_argument("no mixer option '" + key + "'");
  if (it->second.index() != value.index()) throw std::invalid_argument("mixer option '" + key + "' has another type");
  it->second = value;
}

// ---- the contract ----

double elements_per_sequence(std::initializer_list<const Tensor*> parts) {
  double n = 0;
  for (const Tensor* t : parts) {
    if (t != nullptr && t->defined()) n += static_cast<double>(t->numel()) / static_cast<double>(t->size(0));
  }
  return n;
}

void check_mixer_input(const MixerInput& in, const std::string& mixer, const MixerTraits& traits) {
  if (!in.x.defined() || in.x.dim() != 3) {
    throw std::invalid_argument(mixer + ": the input must be [B, T, C], got " +
                                (in.x.defined() ? shape_str(in.x.shape()) : std::string("nothing")));
  }
  if (!in.causal && !traits.bidirectional) {
    throw std::invalid_argument(mixer + " is causal only: it cannot mix a row in both directions (an encoder's "
                                        "blocks need a bidirectional mixer such as attention)");
  }
  if (in.memory.defined() && !traits.cross_attention) {
    throw std::invalid_argument(mixer + " cannot attend to a memory (no cross attention)");
  }
  if (in.bias.defined() && !traits.score_bias) {
    throw std::invalid_argument(mixer + " has no attention scores to add a bias to (relative position bias)");
  }
}

// ---- pieces the mixers share ----

int64_t head_dim(const MixerContext& ctx, const std::string& mixer) {
  if (ctx.d_model <= 0 || ctx.n_heads <= 0) throw std::invalid_argument(mixer + ": d_model and n_heads must be positive");
  if (ctx.d_model % ctx.n_heads != 0) {
    throw std::invalid_argument(mixer + ": d_model " + std::to_string(ctx.d_model) + " not divisible by n_heads " +
                                std::to_string(ctx.n_heads));
  }
  return ctx.d_model / ctx.n_heads;
}

OptionSpec chunk_size_option() {
  return OptionSpec::integer("chunk_size", 64, 1, "tokens per chunk of the chunkwise training form");
}

double matrix_state_size(const MixerContext& ctx, const MixerOptions&, int64_t) {
  const double d = static_cast<double>(ctx.d_model), head = d / static_cast<double>(ctx.n_heads);
  return d * head;
}

double chunkwise_recurrence_flops(const MixerContext& ctx, int64_t chunk, int64_t seq_len) {
  const double d = static_cast<double>(ctx.d_model), head = d / static_cast<double>(ctx.n_heads);
  const double c = static_cast<double>(std::min(chunk, seq_len));
  return 6.0 * c * d + 12.0 * d * head;
}

// ---- the registry ----

namespace {

struct Registry {
  std::map<std::string, MixerSpec> specs;       // by name
  std::map<std::string, std::string> by_alias;  // alias → name
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_mixer(MixerSpec spec) {
  Registry& r = registry();
  if (!spec.make || !spec.mixing_flops_per_token || !spec.parameter_count) {
    throw std::logic_error("mixer '" + spec.name + "' is registered without a factory, a FLOP count or a parameter count");
  }
  for (const std::string& name : [&] {
         std::vector<std::string> all = spec.aliases;
         all.push_back(spec.name);
         return all;
       }()) {
    if (r.specs.count(name) || r.by_alias.count(name)) {
      throw std::logic_error("mixer name '" + name + "' is registered twice");
    }
  }
  for (const std::string& alias : spec.aliases) r.by_alias[alias] = spec.name;
  const std::string name = spec.name;
  r.specs.emplace(name, std::move(spec));
}

const MixerSpec* find_mixer(const std::string& name) {
  const Registry& r = registry();
  auto alias = r.by_alias.find(name);
  auto it = r.specs.find(alias != r.by_alias.end() ? alias->second : name);
  return it == r.specs.end() ? nullptr : &it->second;
}

const MixerSpec& mixer_spec(const std::string& name) {
  const MixerSpec* spec = find_mixer(name);
  if (spec == nullptr) throw std::invalid_argument("unknown mixer '" + name + "' (mixers: " + mixer_names() + ")");
  return *spec;
}

std::vector<const MixerSpec*> registered_mixers() {
  std::vector<const MixerSpec*> out;
  for (const auto& [name, spec] : registry().specs) out.push_back(&spec);
  return out;
}

std::string mixer_names() {
  std::string out;
  for (const MixerSpec* s : registered_mixers()) out += (out.empty() ? "" : ", ") + s->name;
  return out;
}

}  // namespace seqlab
