#include "train/data/token_stream.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "train/data/data_io.h"

namespace seqlab {

// ---------------------------------------------------------------------------------------------------
// TokenStream

absl::StatusOr<TokenStream> TokenStream::open(const std::vector<std::string>& shard_paths, int64_t vocab_size) {
  if (shard_paths.empty()) return absl::InvalidArgumentError("no shards to load");
  TokenStream t;
  for (const std::string& path : shard_paths) {
    absl::StatusOr<Shard> s = Shard::open(path);
    if (!s.ok()) return s.status();
    if (absl::Status ids = s->check_ids(vocab_size); !ids.ok()) return ids;
    t.offsets_.push_back(t.offsets_.back() + s->size());
    t.shards_.push_back(std::move(*s));
  }
  return t;
}

std::string TokenStream::name() const {
  if (shards_.empty()) return "(no shards)";
  return shards_.size() == 1 ? shards_[0].path()
                             : absl::StrCat(shards_[0].path(), " and ", shards_.size() - 1, " more shard(s)");
}

void TokenStream::read(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > size()) {
    throw std::out_of_range(absl::StrCat("read_tokens [", start, ", ", start + n, ") outside the ", size(), " tokens"));
  }
  // The shard holding `start`: the last whose first token is at or before it.
  size_t s = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), start) - offsets_.begin() - 1);
  while (n > 0) {
    int64_t at = start - offsets_[s];
    int64_t take = std::min(n, shards_[s].size() - at);
    const uint16_t* src = shards_[s].tokens() + at;
    for (int64_t i = 0; i < take; ++i) out[i] = src[i];
    out += take;
    start += take;
    n -= take;
    ++s;
  }
}

// ---------------------------------------------------------------------------------------------------
// DocumentStream

absl::StatusOr<DocumentStream> DocumentStream::open(const std::vector<std::string>& shard_paths, int64_t vocab_size,
                                                    int32_t num_regular, int32_t eot) {
  absl::StatusOr<TokenStream> stream = TokenStream::open(shard_paths, vocab_size);
  if (!stream.ok()) return stream.status();
  DocumentStream d;
  d.stream_ = std::move(*stream);
  // One pass over the ids: a document starts after every eot (and at the stream's start) and runs to
  // the next; a document may continue from one shard into the next.
  int64_t doc_start = 0;
  auto close = [&](int64_t end) {
    if (end > doc_start) {
      d.start_.push_back(doc_start);
      d.packed_.push_back(d.packed_.back() + (end - doc_start));
    }
  };
  for (size_t s = 0; s < d.stream_.shards().size(); ++s) {
    const Shard& shard = d.stream_.shards()[s];
    const uint16_t* ids = shard.tokens();
    const int64_t offset = d.stream_.shard_offset(s);
    for (int64_t i = 0; i < shard.size(); ++i) {
      const int32_t id = ids[i];
      if (id == eot) {
        close(offset + i);
        doc_start = offset + i + 1;
      } else if (id >= num_regular) {
        return absl::InvalidArgumentError(absl::StrCat(
            shard.path(), ": token id ", id, " at position ", i, " is a special token (the text ids are 0 to ",
            num_regular - 1, ", end-of-text ", eot, "); the masked_lm and span_corruption objectives read text "
            "and insert their own special tokens"));
      }
    }
  }
  close(d.stream_.size());
  return d;
}

std::vector<int32_t> DocumentStream::document(int64_t d, int64_t max_tokens) const {
  if (d < 0 || d >= num_documents()) {
    throw std::out_of_range(absl::StrCat("document ", d, " of ", num_documents()));
  }
  std::vector<int32_t> out(static_cast<size_t>(std::min(std::max<int64_t>(max_tokens, 0), document_size(d))));
  stream_.read(start_[d], static_cast<int64_t>(out.size()), out.data());
  return out;
}

void DocumentStream::read_text(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > text_size()) {
    throw std::out_of_range(absl::StrCat("text tokens [", start, ", ", start + n, ") outside the ", text_size()));
  }
  // The document holding `start`: the last whose first packed token is at or before it.
  int64_t d = std::upper_bound(packed_.begin(), packed_.end(), start) - packed_.begin() - 1;
  while (n > 0) {
    const int64_t at = start - packed_[d];
    const int64_t take = std::min(n, document_size(d) - at);
    stream_.read(start_[d] + at, take, out);
    out += take;
    start += take;
    n -= take;
    ++d;
  }
}

// ---------------------------------------------------------------------------------------------------
// EpochOrder

EpochOrder::EpochOrder(int64_t items, uint64_t seed, int rank, int world, bool shuffle)
    : items_(items), seed_(seed), rank_(rank), world_(world), shuffle_(shuffle) {
  if (world < 1 || rank < 0 || rank >= world || items < world) {
    throw std::invalid_argument(absl::StrCat("EpochOrder: ", items, " items cannot be shared by rank ", rank, " of ",
                                             world));
  }
  build();
}

void EpochOrder::build() {
  std::vector<int64_t> all(static_cast<size_t>(items_));
  for (int64_t w = 0; w < items_; ++w) all[w] = w;
  if (shuffle_) {
    Generator gen(mix_seed(seed_, static_cast<uint64_t>(epoch_)));
    shuffle_in_place(all, gen);
  }
  const int64_t n = per_rank();
  order_.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) order_[j] = all[j * world_ + rank_];
}

EpochOrder::Entry EpochOrder::next() {
  if (position_ == per_rank()) {
    ++epoch_;
    position_ = 0;
    build();
  }
  Entry e{order_[position_], epoch_, position_ * world_ + rank_};
  ++position_;
  return e;
}

absl::Status EpochOrder::restore(const LoaderState& state, const std::string& unit) {
  if (state.epoch < 0 || state.position < 0 || state.position > per_rank()) {
    return absl::InvalidArgumentError(absl::StrCat("loader state (epoch ", state.epoch, ", position ", state.position,
                                                   ") does not fit this data: ", per_rank(), " ", unit,
                                                   " per rank and epoch"));
  }
  epoch_ = state.epoch;
  position_ = state.position;
  build();
  return absl::OkStatus();
}

Generator example_generator(uint64_t seed, uint64_t salt, int64_t epoch, int64_t index) {
  return Generator(
      mix_seed(mix_seed(mix_seed(seed, salt), static_cast<uint64_t>(epoch)), static_cast<uint64_t>(index)));
}

int64_t round_half_even(double x) {
  const double below = std::floor(x), rest = x - below;
  const bool up = rest > 0.5 || (rest == 0.5 && std::fmod(below, 2.0) != 0.0);
  return static_cast<int64_t>(up ? below + 1 : below);
}

BatchDraws next_batch_draws(EpochOrder& order, uint64_t seed, uint64_t salt, int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument(absl::StrCat("batch size ", batch_size, " must be at least 1"));
  BatchDraws d;
  for (int64_t row = 0; row < batch_size; ++row) {
    const EpochOrder::Entry e = order.next();
    d.items.push_back(e.item);
    d.gens.push_back(example_generator(seed, salt, e.epoch, e.index));
  }
  return d;
}

BatchDraws eval_batch_draws(int64_t items, uint64_t seed, uint64_t salt, int64_t index, int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument(absl::StrCat("batch size ", batch_size, " must be at least 1"));
  if (index < 0) throw std::invalid_argument(absl::StrCat("eval batch index ", index, " is negative"));
  BatchDraws d;
  for (int64_t row = 0; row < batch_size; ++row) {
    const int64_t j = index * batch_size + row;
    d.items.push_back(j % items);
    d.gens.push_back(example_generator(seed, salt, 0, j));
  }
  return d;
}

}  // namespace seqlab
