#include "layers/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "autograd/ops.h"
#include "layers/sequence_parallel.h"

namespace seqlab {
namespace {

DecoderConfig resolved(DecoderConfig cfg) {
  if (cfg.n_kv_heads == 0) cfg.n_kv_heads = cfg.n_heads;
  if (cfg.vocab_size <= 0 || cfg.d_model <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.d_ff < 0 ||
      cfg.max_seq_len < 0) {
    throw std::invalid_argument("decoder: sizes must be positive");
  }
  if (cfg.d_model % cfg.n_heads != 0) {
    throw std::invalid_argument("decoder: d_model " + std::to_string(cfg.d_model) + " not divisible by n_heads " +
                                std::to_string(cfg.n_heads));
  }
  if (!(cfg.dropout >= 0 && cfg.dropout < 1)) {
    throw std::invalid_argument("decoder: dropout must be in [0, 1), got " + std::to_string(cfg.dropout));
  }
  for (const BlockSpec& b : cfg.blocks) mixer_spec(b.mixer);  // throws naming the registered mixers
  return cfg;
}

// What every mixer of the model shares, from a resolved configuration.
MixerContext mixer_context_of(const DecoderConfig& cfg) {
  MixerContext ctx;
  ctx.d_model = cfg.d_model;
  ctx.n_heads = cfg.n_heads;
  ctx.n_kv_heads = cfg.n_kv_heads;
  ctx.positions = cfg.positions;
  ctx.rope_base = cfg.rope_base;
  ctx.bias = cfg.bias;
  ctx.norm_eps = cfg.norm_eps;
  ctx.init_std = cfg.init_std;
  return ctx;
}

// The options of `spec` in the configuration (its defaults where the configuration has none).
MixerOptions options_of(const DecoderConfig& cfg, const MixerSpec& spec) {
  auto options = cfg.mixer_options.find(spec.name);
  return options != cfg.mixer_options.end() ? options->second : MixerOptions(spec.options);
}

}  // namespace

const char* ffn_kind_name(FfnKind kind) {
  switch (kind) {
    case FfnKind::gelu: return "gelu";
    case FfnKind::swiglu: return "swiglu";
    case FfnKind::none: return "none";
  }
  return "";
}

DecoderConfig gpt2_config(int64_t vocab_size, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t max_seq_len) {
  DecoderConfig cfg;
  cfg.vocab_size = vocab_size;
  cfg.d_model = d_model;
  cfg.n_heads = n_heads;
  cfg.max_seq_len = max_seq_len;
  cfg.blocks.assign(static_cast<size_t>(n_layers), BlockSpec{"attention", FfnKind::gelu});
  cfg.positions = PositionKind::learned;
  cfg.norm = NormKind::layer_norm;
  cfg.bias = true;
  return cfg;
}

int64_t decoder_d_ff(FfnKind kind, int64_t d_model) {
  if (kind == FfnKind::gelu) return 4 * d_model;
  return std::max<int64_t>(64, std::llround(8.0 * static_cast<double>(d_model) / 3.0 / 64.0) * 64);
}

DecoderConventions decoder_conventions(const std::vector<std::string>& mixers) {
  const bool all_attention = std::all_of(mixers.begin(), mixers.end(),
                                         [](const std::string& m) { return !mixer_spec(m).traits.recurrent; });
  if (all_attention) return {NormKind::layer_norm, FfnKind::gelu, true, PositionKind::learned};
  return {NormKind::rms_norm, FfnKind::swiglu, false, PositionKind::none};
}

// ---- the FFN ----

Ffn::Ffn(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias, Generator& gen, double init_std)
    : fc_(add_module("fc", std::make_unique<Linear>(d_model, d_ff, bias, gen, init_std))),
      gate_(kind == FfnKind::swiglu ? &add_module("gate", std::make_unique<Linear>(d_model, d_ff, bias, gen, init_std))
                                    : nullptr),
      proj_(add_module("proj", std::make_unique<Linear>(d_ff, d_model, bias, gen, init_std))) {}

Tensor Ffn::forward(const Tensor& x) const {
  // GELU: proj(gelu(fc x)), fc and gelu fused (linear_gelu);  SwiGLU: proj(silu(fc x) ⊙ gate x).
  Tensor h = gate_ != nullptr ? mul(silu(fc_.forward(x)), gate_->forward(x)) : fc_.forward_gelu(x);
  return proj_.forward(h);
}

// ---- a block ----

DecoderBlock::DecoderBlock(const DecoderConfig& cfg, const BlockSpec& spec, const MixerContext& ctx,
                           Generator& init_gen, Generator& dropout_gen)
    : dropout_(cfg.dropout),
      dropout_gen_(dropout_gen),
      norm1_(add_module("norm1", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps))),
      mixer_(add_module("mixer", [&] {
        const MixerSpec& mixer = mixer_spec(spec.mixer);
        return mixer.make(ctx, options_of(cfg, mixer), init_gen);
      }())) {
  if (spec.ffn == FfnKind::none) return;
  norm2_ = &add_module("norm2", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps));
  const int64_t d_ff = cfg.d_ff > 0 ? cfg.d_ff : decoder_d_ff(spec.ffn, cfg.d_model);
  ffn_ = &add_module("mlp", std::make_unique<Ffn>(spec.ffn, cfg.d_model, d_ff, cfg.bias, init_gen, cfg.init_std));
}

Tensor DecoderBlock::drop(const Tensor& x) const {
  return dropout_ > 0 && training() ? dropout(x, dropout_, dropout_gen_) : x;
}

std::pair<Tensor, Tensor> DecoderBlock::forward(const Tensor& x, const Tensor& branch, MixerState* state) const {
  // Pre-norm residual: x + drop(mixer(norm1 x)), then + drop(ffn(norm2 ·)), each add fused with the
  // norm that reads its result.
  const AddNormResult in = norm1_.add_forward(x, branch);
  MixerInput input;
  input.x = in.y;
  Tensor mixed = drop(mixer_.forward(input, state));
  if (ffn_ == nullptr) return {in.sum, mixed};
  const AddNormResult mid = norm2_->add_forward(in.sum, mixed);
  return {mid.sum, drop(ffn_->forward(mid.y))};
}

// ---- the model ----

Decoder::Decoder(const DecoderConfig& cfg, Generator& gen)
    : cfg_(resolved(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.d_model, gen, cfg_.init_std))) {
  if (bounded_context() && cfg_.max_seq_len <= 0) {
    throw std::invalid_argument("decoder: attention and learned positions need max_seq_len > 0");
  }
  if (cfg_.positions == PositionKind::learned) {
    wpe_ = &add_module("wpe", std::make_unique<Embedding>(cfg_.max_seq_len, cfg_.d_model, gen, cfg_.init_std));
  }
  const MixerContext ctx = mixer_context();
  for (size_t i = 0; i < cfg_.blocks.size(); ++i) {
    blocks_.push_back(&add_module("blocks." + std::to_string(i),
                                  std::make_unique<DecoderBlock>(cfg_, cfg_.blocks[i], ctx, gen, dropout_gen_)));
  }
  norm_f_ = &add_module("norm_f", std::make_unique<Norm>(cfg_.norm, cfg_.d_model, cfg_.norm_eps));
}

MixerContext Decoder::mixer_context() const { return mixer_context_of(cfg_); }

bool Decoder::bounded_context() const {
  return cfg_.positions == PositionKind::learned ||
         std::any_of(cfg_.blocks.begin(), cfg_.blocks.end(),
                     [](const BlockSpec& b) { return !mixer_spec(b.mixer).traits.recurrent; });
}

int64_t Decoder::max_context() const { return bounded_context() ? cfg_.max_seq_len : 0; }

double Decoder::mixing_flops_per_token(int64_t seq_len) const { return decoder_mixing_flops_per_token(cfg_, seq_len); }

namespace {
// Σ over the blocks of `per_block`, one of a MixerSpec's per-layer counts, for sequences of seq_len tokens.
using PerBlock = std::function<double(const MixerContext&, const MixerOptions&, int64_t)> MixerSpec::*;
double sum_over_blocks(const DecoderConfig& config, PerBlock per_block, int64_t seq_len) {
  const DecoderConfig cfg = resolved(config);
  const MixerContext ctx = mixer_context_of(cfg);
  double sum = 0;
  for (const BlockSpec& b : cfg.blocks) {
    const MixerSpec& spec = mixer_spec(b.mixer);
    sum += (spec.*per_block)(ctx, options_of(cfg, spec), seq_len);
  }
  return sum;
}
}  // namespace

double decoder_state_size(const DecoderConfig& config, int64_t seq_len) {
  return sum_over_blocks(config, &MixerSpec::state_size, seq_len);
}

double decoder_mixing_flops_per_token(const DecoderConfig& config, int64_t seq_len) {
  return sum_over_blocks(config, &MixerSpec::mixing_flops_per_token, seq_len);
}

double decoder_parameter_count(const DecoderConfig& config) {
  const DecoderConfig cfg = resolved(config);
  const MixerContext ctx = mixer_context_of(cfg);
  const double d = static_cast<double>(cfg.d_model);
  const double norm = cfg.norm == NormKind::layer_norm ? 2 * d : d;  // gain (and bias)
  double n = static_cast<double>(cfg.vocab_size) * d + norm;           // wte, norm_f
  if (cfg.positions == PositionKind::learned) n += static_cast<double>(cfg.max_seq_len) * d;
  // Blocks come in few kinds: count each kind once.
  std::map<std::pair<std::string, FfnKind>, double> kinds;
  for (const BlockSpec& b : cfg.blocks) kinds[{b.mixer, b.ffn}] += 1;
  for (const auto& [kind, count] : kinds) {
    const MixerSpec& spec = mixer_spec(kind.first);
    double block = norm + spec.parameter_count(ctx, options_of(cfg, spec));
    if (kind.second != FfnKind::none) {
      const double ff = static_cast<double>(cfg.d_ff > 0 ? cfg.d_ff : decoder_d_ff(kind.second, cfg.d_model));
      const double matrices = kind.second == FfnKind::swiglu ? 3 : 2;  // fc (gate) proj
      block += norm + matrices * d * ff + (cfg.bias ? (matrices - 1) * ff + d : 0.0);
    }
    n += count * block;
  }
  return n;
}

Tensor Decoder::run(const Tensor& tokens, DecoderState* state) {
  if (tokens.dim() != 2) throw std::invalid_argument("decoder: tokens must be [B, T], got " + shape_str(tokens.shape()));
  const int64_t T = tokens.shape()[1];
  const int64_t start = state != nullptr ? state->position : 0;
  // Sequence-parallel (training only): the T tokens are this rank's two chunks of a sequence P times longer.
  const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr;
  const int64_t end = sp != nullptr ? T * sp->size() : start + T;
  if (max_context() > 0 && end > max_context()) {
    throw std::invalid_argument("decoder: positions up to " + std::to_string(end) + " exceed max_seq_len " +
                                std::to_string(max_context()));
  }
  Tensor x = wte_.forward(tokens);  // [B, T, C]
  if (wpe_ != nullptr) {
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = start + t;
    if (sp != nullptr) pos = sequence_positions(T, *sp);
    Tensor positions = Tensor::from_indices(pos, {T}, DType::i64, tokens.device());
    x = add(x, wpe_->forward(positions));  // [T, C] broadcast over B
  }
  if (cfg_.dropout > 0 && training()) x = dropout(x, cfg_.dropout, dropout_gen_);
  if (state != nullptr && state->blocks.empty()) {
    for (const DecoderBlock* block : blocks_) state->blocks.push_back(block->mixer().new_state());
  }
  Tensor branch;  // the last block's output not yet added to x
  for (size_t i = 0; i < blocks_.size(); ++i) {
    MixerState* s = state != nullptr ? state->blocks[i].get() : nullptr;
    if (s != nullptr) s->position = start;
    std::tie(x, branch) = blocks_[i]->forward(x, branch, s);
  }
  if (state != nullptr) state->position = start + T;
  // Tied output: logits = norm_f(x + branch) · wteᵀ.
  return linear(norm_f_->add_forward(x, branch).y, wte_.weight());
}

Tensor Decoder::logits(const Batch& batch) {
  if (batch.decoder_inputs.defined() || batch.decoder_targets.defined()) {
    throw std::invalid_argument("decoder: a decoder-only model takes no decoder_inputs or decoder_targets "
                                "(those are for encoder-decoder models)");
  }
  if (batch.segment_ids.defined()) {
    throw std::invalid_argument("decoder: segment_ids are not supported by the decoder (its attention and "
                                "recurrences do not reset at segment boundaries)");
  }
  if (!batch.inputs.defined()) throw std::invalid_argument("decoder: the batch has no inputs");
  return run(batch.inputs, nullptr);
}

Tensor Decoder::forward_step(const Tensor& tokens, DecodeState& state) {
  auto* s = dynamic_cast<DecoderState*>(&state);
  if (s == nullptr) throw std::invalid_argument("decoder: forward_step takes the state of new_decode_state()");
  return run(tokens, s);
}

}  // namespace seqlab
