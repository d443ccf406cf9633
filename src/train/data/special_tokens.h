// Special tokens: the ids a vocabulary adds after its tokenizer's regular ids (the bytes, or the bytes and
// BPE merges) for what no text holds — document boundaries, padding, masks, span sentinels. Which ones
// depends on what the data is for, data.objective, and this file is the one place that says so:
//
//   objective         special tokens, in id order from n = the tokenizer's regular ids (byte: 256)
//   lm                <|eot|> <|pad|> <|mask|> <|sentinel_0|> ... <|sentinel_15|>        (19; vocab n+19)
//   masked_lm         [PAD] [CLS] [SEP] [MASK]                                            (4; vocab n+4)
//   span_corruption   [PAD] [EOS] <extra_id_0> ... <extra_id_{k-1}>                       (2+k; vocab n+2+k)
//
// lm is the table every vocabulary had before objectives existed, kept id for id so that language-model
// runs keep their vocabulary and their losses; its marker texts are only how ids print ("<|eot|>" in a
// prompt is seven bytes, as before). The masked_lm and span_corruption tables use BERT's and T5's
// spellings, and their texts are tokens in a prompt too: Tokenizer::encode_prompt reads "The [MASK] sat"
// as "The ", the [MASK] id, " sat". k, the sentinels, is what the longest row needs (span_corruption.h,
// span_corruption_lengths: one per noise span).
//
// Each table also says which of its tokens plays each role (-1: none), so code asks for "the padding id"
// and never counts offsets. eot, the token that ends a text (a prepared stream puts one before every
// document; sampling starts a prompt with it), is <|eot|>, [SEP] (a BERT row ends with it) or [EOS].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/statusor.h>

namespace seqlab {

// What a run's data trains: data.objective.
enum class Objective { lm, masked_lm, span_corruption };
absl::StatusOr<Objective> parse_objective(const std::string& name);  // "lm", "masked_lm", "span_corruption"
const char* objective_name(Objective objective);

struct SpecialTokens {
  std::string objective;           // the objective whose table this is ("lm", ...): named in errors
  std::vector<std::string> texts;  // special token i has id n + i and prints as texts[i]
  bool in_prompts = false;         // encode_prompt turns these texts into their ids
  // The index in `texts` of each role; -1 where the table has none.
  int eot = -1, pad = -1, mask = -1, cls = -1, sep = -1, eos = -1;
  int first_sentinel = -1, sentinels = 0;  // sentinel i is texts[first_sentinel + i], i < sentinels

  int size() const { return static_cast<int>(texts.size()); }
  bool operator==(const SpecialTokens& o) const {
    return objective == o.objective && texts == o.texts && in_prompts == o.in_prompts;
  }
};

// The lm table's sentinels: 16, as every vocabulary had them.
constexpr int kLmSentinels = 16;

// The table of `objective` (above); `sentinels` is read for span_corruption only and must be at least 1
// there (std::invalid_argument otherwise).
SpecialTokens special_tokens(Objective objective, int64_t sentinels = 0);

}  // namespace seqlab
