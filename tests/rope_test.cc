// Rotary position embedding: the fused op against the materialised reference (values and
// gradients, f32 and f64), finite-difference gradients, the relative-position property of q·k,
// offset consistency (decoding), the backward as the inverse rotation, a hand-written value,
// the registry entry and shape errors.
#include "layers/attention/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

double dot(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

struct Result {
  Tensor y, dx;
};

template <class Fn>
Result forward_backward(Fn fn, const Tensor& x0, uint64_t seed) {
  Tensor x = set_requires_grad(x0.detach());
  Tensor y = fn(x);
  Generator gen(seed);
  Tensor gy = Tensor::randn(y.shape(), gen, y.dtype());
  backward({y}, {gy});
  return {y.detach(), grad_of(x)};
}

struct Case {
  int64_t B, T, H, D, start;
  double base;
};

class RopeMatchesReference : public ::testing::TestWithParam<Case> {};

void expect_match(const Case& c, DType dtype, double tol) {
  Generator gen(7);
  Tensor x = Tensor::randn({c.B, c.T, c.H, c.D}, gen, dtype);
  RopeOptions opts{c.base, c.start};
  Result fused = forward_backward([&](const Tensor& t) { return rope(t, opts); }, x, 11);
  Result ref = forward_backward([&](const Tensor& t) { return rope_reference(t, opts); }, x, 11);
  ASSERT_TRUE(fused.dx.defined());
  EXPECT_EQ(fused.y.shape(), x.shape());
  EXPECT_EQ(fused.y.dtype(), dtype);
  EXPECT_LE(max_rel_error(fused.y, ref.y), tol) << "y";
  EXPECT_LE(max_rel_error(fused.dx, ref.dx), tol) << "dx";
}

TEST_P(RopeMatchesReference, F64) { expect_match(GetParam(), DType::f64, 1e-14); }
TEST_P(RopeMatchesReference, F32) { expect_match(GetParam(), DType::f32, 1e-6); }

// B, T, H, D, start, base
INSTANTIATE_TEST_SUITE_P(Shapes, RopeMatchesReference,
                         ::testing::Values(Case{2, 5, 3, 6, 0, 10000}, Case{2, 5, 3, 6, 7, 100},
                                           Case{1, 1, 2, 8, 41, 10000},  // one decoded token
                                           Case{3, 4, 1, 2, 2, 10},      // a single pair
                                           Case{2, 33, 5, 16, 1000, 10000},  // many rows: several threads
                                           Case{1, 3, 2, 4, 100000, 500000}));

// The op against cos/sin written out by hand for one pair: D = 4 gives θ_0 = 1, θ_1 = base^(−1/2).
TEST(Rope, HandWrittenValues) {
  const double base = 16, start = 2;
  Tensor x = Tensor::from_vector({1, 2, 3, 4, -1, 0.5, 2, -3}, {1, 2, 1, 4}, DType::f64);
  std::vector<double> y = rope(x, {base, 2}).to_doubles();
  std::vector<double> xv = x.to_doubles();
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      const double phi = (start + t) * (i == 0 ? 1.0 : 0.25);
      const double a = xv[t * 4 + 2 * i], b = xv[t * 4 + 2 * i + 1];
      EXPECT_NEAR(y[t * 4 + 2 * i], a * std::cos(phi) - b * std::sin(phi), 1e-14) << t << " " << i;
      EXPECT_NEAR(y[t * 4 + 2 * i + 1], a * std::sin(phi) + b * std::cos(phi), 1e-14) << t << " " << i;
    }
  }
  // Position 0 is the identity.
  EXPECT_LE(max_rel_error(rope(narrow(x, 1, 0, 1), {base, 0}), narrow(x, 1, 0, 1)), 0.0);
}

TEST(RopeGradcheck, F64) {
  for (int64_t start : {int64_t{0}, int64_t{5}}) {
    Generator gen(3);
    Tensor x = Tensor::randn({2, 4, 3, 6}, gen, DType::f64);
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{rope(in[0], {50.0, start})}; }, {x});
    EXPECT_EQ(r.elements_checked, 2 * 4 * 3 * 6);
    EXPECT_LE(r.max_error, 1e-6) << r.worst;
  }
}

// ⟨R(mθ) q, R(nθ) k⟩ depends only on n − m (and the rotation keeps norms).
TEST(Rope, ScoresDependOnlyOnRelativePosition) {
  Generator gen(5);
  const int64_t D = 8;
  Tensor q = Tensor::randn({1, 1, 1, D}, gen, DType::f64), k = Tensor::randn({1, 1, 1, D}, gen, DType::f64);
  auto score = [&](int64_t m, int64_t n) { return dot(rope(q, {10000, m}), rope(k, {10000, n})); };
  for (int64_t dist : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{-2}}) {
    const int64_t m0 = dist < 0 ? -dist : 0;
    const double s0 = score(m0, m0 + dist);
    for (int64_t m : {int64_t{5}, int64_t{17}, int64_t{1000}, int64_t{123456}}) {
      EXPECT_NEAR(score(m, m + dist), s0, 1e-9) << "distance " << dist << " at " << m;
    }
  }
  EXPECT_NEAR(score(0, 0), dot(q, k), 1e-14);
  // Not trivially constant: different distances give different scores.
  EXPECT_GT(std::abs(score(0, 1) - score(0, 3)), 1e-3);
  EXPECT_NEAR(dot(rope(q, {10000, 77}), rope(q, {10000, 77})), dot(q, q), 1e-12);
}

// The same tokens through the relative property for a whole sequence: the score matrix of rotated
// q, k over positions s..s+T equals that over 0..T (a shifted window).
TEST(Rope, ScoreMatrixIsShiftInvariant) {
  Generator gen(9);
  Tensor q = Tensor::randn({1, 6, 2, 4}, gen, DType::f64), k = Tensor::randn({1, 6, 2, 4}, gen, DType::f64);
  auto scores = [&](int64_t start) {
    Tensor qr = permute(rope(q, {100, start}), {0, 2, 1, 3}), kr = permute(rope(k, {100, start}), {0, 2, 1, 3});
    return matmul(qr, transpose(kr, 2, 3));  // [1, H, T, T]
  };
  EXPECT_LE(max_rel_error(scores(9), scores(0)), 1e-12);
  EXPECT_GT(max_rel_error(matmul(permute(q, {0, 2, 1, 3}), transpose(permute(k, {0, 2, 1, 3}), 2, 3)), scores(0)),
            1e-3);
}

// rope over positions start..start+T of a slice equals the slice of rope over 0..start+T; in
// f32 too, since decoding uses it at every step.
TEST(Rope, OffsetMatchesSliceOfFullSequence) {
  for (DType dtype : {DType::f64, DType::f32}) {
    Generator gen(13);
    Tensor x = Tensor::randn({2, 9, 3, 6}, gen, dtype);
    Tensor full = rope(x);
    for (int64_t start : {int64_t{0}, int64_t{4}, int64_t{8}}) {
      const int64_t len = 9 - start;
      Tensor part = rope(narrow(x, 1, start, len), {10000, start});
      EXPECT_LE(max_rel_error(part, narrow(full, 1, start, len)), dtype == DType::f64 ? 1e-15 : 1e-7)
          << "start " << start;
    }
  }
}

// The backward is the inverse rotation: rotating back recovers x, and ⟨R x, g⟩ = ⟨x, R⁻¹ g⟩.
TEST(Rope, BackwardIsInverseRotation) {
  Generator gen(17);
  Tensor x = Tensor::randn({2, 5, 2, 6}, gen, DType::f64), g = Tensor::randn({2, 5, 2, 6}, gen, DType::f64);
  RopeOptions opts{1000, 11};
  Tensor y = kernel::rope_rotate(x, opts, false);
  EXPECT_LE(max_rel_error(kernel::rope_rotate(y, opts, true), x), 1e-15);
  EXPECT_GT(max_rel_error(y, x), 1e-2);
  Result r = forward_backward([&](const Tensor& t) { return rope(t, opts); }, x, 19);
  Generator gen2(19);
  Tensor gy = Tensor::randn(x.shape(), gen2, DType::f64);
  EXPECT_LE(max_rel_error(r.dx, kernel::rope_rotate(gy, opts, true)), 0.0);
  EXPECT_NEAR(dot(y, g), dot(x, kernel::rope_rotate(g, opts, true)), 1e-12);
}

// A strided view (the q columns of a fused qkv projection's output) gives the same result.
TEST(Rope, AcceptsStridedInputs) {
  Generator gen(23);
  Tensor qkv = Tensor::randn({2, 5, 3 * 12}, gen, DType::f64);
  Tensor q_view = Tensor::make_view(qkv.storage(), {2, 5, 2, 6}, {5 * 36, 36, 6, 1}, 12, DType::f64);
  ASSERT_FALSE(q_view.is_contiguous());
  Tensor q = kernel::contiguous(q_view);
  EXPECT_LE(max_rel_error(rope(q_view, {100, 2}), rope(q, {100, 2})), 0.0);
}

TEST(Rope, RegistryEntry) {
  const OpSpec* op = find_op("rope");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"y"}));
  Generator gen(29);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  OpAttrs attrs = OpAttrs::parse("rope", op->attrs, {{"base", "100"}, {"start", "3"}});
  std::vector<Tensor> y = op->forward(x, attrs);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_LE(max_rel_error(y[0], rope_reference(x[0], {100, 3})), 1e-14);
  OpAttrs defaults = OpAttrs::parse("rope", op->attrs, {});
  EXPECT_LE(max_rel_error(op->forward(x, defaults)[0], rope_reference(x[0], {10000, 0})), 1e-14);
}

std::string error_of(const Tensor& x, RopeOptions opts = {}) {
  try {
    rope(x, opts);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Rope, ErrorsNameTheShape) {
  std::string e = error_of(Tensor::zeros({2, 5, 3, 5}));
  EXPECT_NE(e.find("must be even"), std::string::npos) << e;
  EXPECT_NE(e.find("x [2, 5, 3, 5]"), std::string::npos) << e;
  e = error_of(Tensor::zeros({2, 5, 6}));
  EXPECT_NE(e.find("4 dimensions"), std::string::npos) << e;
  e = error_of(Tensor::zeros({2, 5, 3, 4}, DType::i64));
  EXPECT_NE(e.find("f32, f64 or bf16"), std::string::npos) << e;
  e = error_of(Tensor::zeros({2, 5, 3, 4}), {0.0, 0});
  EXPECT_NE(e.find("base must be positive"), std::string::npos) << e;
  e = error_of(Tensor::zeros({2, 5, 3, 4}), {10000, -1});
  EXPECT_NE(e.find("start must be"), std::string::npos) << e;
  EXPECT_THROW(rope_reference(Tensor::zeros({2, 5, 3, 5})), std::invalid_argument);
}

}  // namespace
}  // namespace seqlab
