#include "train/data/masked_lm.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "train/data/data_io.h"

namespace seqlab {

namespace {

constexpr uint64_t kTrainSalt = 0x6d6c6d2d74726e;  // "mlm-trn": the training rows' draws
constexpr uint64_t kEvalSalt = 0x6d6c6d2d65766c;   // "mlm-evl": the evaluation walk's, apart from them

enum : uint8_t { kEndsLine = 1, kEndsSentence = 2, kStartsSpace = 4 };

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

absl::StatusOr<MaskedLmSource> MaskedLmSource::open(const std::vector<std::string>& shard_paths, int32_t stream_eot,
                                                    const Tokenizer& tokenizer, const LoaderOptions& options,
                                                    const MaskedLmConfig& config) {
  const SpecialTokens& table = tokenizer.special_tokens();
  if (table.objective != objective_name(Objective::masked_lm)) {
    return absl::InvalidArgumentError(absl::StrCat("masked_lm rows need the masked_lm vocabulary, not the ",
                                                   table.objective, " one"));
  }
  if (options.seq_len < kMaskedLmMinSeqLen) {
    return absl::InvalidArgumentError(absl::StrCat("masked_lm: seq_len ", options.seq_len, " is below ",
                                                   kMaskedLmMinSeqLen, " ([CLS] A [SEP] B [SEP] with a token each)"));
  }
  if (!(config.mask_fraction > 0 && config.mask_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("masked_lm: mask_fraction ", config.mask_fraction,
                                                   " must be in (0, 1]"));
  }
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of ", options.world, " is not a valid rank"));
  }
  MaskedLmSource s;
  s.opt_ = options;
  s.config_ = config;
  s.num_regular_ = tokenizer.num_regular();
  s.pad_ = tokenizer.pad();
  s.cls_ = tokenizer.cls();
  s.sep_ = tokenizer.sep();
  s.mask_ = tokenizer.mask();
  absl::StatusOr<DocumentStream> docs = DocumentStream::open(shard_paths, options.vocab_size, s.num_regular_, stream_eot);
  if (!docs.ok()) return docs.status();
  s.docs_ = std::move(*docs);
  const int64_t needed = std::max<int64_t>(options.world, config.next_sentence ? 2 : 1);
  if (s.num_documents() < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.docs_.name(), ": ", s.num_documents(), " document(s), fewer than the ", needed, " that ",
        config.next_sentence && needed == 2 ? "next_sentence needs (a random B comes from another document)"
                                            : absl::StrCat(options.world, " ranks need (one each)")));
  }
  s.order_ = EpochOrder(s.num_documents(), options.seed, options.rank, options.world, options.shuffle);
  s.flags_.resize(static_cast<size_t>(s.num_regular_));
  for (int32_t id = 0; id < s.num_regular_; ++id) {
    const std::string text = tokenizer.token_text(id);
    if (text.empty()) continue;
    uint8_t f = 0;
    if (text.back() == '\n') f |= kEndsLine;
    if (text.back() == '.' || text.back() == '!' || text.back() == '?') f |= kEndsSentence;
    if (is_space(text.front())) f |= kStartsSpace;
    s.flags_[static_cast<size_t>(id)] = f;
  }
  return s;
}

int64_t MaskedLmSource::split_point(const std::vector<int32_t>& t) const {
  const int64_t m = static_cast<int64_t>(t.size());
  if (m < 2) throw std::invalid_argument(absl::StrCat("masked_lm: a document of ", m, " token(s) has no split"));
  // Boundary i sits between t[i-1] and t[i]; the one nearest the middle (|2i - m| least, the earlier on
  // a tie) within the middle half wins.
  int64_t best = -1;
  for (int64_t i = std::max<int64_t>(1, (m + 3) / 4); i < m && 4 * i <= 3 * m; ++i) {
    const uint8_t before = flags_[static_cast<size_t>(t[i - 1])], after = flags_[static_cast<size_t>(t[i])];
    const bool boundary = (before & kEndsLine) || ((before & kEndsSentence) && (after & kStartsSpace));
    if (boundary && (best < 0 || std::abs(2 * i - m) < std::abs(2 * best - m))) best = i;
  }
  return best > 0 ? best : m / 2;
}

std::pair<int32_t, int32_t> MaskedLmSource::fill_row(int64_t d, Generator& gen, int32_t* in, int32_t* tg,
                                                     int32_t* seg) const {
  const int64_t t = opt_.seq_len, budget = t - 3;
  std::fill(in, in + t, pad_);
  std::fill(tg, tg + t, kIgnoreIndex);
  std::fill(seg, seg + t, 0);
  const std::vector<int32_t> doc = docs_.document(d, budget);
  const int64_t m = static_cast<int64_t>(doc.size());
  // The positions of the row's text tokens: the candidates for masking.
  std::vector<int64_t> text;
  int64_t at = 0;
  int32_t label = kIgnoreIndex;
  auto put = [&](int32_t id, int32_t segment, bool is_text) {
    if (is_text) text.push_back(at);
    seg[at] = segment;
    in[at++] = id;
  };
  put(cls_, 0, false);
  if (m < 2) {
    for (int32_t id : doc) put(id, 0, true);
    put(sep_, 0, false);
  } else {
    const int64_t s = split_point(doc);
    for (int64_t i = 0; i < s; ++i) put(doc[i], 0, true);
    put(sep_, 0, false);
    std::vector<int32_t> b(doc.begin() + s, doc.end());
    if (config_.next_sentence) {
      label = static_cast<int32_t>(random_below(gen, 2));
      if (label == 1) {
        int64_t e = static_cast<int64_t>(random_below(gen, static_cast<uint64_t>(num_documents() - 1)));
        if (e >= d) ++e;  // any document but this one
        const std::vector<int32_t> other = docs_.document(e, budget);
        const int64_t from = other.size() >= 2 ? split_point(other) : 0;
        const int64_t room = budget - s;  // ≥ 1: s < m ≤ budget
        b.assign(other.begin() + from, other.begin() + std::min<int64_t>(static_cast<int64_t>(other.size()), from + room));
      }
    }
    for (int32_t id : b) put(id, 1, true);
    put(sep_, 1, false);
  }
  // k distinct positions of the text tokens (a partial Fisher-Yates shuffle), then 80/10/10.
  const int64_t n = static_cast<int64_t>(text.size());
  const int64_t k = std::min(n, std::max<int64_t>(1, round_half_even(config_.mask_fraction * static_cast<double>(n))));
  for (int64_t i = 0; i < k; ++i) {
    std::swap(text[i], text[i + static_cast<int64_t>(random_below(gen, static_cast<uint64_t>(n - i)))]);
    const int64_t p = text[i];
    tg[p] = in[p];
    const uint64_t r = random_below(gen, 10);
    if (r < 8) {
      in[p] = mask_;
    } else if (r == 8) {
      in[p] = static_cast<int32_t>(random_below(gen, static_cast<uint64_t>(num_regular_)));
    }
  }
  return {static_cast<int32_t>(at), label};
}

Batch MaskedLmSource::make_batch(int64_t batch_size, const std::vector<int64_t>& documents,
                                 std::vector<Generator>& gens) const {
  const int64_t t = opt_.seq_len;
  Batch b{Tensor::empty({batch_size, t}, DType::i32), Tensor::empty({batch_size, t}, DType::i32)};
  b.segment_ids = Tensor::empty({batch_size, t}, DType::i32);
  b.lengths = Tensor::empty({batch_size}, DType::i32);
  if (config_.next_sentence) b.sequence_targets = Tensor::empty({batch_size}, DType::i32);
  for (int64_t row = 0; row < batch_size; ++row) {
    auto [length, label] = fill_row(documents[row], gens[row], b.inputs.data<int32_t>() + row * t,
                                    b.targets.data<int32_t>() + row * t, b.segment_ids.data<int32_t>() + row * t);
    b.lengths.data<int32_t>()[row] = length;
    if (config_.next_sentence) b.sequence_targets.data<int32_t>()[row] = label;
  }
  return b;
}

Batch MaskedLmSource::next_batch(int64_t batch_size) {
  BatchDraws d = next_batch_draws(order_, opt_.seed, kTrainSalt, batch_size);
  return make_batch(batch_size, d.items, d.gens);
}

Batch MaskedLmSource::eval_batch(int64_t index, int64_t batch_size) const {
  BatchDraws d = eval_batch_draws(num_documents(), opt_.seed, kEvalSalt, index, batch_size);
  return make_batch(batch_size, d.items, d.gens);
}

}  // namespace seqlab
