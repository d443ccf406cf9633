// Layer norm and RMS norm against the textbook formulas, written here with loops in double:
// outputs from the mean and biased variance of each row, gradients through the full Jacobian
// ∂y_j/∂x_c (not the compact formulas the kernels use). f64 must agree to 1e-12, f32 to 1e-5.
#include <gtest/gtest.h>

#include <cmath>
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

class Norm : public ::testing::TestWithParam<Precision> {
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

Vec random_values(size_t n, Generator& gen, double scale, double offset = 0.0) {
  Vec v(n);
  for (double& x : v) x = offset + scale * gen.normal();
  return v;
}

struct NaiveNorm {
  Vec y, dx, dw, db;
};

// Rows of x [rows, C]: y_j = w_j x̂_j + b_j with x̂ = (x − μ) / √(σ² + eps) (layer) or
// x̂ = x / √(mean x² + eps) (rms). dx_c = Σ_j dy_j ∂y_j/∂x_c with, writing r = 1/√(·),
//   layer: ∂y_j/∂x_c = w_j r (δ_jc − 1/C − x̂_j x̂_c / C),   rms: ∂y_j/∂x_c = w_j r (δ_jc − x̂_j x̂_c / C);
// dw_j = Σ_rows dy_j x̂_j, db_j = Σ_rows dy_j.
NaiveNorm naive_norm(const Vec& x, const Vec& w, const Vec& b, const Vec& dy, int64_t c, double eps, bool layer) {
  const size_t C = static_cast<size_t>(c), rows = x.size() / C;
  NaiveNorm out{Vec(x.size()), Vec(x.size(), 0.0), Vec(C, 0.0), Vec(C, 0.0)};
  for (size_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * C];
    double mu = 0, var = 0;
    if (layer) {
      for (size_t i = 0; i < C; ++i) mu += xr[i] / c;
    }
    for (size_t i = 0; i < C; ++i) var += (xr[i] - mu) * (xr[i] - mu) / c;
    const double rs = 1.0 / std::sqrt(var + eps);
    Vec xhat(C);
    for (size_t i = 0; i < C; ++i) xhat[i] = (xr[i] - mu) * rs;
    for (size_t j = 0; j < C; ++j) {
      out.y[r * C + j] = w[j] * xhat[j] + (b.empty() ? 0.0 : b[j]);
      out.dw[j] += dy[r * C + j] * xhat[j];
      out.db[j] += dy[r * C + j];
      for (size_t i = 0; i < C; ++i) {
        const double jac = w[j] * rs * ((i == j ? 1.0 : 0.0) - (layer ? 1.0 / c : 0.0) - xhat[j] * xhat[i] / c);
        out.dx[r * C + i] += dy[r * C + j] * jac;
      }
    }
  }
  return out;
}

// x [2, 3, 7] (offset by 3 so the mean matters), weight and bias [7]; checks y, dx, dweight and dbias.
void check_norm(const Norm& t, bool layer, bool with_bias, double eps) {
  Generator gen(17);
  const DType dt = t.dtype();
  Tensor x = Tensor::from_vector(random_values(42, gen, 1.5, 3.0), {2, 3, 7}, dt).set_requires_grad();
  Tensor w = Tensor::from_vector(random_values(7, gen, 1.0, 1.0), {7}, dt).set_requires_grad();
  Tensor b = with_bias ? Tensor::from_vector(random_values(7, gen, 1.0), {7}, dt).set_requires_grad() : Tensor();
  Tensor dy = Tensor::from_vector(random_values(42, gen, 1.0), {2, 3, 7}, dt);
  Tensor y = layer ? layer_norm(x, w, b, eps) : rms_norm(x, w, eps);
  y.backward(dy);
  NaiveNorm want =
      naive_norm(x.to_doubles(), w.to_doubles(), with_bias ? b.to_doubles() : Vec{}, dy.to_doubles(), 7, eps, layer);
  const std::string what = layer ? "layer_norm" : "rms_norm";
  t.expect_close(y.to_doubles(), want.y, what + " y");
  t.expect_close(x.grad().to_doubles(), want.dx, what + " dx");
  t.expect_close(w.grad().to_doubles(), want.dw, what + " dweight");
  if (with_bias) t.expect_close(b.grad().to_doubles(), want.db, what + " dbias");
}

TEST_P(Norm, LayerNormMatchesTextbook) { check_norm(*this, true, true, 1e-5); }
TEST_P(Norm, LayerNormWithoutBiasMatchesTextbook) { check_norm(*this, true, false, 1e-3); }
TEST_P(Norm, RmsNormMatchesTextbook) { check_norm(*this, false, false, 1e-6); }
TEST_P(Norm, RmsNormLargeEpsMatchesTextbook) { check_norm(*this, false, false, 0.5); }

// 300 rows of 200: enough work that rows (dx) and columns (dweight, dbias) are split across threads.
TEST_P(Norm, ManyRowsMatchTextbook) {
  Generator gen(23);
  Tensor x = Tensor::from_vector(random_values(60000, gen, 2.0, -1.0), {300, 200}, dtype()).set_requires_grad();
  Tensor w = Tensor::from_vector(random_values(200, gen, 1.0), {200}, dtype()).set_requires_grad();
  Tensor b = Tensor::from_vector(random_values(200, gen, 1.0), {200}, dtype()).set_requires_grad();
  Tensor dy = Tensor::from_vector(random_values(60000, gen, 1.0), {300, 200}, dtype());
  Tensor y = layer_norm(x, w, b);
  y.backward(dy);
  NaiveNorm want = naive_norm(x.to_doubles(), w.to_doubles(), b.to_doubles(), dy.to_doubles(), 200, 1e-5, true);
  expect_close(y.to_doubles(), want.y, "y");
  expect_close(x.grad().to_doubles(), want.dx, "dx");
  expect_close(w.grad().to_doubles(), want.dw, "dweight");
  expect_close(b.grad().to_doubles(), want.db, "dbias");
}

// A row of equal values has zero variance: y is the bias exactly and the gradient stays finite.
TEST_P(Norm, ConstantRowGivesBias) {
  Tensor x = Tensor::full({1, 5}, 2.5, dtype()).set_requires_grad();
  Tensor w = Tensor::ones({5}, dtype());
  Tensor b = Tensor::from_vector({-1, 0, 1, 2, 3}, {5}, dtype());
  Tensor y = layer_norm(x, w, b);
  expect_close(y.to_doubles(), {-1, 0, 1, 2, 3}, "y");
  y.backward(Tensor::from_vector({1, -2, 0.5, 0, 3}, {1, 5}, dtype()));
  for (double g : x.grad().to_doubles()) EXPECT_TRUE(std::isfinite(g));
}

// Only the inputs that require a gradient get one.
TEST_P(Norm, ComputesOnlyRequestedGradients) {
  Generator gen(2);
  Tensor x = Tensor::randn({3, 5}, gen, dtype());
  Tensor w = Tensor::randn({5}, gen, dtype()).set_requires_grad();
  Tensor b = Tensor::randn({5}, gen, dtype());
  layer_norm(x, w, b).backward(Tensor::ones({3, 5}, dtype()));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST_P(Norm, RejectsMismatchedWeight) {
  Tensor x = Tensor::zeros({2, 5}, dtype());
  EXPECT_THROW(layer_norm(x, Tensor::ones({4}, dtype()), Tensor()), std::invalid_argument);
  EXPECT_THROW(rms_norm(x, Tensor::ones({5}, dtype()), -1.0), std::invalid_argument);
  EXPECT_THROW(layer_norm(x, Tensor::ones({5}, dtype()), Tensor::ones({6}, dtype())), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Norm, ::testing::Values(Precision{DType::f64, 1e-12}, Precision{DType::f32, 1e-5}),
                         [](const ::testing::TestParamInfo<Precision>& info) { return dtype_name(info.param.dtype); });

// ---- finite differences ----

TEST(NormGradcheck, LayerNormWithoutBias) {
  Generator gen(9);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], Tensor(), 1e-5)}; },
      {Tensor::randn({3, 5, 7}, gen, DType::f64), Tensor::randn({7}, gen, DType::f64)});
  EXPECT_EQ(r.elements_checked, 105 + 7);
  EXPECT_TRUE(r.ok) << r.worst;
}

TEST(NormGradcheck, RmsNormOnAStridedInput) {
  Generator gen(10);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(transpose(in[0], 0, 1), in[1], 1e-2)}; },
      {Tensor::randn({5, 3, 7}, gen, DType::f64), Tensor::randn({7}, gen, DType::f64)});
  EXPECT_TRUE(r.ok) << r.worst;
}

}  // namespace
}  // namespace seqlab
