#include "train/data/loader.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <stdexcept>

#include "train/data/data_io.h"

namespace seqlab {

namespace {

void check_batch_size(int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument(absl::StrCat("batch size ", batch_size, " must be at least 1"));
}

}  // namespace

absl::StatusOr<TokenLoader> TokenLoader::open(const std::vector<std::string>& shard_paths,
                                              const LoaderOptions& options) {
  if (options.seq_len < 1) return absl::InvalidArgumentError(absl::StrCat("seq_len ", options.seq_len, " must be at least 1"));
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of ", options.world, " is not a valid rank"));
  }
  if (options.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", options.vocab_size, " must be at least 1"));
  }
  if (shard_paths.empty()) return absl::InvalidArgumentError("no shards to load");
  TokenLoader l;
  l.opt_ = options;
  for (const std::string& path : shard_paths) {
    absl::StatusOr<Shard> s = Shard::open(path);
    if (!s.ok()) return s.status();
    if (absl::Status ids = s->check_ids(options.vocab_size); !ids.ok()) return ids;
    l.offsets_.push_back(l.offsets_.back() + s->size());
    l.shards_.push_back(std::move(*s));
  }
  const int64_t n = l.num_tokens(), t = options.seq_len;
  std::string what = shard_paths.size() == 1 ? shard_paths[0]
                                             : absl::StrCat(shard_paths[0], " and ", shard_paths.size() - 1, " more shard(s)");
  if (n < t + 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " tokens, fewer than seq_len + 1 = ", t + 1,
                                                   " (one window)"));
  }
  l.windows_ = (n - 1) / t;
  if (l.windows_ < options.world) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " tokens make ", l.windows_, " window(s) of ", t + 1,
                                                   " tokens, fewer than the ", options.world, " ranks"));
  }
  l.build_order();
  return l;
}

absl::StatusOr<TokenLoader> TokenLoader::open_split(const std::string& dir, const std::string& split,
                                                    const LoaderOptions& options) {
  absl::StatusOr<std::vector<std::string>> paths = find_shards(dir, split);
  if (!paths.ok()) return paths.status();
  return open(*paths, options);
}

void TokenLoader::build_order() {
  std::vector<int64_t> all(static_cast<size_t>(windows_));
  for (int64_t w = 0; w < windows_; ++w) all[w] = w;
  if (opt_.shuffle) {
    Generator gen(mix_seed(opt_.seed, static_cast<uint64_t>(epoch_)));
    shuffle_in_place(all, gen);
  }
  const int64_t per_rank = windows_per_rank();
  order_.resize(static_cast<size_t>(per_rank));
  for (int64_t j = 0; j < per_rank; ++j) order_[j] = all[j * opt_.world + opt_.rank];
}

void TokenLoader::read_tokens(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > num_tokens()) {
    throw std::out_of_range(absl::StrCat("read_tokens [", start, ", ", start + n, ") outside the ", num_tokens(), " tokens"));
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

void TokenLoader::fill_row(int64_t window, int32_t* inputs, int32_t* targets) const {
  const int64_t t = opt_.seq_len;
  std::vector<int32_t> buf(static_cast<size_t>(t + 1));
  read_tokens(window * t, t + 1, buf.data());
  std::copy(buf.begin(), buf.end() - 1, inputs);
  std::copy(buf.begin() + 1, buf.end(), targets);
}

Batch TokenLoader::next_batch(int64_t batch_size) {
  check_batch_size(batch_size);
  const int64_t t = opt_.seq_len;
  Batch b{Tensor::empty({batch_size, t}, DType::i32), Tensor::empty({batch_size, t}, DType::i32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  for (int64_t row = 0; row < batch_size; ++row) {
    if (position_ == windows_per_rank()) {
      ++epoch_;
      position_ = 0;
      build_order();
    }
    fill_row(order_[position_++], in + row * t, tg + row * t);
  }
  return b;
}

Batch TokenLoader::eval_batch(int64_t index, int64_t batch_size) const {
  check_batch_size(batch_size);
  if (index < 0) throw std::invalid_argument(absl::StrCat("eval batch index ", index, " is negative"));
  const int64_t t = opt_.seq_len, per_rank = windows_per_rank();
  Batch b{Tensor::empty({batch_size, t}, DType::i32), Tensor::empty({batch_size, t}, DType::i32)};
  for (int64_t row = 0; row < batch_size; ++row) {
    int64_t j = (index * batch_size + row) % per_rank;
    fill_row(j * opt_.world + opt_.rank, b.inputs.data<int32_t>() + row * t, b.targets.data<int32_t>() + row * t);
  }
  return b;
}

absl::Status TokenLoader::restore(const LoaderState& state) {
  if (state.epoch < 0 || state.position < 0 || state.position > windows_per_rank()) {
    return absl::InvalidArgumentError(absl::StrCat("loader state (epoch ", state.epoch, ", position ", state.position,
                                                   ") does not fit this data: ", windows_per_rank(),
                                                   " windows per rank and epoch"));
  }
  epoch_ = state.epoch;
  position_ = state.position;
  build_order();
  return absl::OkStatus();
}

}  // namespace seqlab
