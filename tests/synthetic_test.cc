// Synthetic tasks: every row of every task is checked against the task's definition (MQAR answers are the
// values bound to the queried keys, copies equal the originals, ...), the accuracy metric on perfect,
// partly wrong and logit predictions, determinism by seed, restore, and configuration errors.
#include "train/data/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace seqlab {
namespace {

using Row = std::vector<int64_t>;

SyntheticSource make(SyntheticConfig c, uint64_t seed = 1) {
  auto s = SyntheticSource::create(c, seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

// Rows of a [B, T] tensor.
std::vector<Row> rows(const Tensor& t) {
  std::vector<int64_t> v = t.to_indices();
  std::vector<Row> out;
  for (int64_t b = 0; b < t.size(0); ++b) out.emplace_back(v.begin() + b * t.size(1), v.begin() + (b + 1) * t.size(1));
  return out;
}

int64_t scored(const Row& targets) {
  return std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t != kIgnoreIndex; });
}

TEST(Synthetic, MqarAnswersAreTheValuesBoundToTheQueriedKeys) {
  SyntheticConfig c;
  c.task = SyntheticTask::mqar;
  c.seq_len = 40, c.vocab_size = 64, c.num_pairs = 8, c.num_queries = 6;
  Batch b = make(c).next_batch(32);
  ASSERT_EQ(b.inputs.shape(), (Shape{32, 40}));
  ASSERT_EQ(b.targets.shape(), (Shape{32, 40}));
  EXPECT_EQ(b.inputs.dtype(), DType::i32);
  EXPECT_EQ(b.targets.dtype(), DType::i32);
  auto in = rows(b.inputs), tg = rows(b.targets);
  for (size_t r = 0; r < in.size(); ++r) {
    std::map<int64_t, int64_t> bound;
    for (int i = 0; i < 8; ++i) {
      int64_t k = in[r][2 * i], v = in[r][2 * i + 1];
      EXPECT_TRUE(k >= 1 && k < 32) << k;  // keys [1, 1+K), K = 31
      EXPECT_TRUE(v >= 32 && v < 64) << v;
      EXPECT_TRUE(bound.emplace(k, v).second) << "key " << k << " bound twice";
      EXPECT_EQ(tg[r][2 * i], kIgnoreIndex);
    }
    std::set<int64_t> asked;
    for (int j = 0; j < 6; ++j) {
      int64_t p = 16 + 2 * j, k = in[r][p];
      ASSERT_TRUE(bound.count(k)) << "query " << k << " was never bound";
      EXPECT_TRUE(asked.insert(k).second);
      EXPECT_EQ(tg[r][p], bound[k]);
      EXPECT_EQ(in[r][p + 1], bound[k]);
      EXPECT_EQ(tg[r][p + 1], kIgnoreIndex);
    }
    for (int p = 28; p < 40; ++p) EXPECT_EQ(in[r][p], 0);
    EXPECT_EQ(scored(tg[r]), 6);
  }
}

// Zoology's layout (synthetic.h): pairs from disjoint halves first, then each query key alone in a slot
// chosen with P(slot g) ∝ (g+1)^(a-1), scored with its value; nothing else scored.
TEST(Synthetic, MqarZoologyLayoutPutsQueriesAtPowerLawGaps) {
  SyntheticConfig c;
  c.task = SyntheticTask::mqar, c.mqar_layout = MqarLayout::zoology;
  c.seq_len = 128, c.vocab_size = 64, c.num_pairs = 8;  // 56 slots of 2 tokens after the 16 of the pairs
  const int64_t rows_n = 400;
  Batch b = make(c).next_batch(rows_n);
  auto in = rows(b.inputs), tg = rows(b.targets);
  std::vector<int64_t> slot_count(56, 0);
  int64_t adjacent_rows = 0;
  for (size_t r = 0; r < in.size(); ++r) {
    std::map<int64_t, int64_t> bound;
    std::set<int64_t> values;
    for (int i = 0; i < 8; ++i) {
      int64_t k = in[r][2 * i], v = in[r][2 * i + 1];
      EXPECT_TRUE(k >= 1 && k < 32) << k;  // keys [1, 32), values [32, 64): disjoint halves
      EXPECT_TRUE(v >= 32 && v < 64) << v;
      EXPECT_TRUE(bound.emplace(k, v).second) << "key " << k << " bound twice";
      EXPECT_TRUE(values.insert(v).second) << "value " << v << " bound twice";
      EXPECT_EQ(tg[r][2 * i], kIgnoreIndex);
      EXPECT_EQ(tg[r][2 * i + 1], kIgnoreIndex);
    }
    std::set<int64_t> asked;
    std::vector<int64_t> slots;
    for (int64_t p = 16; p < 128; ++p) {
      EXPECT_TRUE(in[r][p] >= 0 && in[r][p] < 64);
      if (tg[r][p] == kIgnoreIndex) continue;
      ASSERT_EQ((p - 16) % 2, 0) << "a query at the second token of a slot";
      ASSERT_TRUE(bound.count(in[r][p])) << "query " << in[r][p] << " was never bound";
      EXPECT_EQ(tg[r][p], bound[in[r][p]]);
      EXPECT_TRUE(asked.insert(in[r][p]).second) << "key " << in[r][p] << " asked twice";
      slots.push_back((p - 16) / 2);
      ++slot_count[(p - 16) / 2];
    }
    EXPECT_EQ(asked.size(), 8u);  // num_queries 0: every pair once
    EXPECT_EQ(scored(tg[r]), 8);
    adjacent_rows += slots.back() == 7;  // the 8 queries in slots 0..7: the packed layout's places
  }
  // The law: slot 0 is the likeliest and the weights fall with the gap, yet queries reach the far half.
  // P ∝ (g+1)^-0.99 over 56 slots gives slot 0 about a fifth of the weight on the first draw.
  EXPECT_LT(adjacent_rows, rows_n / 2);
  int64_t near = 0, far = 0;
  for (int g = 0; g < 8; ++g) near += slot_count[g];
  for (int g = 28; g < 56; ++g) far += slot_count[g];
  EXPECT_GT(slot_count[0], slot_count[10]);
  EXPECT_GT(slot_count[0], slot_count[55]);
  EXPECT_GT(near, far);
  EXPECT_GT(far, 0);
  // a = 1 is uniform: the far half holds about half the queries.
  c.mqar_power = 1.0;
  auto tu = rows(make(c).next_batch(rows_n).targets);
  int64_t far_uniform = 0;
  for (const Row& t : tu)
    for (int64_t p = 16 + 2 * 28; p < 128; ++p) far_uniform += t[p] != kIgnoreIndex;
  EXPECT_NEAR(static_cast<double>(far_uniform) / (rows_n * 8), 0.5, 0.05);
}

TEST(Synthetic, CopyReproducesTheSequenceAfterTheSeparator) {
  SyntheticConfig c;
  c.task = SyntheticTask::copy;
  c.seq_len = 20, c.vocab_size = 10, c.copy_len = 8;
  Batch b = make(c).next_batch(16);
  auto in = rows(b.inputs), tg = rows(b.targets);
  for (size_t r = 0; r < in.size(); ++r) {
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(in[r][i] >= 2 && in[r][i] < 10);
      EXPECT_EQ(in[r][9 + i], in[r][i]);
      EXPECT_EQ(tg[r][8 + i], in[r][i]);
    }
    EXPECT_EQ(in[r][8], 1);
    for (int p = 17; p < 20; ++p) EXPECT_EQ(in[r][p], 0);
    EXPECT_EQ(scored(tg[r]), 8);
  }
}

TEST(Synthetic, SelectiveCopyKeepsOnlyTheDataTokensInOrder) {
  SyntheticConfig c;
  c.task = SyntheticTask::selective_copy;
  c.seq_len = 32, c.vocab_size = 12, c.copy_len = 6;
  Batch b = make(c).next_batch(16);
  auto in = rows(b.inputs), tg = rows(b.targets);
  const int region = 32 - 1 - 6;
  bool some_gap = false;
  for (size_t r = 0; r < in.size(); ++r) {
    Row data;
    for (int p = 0; p < region; ++p) {
      if (in[r][p] != 0) data.push_back(in[r][p]);
      EXPECT_EQ(tg[r][p], kIgnoreIndex);
    }
    ASSERT_EQ(data.size(), 6u);
    some_gap = some_gap || in[r][0] == 0;
    EXPECT_EQ(in[r][region], 1);
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(data[i] >= 2 && data[i] < 12);
      EXPECT_EQ(in[r][region + 1 + i], data[i]);
      EXPECT_EQ(tg[r][region + i], data[i]);
    }
    EXPECT_EQ(tg[r][31], kIgnoreIndex);
    EXPECT_EQ(scored(tg[r]), 6);
  }
  EXPECT_TRUE(some_gap);  // the data is scattered, not packed at the front
}

TEST(Synthetic, InductionTargetFollowsTheEarlierTrigger) {
  SyntheticConfig c;
  c.task = SyntheticTask::induction;
  c.seq_len = 24, c.vocab_size = 16;
  Batch b = make(c).next_batch(64);
  auto in = rows(b.inputs), tg = rows(b.targets);
  std::set<int64_t> trigger_positions;
  for (size_t r = 0; r < in.size(); ++r) {
    std::vector<int> triggers;
    for (int p = 0; p < 24; ++p) {
      if (in[r][p] == 1) {
        triggers.push_back(p);
      } else {
        EXPECT_TRUE(in[r][p] >= 2 && in[r][p] < 16) << in[r][p];
      }
    }
    ASSERT_EQ(triggers.size(), 2u);
    EXPECT_EQ(triggers[1], 23);
    EXPECT_LE(triggers[0], 21);
    trigger_positions.insert(triggers[0]);
    EXPECT_EQ(tg[r][23], in[r][triggers[0] + 1]);
    EXPECT_EQ(scored(tg[r]), 1);
  }
  EXPECT_GT(trigger_positions.size(), 5u);
}

TEST(Synthetic, AccuracyCountsOnlyScoredPositions) {
  SyntheticConfig c;
  c.task = SyntheticTask::copy;
  c.seq_len = 12, c.vocab_size = 8, c.copy_len = 4;
  Batch b = make(c).next_batch(2);
  std::vector<int64_t> tg = b.targets.to_indices(), pred(tg.size());
  for (size_t i = 0; i < tg.size(); ++i) pred[i] = tg[i] == kIgnoreIndex ? 5 : tg[i];  // unscored positions: anything
  EXPECT_EQ(accuracy(Tensor::from_indices(pred, {2, 12}, DType::i64), b.targets), 1.0);

  // One-hot logits at the targets (f32 and f64), argmax picks them.
  std::vector<double> logits(tg.size() * 8, 0.0);
  for (size_t i = 0; i < tg.size(); ++i) logits[i * 8 + (tg[i] == kIgnoreIndex ? 0 : tg[i])] = 3.0;
  for (DType d : {DType::f32, DType::f64}) {
    EXPECT_EQ(accuracy(Tensor::from_vector(logits, {2, 12, 8}, d), b.targets), 1.0);
  }

  // Wrong on 3 of the 8 scored positions.
  int wrong = 0;
  for (size_t i = 0; i < tg.size() && wrong < 3; ++i) {
    if (tg[i] == kIgnoreIndex) continue;
    pred[i] = (tg[i] + 1) % 8;
    ++wrong;
  }
  AccuracyCount n = count_correct(Tensor::from_indices(pred, {2, 12}, DType::i32), b.targets);
  EXPECT_EQ(n.scored, 8);
  EXPECT_EQ(n.correct, 5);
  EXPECT_DOUBLE_EQ(n.fraction(), 5.0 / 8.0);

  // Ties go to the first maximum: all-zero logits predict 0, which no copy target is.
  EXPECT_EQ(accuracy(Tensor::zeros({2, 12, 8}), b.targets), 0.0);
  EXPECT_THROW(accuracy(Tensor::zeros({2, 11, 8}), b.targets), std::invalid_argument);
  EXPECT_EQ(AccuracyCount{}.fraction(), 0.0);
}

TEST(Synthetic, DeterministicBySeedAndRestorable) {
  SyntheticConfig c;  // mqar defaults
  SyntheticSource a = make(c, 7), same = make(c, 7), other = make(c, 8);
  std::vector<std::vector<int64_t>> seq;
  for (int i = 0; i < 5; ++i) seq.push_back(a.next_batch(4).inputs.to_indices());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(same.next_batch(4).inputs.to_indices(), seq[i]);
  EXPECT_NE(other.next_batch(4).inputs.to_indices(), seq[0]);
  EXPECT_NE(seq[0], seq[1]);
  EXPECT_EQ(a.state(), (LoaderState{0, 5}));

  SyntheticSource b = make(c, 7);
  ASSERT_TRUE(b.restore({0, 3}).ok());
  EXPECT_EQ(b.next_batch(4).inputs.to_indices(), seq[3]);
  EXPECT_EQ(b.next_batch(4).inputs.to_indices(), seq[4]);
  EXPECT_FALSE(b.restore({1, 0}).ok());

  // Eval batches: a stream of their own, the same on every call, and no effect on training.
  std::vector<int64_t> e0 = a.eval_batch(0, 4).inputs.to_indices();
  EXPECT_EQ(a.eval_batch(0, 4).inputs.to_indices(), e0);
  EXPECT_EQ(make(c, 7).eval_batch(0, 4).inputs.to_indices(), e0);
  EXPECT_NE(a.eval_batch(1, 4).inputs.to_indices(), e0);
  for (const auto& s : seq) EXPECT_NE(s, e0);
  EXPECT_EQ(a.state(), (LoaderState{0, 5}));
}

TEST(Synthetic, ConfigurationErrorsNameTheConstraint) {
  auto err = [](SyntheticConfig c) {
    absl::Status s = validate(c);
    return s.ok() ? std::string("ok") : std::string(s.message());
  };
  SyntheticConfig c;
  c.seq_len = 32, c.num_pairs = 10;
  EXPECT_EQ(err(c), "mqar: 2 × (num_pairs + num_queries) = 40 tokens exceed seq_len 32");
  c.seq_len = 64, c.vocab_size = 16;
  EXPECT_EQ(err(c), "mqar: num_pairs 10 distinct keys need vocab_size >= 22, not 16");
  c.vocab_size = 64, c.num_queries = 11;
  EXPECT_EQ(err(c), "mqar: num_queries 11 must be in [0, num_pairs = 10]");
  c.num_queries = 0;
  EXPECT_EQ(err(c), "ok");
  c.task = SyntheticTask::copy, c.copy_len = 32;
  EXPECT_EQ(err(c), "copy: 2 × copy_len + 1 = 65 tokens exceed seq_len 64");
  c.task = SyntheticTask::induction, c.vocab_size = 2;
  EXPECT_EQ(err(c), "induction: vocab_size 2 must be at least 3 (blank, separator, data)");
  EXPECT_FALSE(SyntheticSource::create(c, 0).ok());
  c.task = SyntheticTask::mqar, c.vocab_size = 64, c.mqar_layout = MqarLayout::zoology, c.mqar_power = 0;
  EXPECT_EQ(err(c), "mqar: mqar_power 0 must be in (0, 1]");
  EXPECT_EQ(*parse_mqar_layout("zoology"), MqarLayout::zoology);
  EXPECT_EQ(parse_mqar_layout("spread").status().message(), "unknown mqar layout 'spread' (packed, zoology)");
  EXPECT_EQ(*parse_synthetic_task("selective_copy"), SyntheticTask::selective_copy);
  EXPECT_EQ(parse_synthetic_task("sort").status().message(),
            "unknown synthetic task 'sort' (mqar, copy, selective_copy, induction)");
}

}  // namespace
}  // namespace seqlab
