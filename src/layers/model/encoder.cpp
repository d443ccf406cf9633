#include "layers/model/encoder.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "layers/model/decoder.h"
#include "layers/sequence_parallel.h"

namespace seqlab {

MaskedLmHead::MaskedLmHead(const ModelConfig& cfg, Generator& gen)
    : dense_(add_module("dense", std::make_unique<Linear>(cfg.d_model, cfg.d_model, cfg.bias, gen, cfg.init_std))),
      norm_(add_module("norm", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps))),
      bias_(add_parameter("bias", Tensor::zeros({cfg.vocab_size}), ParamRole::bias)) {}

Encoder::Encoder(const ModelConfig& cfg, Generator& gen)
    : cfg_(resolved_config(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.d_model, gen, cfg_.init_std))) {
  if (cfg_.kind != ModelKind::encoder) throw std::logic_error("Encoder: the configuration is of another kind");
  if (cfg_.max_seq_len <= 0) throw std::invalid_argument("encoder: max_seq_len must be positive");
  if (cfg_.segments > 0) {
    segment_ = &add_module("segment", std::make_unique<Embedding>(cfg_.segments, cfg_.d_model, gen, cfg_.init_std));
  }
  if (cfg_.positions == PositionKind::learned) {
    wpe_ = &add_module("wpe", std::make_unique<Embedding>(cfg_.max_seq_len, cfg_.d_model, gen, cfg_.init_std));
  }
  stack_ = &add_module("", std::make_unique<Stack>(cfg_, cfg_.blocks, /*cross=*/false, gen, dropout_gen_));
  head_ = &add_module("head", std::make_unique<MaskedLmHead>(cfg_, gen));
  if (!cfg_.tie_embeddings) {
    lm_head_ = &add_module("lm_head", std::make_unique<Linear>(cfg_.d_model, cfg_.vocab_size, false, gen, cfg_.init_std));
  }
  if (cfg_.next_sentence) {
    pooler_ = &add_module("pooler", std::make_unique<Linear>(cfg_.d_model, cfg_.d_model, true, gen, cfg_.init_std));
    nsp_ = &add_module("nsp", std::make_unique<Linear>(cfg_.d_model, 2, true, gen, cfg_.init_std));
  }
}

double encoder_parameter_count(const ModelConfig& config) {
  const ModelConfig cfg = resolved_config(config);
  const double d = static_cast<double>(cfg.d_model), vocab = static_cast<double>(cfg.vocab_size);
  const double norm = cfg.norm == NormKind::layer_norm ? 2 * d : d;
  double n = vocab * d + static_cast<double>(cfg.segments) * d;
  if (cfg.positions == PositionKind::learned) n += static_cast<double>(cfg.max_seq_len) * d;
  n += stack_parameter_count(cfg, cfg.blocks, /*cross=*/false);
  n += d * d + (cfg.bias ? d : 0.0) + norm + vocab;  // head: dense, norm, output bias
  if (!cfg.tie_embeddings) n += vocab * d;
  if (cfg.next_sentence) n += d * d + d + 2 * d + 2;  // pooler, nsp
  return n;
}

// Every row sees every token: twice a causal stack's token mixing.
double encoder_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len) {
  return 2 * decoder_mixing_flops_per_token(causal_stack_config(cfg, cfg.blocks), seq_len);
}

double Encoder::mixing_flops_per_token(int64_t seq_len) const { return encoder_mixing_flops_per_token(cfg_, seq_len); }

Tensor Encoder::logits(const Batch& batch) { return outputs(batch).logits; }

ModelOutputs Encoder::outputs(const Batch& batch) {
  if (batch.decoder_inputs.defined() || batch.decoder_targets.defined()) {
    throw std::invalid_argument("encoder: an encoder takes no decoder_inputs or decoder_targets (those are for "
                                "encoder-decoder models)");
  }
  if (!batch.inputs.defined() || batch.inputs.dim() != 2) {
    throw std::invalid_argument("encoder: the batch needs inputs [B, T]");
  }
  if (sequence_group() != nullptr) {
    throw std::invalid_argument("encoder: sequence parallelism runs causal stacks only (parallel.sp = 1)");
  }
  const Tensor& tokens = batch.inputs;
  const int64_t T = tokens.size(1);
  if (T > cfg_.max_seq_len) {
    throw std::invalid_argument("encoder: " + std::to_string(T) + " tokens exceed max_seq_len " +
                                std::to_string(cfg_.max_seq_len));
  }
  Tensor x = wte_.forward(tokens);  // [B, T, C]
  if (batch.segment_ids.defined()) {
    if (segment_ == nullptr) throw std::invalid_argument("encoder: segment_ids given to a model without segments");
    x = add(x, segment_->forward(batch.segment_ids));
  }
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = t;
  if (Tensor p = absolute_positions(cfg_, wpe_, pos, x.dtype(), tokens.device()); p.defined()) x = add(x, p);
  StackInput in;
  in.causal = false;
  in.lengths = batch.lengths;
  x = stack_->forward(x, in, 0, nullptr);
  // The masked-LM head: transform, then the (tied) output embedding with its own bias.
  const Tensor h = head_->transform(x);
  ModelOutputs out;
  out.logits = linear(h, lm_head_ != nullptr ? lm_head_->weight() : wte_.weight(), head_->bias());
  if (nsp_ != nullptr) {
    const Tensor cls = reshape(narrow(x, 1, 0, 1), {x.size(0), cfg_.d_model});  // the [CLS] token's row
    out.sequence_logits = nsp_->forward(tanh(pooler_->forward(cls)));
  }
  return out;
}

}  // namespace seqlab
