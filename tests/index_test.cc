// embedding, dropout, concat, split and stack against loops written here, in f32 and f64:
// forward values, gradients (repeated embedding rows accumulate), determinism, and the errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using Vec = std::vector<double>;

Vec normal_values(size_t n, Generator& gen) {
  Vec v(n);
  for (double& x : v) x = gen.normal();
  return v;
}

// The message of the std::invalid_argument that fn throws ("" when it throws nothing).
template <class Fn>
std::string invalid_argument_message(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

class IndexOps : public ::testing::TestWithParam<DType> {
 public:
  DType dtype() const { return GetParam(); }
  // Values as stored in this dtype (f32 rounds), so that references start from the same inputs.
  Vec stored(const Vec& v) const { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype()).to_doubles(); }
};

// ---- embedding ----

TEST_P(IndexOps, EmbeddingGathersRows) {
  Generator gen(1);
  const int64_t V = 7, C = 5;
  Vec w = stored(normal_values(V * C, gen));
  for (DType index_dtype : {DType::i32, DType::i64}) {
    std::vector<int64_t> idx = {1, 6, 1, 0, 3, 6};
    Tensor y = embedding(Tensor::from_vector(w, {V, C}, dtype()), Tensor::from_indices(idx, {2, 3}, index_dtype));
    ASSERT_EQ(y.shape(), (Shape{2, 3, C}));
    EXPECT_EQ(y.dtype(), dtype());
    Vec got = y.to_doubles();
    for (size_t n = 0; n < idx.size(); ++n) {
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(got[n * C + static_cast<size_t>(c)], w[static_cast<size_t>(idx[n] * C + c)]) << n << "," << c;
      }
    }
  }
}

TEST_P(IndexOps, EmbeddingGradientAccumulatesRepeatedRows) {
  Generator gen(2);
  const int64_t V = 5, C = 3;
  Tensor w = Tensor::from_vector(normal_values(V * C, gen), {V, C}, dtype());
  set_requires_grad(w, true);
  std::vector<int64_t> idx = {0, 2, 0, 0, 4};  // row 0 three times, rows 1 and 3 never
  Vec dy = stored(normal_values(idx.size() * C, gen));
  backward({embedding(w, Tensor::from_indices(idx, {5}, DType::i32))}, {Tensor::from_vector(dy, {5, C}, dtype())});
  Vec want(static_cast<size_t>(V * C), 0.0);
  for (size_t n = 0; n < idx.size(); ++n) {
    for (int64_t c = 0; c < C; ++c) want[static_cast<size_t>(idx[n] * C + c)] += dy[n * C + static_cast<size_t>(c)];
  }
  Vec got = grad_of(w).to_doubles();
  const double tol = dtype() == DType::f64 ? 1e-15 : 1e-6;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(got[static_cast<size_t>(1 * C + c)], 0.0);  // unused rows get exactly zero
    EXPECT_EQ(got[static_cast<size_t>(3 * C + c)], 0.0);
  }
}

// Large enough that the backward runs on several threads: same bits for 1 and 4 threads, and
// equal to a serial double-precision sum.
TEST_P(IndexOps, EmbeddingBackwardIsDeterministicAcrossThreadCounts) {
  Generator gen(3);
  const int64_t V = 50, C = 64, N = 2000;
  std::vector<int64_t> idx(N);
  for (int64_t& i : idx) i = static_cast<int64_t>(gen.next_u64() % 7) * 7;  // few hot rows, many repeats
  Tensor index = Tensor::from_indices(idx, {N});
  Tensor dy = Tensor::from_vector(normal_values(N * C, gen), {N, C}, dtype());
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Vec one = kernel::embedding_backward(dy, index, V).to_doubles();
  omp_set_num_threads(4);
  Vec four = kernel::embedding_backward(dy, index, V).to_doubles();
  omp_set_num_threads(saved_threads);
  ASSERT_EQ(one.size(), static_cast<size_t>(V * C));
  Vec g = dy.to_doubles(), want(one.size(), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) want[static_cast<size_t>(idx[static_cast<size_t>(n)] * C + c)] += g[static_cast<size_t>(n * C + c)];
  }
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i], four[i]) << "element " << i;
    EXPECT_NEAR(one[i], want[i], dtype() == DType::f64 ? 1e-12 : 1e-5) << "element " << i;
  }
}

TEST_P(IndexOps, EmbeddingRejectsOutOfRangeIndices) {
  Tensor w = Tensor::zeros({4, 3}, dtype());
  std::string msg = invalid_argument_message([&] { embedding(w, Tensor::from_indices({0, 9, 1}, {3})); });
  EXPECT_NE(msg.find("index 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("V = 4"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { embedding(w, Tensor::from_indices({-1}, {1}, DType::i32)); });
  EXPECT_NE(msg.find("index -1"), std::string::npos) << msg;
  EXPECT_THROW(embedding(w, Tensor::zeros({2}, DType::f32)), std::invalid_argument);  // not indices
  EXPECT_THROW(embedding(Tensor::zeros({4}, dtype()), Tensor::from_indices({0}, {1})), std::invalid_argument);
}

// ---- dropout ----

TEST_P(IndexOps, DropoutIsDeterministicForASeedAndScalesSurvivors) {
  Generator data(4);
  const int64_t n = 20000;
  const double p = 0.3;
  Vec xv = stored(normal_values(n, data));
  Tensor x = Tensor::from_vector(xv, {100, 200}, dtype());
  Generator g1(7), g2(7), g3(8);
  Vec y1 = dropout(x, p, g1).to_doubles(), y2 = dropout(x, p, g2).to_doubles(), y3 = dropout(x, p, g3).to_doubles();
  EXPECT_EQ(y1, y2);
  EXPECT_NE(y1, y3);
  int64_t kept = 0;
  const double tol = dtype() == DType::f64 ? 1e-15 : 1e-6;
  for (size_t i = 0; i < y1.size(); ++i) {
    if (y1[i] == 0.0) continue;
    ++kept;
    EXPECT_NEAR(y1[i], xv[i] / (1.0 - p), tol * std::fabs(xv[i])) << "element " << i;
  }
  // kept ~ Binomial(n, 0.7): standard deviation ≈ 65, so ±400 is far outside chance.
  EXPECT_NEAR(static_cast<double>(kept), 0.7 * n, 400.0);
  // A generator consumed further gives a different mask the next time.
  EXPECT_NE(dropout(x, p, g1).to_doubles(), y1);
}

TEST_P(IndexOps, DropoutGradientUsesTheSameMask) {
  Generator data(5);
  Tensor x = Tensor::from_vector(Vec(300, 1.0), {300}, dtype());
  set_requires_grad(x, true);
  Generator gen(11);
  Tensor y = dropout(x, 0.5, gen);
  Vec dy = stored(normal_values(300, data));
  backward({y}, {Tensor::from_vector(dy, {300}, dtype())});
  Vec yv = y.to_doubles(), dx = grad_of(x).to_doubles();
  for (size_t i = 0; i < yv.size(); ++i) {
    // x = 1, so y holds the scaled mask itself: m / (1 − p) ∈ {0, 2}.
    ASSERT_TRUE(yv[i] == 0.0 || yv[i] == 2.0) << yv[i];
    EXPECT_DOUBLE_EQ(dx[i], dy[i] * yv[i]);
  }
}

TEST_P(IndexOps, DropoutIsTheIdentityAtZeroOrInEvaluation) {
  Generator data(6), gen(1);
  Vec xv = stored(normal_values(40, data));
  for (auto [p, training] : {std::pair<double, bool>{0.0, true}, {0.5, false}}) {
    Tensor x = Tensor::from_vector(xv, {5, 8}, dtype());
    set_requires_grad(x, true);
    Tensor y = dropout(x, p, gen, training);
    EXPECT_EQ(y.to_doubles(), xv);
    ASSERT_TRUE(requires_grad(y));  // still differentiable
    backward({y}, {Tensor::full({5, 8}, 3.0, dtype())});
    EXPECT_EQ(grad_of(x).to_doubles(), Vec(40, 3.0));
  }
}

TEST_P(IndexOps, DropoutRejectsProbabilitiesOutsideZeroOne) {
  Generator gen(0);
  Tensor x = Tensor::ones({3}, dtype());
  for (double p : {1.0, -0.1, 1.5, std::nan("")}) {
    std::string msg = invalid_argument_message([&] { dropout(x, p, gen); });
    EXPECT_NE(msg.find("[0, 1)"), std::string::npos) << "p = " << p << ": " << msg;
  }
  EXPECT_THROW(dropout(x, 1.0, gen, /*training=*/false), std::invalid_argument);
}

// ---- concat, split, stack ----

// x[i, j, k] of a contiguous [I, J, K] block.
double at3(const Vec& x, const Shape& s, int64_t i, int64_t j, int64_t k) {
  return x[static_cast<size_t>((i * s[1] + j) * s[2] + k)];
}

TEST_P(IndexOps, ConcatAlongTheMiddleDimensionAndItsGradient) {
  Generator gen(7);
  std::vector<Shape> shapes = {{2, 3, 4}, {2, 1, 4}, {2, 2, 4}};
  std::vector<Tensor> xs;
  std::vector<Vec> vals;
  for (const Shape& s : shapes) {
    vals.push_back(stored(normal_values(static_cast<size_t>(shape_numel(s)), gen)));
    xs.push_back(Tensor::from_vector(vals.back(), s, dtype()));
    set_requires_grad(xs.back(), true);
  }
  Tensor y = concat(xs, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 6, 4}));
  Vec got = y.to_doubles();
  for (int64_t i = 0; i < 2; ++i) {
    int64_t j = 0;
    for (size_t p = 0; p < xs.size(); ++p) {
      for (int64_t jj = 0; jj < shapes[p][1]; ++jj, ++j) {
        for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(at3(got, {2, 6, 4}, i, j, k), at3(vals[p], shapes[p], i, jj, k));
      }
    }
  }
  // With dy = ramp, each input's gradient is its own slice of the ramp.
  Vec ramp(48);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<double>(i);
  backward({y}, {Tensor::from_vector(ramp, {2, 6, 4}, dtype())});
  int64_t offset = 0;
  for (size_t p = 0; p < xs.size(); ++p) {
    Vec g = grad_of(xs[p]).to_doubles();
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t jj = 0; jj < shapes[p][1]; ++jj) {
        for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(at3(g, shapes[p], i, jj, k), at3(ramp, {2, 6, 4}, i, offset + jj, k));
      }
    }
    offset += shapes[p][1];
  }
}

TEST_P(IndexOps, ConcatOfStridedInputsAlongTheLastDimension) {
  Tensor a = kernel::transpose(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, dtype()), 0, 1);  // [[1,3,5],[2,4,6]]
  Tensor b = Tensor::from_vector({7, 8}, {2, 1}, dtype());
  Tensor y = concat({a, b}, -1);
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_EQ(y.to_doubles(), (Vec{1, 3, 5, 7, 2, 4, 6, 8}));
}

TEST_P(IndexOps, SplitThenConcatRoundTripsAndPiecesAreDifferentiable) {
  Generator gen(8);
  Vec xv = stored(normal_values(2 * 6 * 3, gen));
  Tensor x = Tensor::from_vector(xv, {2, 6, 3}, dtype());
  set_requires_grad(x, true);
  std::vector<Tensor> ys = split(x, {2, 1, 3}, 1);
  ASSERT_EQ(ys.size(), 3u);
  EXPECT_EQ(ys[0].shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(ys[1].shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(ys[2].shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(ys[2].to_doubles()[0], at3(xv, {2, 6, 3}, 0, 3, 0));
  EXPECT_EQ(concat(ys, 1).to_doubles(), xv);
  // Only the last piece is used: its gradient pads into the input, zeros elsewhere.
  backward(sum(ys[2]));
  Vec g = grad_of(x).to_doubles();
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(at3(g, {2, 6, 3}, i, j, k), j >= 3 ? 1.0 : 0.0);
    }
  }
}

TEST_P(IndexOps, StackAddsADimensionAndUnstacksBack) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, dtype());
  Tensor b = Tensor::from_vector({10, 20, 30, 40, 50, 60}, {2, 3}, dtype());
  set_requires_grad(a, true);
  set_requires_grad(b, true);
  Tensor s0 = stack({a, b}, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(s0.to_doubles(), (Vec{1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60}));
  Tensor s2 = stack({a, b}, -1);
  EXPECT_EQ(s2.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s2.to_doubles(), (Vec{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60}));
  std::vector<Tensor> back = split(s2, {1, 1}, -1);
  EXPECT_EQ(squeeze(back[1], -1).to_doubles(), b.to_doubles());
  // d/db Σ s2 ⊙ w picks w[..., 1].
  Vec w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i);
  backward({s2}, {Tensor::from_vector(w, {2, 3, 2}, dtype())});
  EXPECT_EQ(grad_of(a).to_doubles(), (Vec{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(grad_of(b).to_doubles(), (Vec{1, 3, 5, 7, 9, 11}));
}

TEST_P(IndexOps, JoinsAndSplitsRejectMismatchedInputsNamingTheShapes) {
  Tensor a = Tensor::zeros({2, 3}, dtype()), b = Tensor::zeros({4, 5}, dtype());
  std::string msg = invalid_argument_message([&] { concat({a, b}, 1); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { stack({a, Tensor::zeros({2, 4}, dtype())}, 0); });
  EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
  DType other = dtype() == DType::f32 ? DType::f64 : DType::f32;
  EXPECT_THROW(concat({a, Tensor::zeros({2, 1}, other)}, 1), std::invalid_argument);
  EXPECT_THROW(concat({}, 0), std::invalid_argument);
  EXPECT_THROW(concat({a, Tensor()}, 0), std::invalid_argument);
  msg = invalid_argument_message([&] { split(a, {1, 1}, 1); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_THROW(split(a, {4, -1}, 1), std::invalid_argument);
  EXPECT_THROW(concat({a, a}, 2), std::out_of_range);
}

INSTANTIATE_TEST_SUITE_P(F32AndF64, IndexOps, ::testing::Values(DType::f32, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace seqlab
