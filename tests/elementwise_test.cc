// Forward values of the elementwise ops, reductions, cumsum and matmul against closed forms and
// loops written here in double, from inputs as stored in the tested dtype. f64 must agree to
// 1e-14 and f32 to 1e-6 (relative to max(1, |reference|)); matmul, whose sums BLAS reorders, to
// 1e-13 and 1e-5.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using Vec = std::vector<double>;
using kernel::UnaryOp;

struct Precision {
  DType dtype;
  double tol;         // elementwise, reductions
  double matmul_tol;  // products
};

class Elementwise : public ::testing::TestWithParam<Precision> {
 public:
  DType dtype() const { return GetParam().dtype; }
  double tol() const { return GetParam().tol; }
  Tensor make(const Vec& v, const Shape& s) const { return Tensor::from_vector(v, s, dtype()); }
  Tensor randn(const Shape& s, Generator& gen) const { return Tensor::randn(s, gen, dtype()); }
  void expect_close(const Vec& got, const Vec& want, const std::string& what, double tol = 0) const {
    if (tol == 0) tol = this->tol();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
    }
  }
};

Vec map(const Vec& x, const std::function<double(double)>& f) {
  Vec y(x.size());
  std::transform(x.begin(), x.end(), y.begin(), f);
  return y;
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- unary ----

struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  bool positive;  // domain x > 0
};

const UnaryCase kUnary[] = {
    {"neg", &neg, [](double x) { return -x; }, false},
    {"exp", &exp, [](double x) { return std::exp(x); }, false},
    {"log", &log, [](double x) { return std::log(x); }, true},
    {"sqrt", &sqrt, [](double x) { return std::sqrt(x); }, true},
    {"rsqrt", &rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, true},
    {"square", &square, [](double x) { return x * x; }, false},
    {"tanh", &tanh, [](double x) { return std::tanh(x); }, false},
    {"sigmoid", &sigmoid, &sigmoid_ref, false},
    {"silu", &silu, [](double x) { return x * sigmoid_ref(x); }, false},
    {"gelu", &gelu,
     [](double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }, false},
    {"relu", &relu, [](double x) { return std::max(x, 0.0); }, false},
    {"softplus", &softplus, [](double x) { return std::log1p(std::exp(x)); }, false},
};

TEST_P(Elementwise, UnaryOpsMatchClosedForms) {
  const Vec mixed = {-2.2, -1.3, -0.7, -0.2, 0.2, 0.5, 1.1, 2.2, 3.7};
  const Vec positive = {0.3, 0.7, 1.0, 1.9, 4.0, 9.5};
  for (const UnaryCase& c : kUnary) {
    Tensor x = make(c.positive ? positive : mixed, {static_cast<int64_t>((c.positive ? positive : mixed).size())});
    Tensor y = c.op(x);
    EXPECT_EQ(y.dtype(), dtype());
    expect_close(y.to_doubles(), map(x.to_doubles(), c.ref), c.name);
  }
  Tensor x = make(mixed, {3, 3});
  expect_close(elu(x, 0.7).to_doubles(), map(x.to_doubles(), [](double v) { return v > 0 ? v : 0.7 * std::expm1(v); }),
               "elu");
  expect_close((-x).to_doubles(), map(x.to_doubles(), [](double v) { return -v; }), "operator-");
}

TEST_P(Elementwise, SoftplusAndSigmoidStayFiniteAtLargeMagnitudes) {
  Tensor x = make({-100, -30, 30, 100}, {4});
  Vec sp = softplus(x).to_doubles(), sg = sigmoid(x).to_doubles(), si = silu(x).to_doubles();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(sp[i]) && std::isfinite(sg[i]) && std::isfinite(si[i])) << i;
    EXPECT_GE(sg[i], 0.0);
    EXPECT_LE(sg[i], 1.0);
  }
  EXPECT_EQ(sp[3], 100.0);
  EXPECT_EQ(sg[3], 1.0);
  EXPECT_EQ(si[3], 100.0);
  // log(1 + e⁻¹⁰⁰) ≈ σ(−100) ≈ e⁻¹⁰⁰ ≈ 3.7e-44: an f32 subnormal, good to a few percent only.
  const double tiny = std::exp(-100.0), rel = dtype() == DType::f64 ? 1e-14 : 0.05;
  EXPECT_NEAR(sp[0], tiny, rel * tiny);
  EXPECT_NEAR(sg[0], tiny, rel * tiny);
  expect_close({sp[1], sp[2], sg[1], sg[2]},
               {std::log1p(std::exp(-30.0)), 30 + std::log1p(std::exp(-30.0)), sigmoid_ref(-30), sigmoid_ref(30)},
               "±30");
}

// ---- binary and scalar ----

TEST_P(Elementwise, BinaryOpsBroadcast) {
  Generator gen(1);
  Tensor a = randn({3, 1, 5}, gen);
  Tensor b = Tensor::rand({4, 5}, gen, dtype(), 0.5, 2.0);  // positive: a safe divisor
  Vec av = a.to_doubles(), bv = b.to_doubles();
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const Case cases[] = {{"add", &operator+, [](double p, double q) { return p + q; }},
                        {"sub", &operator-, [](double p, double q) { return p - q; }},
                        {"mul", &operator*, [](double p, double q) { return p * q; }},
                        {"div", &operator/, [](double p, double q) { return p / q; }}};
  for (const Case& c : cases) {
    Tensor y = c.op(a, b);
    ASSERT_EQ(y.shape(), (Shape{3, 4, 5})) << c.name;
    Vec want(60);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 4; ++j) {
        for (int k = 0; k < 5; ++k)
          want[static_cast<size_t>((i * 4 + j) * 5 + k)] = c.ref(av[i * 5 + k], bv[j * 5 + k]);
      }
    }
    expect_close(y.to_doubles(), want, c.name);
  }
  // A 0-d operand broadcasts against anything.
  expect_close(mul(a, make({2.0}, {})).to_doubles(), map(av, [](double v) { return 2 * v; }), "0-d");
}

TEST_P(Elementwise, StridedInputsAreReadInTheirViewOrder) {
  Generator gen(2);
  Tensor base = randn({5, 4}, gen);
  Tensor xt = kernel::transpose(base, 0, 1);  // [4, 5], not contiguous
  ASSERT_FALSE(xt.is_contiguous());
  Vec bv = base.to_doubles(), xv(20);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 5; ++j) xv[static_cast<size_t>(i * 5 + j)] = bv[static_cast<size_t>(j * 4 + i)];
  }
  expect_close(exp(xt).to_doubles(), map(xv, [](double v) { return std::exp(v); }), "exp of a transpose");
  Tensor c = randn({4, 5}, gen);
  Vec cv = c.to_doubles(), want(20);
  for (size_t i = 0; i < 20; ++i) want[i] = xv[i] * cv[i];
  expect_close(mul(xt, c).to_doubles(), want, "transpose ⊙ contiguous");
  // A narrowed view with an offset, as the right operand.
  Tensor n = kernel::narrow(base, 1, 1, 2);  // [5, 2]: columns 1 and 2
  Vec nv = (n - 1.0).to_doubles();
  for (int r = 0; r < 5; ++r) {
    EXPECT_NEAR(nv[static_cast<size_t>(r * 2)], bv[static_cast<size_t>(r * 4 + 1)] - 1.0, tol() * 4) << r;
    EXPECT_NEAR(nv[static_cast<size_t>(r * 2 + 1)], bv[static_cast<size_t>(r * 4 + 2)] - 1.0, tol() * 4) << r;
  }
}

TEST_P(Elementwise, ScalarOpsMatchClosedForms) {
  Tensor x = make({0.3, 0.8, 1.5, 2.0, 3.25}, {5});
  Vec xv = x.to_doubles();
  expect_close(add(x, 1.5).to_doubles(), map(xv, [](double v) { return v + 1.5; }), "add");
  expect_close((x - 1.5).to_doubles(), map(xv, [](double v) { return v - 1.5; }), "operator-");
  expect_close(mul(x, -0.75).to_doubles(), map(xv, [](double v) { return v * -0.75; }), "mul");
  expect_close((2.0 * x).to_doubles(), map(xv, [](double v) { return 2 * v; }), "s * x");
  expect_close((x / 4.0).to_doubles(), map(xv, [](double v) { return v / 4; }), "x / s");
  expect_close(pow(x, 2.5).to_doubles(), map(xv, [](double v) { return std::pow(v, 2.5); }), "pow");
  expect_close(pow(x, -1.0).to_doubles(), map(xv, [](double v) { return 1.0 / v; }), "pow -1");
  expect_close(rsub(x, 3.0).to_doubles(), map(xv, [](double v) { return 3.0 - v; }), "rsub");
  expect_close(rdiv(x, 2.0).to_doubles(), map(xv, [](double v) { return 2.0 / v; }), "rdiv");
}

TEST_P(Elementwise, WhereAndMaskedFillBroadcast) {
  Tensor cond = Tensor::from_indices({1, 0, 1}, {3, 1});
  Tensor a = make({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  Tensor b = make({-1, -2, -3, -4}, {4});
  EXPECT_EQ(where(cond, a, b).to_doubles(), (Vec{1, 2, 3, 4, -1, -2, -3, -4, 9, 10, 11, 12}));
  Tensor mask = Tensor::from_indices({0, 1, 0, 3}, {4}, DType::i32);  // any nonzero counts
  EXPECT_EQ(masked_fill(a, mask, -9).to_doubles(), (Vec{1, -9, 3, -9, 5, -9, 7, -9, 9, -9, 11, -9}));
  Tensor fmask = make({0, 0.5, 0, 0}, {4});  // a floating mask too
  EXPECT_EQ(masked_fill(b, fmask, 7).to_doubles(), (Vec{-1, 7, -3, -4}));
}

// ---- reductions ----

// x[i, j, k] of a contiguous [2, 3, 4] block.
double at(const Vec& x, int i, int j, int k) { return x[static_cast<size_t>((i * 3 + j) * 4 + k)]; }

TEST_P(Elementwise, SumMeanMaxOverDimsWithKeepdim) {
  Generator gen(3);
  Tensor x = randn({2, 3, 4}, gen);
  Vec xv = x.to_doubles();
  Tensor s = sum(x, {0, 2}, /*keepdim=*/true);
  EXPECT_EQ(s.shape(), (Shape{1, 3, 1}));
  Vec want_s(3, 0.0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) want_s[static_cast<size_t>(j)] += at(xv, i, j, k);
    }
  }
  expect_close(s.to_doubles(), want_s, "sum {0, 2} keepdim");
  EXPECT_EQ(sum(x, {2, 0}).shape(), (Shape{3}));  // dims in any order
  double total = 0;
  for (double v : xv) total += v;
  Tensor all = sum(x);
  EXPECT_EQ(all.dim(), 0);
  expect_close({all.item()}, {total}, "sum of all");

  Tensor m = mean(x, {-1});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  Vec want_m(6, 0.0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) want_m[static_cast<size_t>(i * 3 + j)] += at(xv, i, j, k) / 4;
    }
  }
  expect_close(m.to_doubles(), want_m, "mean {-1}");
  EXPECT_EQ(mean(x, {1}, true).shape(), (Shape{2, 1, 4}));

  auto [mx, index] = kernel::max(x, {1}, /*keepdim=*/false);
  EXPECT_EQ(mx.shape(), (Shape{2, 4}));
  Vec mv = mx.to_doubles();
  std::vector<int64_t> iv = index.to_indices();
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) {
      int best = 0;
      for (int j = 1; j < 3; ++j) best = at(xv, i, j, k) > at(xv, i, best, k) ? j : best;
      EXPECT_EQ(mv[static_cast<size_t>(i * 4 + k)], at(xv, i, best, k));
      EXPECT_EQ(iv[static_cast<size_t>(i * 4 + k)], best);
    }
  }
  EXPECT_EQ(max(x, {0, 2}, true).shape(), (Shape{1, 3, 1}));
}

TEST_P(Elementwise, MaxTiesGoToTheFirstIndex) {
  Tensor x = make({1, 3, 3, 2, 5, 5, 0, 5}, {2, 4});
  auto [values, index] = kernel::max(x, {1}, false);
  EXPECT_EQ(values.to_doubles(), (Vec{3, 5}));
  EXPECT_EQ(index.to_indices(), (std::vector<int64_t>{1, 0}));
  set_requires_grad(x, true);
  backward(sum(max(x, {1})));
  EXPECT_EQ(grad_of(x).to_doubles(), (Vec{0, 1, 0, 0, 1, 0, 0, 0}));
}

TEST_P(Elementwise, CumsumForwardAndReverse) {
  Generator gen(4);
  Tensor x = randn({2, 3, 4}, gen);
  Vec xv = x.to_doubles(), fwd(24), rev(24);
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) {
      double acc = 0, racc = 0;
      for (int j = 0; j < 3; ++j) {
        acc += at(xv, i, j, k);
        fwd[static_cast<size_t>((i * 3 + j) * 4 + k)] = acc;
        racc += at(xv, i, 2 - j, k);
        rev[static_cast<size_t>((i * 3 + 2 - j) * 4 + k)] = racc;
      }
    }
  }
  expect_close(cumsum(x, 1).to_doubles(), fwd, "cumsum");
  expect_close(kernel::cumsum(x, -2, /*reverse=*/true).to_doubles(), rev, "reverse cumsum");
}

// ---- matmul ----

// C[..., m, n] = Σ_k A[..., m, k] B[..., k, n] with NumPy broadcasting of the batch dims.
Vec naive_matmul(const Vec& a, const Shape& sa, const Vec& b, const Shape& sb, Shape* out_shape) {
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t rank = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), rank - ba.size(), 1);
  bb.insert(bb.begin(), rank - bb.size(), 1);
  Shape bo(rank);
  for (size_t d = 0; d < rank; ++d) bo[d] = std::max(ba[d], bb[d]);
  *out_shape = bo;
  out_shape->push_back(M);
  out_shape->push_back(N);
  Vec c;
  for (int64_t flat = 0; flat < shape_numel(bo); ++flat) {
    int64_t rest = flat, oa = 0, ob = 0, sa_stride = 1, sb_stride = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t i = rest % bo[d];
      rest /= bo[d];
      oa += (ba[d] == 1 ? 0 : i) * sa_stride;
      ob += (bb[d] == 1 ? 0 : i) * sb_stride;
      sa_stride *= ba[d];
      sb_stride *= bb[d];
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a[static_cast<size_t>((oa * M + m) * K + k)] * b[static_cast<size_t>((ob * K + k) * N + n)];
        c.push_back(s);
      }
    }
  }
  return c;
}

TEST_P(Elementwise, MatmulMatchesATripleLoop) {
  Generator gen(5);
  const std::pair<Shape, Shape> cases[] = {
      {{2, 3, 4, 5}, {2, 3, 5, 6}},  // batched
      {{2, 1, 4, 5}, {3, 5, 6}},     // broadcast batch dims on both sides
      {{2, 3, 4, 5}, {5, 6}},        // 2-D weight
      {{7, 3}, {3, 1}},              // plain matrices
  };
  for (const auto& [sa, sb] : cases) {
    Tensor a = randn(sa, gen), b = randn(sb, gen);
    Shape so;
    Vec want = naive_matmul(a.to_doubles(), sa, b.to_doubles(), sb, &so);
    Tensor c = matmul(a, b);
    EXPECT_EQ(c.shape(), so);
    expect_close(c.to_doubles(), want, shape_str(sa) + " @ " + shape_str(sb), GetParam().matmul_tol);
  }
  // Transposed operands, given as strided views and through the kernel's flags.
  Tensor at_ = randn({5, 4}, gen), b = randn({6, 5}, gen);
  Shape so;
  Vec want = naive_matmul(kernel::contiguous(kernel::transpose(at_, 0, 1)).to_doubles(), {4, 5},
                          kernel::contiguous(kernel::transpose(b, 0, 1)).to_doubles(), {5, 6}, &so);
  expect_close(matmul(kernel::transpose(at_, 0, 1), kernel::transpose(b, 0, 1)).to_doubles(), want, "views",
               GetParam().matmul_tol);
  expect_close(kernel::matmul(at_, b, /*trans_a=*/true, /*trans_b=*/true).to_doubles(), want, "flags",
               GetParam().matmul_tol);
  try {
    matmul(randn({2, 3}, gen), randn({4, 5}, gen));
    FAIL() << "mismatched inner dimensions did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
}

// Products large enough for the CPU GEMM to split across the OpenMP team: by batch entry, by rows
// of C (taller than wide) and by columns (wider than tall), with extents that are not multiples
// of the split alignment, every transpose combination.
TEST_P(Elementwise, LargeMatmulsSplitAcrossThreadsMatchATripleLoop) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  Generator gen(9);
  const double tol = 5 * GetParam().matmul_tol;  // sums of 110–150 products, not 5
  const std::pair<Shape, Shape> cases[] = {
      {{3, 100, 110}, {3, 110, 100}},  // batch ≥ threads: one product per thread
      {{130, 150}, {150, 70}},         // split by rows
      {{70, 150}, {150, 130}},         // split by columns
  };
  for (const auto& [sa, sb] : cases) {
    Tensor a = randn(sa, gen), b = randn(sb, gen);
    Shape so;
    const Vec want = naive_matmul(a.to_doubles(), sa, b.to_doubles(), sb, &so);
    expect_close(matmul(a, b).to_doubles(), want, shape_str(sa) + " @ " + shape_str(sb), tol);
    if (a.dim() != 2) continue;
    const Tensor at = kernel::contiguous(kernel::transpose(a, 0, 1)),
                 bt = kernel::contiguous(kernel::transpose(b, 0, 1));
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor c = kernel::matmul(ta ? at : a, tb ? bt : b, ta, tb);
        expect_close(c.to_doubles(), want,
                     shape_str(sa) + " @ " + shape_str(sb) + (ta ? " Aᵀ" : "") + (tb ? " Bᵀ" : ""), tol);
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

// The branch-free float exp behind gelu and the attention softmax, over its whole range and at
// its edges, against the library exp in double.
// linear_gelu is gelu(linear(...)) with the same steps on the CPU: the same bits, forward and backward,
// with and without a bias, over leading batch dimensions.
TEST_P(Elementwise, LinearGeluIsGeluOfLinearBitForBit) {
  Generator gen(23);
  for (bool with_bias : {true, false}) {
    const std::string what = with_bias ? "with bias" : "without bias";
    Tensor x = randn({2, 3, 5}, gen), w = randn({4, 5}, gen), b = with_bias ? randn({4}, gen) : Tensor();
    Tensor dy = randn({2, 3, 4}, gen);
    set_requires_grad(x, true);
    set_requires_grad(w, true);
    if (with_bias) set_requires_grad(b, true);
    auto run = [&](Tensor (*f)(const Tensor&, const Tensor&, const Tensor&)) {
      clear_grad(x);
      clear_grad(w);
      if (with_bias) clear_grad(b);
      Tensor y = f(x, w, b);
      backward({y}, {dy});
      std::vector<Vec> out{y.to_doubles(), grad_of(x).to_doubles(), grad_of(w).to_doubles()};
      if (with_bias) out.push_back(grad_of(b).to_doubles());
      return out;
    };
    const auto fused = run(&linear_gelu);
    const auto composed = run([](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(linear(x, w, b)); });
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], composed[i]) << what << " " << names[i];
  }
  EXPECT_THROW(linear_gelu(randn({3, 5}, gen), randn({4, 6}, gen)), std::invalid_argument);
  EXPECT_THROW(linear_gelu(randn({3, 5}, gen), randn({4, 5}, gen), randn({3}, gen)), std::invalid_argument);
}

TEST(ExpVec, MatchesExpToAFewUlpAndKeepsTheEdges) {
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(math::exp_vec(x), want, 3e-7 * want) << x;
  }
  EXPECT_EQ(math::exp_vec(0.0f), 1.0f);
  EXPECT_NEAR(math::exp_vec(-100.0f), std::exp(-100.0f), 1e-2 * std::exp(-100.0f));  // subnormal, kept
  EXPECT_EQ(math::exp_vec(-105.0f), 0.0f);
  EXPECT_EQ(math::exp_vec(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(math::exp_vec(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(math::exp_vec(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(math::exp_vec(std::numeric_limits<float>::quiet_NaN())));
}

// softplus' log(1 + e^−|x|): within 1.5 ulp of log1p on [0, 1], tiny arguments kept (1 + u rounds to 1).
TEST(ExpVec, Log1pOnTheUnitIntervalMatchesLog1p) {
  for (float u = 0.0f; u <= 1.0f; u += 0.0000917f) {
    const double want = std::log1p(static_cast<double>(u));
    EXPECT_NEAR(math::log1p_unit_vec(u), want, 1.5 * 1.2e-7 * want) << u;
  }
  for (float u : {1e-30f, 3e-8f, 1e-7f, 1.0f}) {
    EXPECT_NEAR(math::log1p_unit_vec(u), std::log1p(static_cast<double>(u)), 1.2e-7 * std::log1p(double(u))) << u;
  }
  EXPECT_EQ(math::log1p_unit_vec(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(math::log1p_unit_vec(std::numeric_limits<float>::quiet_NaN())));
}

// The softmax's exp: exp_vec's bits wherever eˣ is a normal float, 0 below (and for −∞), NaN kept.
TEST(ExpVec, NonpositiveMatchesExpVecDownToTheNormalFloats) {
  for (float x = -87.33f; x <= 0.5f; x += 0.00731f) {
    EXPECT_EQ(math::exp_vec_nonpositive(x), math::exp_vec(x)) << x;
  }
  EXPECT_EQ(math::exp_vec_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(math::exp_vec_nonpositive(-87.34f), 0.0f);  // exp_vec: a subnormal
  EXPECT_EQ(math::exp_vec_nonpositive(-1000.0f), 0.0f);
  EXPECT_EQ(math::exp_vec_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(math::exp_vec_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(math::exp_vec_nonpositive(-3.0), std::exp(-3.0));  // double: std::exp
}

// NaN through the vectorised loops of exp_vec's callers stays NaN without undefined behaviour on the
// way (UBSan, scripts/sanitize.sh: fuzzing found NaN weights of a checkpoint converting NaN to int).
TEST(ExpVec, NanThroughTheF32KernelsStaysNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector({nan, 0.0, nan, -1.0, 2.0, nan, 3.0, nan, nan}, {9}, DType::f32);
  for (const Tensor& y : {sigmoid(x), silu(x), gelu(x)}) {
    const Vec v = y.to_doubles();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(std::isnan(v[i]), std::isnan(x.to_doubles()[i])) << i;
  }
}

// gelu and its derivative in f32 (computed through exp_vec) against the tanh form in double,
// including magnitudes where e^(−2u) overflows or underflows.
TEST(GeluF32, ForwardAndBackwardMatchTheTanhFormAtAllMagnitudes) {
  const Vec xs = {-300, -40, -9, -3.3, -1, -0.25, 0, 0.1, 0.8, 2.5, 7, 40, 300};
  const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
  Tensor x = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())}, DType::f32);
  set_requires_grad(x, true);
  Tensor y = gelu(x);
  backward(sum(y, {}, false));
  const Vec got = y.to_doubles(), dgot = grad_of(x).to_doubles();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], t = std::tanh(c * (v + a * v * v * v));
    const double want = 0.5 * v * (1 + t);
    const double dwant = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * a * v * v);
    EXPECT_NEAR(got[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << v;
    EXPECT_NEAR(dgot[i], dwant, 1e-6 * std::max(1.0, std::fabs(dwant))) << v;
  }
}

INSTANTIATE_TEST_SUITE_P(F32AndF64, Elementwise,
                         ::testing::Values(Precision{DType::f32, 1e-6, 1e-5}, Precision{DType::f64, 1e-14, 1e-13}),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(dtype_name(info.param.dtype));
                         });

}  // namespace
}  // namespace seqlab
