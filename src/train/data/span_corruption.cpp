#include "train/data/span_corruption.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "train/data/data_io.h"

namespace seqlab {

namespace {

constexpr uint64_t kTrainSalt = 0x7370616e2d74726e;  // "span-trn": the training rows' draws
constexpr uint64_t kEvalSalt = 0x7370616e2d65766c;   // "span-evl": the evaluation walk's, apart from them

absl::Status check_config(const SpanCorruptionConfig& c) {
  if (!(c.noise_density > 0 && c.noise_density < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption: noise_density ", c.noise_density,
                                                   " must be in (0, 1)"));
  }
  if (!(c.mean_span_length >= 1) || !std::isfinite(c.mean_span_length)) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption: mean_span_length ", c.mean_span_length,
                                                   " must be a number ≥ 1"));
  }
  return absl::OkStatus();
}

// The lengths of `segments` ≥ 1 non-empty parts of `items` ≥ segments tokens, every way to cut them
// equally likely: T5's _random_segmentation, which shuffles segments − 1 "a new part starts here" marks
// among the items − 1 gaps between tokens.
std::vector<int64_t> random_segmentation(int64_t items, int64_t segments, Generator& gen) {
  std::vector<uint8_t> starts(static_cast<size_t>(items - 1), 0);
  std::fill(starts.begin(), starts.begin() + (segments - 1), 1);
  shuffle_in_place(starts, gen);
  std::vector<int64_t> lengths(static_cast<size_t>(segments), 0);
  size_t part = 0;
  lengths[0] = 1;
  for (uint8_t start : starts) {
    part += start;
    ++lengths[part];
  }
  return lengths;
}

}  // namespace

SpanLengths span_lengths(int64_t raw, const SpanCorruptionConfig& config) {
  if (raw < 2) throw std::invalid_argument(absl::StrCat("span_corruption: ", raw, " raw tokens hold no noise span"));
  SpanLengths l;
  l.raw = raw;
  l.noise = std::clamp<int64_t>(round_half_even(static_cast<double>(raw) * config.noise_density), 1, raw - 1);
  l.spans = std::max<int64_t>(1, round_half_even(static_cast<double>(l.noise) / config.mean_span_length));
  l.spans = std::min({l.spans, l.noise, raw - l.noise});
  l.inputs = raw - l.noise + l.spans + 1;
  l.targets = l.noise + l.spans + 1;
  return l;
}

absl::StatusOr<SpanLengths> span_corruption_lengths(int64_t seq_len, const SpanCorruptionConfig& config) {
  if (absl::Status s = check_config(config); !s.ok()) return s;
  if (seq_len < kSpanCorruptionMinSeqLen) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption: seq_len ", seq_len, " is below ",
                                                   kSpanCorruptionMinSeqLen, " (a kept token, a sentinel and [EOS])"));
  }
  // inputs(L) never decreases with L (n, s and L − n never shrink as L grows), so the largest L with
  // inputs(L) ≤ seq_len is found by bisection; T5 steps L up one at a time from seq_len − 1, which ends
  // at the same L. inputs(L) ≤ L + 1 (s ≤ n) puts lo = seq_len − 1 within it; inputs(L) ≥ L·(1 − density)
  // + 1.5 puts hi past it.
  int64_t lo = seq_len - 1;
  const double bound = std::ceil(static_cast<double>(seq_len) / (1 - config.noise_density)) + 2;
  if (!(bound < 1e15)) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption: seq_len ", seq_len, " with noise_density ",
                                                   config.noise_density, " needs rows of more than 10^15 tokens"));
  }
  int64_t hi = static_cast<int64_t>(bound);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (span_lengths(mid, config).inputs <= seq_len ? lo : hi) = mid;
  }
  return span_lengths(lo, config);
}

absl::StatusOr<SpanCorruptionSource> SpanCorruptionSource::open(const std::vector<std::string>& shard_paths,
                                                                int32_t stream_eot, const Tokenizer& tokenizer,
                                                                const LoaderOptions& options,
                                                                const SpanCorruptionConfig& config) {
  const SpecialTokens& table = tokenizer.special_tokens();
  if (table.objective != objective_name(Objective::span_corruption)) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption rows need the span_corruption vocabulary, not the ",
                                                   table.objective, " one"));
  }
  absl::StatusOr<SpanLengths> lengths = span_corruption_lengths(options.seq_len, config);
  if (!lengths.ok()) return lengths.status();
  if (lengths->spans > tokenizer.num_sentinels()) {
    return absl::InvalidArgumentError(absl::StrCat("span_corruption: rows of seq_len ", options.seq_len, " hold ",
                                                   lengths->spans, " noise spans, more than the vocabulary's ",
                                                   tokenizer.num_sentinels(), " sentinels"));
  }
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of ", options.world, " is not a valid rank"));
  }
  SpanCorruptionSource s;
  s.opt_ = options;
  s.config_ = config;
  s.lengths_ = *lengths;
  s.pad_ = tokenizer.pad();
  s.eos_ = tokenizer.eos();
  s.first_sentinel_ = tokenizer.sentinel(0);
  absl::StatusOr<DocumentStream> docs =
      DocumentStream::open(shard_paths, options.vocab_size, tokenizer.num_regular(), stream_eot);
  if (!docs.ok()) return docs.status();
  s.docs_ = std::move(*docs);
  if (s.num_rows() < options.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.docs_.name(), ": ", s.num_text_tokens(), " text tokens make ", s.num_rows(), " row(s) of ", s.lengths_.raw,
        " raw tokens, fewer than the ", options.world, " rank(s)"));
  }
  s.order_ = EpochOrder(s.num_rows(), options.seed, options.rank, options.world, options.shuffle);
  return s;
}

void SpanCorruptionSource::fill_row(int64_t row, Generator& gen, int32_t* in, int32_t* dec_in, int32_t* dec_tg) const {
  const SpanLengths& l = lengths_;
  std::vector<int32_t> raw(static_cast<size_t>(l.raw));
  docs_.read_text(row * l.raw, l.raw, raw.data());
  const std::vector<int64_t> noise = random_segmentation(l.noise, l.spans, gen);
  const std::vector<int64_t> kept = random_segmentation(l.raw - l.noise, l.spans, gen);
  std::fill(in, in + opt_.seq_len, pad_);
  int64_t at = 0, out = 0;  // the next raw token, the next decoder target
  int32_t* enc = in;
  for (int64_t i = 0; i < l.spans; ++i) {
    for (int64_t k = 0; k < kept[i]; ++k) *enc++ = raw[at++];
    const int32_t sentinel = first_sentinel_ + static_cast<int32_t>(i);
    *enc++ = sentinel;
    dec_tg[out++] = sentinel;
    for (int64_t k = 0; k < noise[i]; ++k) dec_tg[out++] = raw[at++];
  }
  *enc = eos_;
  dec_tg[out] = eos_;
  // Teacher forcing: the decoder reads [PAD] (its start token), then each target before the one it predicts.
  dec_in[0] = pad_;
  std::copy(dec_tg, dec_tg + l.targets - 1, dec_in + 1);
}

Batch SpanCorruptionSource::make_batch(int64_t batch_size, const std::vector<int64_t>& rows,
                                       std::vector<Generator>& gens) const {
  const int64_t t = opt_.seq_len, s = lengths_.targets;
  Batch b{Tensor::empty({batch_size, t}, DType::i32)};
  b.lengths = Tensor::full({batch_size}, static_cast<double>(lengths_.inputs), DType::i32);
  b.decoder_inputs = Tensor::empty({batch_size, s}, DType::i32);
  b.decoder_targets = Tensor::empty({batch_size, s}, DType::i32);
  b.decoder_lengths = Tensor::full({batch_size}, static_cast<double>(s), DType::i32);
  for (int64_t row = 0; row < batch_size; ++row) {
    fill_row(rows[row], gens[row], b.inputs.data<int32_t>() + row * t, b.decoder_inputs.data<int32_t>() + row * s,
             b.decoder_targets.data<int32_t>() + row * s);
  }
  return b;
}

Batch SpanCorruptionSource::next_batch(int64_t batch_size) {
  BatchDraws d = next_batch_draws(order_, opt_.seed, kTrainSalt, batch_size);
  return make_batch(batch_size, d.items, d.gens);
}

Batch SpanCorruptionSource::eval_batch(int64_t index, int64_t batch_size) const {
  BatchDraws d = eval_batch_draws(num_rows(), opt_.seed, kEvalSalt, index, batch_size);
  return make_batch(batch_size, d.items, d.gens);
}

}  // namespace seqlab
