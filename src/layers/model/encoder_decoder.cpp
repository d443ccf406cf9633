#include "layers/model/encoder_decoder.h"

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "layers/model/decoder.h"
#include "layers/sequence_parallel.h"

namespace seqlab {

EncoderDecoder::EncoderDecoder(const ModelConfig& cfg, Generator& gen)
    : cfg_(resolved_config(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      // T5's shared embedding starts at N(0, 1), not init_std: its rows reach the stacks through an RMSNorm,
      // and the tied output divides by √d_model, so small rows would give near-zero logits that take
      // hundreds of steps to grow.
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.d_model, gen, kT5EmbeddingStd))) {
  if (cfg_.kind != ModelKind::encoder_decoder) {
    throw std::logic_error("EncoderDecoder: the configuration is of another kind");
  }
  if (cfg_.max_seq_len <= 0) throw std::invalid_argument("encoder_decoder: max_seq_len must be positive");
  if (cfg_.positions == PositionKind::learned) {
    wpe_ = &add_module("wpe", std::make_unique<Embedding>(cfg_.max_seq_len, cfg_.d_model, gen, cfg_.init_std));
  }
  encoder_ = &add_module("encoder", std::make_unique<Stack>(cfg_, cfg_.blocks, /*cross=*/false, gen, dropout_gen_));
  decoder_ =
      &add_module("decoder", std::make_unique<Stack>(cfg_, cfg_.decoder_blocks, /*cross=*/true, gen, dropout_gen_));
  if (!cfg_.tie_embeddings) {
    lm_head_ = &add_module("lm_head", std::make_unique<Linear>(cfg_.d_model, cfg_.vocab_size, false, gen, cfg_.init_std));
  }
}

double encoder_decoder_parameter_count(const ModelConfig& config) {
  const ModelConfig cfg = resolved_config(config);
  const double d = static_cast<double>(cfg.d_model), vocab = static_cast<double>(cfg.vocab_size);
  double n = vocab * d;
  if (cfg.positions == PositionKind::learned) n += static_cast<double>(cfg.max_seq_len) * d;
  n += stack_parameter_count(cfg, cfg.blocks, false) + stack_parameter_count(cfg, cfg.decoder_blocks, true);
  if (!cfg.tie_embeddings) n += vocab * d;
  return n;
}

namespace {
// The cross attention of one decoder block over seq_len memory tokens: every query sees every key,
// 2·seq_len·d multiply-adds forward (scores and mixing), ×3 for forward and backward.
double cross_flops(const ModelConfig& cfg, int64_t seq_len) {
  return 12.0 * static_cast<double>(seq_len) * static_cast<double>(cfg.d_model);
}
}  // namespace

double encoder_decoder_mixing_flops_per_token(const ModelConfig& config, int64_t seq_len) {
  const ModelConfig cfg = resolved_config(config);
  return 2 * decoder_mixing_flops_per_token(causal_stack_config(cfg, cfg.blocks), seq_len) +
         decoder_mixing_flops_per_token(causal_stack_config(cfg, cfg.decoder_blocks), seq_len) +
         static_cast<double>(cfg.decoder_blocks.size()) * cross_flops(cfg, seq_len);
}

double encoder_decoder_state_size(const ModelConfig& config, int64_t seq_len) {
  const ModelConfig cfg = resolved_config(config);
  const MixerSpec& attention = mixer_spec("attention");
  const double cross = attention.state_size(mixer_context_of(cfg), options_of(cfg, attention), seq_len);
  return decoder_state_size(causal_stack_config(cfg, cfg.decoder_blocks), seq_len) +
         static_cast<double>(cfg.decoder_blocks.size()) * cross;
}

double EncoderDecoder::mixing_flops_per_token(int64_t seq_len) const {
  return encoder_decoder_mixing_flops_per_token(cfg_, seq_len);
}

int64_t EncoderDecoder::max_context() const { return cfg_.max_seq_len; }

Tensor EncoderDecoder::embed(const Tensor& tokens, int64_t start) const {
  if (tokens.dim() != 2) {
    throw std::invalid_argument("encoder_decoder: tokens must be [B, T], got " + shape_str(tokens.shape()));
  }
  const int64_t T = tokens.size(1);
  if (start + T > cfg_.max_seq_len) {
    throw std::invalid_argument("encoder_decoder: positions up to " + std::to_string(start + T) +
                                " exceed max_seq_len " + std::to_string(cfg_.max_seq_len));
  }
  Tensor x = wte_.forward(tokens);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = start + t;
  if (Tensor p = absolute_positions(cfg_, wpe_, pos, x.dtype(), tokens.device()); p.defined()) x = add(x, p);
  return x;
}

Tensor EncoderDecoder::run_encoder(const Tensor& inputs, const Tensor& lengths) const {
  StackInput in;
  in.causal = false;
  in.lengths = lengths;
  return encoder_->forward(embed(inputs, 0), in, 0, nullptr);
}

Tensor EncoderDecoder::run_decoder(const Tensor& tokens, const Tensor& memory, const Tensor& memory_lengths,
                                   int64_t start, std::vector<BlockState>* states) const {
  StackInput in;  // causal: no lengths needed for the decoder's own padding
  in.memory = memory;
  in.memory_lengths = memory_lengths;
  Tensor y = decoder_->forward(embed(tokens, start), in, start, states);
  if (lm_head_ != nullptr) return linear(y, lm_head_->weight());
  // Tied: T5 rescales the decoder's output by d^−½ before the shared embedding.
  return linear(mul(y, 1.0 / std::sqrt(static_cast<double>(cfg_.d_model))), wte_.weight());
}

Tensor EncoderDecoder::logits(const Batch& batch) {
  if (sequence_group() != nullptr) {
    throw std::invalid_argument("encoder_decoder: sequence parallelism runs decoder-only models (parallel.sp = 1)");
  }
  if (!batch.inputs.defined() || !batch.decoder_inputs.defined()) {
    throw std::invalid_argument("encoder_decoder: the batch needs inputs (the source) and decoder_inputs (the target)");
  }
  if (batch.segment_ids.defined()) throw std::invalid_argument("encoder_decoder: segment_ids are not supported");
  const Tensor memory = run_encoder(batch.inputs, batch.lengths);
  return run_decoder(batch.decoder_inputs, memory, batch.lengths, 0, nullptr);
}

void EncoderDecoder::encode(const Tensor& inputs, const Tensor& lengths, DecodeState& state) {
  auto* s = dynamic_cast<EncoderDecoderState*>(&state);
  if (s == nullptr) throw std::invalid_argument("encoder_decoder: encode takes the state of new_decode_state()");
  s->memory = run_encoder(inputs, lengths);
  s->memory_lengths = lengths;
  s->blocks.clear();
  s->position = 0;
}

Tensor EncoderDecoder::forward_step(const Tensor& tokens, DecodeState& state) {
  auto* s = dynamic_cast<EncoderDecoderState*>(&state);
  if (s == nullptr) throw std::invalid_argument("encoder_decoder: forward_step takes the state of new_decode_state()");
  if (!s->memory.defined()) throw std::invalid_argument("encoder_decoder: encode the source before decoding");
  Tensor logits = run_decoder(tokens, s->memory, s->memory_lengths, s->position, &s->blocks);
  s->position += tokens.size(1);
  return logits;
}

}  // namespace seqlab
