// What the loaders share: the shards of a split read as one stream (TokenStream), that stream cut into
// its documents (DocumentStream), and the order in which an epoch visits a source's examples, shared out
// among data-parallel ranks (EpochOrder).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "tensor/tensor.h"
#include "train/data/shards.h"

namespace seqlab {

// Where a source is in its data: saved in checkpoints, restored exactly.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;  // examples (windows, documents, ...) or generated batches consumed within the epoch
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && position == o.position; }
};

// The shards of a split concatenated in the given order, every id checked against a vocabulary as they
// open (Shard::check_ids).
class TokenStream {
 public:
  // Errors name the shard (and an offending id and its position).
  static absl::StatusOr<TokenStream> open(const std::vector<std::string>& shard_paths, int64_t vocab_size);
  TokenStream() = default;

  int64_t size() const { return offsets_.back(); }
  // Tokens [start, start + n) widened to int32; std::out_of_range past the end.
  void read(int64_t start, int64_t n, int32_t* out) const;
  const std::vector<Shard>& shards() const { return shards_; }
  int64_t shard_offset(size_t i) const { return offsets_[i]; }  // stream position of shard i's first token
  // "PATH", or "PATH and N more shard(s)": the stream in an error message.
  std::string name() const;

 private:
  std::vector<Shard> shards_;
  std::vector<int64_t> offsets_{0};
};

// A prepared split read as documents: prepare writes `eot doc0 eot doc1 ...` (prepare.h), so the stream
// is cut at every end-of-text id `eot`, and documents left empty (two eot in a row, or none before the
// first) are dropped. Every other id must stand for text (below `num_regular`): a stream holding another
// special id — a pad or sentinel of the lm vocabulary — is refused, naming the shard and the position,
// since the objectives read text and insert their own special tokens.
class DocumentStream {
 public:
  static absl::StatusOr<DocumentStream> open(const std::vector<std::string>& shard_paths, int64_t vocab_size,
                                             int32_t num_regular, int32_t eot);
  DocumentStream() = default;

  int64_t num_documents() const { return static_cast<int64_t>(start_.size()); }
  int64_t document_size(int64_t d) const { return packed_[d + 1] - packed_[d]; }
  // The first min(max_tokens, document_size(d)) tokens of document d.
  std::vector<int32_t> document(int64_t d, int64_t max_tokens) const;
  // The documents' tokens packed one after another without end-of-text (as T5 packs its corpus):
  // text_size() of them, and [start, start + n) of them.
  int64_t text_size() const { return packed_.back(); }
  void read_text(int64_t start, int64_t n, int32_t* out) const;
  std::string name() const { return stream_.name(); }

 private:
  TokenStream stream_;
  std::vector<int64_t> start_;      // stream position of document d's first token
  std::vector<int64_t> packed_{0};  // text tokens before document d; packed_.back(): all of them
};

// The order of an epoch over `items` examples (windows, documents, spans): shuffled from (seed, epoch),
// or in order without shuffle. Rank r of P takes entries r, r+P, r+2P, ... of it, so ranks see disjoint
// examples and each gets items / P of them (the items mod P left over are skipped that epoch, keeping the
// ranks in lockstep); past its last, the next epoch begins.
//
// The state is (epoch, entries this rank has taken in it). DataParallel::to_global multiplies the
// position by P: P ranks at position k have together taken entries [0, kP) of the epoch's order, as one
// process at position kP has, so a run resumes on any world size.
class EpochOrder {
 public:
  EpochOrder() = default;
  EpochOrder(int64_t items, uint64_t seed, int rank, int world, bool shuffle);

  // One example of this rank: its item, and its entry's epoch and index in the epoch's whole order (the
  // same on every world size: what an example's own random draws are seeded from).
  struct Entry {
    int64_t item = 0, epoch = 0, index = 0;
  };
  Entry next();
  int64_t per_rank() const { return items_ / world_; }

  LoaderState state() const { return {epoch_, position_}; }
  // An error, naming `unit` ("windows", "documents", ...), for a state outside this order.
  absl::Status restore(const LoaderState& state, const std::string& unit);

 private:
  void build();  // order_ for epoch_

  int64_t items_ = 0;
  uint64_t seed_ = 0;
  int rank_ = 0, world_ = 1;
  bool shuffle_ = true;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;  // this rank's items in the current epoch
};

// The random draws of one example: a generator seeded from the source's seed and salt and the example's
// place — (epoch, index) of its EpochOrder::Entry for training, its walk index for evaluation — so an
// example is the same whichever rank draws it and however the run was resumed.
Generator example_generator(uint64_t seed, uint64_t salt, int64_t epoch, int64_t index);

// The examples of one batch with each one's generator: for training the next batch_size entries of
// `order`; for evaluation, batch `index` of the walk over `items` examples (example j of the walk is item
// j mod items). std::invalid_argument for a batch size below 1 or a negative index, as BatchSource's
// calls say.
struct BatchDraws {
  std::vector<int64_t> items;
  std::vector<Generator> gens;
};
BatchDraws next_batch_draws(EpochOrder& order, uint64_t seed, uint64_t salt, int64_t batch_size);
BatchDraws eval_batch_draws(int64_t items, uint64_t seed, uint64_t salt, int64_t index, int64_t batch_size);

// x rounded to the nearest integer, halves to the even one: Python's round() and TensorFlow's tf.round,
// which BERT's and T5's data code count with (round(2.5) = 2, round(3.5) = 4).
int64_t round_half_even(double x);

}  // namespace seqlab
