// Softmax, log-softmax and cross-entropy against naive references written here with loops in
// double: outputs from exp/sum and log-sum-exp by hand, gradients through the full Jacobian
// (not the compact formulas the kernels use). f64 must agree to 1e-12, f32 to 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace seqlab {
namespace {

using Vec = std::vector<double>;

struct Precision {
  DType dtype;
  double tol;
};

class Softmax : public ::testing::TestWithParam<Precision> {
 public:
  DType dtype() const { return GetParam().dtype; }
  // |got − want| ≤ tol · max(1, |want|) element by element.
  void expect_close(const Vec& got, const Vec& want, const std::string& what) const {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], GetParam().tol * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
    }
  }
};

Vec random_values(size_t n, Generator& gen, double scale) {
  Vec v(n);
  for (double& x : v) x = scale * gen.normal();
  return v;
}

// Softmax of x [outer, n, inner] along the middle dimension, by its definition exp(x_i) / Σ_j exp(x_j).
Vec naive_softmax(const Vec& x, int64_t outer, int64_t n, int64_t inner) {
  Vec y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < inner; ++k) {
      auto at = [&](int64_t i) { return static_cast<size_t>((o * n + i) * inner + k); };
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += std::exp(x[at(i)]);
      for (int64_t i = 0; i < n; ++i) y[at(i)] = std::exp(x[at(i)]) / s;
    }
  }
  return y;
}

// dx_i = Σ_j dy_j ∂y_j/∂x_i along the middle dimension, with the Jacobian of softmax
// ∂p_j/∂x_i = p_j (δ_ij − p_i), or of log-softmax ∂(log p_j)/∂x_i = δ_ij − p_i.
Vec naive_vjp(const Vec& p, const Vec& dy, int64_t outer, int64_t n, int64_t inner, bool log) {
  Vec dx(p.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < inner; ++k) {
      auto at = [&](int64_t i) { return static_cast<size_t>((o * n + i) * inner + k); };
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double delta = i == j ? 1.0 : 0.0;
          const double jac = log ? delta - p[at(i)] : p[at(j)] * (delta - p[at(i)]);
          dx[at(i)] += dy[at(j)] * jac;
        }
      }
    }
  }
  return dx;
}

// Runs softmax or log-softmax of x [3, 5, 7] along `dim` and checks y and dx against the naive forms.
void check_softmax(const Softmax& t, int64_t dim, bool log) {
  const Shape shape{3, 5, 7};
  const int64_t d = dim < 0 ? dim + 3 : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[static_cast<size_t>(i)];
  for (int64_t i = d + 1; i < 3; ++i) inner *= shape[static_cast<size_t>(i)];
  Generator gen(7);
  Tensor x = set_requires_grad(Tensor::from_vector(random_values(105, gen, 2.0), shape, t.GetParam().dtype));
  Tensor dy = Tensor::from_vector(random_values(105, gen, 1.0), shape, t.GetParam().dtype);
  Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
  backward({y}, {dy});

  Vec p = naive_softmax(x.to_doubles(), outer, shape[static_cast<size_t>(d)], inner);
  Vec want = p;
  if (log) {
    for (double& v : want) v = std::log(v);
  }
  const std::string what = std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim);
  t.expect_close(y.to_doubles(), want, what + " y");
  t.expect_close(grad_of(x).to_doubles(), naive_vjp(p, dy.to_doubles(), outer, shape[static_cast<size_t>(d)], inner, log),
                 what + " dx");
}

TEST_P(Softmax, LastDimMatchesNaive) { check_softmax(*this, -1, false); }
TEST_P(Softmax, MiddleDimMatchesNaive) { check_softmax(*this, 1, false); }
TEST_P(Softmax, FirstDimMatchesNaive) { check_softmax(*this, 0, false); }
TEST_P(Softmax, LogLastDimMatchesNaive) { check_softmax(*this, -1, true); }
TEST_P(Softmax, LogMiddleDimMatchesNaive) { check_softmax(*this, 1, true); }

// 200 rows of 300: enough work that the kernels split rows across threads.
TEST_P(Softmax, ManyRowsMatchNaive) {
  Generator gen(13);
  Tensor x = set_requires_grad(Tensor::from_vector(random_values(60000, gen, 3.0), {200, 300}, dtype()));
  Tensor dy = Tensor::from_vector(random_values(60000, gen, 1.0), {200, 300}, dtype());
  backward({softmax(x)}, {dy});
  Vec p = naive_softmax(x.to_doubles(), 200, 300, 1);
  expect_close(softmax(x).to_doubles(), p, "softmax y");
  expect_close(grad_of(x).to_doubles(), naive_vjp(p, dy.to_doubles(), 200, 300, 1, false), "softmax dx");
}

// Logits of ±1e4 overflow exp unless the row max is subtracted first.
TEST_P(Softmax, LargeLogitsStayFinite) {
  Tensor x = Tensor::from_vector({1e4, 1e4 - 1.0, -1e4, 0.0, 1e4 - 2.0}, {1, 5}, dtype());
  const double s = 1.0 + std::exp(-1.0) + std::exp(-2.0);
  expect_close(softmax(x).to_doubles(), {1.0 / s, std::exp(-1.0) / s, 0.0, 0.0, std::exp(-2.0) / s}, "softmax");
  expect_close(log_softmax(x).to_doubles(),
               {-std::log(s), -1.0 - std::log(s), -2e4 - std::log(s), -1e4 - std::log(s), -2.0 - std::log(s)},
               "log_softmax");
  set_requires_grad(x);
  Tensor loss = cross_entropy(x, Tensor::from_indices({2}, {1}));
  expect_close({loss.item()}, {2e4 + std::log(s)}, "cross_entropy");
  backward(loss);
  for (double g : grad_of(x).to_doubles()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(grad_of(x).to_doubles()[2], -1.0, GetParam().tol);  // softmax there is 0: the gradient is −onehot
}

// ---- cross-entropy ----

// Mean over counted rows of lse − x[target], lse = log Σ exp computed by hand; and the gradient
// dloss · (softmax − onehot) / count on counted rows, 0 on ignored ones.
struct NaiveCE {
  double loss = 0;
  Vec dlogits;
};
NaiveCE naive_cross_entropy(const Vec& x, const std::vector<int64_t>& t, int64_t v, int64_t ignore, double dloss) {
  NaiveCE r;
  r.dlogits.assign(x.size(), 0.0);
  int64_t count = 0;
  for (int64_t target : t) count += target != ignore;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) continue;
    double s = 0;
    for (int64_t i = 0; i < v; ++i) s += std::exp(x[n * static_cast<size_t>(v) + static_cast<size_t>(i)]);
    r.loss += (std::log(s) - x[n * static_cast<size_t>(v) + static_cast<size_t>(t[n])]) / static_cast<double>(count);
    for (int64_t i = 0; i < v; ++i) {
      const size_t e = n * static_cast<size_t>(v) + static_cast<size_t>(i);
      r.dlogits[e] = dloss * (std::exp(x[e]) / s - (i == t[n] ? 1.0 : 0.0)) / static_cast<double>(count);
    }
  }
  return r;
}

void check_cross_entropy(const Softmax& t, const std::vector<int64_t>& targets, DType index_dtype, int64_t ignore) {
  Generator gen(11);
  Tensor logits = set_requires_grad(Tensor::from_vector(random_values(30, gen, 2.0), {2, 3, 5}, t.GetParam().dtype));
  Tensor loss = cross_entropy(logits, Tensor::from_indices(targets, {2, 3}, index_dtype), ignore);
  backward({loss}, {Tensor::scalar(2.5, t.GetParam().dtype)});
  NaiveCE want = naive_cross_entropy(logits.to_doubles(), targets, 5, ignore, 2.5);
  EXPECT_EQ(loss.dim(), 0);
  t.expect_close({loss.item()}, {want.loss}, "loss");
  t.expect_close(grad_of(logits).to_doubles(), want.dlogits, "dlogits");
}

TEST_P(Softmax, CrossEntropyMatchesNaive) { check_cross_entropy(*this, {0, 4, 2, 2, 1, 3}, DType::i64, -100); }

TEST_P(Softmax, CrossEntropyOverManyRowsMatchesNaive) {
  Generator gen(19);
  std::vector<int64_t> targets(200);
  for (int64_t& t : targets) t = static_cast<int64_t>(gen.next_u64() % 301) - 1;  // −1 is ignored
  Tensor logits = set_requires_grad(Tensor::from_vector(random_values(60000, gen, 3.0), {200, 300}, dtype()));
  Tensor loss = cross_entropy(logits, Tensor::from_indices(targets, {200}), -1);
  backward(loss);
  NaiveCE want = naive_cross_entropy(logits.to_doubles(), targets, 300, -1, 1.0);
  expect_close({loss.item()}, {want.loss}, "loss");
  expect_close(grad_of(logits).to_doubles(), want.dlogits, "dlogits");
}

TEST_P(Softmax, CrossEntropySkipsIgnoredTargets) {
  check_cross_entropy(*this, {0, -100, 2, 2, -100, 3}, DType::i64, -100);
  check_cross_entropy(*this, {1, 2, 2, 0, 4, 2}, DType::i32, 2);  // a class index as ignore_index
}

TEST_P(Softmax, CrossEntropyAllIgnoredIsZeroWithZeroGradient) {
  Tensor logits = set_requires_grad(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, dtype()));
  Tensor loss = cross_entropy(logits, Tensor::from_indices({-100, -100}, {2}));
  backward(loss);
  EXPECT_EQ(loss.item(), 0.0);
  for (double g : grad_of(logits).to_doubles()) EXPECT_EQ(g, 0.0);
}

TEST_P(Softmax, CrossEntropyRejectsOutOfRangeTargets) {
  Tensor logits = Tensor::zeros({2, 5}, dtype());
  for (int64_t bad : {5, -1}) {
    try {
      cross_entropy(logits, Tensor::from_indices({0, bad}, {2}));
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("5 classes"), std::string::npos) << msg;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Softmax, ::testing::Values(Precision{DType::f64, 1e-12}, Precision{DType::f32, 1e-5}),
                         [](const ::testing::TestParamInfo<Precision>& info) { return dtype_name(info.param.dtype); });

// ---- finite differences ----

TEST(SoftmaxGradcheck, NonDefaultDims) {
  Generator gen(3);
  Tensor x = Tensor::randn({4, 3, 5}, gen, DType::f64);
  for (int64_t dim : {0, 1}) {
    GradcheckResult r =
        gradcheck([dim](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], dim)}; }, {x});
    EXPECT_TRUE(r.ok) << "softmax dim " << dim << ": " << r.worst;
    r = gradcheck([dim](const std::vector<Tensor>& in) { return std::vector<Tensor>{log_softmax(in[0], dim)}; }, {x});
    EXPECT_TRUE(r.ok) << "log_softmax dim " << dim << ": " << r.worst;
  }
}

TEST(SoftmaxGradcheck, CrossEntropyWithIgnoredTargets) {
  Generator gen(5);
  Tensor logits = Tensor::randn({3, 2, 7}, gen, DType::f64);
  Tensor targets = Tensor::from_indices({6, -100, 0, 3, 3, -100}, {3, 2}, DType::i32);
  GradcheckResult r =
      gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy(in[0], in[1])}; },
                {logits, targets});
  EXPECT_EQ(r.elements_checked, 42);
  EXPECT_TRUE(r.ok) << r.worst;
}

}  // namespace
}  // namespace seqlab
