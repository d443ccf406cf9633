// T5's relative position bias: the bucketing against hand-computed T5 buckets at the edges (rel = 0, ±1, the
// max_exact boundary, the log-spaced buckets, max_distance and beyond, both directions, a float32 edge), the
// fused op against the embedding-gather reference (values and the table's gradient, f64 and f32), finite
// differences of the table (alone and through attention, as a T5 layer uses it), a deterministic backward,
// the registry entry and the errors.
#include "layers/attention/relative_position_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

const RelativePositionOptions kEncoder{true, 32, 128};   // T5's defaults, bidirectional (encoder)
const RelativePositionOptions kDecoder{false, 32, 128};  // and causal (decoder self-attention)

// rel = key position − query position. Bidirectional, 32 buckets: 16 per direction, max_exact = 8, so
// f(n) = n below 8 and 8 + ⌊log(n/8) / log(16) · 8⌋ from 8 on, i.e. 8 + ⌊2 log2(n/8)⌋: a new bucket at
// n = 8·2^(k/2) — 8, 11.3, 16, 22.6, 32, 45.3, 64, 90.5 — and the last, 15, from n = 91 on (max_distance = 128
// and beyond included: 8 + 8 would be past it). Keys after the query (rel > 0) take the upper 16.
TEST(RelativePositionBucket, BidirectionalT5Defaults) {
  const std::vector<std::pair<int64_t, int64_t>> rel_bucket = {
      {0, 0},     {-1, 1},     {1, 17},      {-7, 7},     {7, 23},     {-8, 8},      {8, 24},
      {-11, 8},   {-12, 9},    {-15, 9},     {15, 25},    {-16, 10},   {16, 26},     {-31, 11},
      {-32, 12},  {-45, 12},   {-46, 13},    {-63, 13},   {-64, 14},   {-90, 14},    {-91, 15},
      {90, 30},   {91, 31},    {-127, 15},   {-128, 15},  {127, 31},   {128, 31},
      {-1000, 15}, {1000, 31}, {-100000, 15}};
  for (const auto& [rel, bucket] : rel_bucket) EXPECT_EQ(relative_position_bucket(rel, kEncoder), bucket) << rel;
}

// Causal, 32 buckets: max_exact = 16, f(n) = 16 + ⌊log(n/16) / log(8) · 16⌋ from 16 on; every key after the
// query shares bucket 0 with rel = 0 (the causal mask hides them).
TEST(RelativePositionBucket, CausalT5Defaults) {
  const std::vector<std::pair<int64_t, int64_t>> rel_bucket = {
      {5, 0},     {1, 0},     {0, 0},     {-1, 1},    {-15, 15},  {-16, 16},   {-31, 21},
      {-32, 21},  {-45, 23},  {-46, 24},  {-127, 31}, {-128, 31}, {-129, 31},  {-1000000, 31}};
  for (const auto& [rel, bucket] : rel_bucket) EXPECT_EQ(relative_position_bucket(rel, kDecoder), bucket) << rel;
}

// 10 buckets, max_distance 6: 5 per direction, max_exact = 2; f(n) = 2 + ⌊log(n/2) / log 3 · 3⌋:
// f(2) = 2, f(3) = 2 + ⌊1.107⌋ = 3, f(4) = 2 + ⌊1.893⌋ = 3, f(5) = 2 + ⌊2.502⌋ = 4, f(6) = min(4, 5) = 4.
TEST(RelativePositionBucket, SmallBidirectional) {
  const RelativePositionOptions opts{true, 10, 6};
  const std::vector<std::pair<int64_t, int64_t>> rel_bucket = {
      {0, 0}, {-1, 1}, {1, 6}, {-2, 2}, {2, 7}, {-3, 3}, {-4, 3}, {-5, 4}, {-6, 4}, {6, 9}, {-100, 4}, {100, 9}};
  for (const auto& [rel, bucket] : rel_bucket) EXPECT_EQ(relative_position_bucket(rel, opts), bucket) << rel;
}

// Where the real value of the log expression is an integer, float32 decides the side: causal, 10 buckets,
// max_distance 160 (max_exact 5), n = 10 gives log(2) / log(32) · 5 = 1 exactly in the reals; in float32 it
// rounds to 1.0 (bucket 6), in float64 to 0.99999999999999989 (bucket 5). T5 computes in float32.
TEST(RelativePositionBucket, EvaluatedInFloat32) {
  EXPECT_EQ(relative_position_bucket(-10, {false, 10, 160}), 6);
  EXPECT_EQ(relative_position_bucket(-10, {true, 20, 160}), 6);
  EXPECT_EQ(relative_position_bucket(10, {true, 20, 160}), 16);
  EXPECT_LT(std::log(2.0) / std::log(32.0) * 5.0, 1.0);  // what float64 would have truncated to 0
}

// Every bucket is in [0, num_buckets), distances only grow buckets, and bidirectional buckets of keys after the
// query are those before it shifted by num_buckets / 2.
TEST(RelativePositionBucket, RangeMonotonyAndSymmetry) {
  for (const RelativePositionOptions& opts : {kEncoder, kDecoder, RelativePositionOptions{true, 9, 5}}) {
    int64_t previous = 0;
    for (int64_t n = 0; n < 400; ++n) {
      const int64_t b = relative_position_bucket(-n, opts);
      EXPECT_GE(b, previous);
      EXPECT_LT(b, opts.num_buckets);
      if (opts.bidirectional && n > 0) {
        EXPECT_EQ(relative_position_bucket(n, opts), b + opts.num_buckets / 2);
      } else if (!opts.bidirectional) {
        EXPECT_EQ(relative_position_bucket(n, opts), 0);
      }
      previous = b;
    }
  }
}

// bias[0, h, i, j] = table[bucket(j − (i + S − T)), h]: checked element by element, with T < S (queries at the
// end of the keys), T > S and T = S.
TEST(RelativePositionBias, LooksUpTheBucketOfEachPair) {
  Generator gen(3);
  const Tensor table = Tensor::randn({10, 3}, gen, DType::f64);
  const RelativePositionOptions opts{true, 10, 6};
  for (const auto& [T, S] : std::vector<std::pair<int64_t, int64_t>>{{4, 9}, {7, 3}, {5, 5}}) {
    const Tensor bias = relative_position_bias(table, T, S, opts);
    ASSERT_EQ(bias.shape(), (Shape{1, 3, T, S}));
    const std::vector<double> b = bias.to_doubles(), t = table.to_doubles();
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < S; ++j) {
          const int64_t bucket = relative_position_bucket(j - (i + S - T), opts);
          EXPECT_EQ(b[static_cast<size_t>((h * T + i) * S + j)], t[static_cast<size_t>(bucket * 3 + h)]);
        }
      }
    }
  }
  // A hand-picked element: T = 4, S = 9, query 0 sits at key position 5; key 0 is 5 before it: f(5) = 4.
  const Tensor bias = relative_position_bias(table, 4, 9, opts);
  EXPECT_EQ(bias.to_doubles()[static_cast<size_t>((2 * 4 + 0) * 9 + 0)], table.to_doubles()[4 * 3 + 2]);
}

struct Case {
  const char* name;
  int64_t NB, H, T, S;
  bool bidirectional;
  int64_t max_distance;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

struct Result {
  Tensor bias, dtable;
};

template <class Fn>
Result forward_backward(Fn fn, const Tensor& table0, uint64_t seed) {
  Tensor table = set_requires_grad(table0.detach());
  Tensor bias = fn(table);
  Generator gen(seed);
  backward({bias}, {Tensor::randn(bias.shape(), gen, bias.dtype())});
  return {bias.detach(), grad_of(table)};
}

class RelativePositionBiasMatchesReference : public ::testing::TestWithParam<Case> {};

void expect_match(const Case& c, DType dtype, double tol) {
  Generator gen(7);
  const Tensor table = Tensor::randn({c.NB, c.H}, gen, dtype);
  const RelativePositionOptions opts{c.bidirectional, c.NB, c.max_distance};
  Result fused = forward_backward([&](const Tensor& t) { return relative_position_bias(t, c.T, c.S, opts); }, table, 11);
  Result ref =
      forward_backward([&](const Tensor& t) { return relative_position_bias_reference(t, c.T, c.S, opts); }, table, 11);
  ASSERT_TRUE(fused.dtable.defined());
  EXPECT_EQ(fused.bias.shape(), (Shape{1, c.H, c.T, c.S}));
  EXPECT_EQ(fused.dtable.shape(), table.shape());
  EXPECT_EQ(max_rel_error(fused.bias, ref.bias), 0.0);  // a gather: exact
  EXPECT_LE(max_rel_error(fused.dtable, ref.dtable), tol);
}

TEST_P(RelativePositionBiasMatchesReference, F64) { expect_match(GetParam(), DType::f64, 1e-12); }
TEST_P(RelativePositionBiasMatchesReference, F32) { expect_match(GetParam(), DType::f32, 1e-5); }

// name, NB, H, T, S, bidirectional, max_distance
INSTANTIATE_TEST_SUITE_P(
    Shapes, RelativePositionBiasMatchesReference,
    ::testing::Values(Case{"t5_encoder", 32, 4, 150, 150, true, 128},  // distances beyond max_distance
                      Case{"t5_decoder", 32, 3, 140, 140, false, 128},
                      Case{"queries_at_the_end", 10, 3, 6, 9, true, 6},
                      Case{"causal_cache", 7, 2, 5, 12, false, 9},
                      Case{"more_queries_than_keys_odd_buckets", 9, 2, 7, 3, true, 5},
                      Case{"one_position", 4, 1, 1, 1, true, 2},
                      Case{"one_query_many_keys", 8, 2, 1, 40, false, 16},
                      Case{"many_heads_threads", 16, 12, 97, 131, true, 40}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- finite differences (f64) of the table ----
TEST(RelativePositionBias, GradcheckTable) {
  for (const Case& c : {Case{"", 10, 3, 6, 9, true, 6}, Case{"", 7, 2, 7, 3, false, 4}, Case{"", 4, 1, 1, 1, true, 2},
                        Case{"", 32, 2, 40, 40, true, 16}}) {
    Generator gen(13);
    const Tensor table = Tensor::randn({c.NB, c.H}, gen, DType::f64);
    const RelativePositionOptions opts{c.bidirectional, c.NB, c.max_distance};
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& x) {
          return std::vector<Tensor>{relative_position_bias(x[0], c.T, c.S, opts)};
        },
        {table});
    EXPECT_EQ(r.elements_checked, c.NB * c.H);
    EXPECT_LE(r.max_error, 1e-6) << r.worst;
  }
}

// As a T5 layer uses it: the bias of the table added to the scores of attention over a padded batch (Bb = 1,
// shared by the batch rows); the table's gradient arrives through attention's dbias, summed over the batch.
// Only the key lengths pad (padded query rows would have lse = −∞, which has no finite difference).
TEST(RelativePositionBias, GradcheckThroughAttention) {
  for (bool bidirectional : {true, false}) {
    Generator gen(17);
    const int64_t B = 2, T = 6, S = 6, H = 2, D = 3, NB = 8;
    const RelativePositionOptions opts{bidirectional, NB, 5};
    AttentionOptions attn;
    attn.causal = !bidirectional;
    attn.block = 4;
    attn.k_lengths = Tensor::from_indices({6, 4}, {B});
    const std::vector<Tensor> x{Tensor::randn({NB, H}, gen, DType::f64), Tensor::randn({B, T, H, D}, gen, DType::f64),
                                Tensor::randn({B, S, H, D}, gen, DType::f64),
                                Tensor::randn({B, S, H, D}, gen, DType::f64)};
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& y) {
          const Tensor bias = relative_position_bias(y[0], T, S, opts);
          const AttentionOutput out = attention_with_lse(y[1], y[2], y[3], attn, bias);
          return std::vector<Tensor>{out.o, out.lse};
        },
        x);
    EXPECT_EQ(r.elements_checked, NB * H + 3 * B * T * H * D);
    EXPECT_LE(r.max_error, 1e-6) << r.worst;
  }
}

// The backward sums in a fixed order whatever the threads do: two runs agree bit for bit.
TEST(RelativePositionBias, BackwardIsDeterministic) {
  Generator gen(19);
  const Tensor dbias = Tensor::randn({1, 12, 300, 257}, gen, DType::f32);
  const Tensor a = kernel::relative_position_bias_backward(dbias, 300, 257, kEncoder);
  const Tensor b = kernel::relative_position_bias_backward(dbias, 300, 257, kEncoder);
  EXPECT_EQ(a.shape(), (Shape{32, 12}));
  EXPECT_EQ(max_rel_error(a, b), 0.0);
  // And the column sums of dtable are the head sums of dbias: every (i, j) lands in exactly one bucket.
  const std::vector<double> dt = kernel::to_dtype(a, DType::f64).to_doubles();
  const std::vector<double> head_sums = kernel::sum(kernel::to_dtype(dbias, DType::f64), {0, 2, 3}, false).to_doubles();
  for (int64_t h = 0; h < 12; ++h) {
    double s = 0;
    for (int64_t n = 0; n < 32; ++n) s += dt[static_cast<size_t>(n * 12 + h)];
    EXPECT_NEAR(s, head_sums[static_cast<size_t>(h)], 1e-2) << h;  // f32 sums of 77100 unit normals
  }
}

// Through the op registry, as `./train op relative_position_bias` runs it.
TEST(RelativePositionBias, RegistryEntry) {
  const OpSpec* op = find_op("relative_position_bias");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"bias"}));
  Generator gen(23);
  const std::vector<Tensor> x = op->example(gen, DType::f64);
  for (bool bidirectional : {true, false}) {
    const OpAttrs attrs = OpAttrs::parse(
        "relative_position_bias", op->attrs,
        {{"T", "6"}, {"S", "9"}, {"num_buckets", "10"}, {"max_distance", "6"}, {"bidirectional", bidirectional ? "1" : "0"}});
    const std::vector<Tensor> y = op->forward(x, attrs);
    ASSERT_EQ(y.size(), 1u);
    EXPECT_EQ(max_rel_error(y[0], relative_position_bias_reference(x[0], 6, 9, {bidirectional, 10, 6})), 0.0);
  }
}

// ---- errors ----
std::string error_of(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  try {
    relative_position_bias(table, T, S, opts);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(RelativePositionBias, ErrorsNameWhatIsWrong) {
  const Tensor table = Tensor::zeros({32, 4}, DType::f32);
  std::string e = error_of(Tensor::zeros({31, 4}, DType::f32), 5, 5, kEncoder);
  EXPECT_NE(e.find("table must be [num_buckets, H] = [32, H], got [31, 4]"), std::string::npos) << e;
  e = error_of(Tensor::zeros({32}, DType::f32), 5, 5, kEncoder);
  EXPECT_NE(e.find("got [32]"), std::string::npos) << e;
  e = error_of(Tensor::zeros({32, 4}, DType::i64), 5, 5, kEncoder);
  EXPECT_NE(e.find("table must be f32, f64 or bf16, got i64"), std::string::npos) << e;
  for (const auto& [T, S] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, -1}, {int64_t{1} << 40, 5}}) {
    e = error_of(table, T, S, kEncoder);
    EXPECT_NE(e.find("T and S (queries and keys) must be in [1, 2^31)"), std::string::npos) << e;
  }
  e = error_of(Tensor::zeros({3, 4}, DType::f32), 5, 5, {true, 3, 128});
  EXPECT_NE(e.find("num_buckets must be at least 4 with bidirectional bucketing"), std::string::npos) << e;
  e = error_of(Tensor::zeros({1, 4}, DType::f32), 5, 5, {false, 1, 128});
  EXPECT_NE(e.find("num_buckets must be at least 2 with causal bucketing"), std::string::npos) << e;
  e = error_of(table, 5, 5, {true, 32, 8});
  EXPECT_NE(e.find("max_distance must exceed the exact distances (max_exact = 8 for num_buckets 32), got 8"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of(table, 5, 5, {true, 32, 9}), "no error");
  EXPECT_THROW(relative_position_bucket(3, {false, 32, 16}), std::invalid_argument);  // max_exact 16
  EXPECT_THROW(relative_position_bias_reference(table, 5, 5, {true, 32, 8}), std::invalid_argument);
  e = "no error";
  try {
    kernel::relative_position_bias_backward(Tensor::zeros({1, 4, 5, 6}, DType::f32), 5, 5, kEncoder);
  } catch (const std::invalid_argument& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("dbias must be [1, H, T, S] = [1, H, 5, 5], got [1, 4, 5, 6]"), std::string::npos) << e;
}

}  // namespace
}  // namespace seqlab
