// Layer norm and RMS norm against the textbook formulas, written here with loops in double:
// outputs from the mean and biased variance of each row, gradients through the full Jacobian
// ∂y_j/∂x_c (not the compact formulas the kernels use). f64 must agree to 1e-12, f32 to 1e-5.
// The fused residual forms (add_layer_norm, add_rms_norm) against add followed by the norm, which
// they must reproduce bit for bit, forward and backward, and against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

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
  Tensor x = set_requires_grad(Tensor::from_vector(random_values(42, gen, 1.5, 3.0), {2, 3, 7}, dt));
  Tensor w = set_requires_grad(Tensor::from_vector(random_values(7, gen, 1.0, 1.0), {7}, dt));
  Tensor b = with_bias ? set_requires_grad(Tensor::from_vector(random_values(7, gen, 1.0), {7}, dt)) : Tensor();
  Tensor dy = Tensor::from_vector(random_values(42, gen, 1.0), {2, 3, 7}, dt);
  Tensor y = layer ? layer_norm(x, w, b, eps) : rms_norm(x, w, eps);
  backward({y}, {dy});
  NaiveNorm want =
      naive_norm(x.to_doubles(), w.to_doubles(), with_bias ? b.to_doubles() : Vec{}, dy.to_doubles(), 7, eps, layer);
  const std::string what = layer ? "layer_norm" : "rms_norm";
  t.expect_close(y.to_doubles(), want.y, what + " y");
  t.expect_close(grad_of(x).to_doubles(), want.dx, what + " dx");
  t.expect_close(grad_of(w).to_doubles(), want.dw, what + " dweight");
  if (with_bias) t.expect_close(grad_of(b).to_doubles(), want.db, what + " dbias");
}

TEST_P(Norm, LayerNormMatchesTextbook) { check_norm(*this, true, true, 1e-5); }
TEST_P(Norm, LayerNormWithoutBiasMatchesTextbook) { check_norm(*this, true, false, 1e-3); }
TEST_P(Norm, RmsNormMatchesTextbook) { check_norm(*this, false, false, 1e-6); }
TEST_P(Norm, RmsNormLargeEpsMatchesTextbook) { check_norm(*this, false, false, 0.5); }

// 300 rows of 200: enough work that rows (dx) and columns (dweight, dbias) are split across threads.
TEST_P(Norm, ManyRowsMatchTextbook) {
  Generator gen(23);
  Tensor x = set_requires_grad(Tensor::from_vector(random_values(60000, gen, 2.0, -1.0), {300, 200}, dtype()));
  Tensor w = set_requires_grad(Tensor::from_vector(random_values(200, gen, 1.0), {200}, dtype()));
  Tensor b = set_requires_grad(Tensor::from_vector(random_values(200, gen, 1.0), {200}, dtype()));
  Tensor dy = Tensor::from_vector(random_values(60000, gen, 1.0), {300, 200}, dtype());
  Tensor y = layer_norm(x, w, b);
  backward({y}, {dy});
  NaiveNorm want = naive_norm(x.to_doubles(), w.to_doubles(), b.to_doubles(), dy.to_doubles(), 200, 1e-5, true);
  expect_close(y.to_doubles(), want.y, "y");
  expect_close(grad_of(x).to_doubles(), want.dx, "dx");
  expect_close(grad_of(w).to_doubles(), want.dw, "dweight");
  expect_close(grad_of(b).to_doubles(), want.db, "dbias");
}

// A row of equal values has zero variance: y is the bias exactly and the gradient stays finite.
TEST_P(Norm, ConstantRowGivesBias) {
  Tensor x = set_requires_grad(Tensor::full({1, 5}, 2.5, dtype()));
  Tensor w = Tensor::ones({5}, dtype());
  Tensor b = Tensor::from_vector({-1, 0, 1, 2, 3}, {5}, dtype());
  Tensor y = layer_norm(x, w, b);
  expect_close(y.to_doubles(), {-1, 0, 1, 2, 3}, "y");
  backward({y}, {Tensor::from_vector({1, -2, 0.5, 0, 3}, {1, 5}, dtype())});
  for (double g : grad_of(x).to_doubles()) EXPECT_TRUE(std::isfinite(g));
}

// Only the inputs that require a gradient get one.
TEST_P(Norm, ComputesOnlyRequestedGradients) {
  Generator gen(2);
  Tensor x = Tensor::randn({3, 5}, gen, dtype());
  Tensor w = set_requires_grad(Tensor::randn({5}, gen, dtype()));
  Tensor b = Tensor::randn({5}, gen, dtype());
  backward({layer_norm(x, w, b)}, {Tensor::ones({3, 5}, dtype())});
  EXPECT_TRUE(grad_of(w).defined());
  EXPECT_FALSE(grad_of(x).defined());
  EXPECT_FALSE(grad_of(b).defined());
}

TEST_P(Norm, RejectsMismatchedWeight) {
  Tensor x = Tensor::zeros({2, 5}, dtype());
  EXPECT_THROW(layer_norm(x, Tensor::ones({4}, dtype()), Tensor()), std::invalid_argument);
  EXPECT_THROW(rms_norm(x, Tensor::ones({5}, dtype()), -1.0), std::invalid_argument);
  EXPECT_THROW(layer_norm(x, Tensor::ones({5}, dtype()), Tensor::ones({6}, dtype())), std::invalid_argument);
}

// ---- residual add fused with the norm ----

enum class AddNormKind { layer, layer_without_bias, rms };

struct AddNormInputs {
  Tensor x, residual, weight, bias;
};

AddNormInputs add_norm_inputs(DType dtype, AddNormKind kind, const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  const int64_t c = shape.back();
  AddNormInputs in;
  in.x = Tensor::randn(shape, gen, dtype, 1.5);
  in.residual = Tensor::randn(shape, gen, dtype);
  in.weight = Tensor::from_vector(random_values(static_cast<size_t>(c), gen, 1.0, 1.0), {c}, dtype);
  if (kind == AddNormKind::layer) in.bias = Tensor::randn({c}, gen, dtype);
  return in;
}

AddNormResult fused(const AddNormInputs& in, AddNormKind kind) {
  return kind == AddNormKind::rms ? add_rms_norm(in.x, in.residual, in.weight, 1e-6)
                                  : add_layer_norm(in.x, in.residual, in.weight, in.bias, 1e-5);
}

// The composition the fused op replaces: sum = x + residual, then the norm of sum.
AddNormResult unfused(const AddNormInputs& in, AddNormKind kind) {
  Tensor sum = add(in.x, in.residual);
  return {sum, kind == AddNormKind::rms ? rms_norm(sum, in.weight, 1e-6) : layer_norm(sum, in.weight, in.bias, 1e-5)};
}

AddNormInputs requiring_grad(const AddNormInputs& in) {
  AddNormInputs out{set_requires_grad(kernel::clone(in.x)), set_requires_grad(kernel::clone(in.residual)),
                    set_requires_grad(kernel::clone(in.weight)), Tensor()};
  if (in.bias.defined()) out.bias = set_requires_grad(kernel::clone(in.bias));
  return out;
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  int64_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += g[i] != w[i];
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << g.size() << " elements differ";
}

class AddNorm : public ::testing::TestWithParam<std::tuple<DType, AddNormKind>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  AddNormKind kind() const { return std::get<1>(GetParam()); }
};

// Forward and backward of the fused op against add + norm, with gradients flowing into both outputs
// (sum and y, as in a transformer block where the sum is the residual stream): the same arithmetic,
// so the same bits. Two shapes: 40 rows of 96 and 3 rows of 7.
TEST_P(AddNorm, SameBitsAsAddThenNorm) {
  for (const Shape& shape : {Shape{2, 20, 96}, Shape{3, 7}}) {
    const AddNormInputs in = add_norm_inputs(dtype(), kind(), shape, 31);
    Generator gen(5);
    const Tensor ds = Tensor::randn(shape, gen, dtype()), dy = Tensor::randn(shape, gen, dtype());
    AddNormInputs a = requiring_grad(in), b = requiring_grad(in);
    AddNormResult got = fused(a, kind()), want = unfused(b, kind());
    expect_same_bits(got.sum, want.sum, "sum");
    expect_same_bits(got.y, want.y, "y");
    backward({got.sum, got.y}, {ds, dy});
    backward({want.sum, want.y}, {ds, dy});
    expect_same_bits(grad_of(a.x), grad_of(b.x), "dx");
    expect_same_bits(grad_of(a.residual), grad_of(b.residual), "dresidual");
    expect_same_bits(grad_of(a.weight), grad_of(b.weight), "dweight");
    if (in.bias.defined()) expect_same_bits(grad_of(a.bias), grad_of(b.bias), "dbias");
  }
}

// y unused: the sum's gradient passes straight to x and residual, and the norm's parameters get zero.
// sum unused: x and residual both get the norm's dx.
TEST_P(AddNorm, GradientIntoOneOutput) {
  const Shape shape{4, 9};
  const AddNormInputs in = add_norm_inputs(dtype(), kind(), shape, 8);
  Generator gen(6);
  const Tensor g = Tensor::randn(shape, gen, dtype());
  {
    AddNormInputs a = requiring_grad(in);
    backward({fused(a, kind()).sum}, {g});
    expect_same_bits(grad_of(a.x), g, "dx from the sum alone");
    expect_same_bits(grad_of(a.residual), g, "dresidual from the sum alone");
    expect_same_bits(grad_of(a.weight), Tensor::zeros({9}, dtype()), "dweight from the sum alone");
  }
  {
    AddNormInputs a = requiring_grad(in), b = requiring_grad(in);
    backward({fused(a, kind()).y}, {g});
    backward({unfused(b, kind()).y}, {g});
    expect_same_bits(grad_of(a.x), grad_of(b.x), "dx from y alone");
    expect_same_bits(grad_of(a.residual), grad_of(b.residual), "dresidual from y alone");
    expect_same_bits(grad_of(a.weight), grad_of(b.weight), "dweight from y alone");
  }
}

// Only the inputs that require a gradient get one; dx is still computed when only the residual asks.
TEST_P(AddNorm, ComputesOnlyRequestedGradients) {
  const Shape shape{3, 5};
  AddNormInputs in = add_norm_inputs(dtype(), kind(), shape, 4);
  set_requires_grad(in.residual);
  AddNormResult r = fused(in, kind());
  backward({r.sum, r.y}, {Tensor::ones(shape, dtype()), Tensor::ones(shape, dtype())});
  EXPECT_TRUE(grad_of(in.residual).defined());
  EXPECT_FALSE(grad_of(in.x).defined());
  EXPECT_FALSE(grad_of(in.weight).defined());
  if (in.bias.defined()) {
    EXPECT_FALSE(grad_of(in.bias).defined());
  }
}

TEST_P(AddNorm, RejectsMismatchedResidual) {
  const AddNormInputs in = add_norm_inputs(dtype(), kind(), {2, 5}, 1);
  const DType other = dtype() == DType::f32 ? DType::f64 : DType::f32;
  for (const Tensor& bad :
       {Tensor::zeros({1, 5}, dtype()), Tensor::zeros({10}, dtype()), Tensor::zeros({2, 5}, other), Tensor()}) {
    AddNormInputs b = in;
    b.residual = bad;
    EXPECT_THROW(fused(b, kind()), std::invalid_argument);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, AddNorm,
                         ::testing::Combine(::testing::Values(DType::f64, DType::f32, DType::bf16),
                                            ::testing::Values(AddNormKind::layer, AddNormKind::layer_without_bias,
                                                              AddNormKind::rms)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, AddNormKind>>& info) {
                           const AddNormKind k = std::get<1>(info.param);
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  (k == AddNormKind::layer                ? "layer"
                                   : k == AddNormKind::layer_without_bias ? "layer_without_bias"
                                                                          : "rms");
                         });

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

// Every input of the fused ops (x, residual, weight, bias) with random cotangents on both outputs, the
// residual a strided view (so the entry point's copy to rows is differentiated too).
TEST(NormGradcheck, AddLayerNormBothOutputs) {
  Generator gen(11);
  for (bool with_bias : {true, false}) {
    std::vector<Tensor> inputs{Tensor::randn({3, 4, 6}, gen, DType::f64), Tensor::randn({4, 3, 6}, gen, DType::f64),
                               Tensor::randn({6}, gen, DType::f64)};
    if (with_bias) inputs.push_back(Tensor::randn({6}, gen, DType::f64));
    GradcheckResult r = gradcheck(
        [](const std::vector<Tensor>& in) {
          AddNormResult o =
              add_layer_norm(in[0], transpose(in[1], 0, 1), in[2], in.size() > 3 ? in[3] : Tensor(), 1e-5);
          return std::vector<Tensor>{o.sum, o.y};
        },
        inputs);
    EXPECT_EQ(r.elements_checked, 72 + 72 + 6 + (with_bias ? 6 : 0));
    EXPECT_TRUE(r.ok) << r.worst;
  }
}

TEST(NormGradcheck, AddRmsNormBothOutputs) {
  Generator gen(12);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& in) {
        AddNormResult o = add_rms_norm(in[0], transpose(in[1], 0, 1), in[2], 1e-2);
        return std::vector<Tensor>{o.sum, o.y};
      },
      {Tensor::randn({3, 4, 6}, gen, DType::f64), Tensor::randn({4, 3, 6}, gen, DType::f64),
       Tensor::randn({6}, gen, DType::f64)});
  EXPECT_EQ(r.elements_checked, 72 + 72 + 6);
  EXPECT_TRUE(r.ok) << r.worst;
}

}  // namespace
}  // namespace seqlab
