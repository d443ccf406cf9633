#include "layers/model/decoder.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "autograd/ops.h"
#include "layers/model/moe.h"
#include "layers/sequence_parallel.h"

namespace seqlab {

bool bounded_context(const ModelConfig& cfg, const std::vector<BlockSpec>& blocks) {
  return cfg.positions == PositionKind::learned || cfg.positions == PositionKind::sinusoidal ||
         shared_attention_uses(cfg, blocks.size()) > 0 ||  // the shared attention block's caches grow
         std::any_of(blocks.begin(), blocks.end(),
                     [](const BlockSpec& b) { return !mixer_spec(b.mixer).traits.recurrent; });
}

ModelConfig causal_stack_config(const ModelConfig& cfg, const std::vector<BlockSpec>& blocks) {
  ModelConfig c = cfg;
  c.kind = ModelKind::decoder;
  c.blocks = blocks;
  c.decoder_blocks.clear();
  c.segments = 0;
  c.next_sentence = false;
  return c;
}

Tensor absolute_positions(const ModelConfig& cfg, const Embedding* wpe, const std::vector<int64_t>& positions,
                          DType dtype, Device device) {
  const int64_t T = static_cast<int64_t>(positions.size());
  if (cfg.positions == PositionKind::learned) {
    return wpe->forward(Tensor::from_indices(positions, {T}, DType::i64, device));
  }
  if (cfg.positions == PositionKind::sinusoidal) return sinusoidal_positions(positions, cfg.d_model, dtype, device);
  return Tensor();
}

Decoder::Decoder(const ModelConfig& cfg, Generator& gen)
    : cfg_(resolved_config(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.d_model, gen, cfg_.init_std))) {
  if (cfg_.kind != ModelKind::decoder) throw std::logic_error("Decoder: the configuration is of another kind");
  if (bounded_context(cfg_, cfg_.blocks) && cfg_.max_seq_len <= 0) {
    throw std::invalid_argument("decoder: attention and absolute positions need max_seq_len > 0");
  }
  if (cfg_.positions == PositionKind::learned) {
    wpe_ = &add_module("wpe", std::make_unique<Embedding>(cfg_.max_seq_len, cfg_.d_model, gen, cfg_.init_std));
  }
  stack_ = &add_module("", std::make_unique<Stack>(cfg_, cfg_.blocks, /*cross=*/false, gen, dropout_gen_));
  has_moe_ = std::any_of(cfg_.blocks.begin(), cfg_.blocks.end(), [](const BlockSpec& b) { return b.ffn == FfnKind::moe; }) ||
             (shared_attention_uses(cfg_, cfg_.blocks.size()) > 0 && cfg_.shared_attention_ffn == FfnKind::moe);
  if (!cfg_.tie_embeddings) {
    lm_head_ = &add_module("lm_head", std::make_unique<Linear>(cfg_.d_model, cfg_.vocab_size, false, gen, cfg_.init_std));
  }
}

int64_t Decoder::max_context() const { return bounded_context(cfg_, cfg_.blocks) ? cfg_.max_seq_len : 0; }

double Decoder::mixing_flops_per_token(int64_t seq_len) const { return decoder_mixing_flops_per_token(cfg_, seq_len); }

double decoder_state_size(const ModelConfig& config, int64_t seq_len) {
  const ModelConfig cfg = resolved_config(config);
  const MixerContext ctx = mixer_context_of(cfg);
  double sum = 0;
  for (const BlockSpec& b : cfg.blocks) {
    const MixerSpec& spec = mixer_spec(b.mixer);
    sum += spec.state_size(ctx, options_of(cfg, spec), seq_len);
  }
  if (const int64_t uses = shared_attention_uses(cfg, cfg.blocks.size()); uses > 0) {  // a cache per use
    const MixerSpec& attention = mixer_spec("attention");
    sum += static_cast<double>(uses) * attention.state_size(ctx, options_of(cfg, attention), seq_len);
  }
  return sum;
}

double decoder_mixing_flops_per_token(const ModelConfig& config, int64_t seq_len) {
  const ModelConfig cfg = resolved_config(config);
  const MixerContext ctx = mixer_context_of(cfg);
  double sum = 0;
  for (const BlockSpec& b : cfg.blocks) {
    const MixerSpec& spec = mixer_spec(b.mixer);
    sum += spec.mixing_flops_per_token(ctx, options_of(cfg, spec), seq_len);
  }
  if (const int64_t uses = shared_attention_uses(cfg, cfg.blocks.size()); uses > 0) {  // attention at every use
    const MixerSpec& attention = mixer_spec("attention");
    sum += static_cast<double>(uses) * attention.mixing_flops_per_token(ctx, options_of(cfg, attention), seq_len);
  }
  return sum;
}

double decoder_parameter_count(const ModelConfig& config) {
  const ModelConfig cfg = resolved_config(config);
  const double d = static_cast<double>(cfg.d_model), vocab = static_cast<double>(cfg.vocab_size);
  double n = vocab * d;  // wte
  if (cfg.positions == PositionKind::learned) n += static_cast<double>(cfg.max_seq_len) * d;
  if (!cfg.tie_embeddings) n += vocab * d;  // lm_head
  return n + stack_parameter_count(cfg, cfg.blocks, /*cross=*/false);
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
  if (sp != nullptr && cfg_.positions == PositionKind::relative) {
    throw std::invalid_argument("decoder: relative positions do not run under sequence parallelism");
  }
  Tensor x = wte_.forward(tokens);  // [B, T, C]
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = start + t;
  if (sp != nullptr) pos = sequence_positions(T, *sp);
  if (Tensor p = absolute_positions(cfg_, wpe_, pos, x.dtype(), tokens.device()); p.defined()) {
    x = add(x, p);  // [T, C] broadcast over B
  }
  StackInput in;  // causal, every token valid (a causal row never sees the padding after it)
  MoeStats moe;
  const bool moe_stats = has_moe_ && state == nullptr && training();
  if (moe_stats) in.moe = &moe;
  x = stack_->forward(x, in, start, state != nullptr ? &state->blocks : nullptr);
  if (moe_stats) {
    last_aux_ = moe.aux_loss;
    last_aux_value_ = moe.aux_value;
    last_balance_ = moe.blocks > 0 ? moe.balance / static_cast<double>(moe.blocks) : 0.0;
    last_dropped_ = moe.assignments > 0 ? static_cast<double>(moe.dropped) / static_cast<double>(moe.assignments) : 0.0;
  }
  if (state != nullptr) state->position = start + T;
  // Tied output: logits = x · wteᵀ (untied: its own lm_head).
  return linear(x, lm_head_ != nullptr ? lm_head_->weight() : wte_.weight());
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

ModelOutputs Decoder::outputs(const Batch& batch) {
  last_aux_ = Tensor();
  ModelOutputs out;
  out.logits = logits(batch);
  out.aux_loss = std::move(last_aux_);  // not kept past the call: it holds the router's graph
  last_aux_ = Tensor();
  return out;
}

std::vector<std::pair<std::string, double>> Decoder::training_metrics() const {
  if (!has_moe_) return {};
  return {{"aux_loss", last_aux_value_}, {"moe_balance", last_balance_}, {"moe_dropped", last_dropped_}};
}

Tensor Decoder::forward_step(const Tensor& tokens, DecodeState& state) {
  auto* s = dynamic_cast<DecoderState*>(&state);
  if (s == nullptr) throw std::invalid_argument("decoder: forward_step takes the state of new_decode_state()");
  return run(tokens, s);
}

}  // namespace seqlab
