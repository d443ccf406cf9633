#include "layers/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "layers/model/decoder.h"
#include "layers/model/encoder.h"
#include "layers/model/encoder_decoder.h"
#include "layers/model/moe.h"

namespace seqlab {

const char* model_kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::decoder: return "decoder";
    case ModelKind::encoder: return "encoder";
    case ModelKind::encoder_decoder: return "encoder_decoder";
  }
  return "";
}

const char* ffn_kind_name(FfnKind kind) {
  switch (kind) {
    case FfnKind::gelu: return "gelu";
    case FfnKind::swiglu: return "swiglu";
    case FfnKind::none: return "none";
    case FfnKind::relu: return "relu";
    case FfnKind::geglu: return "geglu";
    case FfnKind::moe: return "moe";
  }
  return "";
}

bool ffn_gated(FfnKind kind) { return kind == FfnKind::swiglu || kind == FfnKind::geglu; }

ModelConfig gpt2_config(int64_t vocab_size, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t max_seq_len) {
  ModelConfig cfg;
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

int64_t ffn_d_ff(FfnKind kind, int64_t d_model) {
  if (!ffn_gated(kind)) return 4 * d_model;
  return std::max<int64_t>(64, std::llround(8.0 * static_cast<double>(d_model) / 3.0 / 64.0) * 64);
}

ModelConventions model_conventions(ModelKind kind, const std::vector<std::string>& mixers) {
  switch (kind) {
    case ModelKind::encoder:
      return {NormKind::layer_norm, FfnKind::gelu, true, PositionKind::learned, NormPlacement::post};
    case ModelKind::encoder_decoder:
      return {NormKind::rms_norm, FfnKind::relu, false, PositionKind::relative, NormPlacement::pre};
    case ModelKind::decoder: break;
  }
  const bool all_attention = std::all_of(mixers.begin(), mixers.end(),
                                         [](const std::string& m) { return !mixer_spec(m).traits.recurrent; });
  if (all_attention) return {NormKind::layer_norm, FfnKind::gelu, true, PositionKind::learned, NormPlacement::pre};
  return {NormKind::rms_norm, FfnKind::swiglu, false, PositionKind::none, NormPlacement::pre};
}

ModelConfig resolved_config(ModelConfig cfg) {
  const std::string kind = model_kind_name(cfg.kind);
  if (cfg.n_kv_heads == 0) cfg.n_kv_heads = cfg.n_heads;
  if (cfg.vocab_size <= 0 || cfg.d_model <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.d_ff < 0 ||
      cfg.max_seq_len < 0 || cfg.segments < 0) {
    throw std::invalid_argument(kind + ": sizes must be positive");
  }
  if (cfg.d_model % cfg.n_heads != 0) {
    throw std::invalid_argument(kind + ": d_model " + std::to_string(cfg.d_model) + " not divisible by n_heads " +
                                std::to_string(cfg.n_heads));
  }
  if (!(cfg.dropout >= 0 && cfg.dropout < 1)) {
    throw std::invalid_argument(kind + ": dropout must be in [0, 1), got " + std::to_string(cfg.dropout));
  }
  if (cfg.positions == PositionKind::relative && (cfg.relative_buckets < 2 || cfg.relative_max_distance < 1)) {
    throw std::invalid_argument(kind + ": relative positions need at least 2 buckets and a max distance of 1 or more");
  }
  if (cfg.kind != ModelKind::encoder && (cfg.segments > 0 || cfg.next_sentence)) {
    throw std::invalid_argument(kind + ": segments and the next-sentence head belong to an encoder");
  }
  if (cfg.kind == ModelKind::encoder_decoder && cfg.decoder_blocks.empty()) cfg.decoder_blocks = cfg.blocks;
  if (cfg.kind != ModelKind::encoder_decoder && !cfg.decoder_blocks.empty()) {
    throw std::invalid_argument(kind + ": decoder_blocks belong to an encoder_decoder");
  }
  for (const BlockSpec& b : cfg.blocks) {
    const MixerSpec& spec = mixer_spec(b.mixer);  // throws naming the registered mixers
    if (cfg.kind != ModelKind::decoder && !spec.traits.bidirectional) {
      throw std::invalid_argument(kind + ": mixer '" + spec.name + "' is causal only, but an encoder's blocks " +
                                  "see the whole row (use a bidirectional mixer: attention)");
    }
  }
  for (const BlockSpec& b : cfg.decoder_blocks) mixer_spec(b.mixer);
  const auto is_moe = [](const BlockSpec& b) { return b.ffn == FfnKind::moe; };
  if (std::any_of(cfg.blocks.begin(), cfg.blocks.end(), is_moe) ||
      std::any_of(cfg.decoder_blocks.begin(), cfg.decoder_blocks.end(), is_moe)) {
    if (cfg.kind != ModelKind::decoder) {
      throw std::invalid_argument(kind + ": the mixture-of-experts FFN (moe) is built into decoder models only");
    }
    check_moe_config(cfg.moe);
  }
  if (cfg.shared_attention_every < 0) throw std::invalid_argument(kind + ": shared_attention_every must be 0 or positive");
  if (cfg.shared_attention_every > 0) {
    if (cfg.kind != ModelKind::decoder || cfg.norm_placement != NormPlacement::pre) {
      throw std::invalid_argument(kind + ": the shared attention block is built into pre-norm decoder models only");
    }
    if (cfg.shared_attention_every > static_cast<int64_t>(cfg.blocks.size())) {
      throw std::invalid_argument(kind + ": shared_attention_every = " + std::to_string(cfg.shared_attention_every) +
                                  " is more than the " + std::to_string(cfg.blocks.size()) +
                                  " blocks: the shared block would never run");
    }
    if (cfg.shared_attention_ffn == FfnKind::moe) check_moe_config(cfg.moe);
  }
  return cfg;
}

MixerContext mixer_context_of(const ModelConfig& cfg) {
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

MixerOptions options_of(const ModelConfig& cfg, const MixerSpec& spec) {
  auto options = cfg.mixer_options.find(spec.name);
  return options != cfg.mixer_options.end() ? options->second : MixerOptions(spec.options);
}

std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Generator& gen) {
  switch (cfg.kind) {
    case ModelKind::decoder: return std::make_unique<Decoder>(cfg, gen);
    case ModelKind::encoder: return std::make_unique<Encoder>(cfg, gen);
    case ModelKind::encoder_decoder: return std::make_unique<EncoderDecoder>(cfg, gen);
  }
  throw std::logic_error("make_model: unknown model kind");
}

double model_parameter_count(const ModelConfig& cfg) {
  switch (cfg.kind) {
    case ModelKind::decoder: return decoder_parameter_count(cfg);
    case ModelKind::encoder: return encoder_parameter_count(cfg);
    case ModelKind::encoder_decoder: return encoder_decoder_parameter_count(cfg);
  }
  return 0;
}

int64_t shared_attention_uses(const ModelConfig& cfg, size_t layers) {
  return cfg.shared_attention_every > 0 ? static_cast<int64_t>(layers) / cfg.shared_attention_every : 0;
}

double model_active_parameter_count(const ModelConfig& config) {
  const double total = model_parameter_count(config);
  const ModelConfig cfg = resolved_config(config);
  double inactive = 0;  // per MoE block, the experts a token is not routed to
  if (const int64_t uses = shared_attention_uses(cfg, cfg.blocks.size()); uses > 0) {
    // Counted once in the total, passed through once per use (an MoE FFN's top_k experts each time).
    const BlockSpec shared{"attention", cfg.shared_attention_ffn};
    const double idle = shared.ffn == FfnKind::moe
                            ? moe_parameter_count(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias) -
                                  moe_active_parameter_count(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias)
                            : 0.0;
    inactive += static_cast<double>(uses) * idle - static_cast<double>(uses - 1) * block_parameter_count(cfg, shared, false);
  }
  for (const std::vector<BlockSpec>* blocks : {&cfg.blocks, &cfg.decoder_blocks}) {
    for (const BlockSpec& b : *blocks) {
      if (b.ffn != FfnKind::moe) continue;
      inactive += moe_parameter_count(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias) -
                  moe_active_parameter_count(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias);
    }
  }
  return total - inactive;
}

double model_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len) {
  switch (cfg.kind) {
    case ModelKind::decoder: return decoder_mixing_flops_per_token(cfg, seq_len);
    case ModelKind::encoder: return encoder_mixing_flops_per_token(cfg, seq_len);
    case ModelKind::encoder_decoder: return encoder_decoder_mixing_flops_per_token(cfg, seq_len);
  }
  return 0;
}

double model_state_size(const ModelConfig& cfg, int64_t seq_len) {
  switch (cfg.kind) {
    case ModelKind::decoder: return decoder_state_size(cfg, seq_len);
    case ModelKind::encoder: return 0;
    case ModelKind::encoder_decoder: return encoder_decoder_state_size(cfg, seq_len);
  }
  return 0;
}

}  // namespace seqlab
