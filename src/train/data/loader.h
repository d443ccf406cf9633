// Batches for the step loop: from token shards (TokenLoader) or generated on the fly (synthetic.h).
//
// TokenLoader views the shards of a split as one stream of N tokens and cuts it into W = (N-1) / T
// windows of T+1 tokens at stride T (window w covers tokens [w·T, w·T+T]); a window gives one row of
// inputs (its first T tokens) and targets (its last T). Each epoch visits the windows in an order
// shuffled from (seed, epoch); rank r of P takes entries r, r+P, r+2P, ... of that order, so ranks see
// disjoint windows and every rank gets W / P of them (the W mod P left over are skipped that epoch,
// keeping ranks in lockstep). A batch that runs past the end of an epoch continues into the next.
//
// The position is (epoch, windows this rank has consumed in it): saved in checkpoints, restored exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "layers/model/batch.h"
#include "tensor/tensor.h"
#include "train/data/shards.h"
#include "train/data/token_stream.h"

namespace seqlab {

// What the step loop draws batches from: token shards, the objectives' rows made from them
// (masked_lm.h, span_corruption.h) or a synthetic task. Their batches fill inputs [B, T] and targets
// [B, T] (i32) of layers/model/batch.h, and the other fields their objective needs.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next_batch(int64_t batch_size) = 0;
  // Batch `index` of a fixed evaluation walk; touches no training position, so the same index always
  // gives the same batch.
  virtual Batch eval_batch(int64_t index, int64_t batch_size) const = 0;
  virtual LoaderState state() const = 0;
  // Afterwards next_batch yields exactly what it yielded after state() was taken.
  virtual absl::Status restore(const LoaderState& state) = 0;
};

struct LoaderOptions {
  int64_t seq_len = 256;
  uint64_t seed = 0;
  int rank = 0;
  int world = 1;
  bool shuffle = true;  // false: windows in stream order every epoch
  int64_t vocab_size = kShardMaxVocab;  // every token id must be below it (checked when the shards open)
};

class TokenLoader : public BatchSource {
 public:
  // Opens (and validates) the shards, concatenated in the given order, and checks every id against
  // options.vocab_size. Errors name the shard (and an offending id and its position), or say that the
  // tokens do not make one window per rank.
  static absl::StatusOr<TokenLoader> open(const std::vector<std::string>& shard_paths, const LoaderOptions& options);
  // The shards of `split` ("train", "val") in `dir`, as find_shards lists them.
  static absl::StatusOr<TokenLoader> open_split(const std::string& dir, const std::string& split,
                                                const LoaderOptions& options);

  Batch next_batch(int64_t batch_size) override;
  // The evaluation walk: the windows in stream order from the start, this rank taking every P-th;
  // batch i holds the rank's windows i·B .. i·B+B-1, wrapping around past the end.
  Batch eval_batch(int64_t index, int64_t batch_size) const override;
  LoaderState state() const override { return order_.state(); }
  absl::Status restore(const LoaderState& state) override { return order_.restore(state, "windows"); }

  int64_t num_tokens() const { return stream_.size(); }
  int64_t num_windows() const { return windows_; }
  int64_t windows_per_rank() const { return windows_ / opt_.world; }
  int64_t seq_len() const { return opt_.seq_len; }
  // How many eval batches of `batch_size` fit before the walk wraps around.
  int64_t eval_batches(int64_t batch_size) const { return windows_per_rank() / batch_size; }

  // Tokens [start, start + n) of the concatenated stream, widened to int32.
  void read_tokens(int64_t start, int64_t n, int32_t* out) const { stream_.read(start, n, out); }

 private:
  TokenLoader() = default;
  void fill_row(int64_t window, int32_t* inputs, int32_t* targets) const;

  LoaderOptions opt_;
  TokenStream stream_;
  int64_t windows_ = 0;
  EpochOrder order_;  // the windows of each epoch, this rank's share
};

}  // namespace seqlab
