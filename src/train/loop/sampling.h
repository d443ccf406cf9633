// Text generation from a language model with its decode state (a KV cache, or recurrent states): the
// prompt is fed once, then one token per step.
//
// The next token is drawn from softmax(logits / temperature) restricted to
//   top-k:  the k most likely ids (k = 0: all), then
//   top-p:  the smallest set of the most likely ids whose probabilities sum to at least p (p = 1: all),
// renormalised, over the ids not suppressed. Temperature 0 is greedy decoding (the argmax; the first on ties).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include "layers/model/language_model.h"
#include "tensor/tensor.h"
#include "train/data/tokenizer.h"

namespace seqlab {

struct SamplingOptions {
  int64_t tokens = 128;      // new tokens to generate
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // in (0, 1]
  int32_t stop_token = -1;   // generation ends after producing this id (-1: never)
  std::vector<int32_t> suppressed;  // ids never drawn (a tokenizer's special tokens that no text holds)
};

// Logits that are NaN or +infinity (or −infinity for every candidate) give no distribution to draw
// from: sample_token and generate refuse them with this error (it used to draw id 0 every time, which
// the byte tokenizer prints as NUL bytes). Weights that are finite but huge give such logits.
class NonFiniteLogits : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One id drawn from `logits` (one row, any length) under `options`; uses `gen` once unless greedy.
// NonFiniteLogits for logits that are not finite (above).
int32_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, Generator& gen);

// The ids a text model should never draw: the tokenizer's special tokens other than end-of-text (pad,
// mask, sentinels: no training text holds them) and any ids of a vocabulary padded past the tokenizer's.
std::vector<int32_t> non_text_ids(const TokenDecoder& tokenizer, int64_t model_vocab_size);

// A sample's prompt: end-of-text (every training document follows one), then the ids of `prompt`
// (TokenDecoder::encode_prompt: its text encoded, or token ids for a decoder that cannot encode).
absl::StatusOr<std::vector<int32_t>> sample_prompt_ids(const TokenDecoder& tokenizer, absl::string_view prompt);
// The prompt without its leading end-of-text and the generated ids after it, decoded as one text (for
// the byte and BPE tokenizers, the prompt's text exactly, then the continuation's).
std::string decode_sample(const TokenDecoder& tokenizer, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& generated);

// Continues `prompt` (at least one id) by up to options.tokens ids and returns only the new ones. The
// model runs in evaluation mode without gradients (its training flag is restored afterwards). When the
// context reaches the model's max_context() (if bounded), the state is rebuilt from the last half of it.
// NonFiniteLogits, naming the token, when the model's logits are not finite.
std::vector<int32_t> generate(LanguageModel& model, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                              Generator& gen);

// An encoder's sample (BERT): `ids` with every position holding `mask_id` replaced by a token drawn
// from the model's logits there (sample_token under `options`; options.tokens is not read), all in one
// forward pass over the whole row, as a masked LM is trained. `segments` as the row's segment ids
// (empty: none). NonFiniteLogits when the logits at a mask are not finite.
std::vector<int32_t> fill_masks(LanguageModel& model, const std::vector<int32_t>& ids, int32_t mask_id,
                                const std::vector<int32_t>& segments, const SamplingOptions& options, Generator& gen);

// An encoder-decoder's sample (T5): the encoder runs once on `source`; the decoder starts from
// `start_id` and draws up to options.tokens ids, ending after options.stop_token; returns the drawn ids.
// The model must be an EncoderDecoder.
std::vector<int32_t> generate_from_source(LanguageModel& model, const std::vector<int32_t>& source, int32_t start_id,
                                          const SamplingOptions& options, Generator& gen);

}  // namespace seqlab
