// Token mixers and the registry that makes them trainable from a recipe.
//
// A mixer maps the normalised residual stream x [B, T, C] to [B, T, C] by mixing information across
// positions: softmax attention (attention/attention_mixer.cpp) or a recurrence (gla, retention,
// linear_attention, delta_net, gated_delta_net, in their family folders). A block of the decoder
// (model/decoder.h) is one mixer and one feed-forward network, so a hybrid is a list of mixer names.
//
// Each mixer registers itself, from its own file, with a MixerSpec: its name (the recipe value
// `model.mixer = "gla"`, the op's room and doc page), older names it still answers to, its options
// (the keys of its recipe sub-table [model.gla], with types, defaults, ranges and docs: the recipe
// loader validates them and docs/recipes.md lists them from this same table) and a factory. Adding a
// mixer therefore touches its room, its tests and its recipe; nothing central.
//
// The contract (docs/design.md "The mixer contract"): a mixer is given one MixerInput — the stream,
// causal or bidirectional, per-sequence lengths (padding), and optionally a memory to attend to (an
// encoder's output, for cross attention) and an additive score bias (T5's relative positions) — and
// returns [B, T, C]. What it can do is declared in its spec's MixerTraits (bidirectional, sequence
// parallelism, cross attention, a score bias), which the recipe loader checks a model against and the
// all-mixer tests read; an input it cannot take is refused with std::invalid_argument naming the mixer.
//
// Training runs a mixer from a zero state (MixerState* null). Decoding passes the state the mixer made
// with new_state(), a type of its own (attention its keys and values, a recurrence its matrix state
// and conv tail, ...), which it continues and replaces: the recurrent form for one token, the chunkwise
// form with an initial state for a prompt (the forms are equal). The state counts its own size, which
// tests/mixer_test.cc checks against the spec's state_size.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "layers/module.h"
#include "tensor/tensor.h"

namespace seqlab {

// How the model knows token order: an absolute embedding added to the input (learned, or the fixed
// sinusoids of the Transformer paper), rotary embedding of every attention layer's queries and keys,
// T5's learned relative bias on attention scores (one table per stack, given to the mixers as
// MixerInput::bias), or nothing (causal attention and recurrences order the tokens themselves).
enum class PositionKind { learned, rope, none, sinusoidal, relative };

// What every mixer of a model shares: the model's own sizes and settings.
struct MixerContext {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;   // key/value heads of attention (grouped-query attention); = n_heads for MHA
  PositionKind positions = PositionKind::none;
  double rope_base = 10000;  // θ_i = rope_base^(−2i/D) with positions = rope
  bool bias = false;         // biases in attention's projections (GPT-2)
  double norm_eps = 1e-5;
  double init_std = 0.02;    // standard deviation of the initial weights
  // A cross-attention layer (MixerTraits::cross_attention): queries from the stream, keys and values
  // from MixerInput::memory, of width memory_dim (0: d_model).
  bool cross = false;
  int64_t memory_dim = 0;
};

// ---- a mixer's own options: the keys of its recipe sub-table ----

using OptionValue = std::variant<int64_t, double, bool, std::string>;
enum class OptionType { integer, number, boolean, text };

struct OptionSpec {
  std::string key;
  OptionType type = OptionType::integer;
  OptionValue default_value;
  double min = -HUGE_VAL, max = HUGE_VAL;  // integer and number options: the allowed interval
  bool min_open = false, max_open = false;
  std::vector<std::string> choices;  // text options: the allowed values (empty: any text)
  std::string doc;

  static OptionSpec integer(std::string key, int64_t def, int64_t min, std::string doc);
  static OptionSpec number(std::string key, double def, double min, bool min_open, std::string doc);
  static OptionSpec choice(std::string key, std::vector<std::string> choices, std::string doc);  // first: default
};

// The value of every option of one mixer: its spec's defaults, overridden by a recipe.
class MixerOptions {
 public:
  MixerOptions() = default;
  explicit MixerOptions(const std::vector<OptionSpec>& specs);  // the defaults
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  // Sets an option the spec has, with a value of its type; throws std::invalid_argument otherwise.
  void set(const std::string& key, const OptionValue& value);
  const std::map<std::string, OptionValue>& values() const { return values_; }
  bool operator==(const MixerOptions& o) const { return values_ == o.values_; }

 private:
  const OptionValue& at(const std::string& key) const;
  std::map<std::string, OptionValue> values_;
};

// ---- the mixer ----

// What a mixer is given. Fields a caller does not set stay undefined.
struct MixerInput {
  Tensor x;              // [B, T, C] the normalised residual stream
  bool causal = true;    // token t sees tokens ≤ t (a decoder); false: its whole row (an encoder)
  Tensor lengths;        // [B] i32/i64 valid tokens per row, the rest padding; undefined: all valid. Causal
                         // mixers may ignore it: right padding never reaches a valid token.
  Tensor memory;         // [B, S, C] what a cross-attention layer attends to (the encoder's output)
  Tensor memory_lengths; // [B] valid memory tokens per row; undefined: all valid
  Tensor bias;           // [1 or B, H, T, S] additive bias of attention scores (T5's relative positions),
                         // S the keys seen (with a cache: cached + new); undefined: none
};

// Everything a mixer carries from one decoding call to the next. Each mixer derives its own (made by
// Mixer::new_state()); the model sets `position` before each call.
struct MixerState {
  virtual ~MixerState() = default;
  int64_t position = 0;  // tokens seen before this call
  // The elements of state it holds per sequence now (MixerSpec::state_size predicts it).
  virtual double size() const = 0;
};

// Σ over the defined tensors of their elements per sequence (numel / their first dim, the batch): the
// size() of a state made of tensors [B, ...].
double elements_per_sequence(std::initializer_list<const Tensor*> parts);

class Mixer : public Module {
 public:
  // in.x [B, T, C] holds the tokens at positions p … p+T−1, p = state->position (0 without a state) →
  // [B, T, C]. `state` null in training; when decoding, a state of new_state(), continued and replaced.
  virtual Tensor forward(const MixerInput& in, MixerState* state) const = 0;
  // An empty decoding state of this mixer's own type.
  virtual std::unique_ptr<MixerState> new_state() const = 0;
};

// The state of `mixer`'s type S, or null when `state` is null; throws std::logic_error for another type.
template <class S>
S* state_of(MixerState* state, const char* mixer) {
  if (state == nullptr) return nullptr;
  S* s = dynamic_cast<S*>(state);
  if (s == nullptr) throw std::logic_error(std::string(mixer) + ": given another mixer's decoding state");
  return s;
}

// What a mixer can do, declared in its spec: the recipe loader refuses a model that asks for more (one
// line naming the mixer), and the all-mixer tests run each mixer on exactly what it declares.
struct MixerTraits {
  // Carries a fixed-size state (a recurrence): decoding a token costs the same at any position and
  // the context is unbounded. Softmax attention keeps a cache that grows with the context instead.
  bool recurrent = true;
  bool bidirectional = false;      // runs with causal = false (an encoder's blocks)
  bool sequence_parallel = true;   // runs under a SequenceGroup (parallel.sp > 1)
  bool cross_attention = false;    // made with MixerContext::cross, attends to in.memory
  bool score_bias = false;         // takes in.bias (T5's relative positions)
};

// Refuses what a mixer's traits say it cannot take: causal = false without `bidirectional`, a memory
// without `cross_attention`, a bias without `score_bias` (std::invalid_argument naming the mixer).
void check_mixer_input(const MixerInput& in, const std::string& mixer, const MixerTraits& traits);

struct MixerSpec {
  std::string name;                  // recipe value, op room and doc page: "gla"
  std::vector<std::string> aliases;  // older recipe values it still answers to ("retnet")
  std::string summary;               // one line for docs/recipes.md
  std::string doc;                   // its page: "docs/variants/gla.md"
  MixerTraits traits;
  std::vector<OptionSpec> options;
  // Throws std::invalid_argument for sizes it cannot take (heads not dividing d_model, ...). Draws its
  // initial weights from `gen`, in a fixed order.
  std::function<std::unique_ptr<Mixer>(const MixerContext&, const MixerOptions&, Generator&)> make;
  // FLOPs per token of one layer's token mixing that 6·N (forward and backward through every weight)
  // does not count, for sequences of seq_len tokens: the MFU estimate's second term.
  std::function<double(const MixerContext&, const MixerOptions&, int64_t seq_len)> mixing_flops_per_token;
  // The number of weights `make` creates for these settings, counted without creating them (a double:
  // a recipe's sizes may be absurd, and the count is what lets the loader refuse them before anything
  // is allocated). tests/mixer_test.cc checks it against the built mixer of every registered mixer.
  std::function<double(const MixerContext&, const MixerOptions&)> parameter_count;
  // The elements of state one layer carries per sequence from token to token when decoding, after seq_len
  // tokens: a recurrence's fixed state (H·dk·dv, and whatever else it keeps), attention's KV cache
  // (2·seq_len·Hk·D). What the sweeps plot accuracy against (docs/scaling.md).
  std::function<double(const MixerContext&, const MixerOptions&, int64_t seq_len)> state_size;
};

// Adds a mixer; throws std::logic_error when its name or an alias is taken.
void register_mixer(MixerSpec spec);
// The spec of a name or alias, or nullptr.
const MixerSpec* find_mixer(const std::string& name);
// The spec of a name or alias; throws std::invalid_argument naming the registered mixers.
const MixerSpec& mixer_spec(const std::string& name);
// Every registered mixer, by name.
std::vector<const MixerSpec*> registered_mixers();
// "attention, delta_net, gla, ..." (for messages).
std::string mixer_names();

// ---- pieces the mixers share ----

// d_model / n_heads; throws std::invalid_argument naming `mixer` when the heads do not divide d_model.
int64_t head_dim(const MixerContext& ctx, const std::string& mixer);
// The chunk_size option of the chunkwise training forms.
OptionSpec chunk_size_option();
// The decoding state of a recurrence that carries one dk×dv matrix per head and nothing else (GLA,
// retention): state [B, H, dk, dv].
struct MatrixState : MixerState {
  Tensor state;
  double size() const override { return elements_per_sequence({&state}); }
};
// The state of a recurrence with one dk×dv matrix per head (dk = dv = d/H): H·(d/H)² elements.
double matrix_state_size(const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len);
// FLOPs per token of one layer of a chunkwise linear recurrence with matrix state, beyond 6·N: causal
// attention within a chunk of C = min(chunk, seq_len) tokens (6·C·d, as softmax attention's 6·T·d)
// plus reading and writing the d/H × d/H state of every head (q S and kᵀv: 4·d·(d/H) forward), ×3
// for forward and backward.
double chunkwise_recurrence_flops(const MixerContext& ctx, int64_t chunk, int64_t seq_len);

// A static MixerRegistration in a mixer's own file registers it when the library loads.
struct MixerRegistration {
  explicit MixerRegistration(MixerSpec spec) { register_mixer(std::move(spec)); }
};

}  // namespace seqlab
