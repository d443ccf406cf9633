// The encoder (model.arch = "encoder"): BERT. Bidirectional blocks over padded rows, a masked-LM head
// and, optionally, the next-sentence head; no decode step (it fills masks in one pass instead).
//
//   x = wte[tokens] + segment[segment_ids] + wpe[positions]   (learned or sinusoidal positions)
//   x = stack(x)          blocks over the whole row, keys past each row's length masked (stack.h);
//                         BERT's post-norm: the embeddings' norm first (norm_in), a norm after each add
//   h = head.norm(gelu(head.dense x))                          the masked-LM head's transform
//   logits = h · wteᵀ + head.bias                              tied (untied: h · lm_headᵀ + head.bias)
//   next sentence (next_sentence only): sequence_logits = nsp(tanh(pooler x_[CLS]))   [B, 2]
// The loss is the cross-entropy of the masked positions (targets ≠ kIgnoreIndex: the data source
// chooses them, data/objectives.h), plus the next-sentence cross-entropy when the batch has its labels.
//
// Parameter names: wte.weight, segment.weight (segments > 0), wpe.weight (learned), the stack's
// (relative_bias.weight, norm_in.*, blocks.{i}.*, norm_f.*), head.dense.*, head.norm.*, head.bias,
// lm_head.weight (untied), pooler.*, nsp.* (next_sentence).
#pragma once

#include <cstdint>
#include <memory>

#include "layers/basic.h"
#include "layers/model/language_model.h"
#include "layers/model/model_config.h"
#include "layers/model/stack.h"

namespace seqlab {

// The masked-LM head's transform and output bias: h = norm(gelu(dense x)); its logits add `bias` [V].
class MaskedLmHead : public Module {
 public:
  MaskedLmHead(const ModelConfig& cfg, Generator& gen);
  Tensor transform(const Tensor& x) const { return norm_.forward(dense_.forward_gelu(x)); }
  const Tensor& bias() const { return bias_; }

 private:
  Linear& dense_;
  Norm& norm_;
  Tensor& bias_;
};

class Encoder : public LanguageModel {
 public:
  // Throws std::invalid_argument for a configuration that does not fit, naming what.
  Encoder(const ModelConfig& cfg, Generator& gen);

  const ModelConfig& config() const { return cfg_; }
  // Reads batch.inputs, lengths (padding) and segment_ids (when the model has segments); refuses
  // decoder_inputs.
  Tensor logits(const Batch& batch) override;
  ModelOutputs outputs(const Batch& batch) override;
  double mixing_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_context() const override { return cfg_.max_seq_len; }
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  ModelConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  Embedding* segment_ = nullptr;
  Embedding* wpe_ = nullptr;
  Stack* stack_ = nullptr;
  MaskedLmHead* head_ = nullptr;
  Linear* lm_head_ = nullptr;
  Linear* pooler_ = nullptr;
  Linear* nsp_ = nullptr;
};

double encoder_parameter_count(const ModelConfig& cfg);
double encoder_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len);

}  // namespace seqlab
