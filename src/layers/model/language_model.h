// What the step loop, evaluation and decoding need from a next-token model, whatever mixes its
// tokens (softmax attention in Gpt, a recurrence in RecurrentLm): logits for a batch, the loss, and
// incremental decoding that carries a state (a KV cache, or recurrent states) from call to call.
#pragma once

#include <cstdint>
#include <memory>

#include "layers/module.h"
#include "tensor/tensor.h"

namespace seqlab {

// What a model carries between decoding calls; each model defines its own (GptCache, RecurrentLmState).
struct DecodeState {
  virtual ~DecodeState() = default;
  int64_t position = 0;  // tokens consumed so far
};

class LanguageModel : public Module {
 public:
  // tokens [B, T] (i32 or i64) → logits [B, T, V].
  virtual Tensor forward(const Tensor& tokens) = 0;
  // Mean cross-entropy of forward(tokens) against targets [B, T] (entries −100 ignored).
  Tensor loss(const Tensor& tokens, const Tensor& targets);

  // An empty state: decoding starts at position 0.
  virtual std::unique_ptr<DecodeState> new_decode_state() const = 0;
  // tokens [B, t] continuing `state` → logits [B, t, V], the same as the last t rows of a full forward
  // over everything fed so far; advances the state. Meant for decoding under NoGradGuard.
  virtual Tensor forward_step(const Tensor& tokens, DecodeState& state) = 0;

  // FLOPs per token of the token mixing that 6·N (forward and backward through every weight) does not
  // count, for a sequence of `seq_len` tokens: the MFU estimate's second term.
  virtual double mixing_flops_per_token(int64_t seq_len) const = 0;

  virtual int64_t vocab_size() const = 0;
  // The longest context a decode state can hold (positions the model knows); 0: unbounded.
  virtual int64_t max_context() const = 0;
  // The generator of every dropout mask: checkpoint its state() and set_state() it on resume.
  virtual Generator& dropout_generator() = 0;
};

}  // namespace seqlab
