#include "train/data/synthetic.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "train/data/data_io.h"

namespace seqlab {

namespace {

constexpr int32_t kBlank = 0;
constexpr int32_t kSeparator = 1;  // also the induction trigger
constexpr uint64_t kEvalSalt = 0x6576616c;  // "eval": eval batches come from their own stream

int32_t draw(Generator& gen, int32_t lo, int32_t hi) {  // uniform in [lo, hi)
  return lo + static_cast<int32_t>(random_below(gen, static_cast<uint64_t>(hi - lo)));
}

// The first k entries of a random permutation of [lo, lo + n): k distinct values.
std::vector<int32_t> distinct(Generator& gen, int32_t lo, int64_t n, int64_t k) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = lo + static_cast<int32_t>(i);
  for (int64_t i = 0; i < k; ++i) std::swap(v[i], v[i + random_below(gen, static_cast<uint64_t>(n - i))]);
  v.resize(static_cast<size_t>(k));
  return v;
}

// One row: in[T] and tg[T] arrive filled with kBlank and kIgnoreIndex.
void mqar_row(const SyntheticConfig& c, Generator& gen, int32_t* in, int32_t* tg) {
  const int32_t num_keys = (c.vocab_size - 1) / 2;
  const int64_t n = c.num_pairs, m = c.num_queries ? c.num_queries : c.num_pairs;
  std::vector<int32_t> keys = distinct(gen, 1, num_keys, n);
  std::vector<int32_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    values[i] = draw(gen, 1 + num_keys, c.vocab_size);
    in[2 * i] = keys[i];
    in[2 * i + 1] = values[i];
  }
  std::vector<int32_t> asked = distinct(gen, 0, n, m);
  for (int64_t j = 0; j < m; ++j) {
    int64_t p = 2 * n + 2 * j;
    in[p] = keys[asked[j]];
    in[p + 1] = values[asked[j]];
    tg[p] = values[asked[j]];
  }
}

// A uniform double in [0, 1) from random_below, so the draw is the same on every platform (see data_io.h).
double unit(Generator& gen) { return static_cast<double>(random_below(gen, uint64_t{1} << 53)) / 9007199254740992.0; }

// Zoology's layout (synthetic.h): numpy's choice(space, size=m, replace=False, p) as Zoology calls it,
// i.e. m draws in turn, each from the weights of the slots not yet taken.
void mqar_zoology_row(const SyntheticConfig& c, Generator& gen, int32_t* in, int32_t* tg) {
  const int32_t num_keys = (c.vocab_size - 1) / 2;
  const int64_t n = c.num_pairs, m = c.num_queries ? c.num_queries : c.num_pairs;
  const int64_t context = 2 * n, slots = (c.seq_len - context) / 2;
  std::vector<int32_t> keys = distinct(gen, 1, num_keys, n);
  // Distinct values: there are V-1-K >= K of them, so the check on the keys covers them too.
  std::vector<int32_t> values = distinct(gen, 1 + num_keys, c.vocab_size - 1 - num_keys, n);
  for (int64_t i = 0; i < n; ++i) {
    in[2 * i] = keys[i];
    in[2 * i + 1] = values[i];
  }
  for (int64_t p = context; p < c.seq_len; ++p) in[p] = draw(gen, 0, c.vocab_size);  // noise
  std::vector<double> weight(static_cast<size_t>(slots));
  double total = 0;
  for (int64_t g = 0; g < slots; ++g) total += weight[g] = std::pow(static_cast<double>(g + 1), c.mqar_power - 1);
  std::vector<int32_t> asked = distinct(gen, 0, n, m);  // which pairs are queried, in query order
  for (int64_t j = 0; j < m; ++j) {
    double u = unit(gen) * total;
    int64_t g = 0;
    while (g + 1 < slots && (weight[g] == 0 || u >= weight[g])) u -= weight[g++];
    if (weight[g] == 0) {  // rounding left u past the last free slot: take the last free one
      while (weight[g] == 0) --g;
    }
    total -= weight[g];
    weight[g] = 0;
    const int64_t p = context + 2 * g;
    in[p] = keys[asked[j]];
    tg[p] = values[asked[j]];
  }
}

// The separator at `sep`, then `data` again: the separator and every copied token but the last predict
// the next data token.
void copy_tail(const std::vector<int32_t>& data, int64_t sep, int32_t* in, int32_t* tg) {
  const int64_t l = static_cast<int64_t>(data.size());
  in[sep] = kSeparator;
  for (int64_t i = 0; i < l; ++i) {
    in[sep + 1 + i] = data[i];
    tg[sep + i] = data[i];  // the separator predicts the first, each copied token the next
  }
}

void copy_row(const SyntheticConfig& c, Generator& gen, int32_t* in, int32_t* tg) {
  std::vector<int32_t> data(static_cast<size_t>(c.copy_len));
  for (int64_t i = 0; i < c.copy_len; ++i) in[i] = data[i] = draw(gen, 2, c.vocab_size);
  copy_tail(data, c.copy_len, in, tg);
}

void selective_copy_row(const SyntheticConfig& c, Generator& gen, int32_t* in, int32_t* tg) {
  const int64_t region = c.seq_len - 1 - c.copy_len;
  std::vector<int32_t> slots = distinct(gen, 0, region, c.copy_len);
  std::sort(slots.begin(), slots.end());
  std::vector<int32_t> data(static_cast<size_t>(c.copy_len));
  for (int64_t i = 0; i < c.copy_len; ++i) in[slots[i]] = data[i] = draw(gen, 2, c.vocab_size);
  copy_tail(data, region, in, tg);
}

void induction_row(const SyntheticConfig& c, Generator& gen, int32_t* in, int32_t* tg) {
  const int64_t t = c.seq_len;
  for (int64_t i = 0; i < t - 1; ++i) in[i] = draw(gen, 2, c.vocab_size);
  int64_t p = static_cast<int64_t>(random_below(gen, static_cast<uint64_t>(t - 2)));  // trigger at p <= T-3
  in[p] = kSeparator;
  in[t - 1] = kSeparator;
  tg[t - 1] = in[p + 1];
}

}  // namespace

absl::StatusOr<SyntheticTask> parse_synthetic_task(const std::string& name) {
  for (SyntheticTask t : {SyntheticTask::mqar, SyntheticTask::copy, SyntheticTask::selective_copy, SyntheticTask::induction}) {
    if (name == synthetic_task_name(t)) return t;
  }
  return absl::InvalidArgumentError("unknown synthetic task '" + name + "' (mqar, copy, selective_copy, induction)");
}

absl::StatusOr<MqarLayout> parse_mqar_layout(const std::string& name) {
  for (MqarLayout l : {MqarLayout::packed, MqarLayout::zoology}) {
    if (name == mqar_layout_name(l)) return l;
  }
  return absl::InvalidArgumentError("unknown mqar layout '" + name + "' (packed, zoology)");
}

const char* mqar_layout_name(MqarLayout layout) {
  return layout == MqarLayout::zoology ? "zoology" : "packed";
}

const char* synthetic_task_name(SyntheticTask task) {
  switch (task) {
    case SyntheticTask::mqar: return "mqar";
    case SyntheticTask::copy: return "copy";
    case SyntheticTask::selective_copy: return "selective_copy";
    case SyntheticTask::induction: return "induction";
  }
  return "?";
}

absl::Status validate(const SyntheticConfig& c) {
  const std::string task = synthetic_task_name(c.task);
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(task + ": " + what); };
  if (c.seq_len < 1) return fail(absl::StrCat("seq_len ", c.seq_len, " must be positive"));
  if (c.vocab_size < 3) return fail(absl::StrCat("vocab_size ", c.vocab_size, " must be at least 3 (blank, separator, data)"));
  switch (c.task) {
    case SyntheticTask::mqar: {
      const int64_t keys = (c.vocab_size - 1) / 2, m = c.num_queries ? c.num_queries : c.num_pairs;
      if (c.num_pairs < 1) return fail(absl::StrCat("num_pairs ", c.num_pairs, " must be at least 1"));
      if (c.num_queries < 0 || c.num_queries > c.num_pairs) {
        return fail(absl::StrCat("num_queries ", c.num_queries, " must be in [0, num_pairs = ", c.num_pairs, "]"));
      }
      if (c.num_pairs > keys) {
        return fail(absl::StrCat("num_pairs ", c.num_pairs, " distinct keys need vocab_size >= ", 2 * c.num_pairs + 2,
                                 ", not ", c.vocab_size));
      }
      if (c.mqar_layout == MqarLayout::zoology) {
        if (!(c.mqar_power > 0 && c.mqar_power <= 1)) {
          return fail(absl::StrCat("mqar_power ", c.mqar_power, " must be in (0, 1]"));
        }
      }
      if (2 * (c.num_pairs + m) > c.seq_len) {
        return fail(absl::StrCat("2 × (num_pairs + num_queries) = ", 2 * (c.num_pairs + m), " tokens exceed seq_len ",
                                 c.seq_len));
      }
      break;
    }
    case SyntheticTask::copy:
    case SyntheticTask::selective_copy:
      if (c.copy_len < 1) return fail(absl::StrCat("copy_len ", c.copy_len, " must be at least 1"));
      if (2 * c.copy_len + 1 > c.seq_len) {
        return fail(absl::StrCat("2 × copy_len + 1 = ", 2 * c.copy_len + 1, " tokens exceed seq_len ", c.seq_len));
      }
      break;
    case SyntheticTask::induction:
      if (c.seq_len < 3) return fail(absl::StrCat("seq_len ", c.seq_len, " must be at least 3 (trigger, token, trigger)"));
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<SyntheticSource> SyntheticSource::create(const SyntheticConfig& config, uint64_t seed) {
  absl::Status s = validate(config);
  if (!s.ok()) return s;
  return SyntheticSource(config, seed);
}

Batch SyntheticSource::generate(uint64_t stream_seed, int64_t batch_size) const {
  if (batch_size < 1) throw std::invalid_argument(absl::StrCat("batch size ", batch_size, " must be at least 1"));
  const int64_t t = config_.seq_len;
  std::vector<int64_t> in(static_cast<size_t>(batch_size * t), kBlank), tg(in.size(), kIgnoreIndex);
  std::vector<int32_t> row_in(static_cast<size_t>(t)), row_tg(static_cast<size_t>(t));
  Generator gen(stream_seed);
  for (int64_t b = 0; b < batch_size; ++b) {
    std::fill(row_in.begin(), row_in.end(), kBlank);
    std::fill(row_tg.begin(), row_tg.end(), kIgnoreIndex);
    switch (config_.task) {
      case SyntheticTask::mqar:
        if (config_.mqar_layout == MqarLayout::zoology) {
          mqar_zoology_row(config_, gen, row_in.data(), row_tg.data());
        } else {
          mqar_row(config_, gen, row_in.data(), row_tg.data());
        }
        break;
      case SyntheticTask::copy: copy_row(config_, gen, row_in.data(), row_tg.data()); break;
      case SyntheticTask::selective_copy: selective_copy_row(config_, gen, row_in.data(), row_tg.data()); break;
      case SyntheticTask::induction: induction_row(config_, gen, row_in.data(), row_tg.data()); break;
    }
    std::copy(row_in.begin(), row_in.end(), in.begin() + b * t);
    std::copy(row_tg.begin(), row_tg.end(), tg.begin() + b * t);
  }
  return {Tensor::from_indices(in, {batch_size, t}, DType::i32), Tensor::from_indices(tg, {batch_size, t}, DType::i32)};
}

Batch SyntheticSource::next_batch(int64_t batch_size) {
  Batch b = generate(mix_seed(seed_, static_cast<uint64_t>(step_)), batch_size);
  ++step_;
  return b;
}

Batch SyntheticSource::eval_batch(int64_t index, int64_t batch_size) const {
  return generate(mix_seed(mix_seed(seed_, kEvalSalt), static_cast<uint64_t>(index)), batch_size);
}

absl::Status SyntheticSource::restore(const LoaderState& state) {
  if (state.epoch != 0 || state.position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic task state (epoch ", state.epoch, ", position ",
                                                   state.position, ") must have epoch 0 and a position >= 0"));
  }
  step_ = state.position;
  return absl::OkStatus();
}

AccuracyCount count_correct(const Tensor& predictions, const Tensor& targets) {
  if (targets.dim() != 2 || !is_integer(targets.dtype())) {
    throw std::invalid_argument("accuracy: targets must be integer [B, T], got " + shape_str(targets.shape()) + " " +
                                dtype_name(targets.dtype()));
  }
  const int64_t n = targets.numel();
  std::vector<int64_t> tg = targets.to_indices(), pred;
  if (predictions.dim() == 3 && !is_integer(predictions.dtype()) && predictions.size(0) == targets.size(0) &&
      predictions.size(1) == targets.size(1)) {
    const int64_t v = predictions.size(2);
    std::vector<double> logits = predictions.to_doubles();
    pred.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double* row = logits.data() + i * v;
      pred[i] = std::max_element(row, row + v) - row;  // the first maximum
    }
  } else if (predictions.shape() == targets.shape() && is_integer(predictions.dtype())) {
    pred = predictions.to_indices();
  } else {
    throw std::invalid_argument("accuracy: predictions " + shape_str(predictions.shape()) + " " +
                                dtype_name(predictions.dtype()) + " are neither logits [B, T, V] nor ids [B, T] for targets " +
                                shape_str(targets.shape()));
  }
  AccuracyCount c;
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] == kIgnoreIndex) continue;
    ++c.scored;
    c.correct += pred[i] == tg[i];
  }
  return c;
}

}  // namespace seqlab
