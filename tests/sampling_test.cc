// Decoding: the token rules (greedy, top-k, top-p, temperature) on fixed logits, the empirical
// distribution of many draws against the renormalised softmax, and generate() with the KV cache
// against decoding by full forwards, including past the model's window; logits that are not finite
// are refused, by sample_token and by generate().
#include "train/loop/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

const std::vector<double> kLogits = {0.5, 2.0, -1.0, 1.5, 2.0};  // ids 1 and 4 tie for the maximum

TEST(SampleToken, GreedyTakesTheFirstMaximum) {
  Generator gen(0);
  SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(sample_token(kLogits, o, gen), 1);
  o.temperature = 1;
  o.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(kLogits, o, gen), 1);
  o.top_k = 0;
  o.top_p = 1e-6;  // the nucleus is the single most likely id
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(kLogits, o, gen), 1);
}

// Draws many tokens and compares their frequencies with the expected probabilities: within 5
// standard deviations of a binomial count, and never outside the allowed set.
void expect_distribution(const SamplingOptions& o, const std::vector<double>& expected) {
  Generator gen(42);
  constexpr int kDraws = 20000;
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(sample_token(kLogits, o, gen))];
  for (size_t id = 0; id < kLogits.size(); ++id) {
    const double p = expected[id];
    if (p == 0) {
      EXPECT_EQ(counts[id], 0) << "id " << id << " is outside the allowed set";
    } else {
      const double sd = std::sqrt(kDraws * p * (1 - p));
      EXPECT_NEAR(counts[id], kDraws * p, 5 * sd) << "id " << id;
    }
  }
}

std::vector<double> softmax_over(const std::vector<size_t>& allowed, double temperature) {
  std::vector<double> p(kLogits.size(), 0.0);
  double total = 0;
  for (size_t id : allowed) total += p[id] = std::exp(kLogits[id] / temperature);
  for (double& v : p) v /= total;
  return p;
}

TEST(SampleToken, FullSoftmaxAtTemperature) {
  SamplingOptions o;
  o.temperature = 0.7;
  expect_distribution(o, softmax_over({0, 1, 2, 3, 4}, 0.7));
}

TEST(SampleToken, TopKRenormalisesTheKMostLikely) {
  SamplingOptions o;
  o.temperature = 1;
  o.top_k = 3;  // ids 1, 4 (tied, lower id first) and 3
  expect_distribution(o, softmax_over({1, 3, 4}, 1));
}

TEST(SampleToken, TopPKeepsTheSmallestNucleus) {
  // Full-softmax probabilities, descending: ids 1, 4 ≈ 0.34 each, 3 ≈ 0.21, 0 ≈ 0.08, 2 ≈ 0.02.
  // p = 0.8 needs ids 1, 4 and 3 (0.68 is not enough; 0.89 is).
  SamplingOptions o;
  o.temperature = 1;
  o.top_p = 0.8;
  expect_distribution(o, softmax_over({1, 3, 4}, 1));
}

TEST(SampleToken, SuppressedIdsAreNeverDrawn) {
  SamplingOptions o;
  o.suppressed = {1, 4};  // the two most likely
  o.temperature = 0;
  Generator gen(3);
  EXPECT_EQ(sample_token(kLogits, o, gen), 3);
  o.temperature = 1;
  expect_distribution(o, softmax_over({0, 2, 3}, 1));
  o.suppressed = {0, 1, 2, 3, 4};
  EXPECT_THROW(sample_token(kLogits, o, gen), std::invalid_argument);
}

TEST(SampleToken, RejectsBadOptions) {
  Generator gen(0);
  SamplingOptions o;
  o.top_p = 0;
  EXPECT_THROW(sample_token(kLogits, o, gen), std::invalid_argument);
  o.top_p = 1;
  o.temperature = -1;
  EXPECT_THROW(sample_token(kLogits, o, gen), std::invalid_argument);
  EXPECT_THROW(sample_token({}, SamplingOptions(), gen), std::invalid_argument);
}

// NaN or +infinity among the candidates leaves the softmax undefined: refused, greedy or not (a NaN
// used to lose every comparison, so id 0 was drawn every time). −infinity only rules an id out, and a
// suppressed id's logit is never looked at.
TEST(SampleToken, NonFiniteLogitsAreRefused) {
  Generator gen(0);
  const double nan = std::nan("");
  SamplingOptions greedy;
  greedy.temperature = 0;
  for (const SamplingOptions& o : {SamplingOptions(), greedy}) {
    EXPECT_THROW(sample_token({0.5, nan, 1.0}, o, gen), NonFiniteLogits);
    EXPECT_THROW(sample_token({0.5, HUGE_VAL}, o, gen), NonFiniteLogits);
    EXPECT_THROW(sample_token({-HUGE_VAL, -HUGE_VAL}, o, gen), NonFiniteLogits);
    EXPECT_EQ(sample_token({-HUGE_VAL, 1.0}, o, gen), 1);
    SamplingOptions suppressed = o;
    suppressed.suppressed = {1};
    EXPECT_EQ(sample_token({0.5, nan}, suppressed, gen), 0);
  }
}

ModelConfig tiny_config() {
  ModelConfig cfg = gpt2_config(13, 8, 2, 2, 8);
  cfg.init_std = 0.3;  // large weights: the next token depends strongly on the context
  return cfg;
}

// Decoding the slow way: a full forward over the context for every token, where the context is cut
// to its last half window whenever it would overflow, exactly as generate() refills its cache.
std::vector<int32_t> decode_by_full_forwards(Decoder& model, std::vector<int32_t> context, const SamplingOptions& o,
                                             Generator& gen) {
  NoGradGuard no_grad;
  const size_t window = static_cast<size_t>(model.max_context());
  std::vector<int32_t> out;
  size_t start = context.size() > window ? context.size() - window / 2 : 0;
  for (int64_t i = 0; i < o.tokens; ++i) {
    std::vector<int64_t> ids(context.begin() + static_cast<std::ptrdiff_t>(start), context.end());
    Tensor logits = model.logits({Tensor::from_indices(ids, {1, static_cast<int64_t>(ids.size())})});
    const int32_t next =
        sample_token(kernel::narrow(logits, 1, static_cast<int64_t>(ids.size()) - 1, 1).to_doubles(), o, gen);
    out.push_back(next);
    context.push_back(next);
    if (context.size() - start > window) start = context.size() - window / 2;
  }
  return out;
}

TEST(Generate, KvCacheMatchesFullForwardsAcrossTheWindow) {
  Generator init(5);
  Decoder model(tiny_config(), init);
  SamplingOptions o;
  o.temperature = 1.0;
  o.tokens = 20;  // well past max_seq_len 8: the cache is rebuilt several times
  for (std::vector<int32_t> prompt : {std::vector<int32_t>{3}, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}) {
    Generator fast_gen(11), slow_gen(11);
    std::vector<int32_t> fast = generate(model, prompt, o, fast_gen);
    EXPECT_EQ(fast, decode_by_full_forwards(model, prompt, o, slow_gen)) << "prompt of " << prompt.size();
    EXPECT_GT(std::set<int32_t>(fast.begin(), fast.end()).size(), 5u) << "a degenerate sequence would prove little";
  }
}

TEST(Generate, SameSeedSameTextAndStopToken) {
  Generator init(6);
  Decoder model(tiny_config(), init);
  model.set_training(true);
  SamplingOptions o;
  o.tokens = 12;
  o.temperature = 1.0;
  Generator a(9), b(9);
  std::vector<int32_t> first = generate(model, {4}, o, a);
  EXPECT_EQ(first, generate(model, {4}, o, b));
  EXPECT_EQ(first.size(), 12u);
  EXPECT_TRUE(model.training()) << "generate() restores the training flag";
  o.stop_token = first[2];
  Generator c(9);
  std::vector<int32_t> stopped = generate(model, {4}, o, c);
  const size_t first_stop = static_cast<size_t>(std::find(first.begin(), first.end(), first[2]) - first.begin());
  EXPECT_EQ(stopped, std::vector<int32_t>(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(first_stop) + 1));
}

// A model whose logits are NaN (here a NaN final norm; in a run, finite weights so large that the forward
// overflows) has no sample: generate() names the token and restores the training flag.
TEST(Generate, AModelWhoseLogitsAreNanIsRefused) {
  Generator init(7);
  Decoder model(tiny_config(), init);
  model.set_training(true);
  for (const Parameter& p : model.parameters()) {
    if (p.name.rfind("norm_f.", 0) == 0) kernel::fill_(*p.tensor, std::nan(""));
  }
  SamplingOptions o;
  o.tokens = 4;
  Generator gen(1);
  try {
    generate(model, {3}, o, gen);
    ADD_FAILURE() << "NaN logits were sampled";
  } catch (const NonFiniteLogits& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 of the sample: the model's logits are not finite (NaN"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(model.training());
}

}  // namespace
}  // namespace seqlab
