// What the trainer, evaluation and decoding need from a model, whatever its kind: logits for a Batch
// (batch.h), the loss, and — for the kinds that generate — incremental decoding that carries a state
// (KV caches, recurrent states) from call to call. The decoder (decoder.h), the encoder (encoder.h,
// BERT) and the encoder-decoder (encoder_decoder.h, T5) implement it over the fields of Batch they read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/model/batch.h"
#include "layers/module.h"
#include "tensor/tensor.h"

namespace seqlab {

// What a model carries between decoding calls; each model defines its own.
struct DecodeState {
  virtual ~DecodeState() = default;
  int64_t position = 0;  // tokens consumed so far
};

// Everything a forward pass gives the objective.
struct ModelOutputs {
  Tensor logits;           // [B, T, V] at the positions the loss scores
  Tensor sequence_logits;  // [B, K] one classification per row (BERT's next sentence); undefined: none
  Tensor aux_loss;         // a scalar the objective adds (the MoE blocks' load balancing); undefined: none
};

class LanguageModel : public Module {
 public:
  // Logits [B, T, V] at the positions the loss scores (the decoder's, for encoder-decoder models).
  // Throws std::invalid_argument naming a field of the batch the model cannot use.
  virtual Tensor logits(const Batch& batch) = 0;
  // The logits and whatever else the model's heads give (by default the logits alone).
  virtual ModelOutputs outputs(const Batch& batch) { return {logits(batch), Tensor(), Tensor()}; }
  // The model's objective on `logits` (= logits(batch)): by default the cross-entropy against
  // batch.scored_targets(), averaged over the positions scored — targets ≠ kIgnoreIndex within the
  // row's length — and weighted by batch.loss_weights when given (Σ w·ℓ / Σ w).
  virtual Tensor loss_from_logits(const Batch& batch, const Tensor& logits) const;
  // The objective on all the outputs: loss_from_logits, plus the cross-entropy of sequence_logits against
  // batch.sequence_targets where both are there (BERT's masked LM + next sentence), plus aux_loss where
  // there is one (the MoE blocks' load-balancing loss, in training).
  Tensor loss_from_outputs(const Batch& batch, const ModelOutputs& out) const;
  Tensor loss(const Batch& batch) { return loss_from_outputs(batch, outputs(batch)); }

  // Whether the model generates token by token (a decoder or an encoder-decoder); an encoder does not,
  // and new_decode_state and forward_step throw std::logic_error.
  virtual bool can_decode() const { return false; }
  // An empty state: decoding starts at position 0.
  virtual std::unique_ptr<DecodeState> new_decode_state() const;
  // tokens [B, t] continuing `state` → logits [B, t, V], the same as the last t rows of a full forward
  // over everything fed so far; advances the state. Meant for decoding under NoGradGuard.
  virtual Tensor forward_step(const Tensor& tokens, DecodeState& state);

  // FLOPs per token of the token mixing that 6·N (forward and backward through every weight) does not
  // count, for a sequence of `seq_len` tokens: the MFU estimate's second term.
  virtual double mixing_flops_per_token(int64_t seq_len) const = 0;

  virtual int64_t vocab_size() const = 0;
  // The longest context a decode state can hold (positions the model knows); 0: unbounded.
  virtual int64_t max_context() const = 0;
  // The generator of every dropout mask: checkpoint its state() and set_state() it on resume.
  virtual Generator& dropout_generator() = 0;

  // Figures of the last training forward the objective does not show, by name, each averaged over
  // micro-batches and ranks by the trainer and logged (the MoE blocks': aux_loss, moe_balance,
  // moe_dropped; moe.h). Empty by default and for models without such blocks.
  virtual std::vector<std::pair<std::string, double>> training_metrics() const { return {}; }
};

// `targets` with every position at or past its row's length set to kIgnoreIndex (lengths [B], targets
// [B, T]); `targets` itself when lengths is undefined.
Tensor ignore_past_lengths(const Tensor& targets, const Tensor& lengths);

}  // namespace seqlab
