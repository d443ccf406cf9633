#include "train/data/loader.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <stdexcept>


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
  TokenLoader l;
  l.opt_ = options;
  absl::StatusOr<TokenStream> stream = TokenStream::open(shard_paths, options.vocab_size);
  if (!stream.ok()) return stream.status();
  l.stream_ = std::move(*stream);
  const int64_t n = l.num_tokens(), t = options.seq_len;
  const std::string what = l.stream_.name();
  if (n < t + 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " tokens, fewer than seq_len + 1 = ", t + 1,
                                                   " (one window)"));
  }
  l.windows_ = (n - 1) / t;
  if (l.windows_ < options.world) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " tokens make ", l.windows_, " window(s) of ", t + 1,
                                                   " tokens, fewer than the ", options.world, " ranks"));
  }
  l.order_ = EpochOrder(l.windows_, options.seed, options.rank, options.world, options.shuffle);
  return l;
}

absl::StatusOr<TokenLoader> TokenLoader::open_split(const std::string& dir, const std::string& split,
                                                    const LoaderOptions& options) {
  absl::StatusOr<std::vector<std::string>> paths = find_shards(dir, split);
  if (!paths.ok()) return paths.status();
  return open(*paths, options);
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
  for (int64_t row = 0; row < batch_size; ++row) fill_row(order_.next().item, in + row * t, tg + row * t);
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

}  // namespace seqlab
