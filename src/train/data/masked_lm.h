// BERT's masked-language-model data (data.objective = "masked_lm"), made from the documents of a
// prepared split (DocumentStream) with the masked_lm vocabulary's special tokens [PAD] [CLS] [SEP] [MASK]
// (special_tokens.h).
//
// A row is one document. Its first seq_len − 3 tokens (the rest of a longer document is not read) are
// split into two "sentences" A and B at the boundary nearest their middle — after a token that ends a
// line, or after one that ends in . ! or ? when the next token starts with whitespace — among the
// boundaries within the middle half (m/4 ≤ i ≤ 3m/4 of m tokens); without one there, at token m/2. The
// row is
//   [CLS] A [SEP] B [SEP] [PAD] ...        segment_ids 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
// and a document of a single token is [CLS] text [SEP]. With next_sentence, each pair row draws whether
// B is its own (sequence_targets 0, "B follows A") or, half the time, the B half of another document
// drawn uniformly from the rest, cut to the room A leaves (sequence_targets 1, "B is random": Hugging
// Face's convention); a single-token row has no pair and its sequence target is kIgnoreIndex.
//
// Masking, as BERT's create_pretraining_data: of the row's m text tokens (never [CLS], [SEP] or [PAD]),
// k = max(1, round(mask_fraction · m)) distinct positions are drawn uniformly; each becomes [MASK] with
// probability 0.8, a random text token (uniform over the tokenizer's regular ids) with 0.1, and stays
// itself with 0.1. targets hold the original id at those k positions and kIgnoreIndex everywhere else.
//
// Byte tokenizer ([PAD] 256, [CLS] 257, [SEP] 258, [MASK] 259), seq_len 12, the document "Hi. Yo\n":
// the boundary after "." (the next token, " ", starts with whitespace) splits it at 3 of 7 tokens;
// with mask_fraction 0.15, k = round(1.05) = 1 position, here 'Y' made [MASK]:
//   inputs       [CLS] H i . [SEP] ␠ [MASK] o \n [SEP] [PAD] [PAD]
//   targets        .   . . .   .   .   Y    . .    .     .     .      (. = kIgnoreIndex)
//   segment_ids    0   0 0 0   0   1   1    1 1    1     0     0
//   lengths 10
//
// The batch: inputs, targets, segment_ids [B, seq_len], lengths [B], and with next_sentence
// sequence_targets [B] (all i32). Epochs visit the documents in an order shuffled from the seed, shared
// out among ranks (EpochOrder); every random draw of a row comes from a generator seeded by the row's
// place in its epoch's order (example_generator), so a row is the same on any number of ranks and after
// any resume. The evaluation walk takes the documents in order from the first (wrapping around), its
// draws seeded from the walk's index in a stream of their own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "train/data/loader.h"
#include "train/data/token_stream.h"
#include "train/data/tokenizer.h"

namespace seqlab {

struct MaskedLmConfig {
  double mask_fraction = 0.15;  // in (0, 1]
  bool next_sentence = false;
};

// The shortest row that holds a pair: [CLS] a [SEP] b [SEP].
constexpr int64_t kMaskedLmMinSeqLen = 5;

class MaskedLmSource : public BatchSource {
 public:
  // Rows of options.seq_len tokens from the documents of `shard_paths`, a prepared split whose stream
  // separates documents with `stream_eot` (every id below options.vocab_size), in the vocabulary of
  // `tokenizer`, which must carry the masked_lm table. Errors say what is wrong: the table, seq_len,
  // mask_fraction, a shard, too few documents for the ranks (or for next_sentence, which needs two).
  static absl::StatusOr<MaskedLmSource> open(const std::vector<std::string>& shard_paths, int32_t stream_eot,
                                             const Tokenizer& tokenizer, const LoaderOptions& options,
                                             const MaskedLmConfig& config);

  Batch next_batch(int64_t batch_size) override;
  // Batch i holds the walk's rows i·B .. i·B+B-1: documents (i·B + row) mod num_documents().
  Batch eval_batch(int64_t index, int64_t batch_size) const override;
  LoaderState state() const override { return order_.state(); }
  absl::Status restore(const LoaderState& state) override { return order_.restore(state, "documents"); }

  int64_t num_documents() const { return docs_.num_documents(); }
  // How many eval batches of `batch_size` fit before the walk wraps around.
  int64_t eval_batches(int64_t batch_size) const { return num_documents() / batch_size; }
  // Where document `d` is split into A and B (above): a token boundary in [1, tokens.size()) for tokens
  // of at least two ids. Exposed for the tests.
  int64_t split_point(const std::vector<int32_t>& tokens) const;

 private:
  MaskedLmSource() = default;
  Batch make_batch(int64_t batch_size, const std::vector<int64_t>& documents, std::vector<Generator>& gens) const;
  // One row for document `d` into in/tg/seg [T]; returns (length, sequence target).
  std::pair<int32_t, int32_t> fill_row(int64_t d, Generator& gen, int32_t* in, int32_t* tg, int32_t* seg) const;

  LoaderOptions opt_;
  MaskedLmConfig config_;
  DocumentStream docs_;
  EpochOrder order_;
  int32_t num_regular_ = 0, pad_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
  // Per text id: whether its text ends a line, ends in sentence punctuation, starts with whitespace.
  std::vector<uint8_t> flags_;
};

}  // namespace seqlab
