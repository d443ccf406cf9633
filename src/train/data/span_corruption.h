// T5's span-corruption data (data.objective = "span_corruption"): the documents of a prepared split
// packed into one text stream without separators (as T5 packs its corpus: DocumentStream::read_text),
// cut into rows of L raw tokens, in each of which spans of noise tokens are replaced by sentinels
// (special_tokens.h: [PAD] [EOS] <extra_id_0> <extra_id_1> ...).
//
// The noise of L raw tokens (T5's random_spans_noise_mask), with round() halves to even as T5's:
//   n = round(L · noise_density), kept within [1, L − 1]           noise tokens
//   s = max(1, round(n / mean_span_length)), at most min(n, L − n)  noise spans
// The n noise tokens are cut into s spans, and the L − n others into s spans too, each cut uniformly
// among the ways to make s non-empty parts (T5's _random_segmentation: s − 1 of the n − 1 gaps chosen
// at random); the row is then non-noise span 0, noise span 0, non-noise span 1, noise span 1, ...:
//   inputs            = nonnoise_0 <extra_id_0> nonnoise_1 <extra_id_1> ... <extra_id_{s-1}> [EOS]
//   decoder_targets   = <extra_id_0> noise_0 <extra_id_1> noise_1 ... <extra_id_{s-1}> noise_{s-1} [EOS]
//   decoder_inputs    = [PAD] decoder_targets without its last token    ([PAD] is T5's decoder start)
// so the encoder input has L − n + s + 1 tokens and the decoder S = n + s + 1, the same for every row.
//
// The lengths, T5's random_spans_helper: train.seq_len (T) is the encoder input's length, and L is the
// largest raw length whose input L − n + s + 1 fits in T. The input's length never drops as L grows and
// rises by one token at a time while the spans are fewer than the kept tokens, so in T5's settings —
// noise_density up to 0.4 with any mean, 0.5 with mean_span_length ≥ 1.5 — it fills T exactly (for T5's
// T = 512, density 0.15, mean 3: L = 568, n = 85, s = 28, input 512, S = 114). Denser noise caps the
// spans at the kept tokens, the input then grows two tokens at a time and may end one short of T: that
// row is padded with [PAD], and lengths says so. The decoder length S follows from L. A vocabulary for T
// needs s sentinels, one per span: span_corruption_lengths(T, ...).spans, the most any row up to T
// tokens holds.
//
// Byte tokenizer ([PAD] 256, [EOS] 257, <extra_id_i> 258 + i), T = 9, density 0.3, mean 2: L = 9,
// n = round(2.7) = 3, s = round(1.5) = 2, input 9 − 3 + 2 + 1 = 9, S = 3 + 2 + 1 = 6 (L = 10 would make
// an input of 10). The raw text "abcdefghi" with noise spans "c" and "hi" (non-noise "ab", "defg"):
//   inputs            a b <extra_id_0> d e f g <extra_id_1> [EOS]     (lengths 9)
//   decoder_targets   <extra_id_0> c <extra_id_1> h i [EOS]          (decoder_lengths 6)
//   decoder_inputs    [PAD] <extra_id_0> c <extra_id_1> h i
//
// The batch: inputs [B, T] (padded with [PAD]), lengths [B], decoder_inputs and decoder_targets [B, S],
// decoder_lengths [B] (all i32); targets stays undefined (the decoder's are scored). Epochs visit the
// rows in an order shuffled from the seed, shared out among ranks, each row's draws seeded by its place
// in that order, and the evaluation walk takes the rows in order — as masked_lm.h says.
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

// The shortest encoder input: a kept token, a sentinel and [EOS].
constexpr int64_t kSpanCorruptionMinSeqLen = 3;

struct SpanCorruptionConfig {
  double noise_density = 0.15;    // in (0, 1)
  double mean_span_length = 3.0;  // ≥ 1
};

struct SpanLengths {
  int64_t raw = 0;      // L: the text tokens of a row
  int64_t noise = 0;    // n
  int64_t spans = 0;    // s: noise spans, each with its sentinel
  int64_t inputs = 0;   // L − n + s + 1: the encoder input
  int64_t targets = 0;  // S = n + s + 1: the decoder's inputs and targets
};

// The noise of `raw` ≥ 2 tokens (above).
SpanLengths span_lengths(int64_t raw, const SpanCorruptionConfig& config);
// The lengths of rows whose encoder input has `seq_len` tokens (at most; above). Errors for seq_len
// below 3 (one kept token, one sentinel, [EOS]) and for a config outside its ranges.
absl::StatusOr<SpanLengths> span_corruption_lengths(int64_t seq_len, const SpanCorruptionConfig& config);

class SpanCorruptionSource : public BatchSource {
 public:
  // Rows whose encoder input has options.seq_len tokens, from the documents of `shard_paths` (a prepared
  // split whose stream separates documents with `stream_eot`, every id below options.vocab_size), in the
  // vocabulary of `tokenizer`, which must carry the span_corruption table with enough sentinels. Errors
  // say what is wrong: the table, the lengths, a shard, too little text for one row per rank.
  static absl::StatusOr<SpanCorruptionSource> open(const std::vector<std::string>& shard_paths, int32_t stream_eot,
                                                   const Tokenizer& tokenizer, const LoaderOptions& options,
                                                   const SpanCorruptionConfig& config);

  Batch next_batch(int64_t batch_size) override;
  // Batch i holds the walk's rows i·B .. i·B+B-1: rows (i·B + row) mod num_rows().
  Batch eval_batch(int64_t index, int64_t batch_size) const override;
  LoaderState state() const override { return order_.state(); }
  absl::Status restore(const LoaderState& state) override { return order_.restore(state, "spans of text"); }

  const SpanLengths& lengths() const { return lengths_; }
  int64_t num_rows() const { return docs_.text_size() / lengths_.raw; }  // rows of L raw tokens
  int64_t num_text_tokens() const { return docs_.text_size(); }
  // How many eval batches of `batch_size` fit before the walk wraps around.
  int64_t eval_batches(int64_t batch_size) const { return num_rows() / batch_size; }

 private:
  SpanCorruptionSource() = default;
  Batch make_batch(int64_t batch_size, const std::vector<int64_t>& rows, std::vector<Generator>& gens) const;
  void fill_row(int64_t row, Generator& gen, int32_t* in, int32_t* dec_in, int32_t* dec_tg) const;

  LoaderOptions opt_;
  SpanCorruptionConfig config_;
  SpanLengths lengths_;
  DocumentStream docs_;
  EpochOrder order_;
  int32_t pad_ = 0, eos_ = 0, first_sentinel_ = 0;
};

}  // namespace seqlab
