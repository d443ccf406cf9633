// Synthetic tasks, generated on the fly: the small benchmarks that separate sequence mixers by what they
// can recall. Each batch is drawn from a Generator seeded by (seed, step), so the state is a step counter
// and a restored source continues exactly; eval batches come from a separate stream of the same seed.
// Targets are kIgnoreIndex except where the task scores a prediction, and every task is scored the same
// way: the fraction of scored positions whose argmax prediction equals the target (accuracy() below).
//
// Token roles (V = vocab_size, T = seq_len): 0 is the blank (padding or noise), 1 the separator or
// trigger; the rest carry data. The layouts, with tiny examples (targets: . is kIgnoreIndex):
//
// mqar — multi-query associative recall. num_pairs key-value pairs (keys distinct, drawn from
//   [1, 1+K) with K = (V-1)/2; values from [1+K, V)), then num_queries of those keys again, in random
//   order, each followed by its value. A query key is scored: its target is the value bound to it.
//   V=9 (keys 1..4, values 5..8), 2 pairs, 2 queries, T=10:
//     inputs   3 6 1 8 | 1 8 3 6 | 0 0
//     targets  . . . . | 8 . 6 . | . .
//
// mqar, layout zoology — the definition of Zoology (Arora et al. 2023, `multiquery_ar`): the pairs
//   (keys distinct, values distinct too) fill the first 2n tokens; the rest of the row is S = (T-2n)/2
//   two-token slots, and the queries take m distinct slots drawn without replacement with P(slot g) ∝
//   (g+1)^(a-1) (a = mqar_power, Zoology's power_a = 0.01: nearly 1/(g+1), so most queries come soon
//   after the pairs and a few far away). A query key sits at the slot's first token, scored with its
//   value; every other token after the pairs is random noise from [0, V) (Zoology's
//   random_non_queries), never scored, so the model must recall from the key alone, not copy the token
//   after an earlier occurrence. Unlike the packed layout, a longer T spreads the queries further from
//   the pairs. V=9, 2 pairs, T=12 (S=4 slots, queries in slots 0 and 2; n: noise):
//     inputs   3 6 1 8 | 1 n n n 3 n n n
//     targets  . . . . | 8 . . . 6 . . .
//
// copy — copy_len data tokens from [2, V), the separator, then the same tokens again; the separator
//   and each copied token predict the next token of the copy. V=6, copy_len=3, T=8:
//     inputs   4 2 5 1 4 2 5 0
//     targets  . . . 4 2 5 . .
//
// selective_copy — copy_len data tokens scattered (in order) among blanks over the first
//   R = T-1-copy_len positions, the separator, then the data tokens without the blanks; scored as copy.
//   V=6, copy_len=2, T=8 (R=5):
//     inputs   0 3 0 0 5 1 3 5
//     targets  . . . . . 3 5 .
//
// induction — random tokens from [2, V); the trigger (1) appears once at a random position followed by
//   a token B, and again as the last token, whose target is B. V=6, T=8:
//     inputs   3 5 1 4 2 3 5 1
//     targets  . . . . . . . 4
#pragma once

#include <cstdint>
#include <string>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "tensor/tensor.h"
#include "train/data/loader.h"

namespace seqlab {

enum class SyntheticTask { mqar, copy, selective_copy, induction };
absl::StatusOr<SyntheticTask> parse_synthetic_task(const std::string& name);  // "mqar", "copy", ...
const char* synthetic_task_name(SyntheticTask task);

// Where mqar puts its queries (the layouts above): packed right after the pairs, or Zoology's.
enum class MqarLayout { packed, zoology };
absl::StatusOr<MqarLayout> parse_mqar_layout(const std::string& name);  // "packed", "zoology"
const char* mqar_layout_name(MqarLayout layout);

struct SyntheticConfig {
  SyntheticTask task = SyntheticTask::mqar;
  int64_t seq_len = 64;
  int32_t vocab_size = 64;
  int64_t num_pairs = 8;    // mqar
  int64_t num_queries = 0;  // mqar; 0 queries every pair
  MqarLayout mqar_layout = MqarLayout::packed;
  double mqar_power = 0.01;  // mqar, zoology layout: the a of P(gap g) ∝ (g+1)^(a-1), in (0, 1]
  int64_t copy_len = 8;     // copy, selective_copy
};

// Says which constraint a configuration breaks (e.g. "mqar: 2 × (num_pairs + num_queries) = 40 tokens
// exceed seq_len 32").
absl::Status validate(const SyntheticConfig& config);

class SyntheticSource : public BatchSource {
 public:
  static absl::StatusOr<SyntheticSource> create(const SyntheticConfig& config, uint64_t seed);

  Batch next_batch(int64_t batch_size) override;
  Batch eval_batch(int64_t index, int64_t batch_size) const override;
  LoaderState state() const override { return {0, step_}; }
  absl::Status restore(const LoaderState& state) override;

  const SyntheticConfig& config() const { return config_; }

 private:
  SyntheticSource(const SyntheticConfig& config, uint64_t seed) : config_(config), seed_(seed) {}
  Batch generate(uint64_t stream_seed, int64_t batch_size) const;

  SyntheticConfig config_;
  uint64_t seed_;
  int64_t step_ = 0;
};

struct AccuracyCount {
  int64_t correct = 0;
  int64_t scored = 0;  // targets that are not kIgnoreIndex
  double fraction() const { return scored ? static_cast<double>(correct) / static_cast<double>(scored) : 0.0; }
};
// `predictions` is logits [B, T, V] (any floating dtype; argmax, first maximum on ties) or ids [B, T]
// (integer dtype); `targets` [B, T] integer. Counts add across batches and ranks.
AccuracyCount count_correct(const Tensor& predictions, const Tensor& targets);
inline double accuracy(const Tensor& predictions, const Tensor& targets) {
  return count_correct(predictions, targets).fraction();
}

}  // namespace seqlab
