// A batch: what a data source hands the trainer and the trainer hands the model, for every model
// family — decoder-only (GPT, recurrent and hybrid LMs), encoder (BERT) and encoder-decoder (T5,
// seq2seq). Fields a source does not fill stay undefined; a model refuses, with a message naming the
// field, what it cannot use (the decoder takes no decoder_inputs and no segment_ids).
#pragma once

#include <cstdint>
#include <utility>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab {

// Targets equal to this are not scored (cross-entropy and accuracy skip them).
constexpr int32_t kIgnoreIndex = -100;

struct Batch {
  Batch() = default;
  // The decoder-only case: inputs and their targets (`Batch{tokens}` when nothing is scored).
  Batch(Tensor inputs, Tensor targets = Tensor()) : inputs(std::move(inputs)), targets(std::move(targets)) {}

  Tensor inputs;   // [B, T] i32/i64 token ids: the decoder's input, or the encoder's (BERT, T5)
  Tensor targets;  // [B, T] the id to predict at each input position; kIgnoreIndex where nothing is scored
  Tensor lengths;  // [B] valid tokens per row, the rest padding (never scored); undefined: every token valid
  Tensor segment_ids;      // [B, T] segment of each token (BERT's sentences A/B; packed documents)
  Tensor decoder_inputs;   // [B, S] encoder-decoder models: the decoder's input ids
  Tensor decoder_targets;  // [B, S] encoder-decoder models: what the decoder predicts
  Tensor decoder_lengths;  // [B] valid decoder tokens per row
  Tensor loss_weights;     // shaped as the scored targets: a weight per position (Σ w·ℓ / Σ w); undefined: 1
  // [B] one label per row for a loss on the whole sequence: BERT's next-sentence prediction (0: segment B
  // follows A, 1: B is from a random document, as Hugging Face counts; kIgnoreIndex: a row without a pair)
  Tensor sequence_targets;

  // The ids the loss scores and the lengths that bound them: the decoder's for encoder-decoder batches.
  const Tensor& scored_targets() const { return decoder_inputs.defined() ? decoder_targets : targets; }
  const Tensor& scored_lengths() const { return decoder_inputs.defined() ? decoder_lengths : lengths; }

  // Every defined field copied to `device` (the batch itself when it is there already).
  Batch to(Device device) const {
    auto move = [&](const Tensor& t) { return t.defined() ? kernel::to_device(t, device) : t; };
    Batch b(move(inputs), move(targets));
    b.lengths = move(lengths);
    b.segment_ids = move(segment_ids);
    b.decoder_inputs = move(decoder_inputs);
    b.decoder_targets = move(decoder_targets);
    b.decoder_lengths = move(decoder_lengths);
    b.loss_weights = move(loss_weights);
    b.sequence_targets = move(sequence_targets);
    return b;
  }
};

}  // namespace seqlab
