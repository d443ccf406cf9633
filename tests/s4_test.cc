// S4D: the convolution and recurrent forms against each other (values and every gradient, f32 and
// f64, both discretisations, odd shapes), float64 finite differences of every input in every form at
// Δ from 1e-4 to 10 and decays near 0 and near 1, no NaN or overflow at the extremes, a sequence split in
// two (the final state carried) equal to the whole, token-by-token decoding, HiPPO-LegS's matrix and
// its normal-plus-low-rank decomposition, and the errors.
#include "layers/ssm/s4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "test_util.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

struct Inputs {
  Tensor u, log_dt, A, B, C, D, x0;
  std::vector<Tensor> list() const { return {u, log_dt, A, B, C, D, x0}; }
};

// u [Bn, T, H]; Λ with Re in −[re_lo, re_hi] and Im in [−3, 3]; log Δ uniform in [dt_lo, dt_hi].
Inputs make_inputs(int64_t Bn, int64_t T, int64_t H, int64_t N2, DType dtype, uint64_t seed, double dt_lo = -2.5,
                   double dt_hi = 0.0, double re_lo = 0.2, double re_hi = 1.5, bool with_d = true,
                   bool with_x0 = true) {
  Generator gen(seed);
  std::vector<double> a = Tensor::rand({H, N2, 2}, gen, DType::f64, 0, 1).to_doubles();
  for (size_t i = 0; i < a.size(); i += 2) {
    a[i] = -(re_lo + (re_hi - re_lo) * a[i]);
    a[i + 1] = 6 * a[i + 1] - 3;
  }
  Inputs in;
  in.u = Tensor::randn({Bn, T, H}, gen, dtype);
  in.log_dt = Tensor::rand({H}, gen, dtype, dt_lo, dt_hi);
  in.A = Tensor::from_vector(a, {H, N2, 2}, dtype);
  in.B = Tensor::randn({H, N2, 2}, gen, dtype);
  in.C = Tensor::randn({H, N2, 2}, gen, dtype);
  if (with_d) in.D = Tensor::randn({H}, gen, dtype);
  if (with_x0) in.x0 = Tensor::randn({Bn, H, N2, 2}, gen, dtype);
  return in;
}

S4Options options(S4Form form, S4Discretisation disc) {
  S4Options o;
  o.form = form;
  o.discretisation = disc;
  return o;
}

struct Outcome {
  std::vector<Tensor> outputs, grads;  // y, final_state; du, dlog_dt, dA, dB, dC, dD, dx0
};

Outcome run(const Inputs& x, const S4Options& o, uint64_t cot_seed = 7) {
  std::vector<Tensor> in = x.list();
  for (Tensor& t : in) {
    if (t.defined()) t = set_requires_grad(t.detach());
  }
  S4Output out = s4(in[0], in[1], in[2], in[3], in[4], in[5], in[6], o);
  Generator gen(cot_seed);
  const std::vector<Tensor> cot{Tensor::randn(out.y.shape(), gen, out.y.dtype()),
                                Tensor::randn(out.final_state.shape(), gen, out.y.dtype())};
  backward({out.y, out.final_state}, cot);
  Outcome r{{out.y, out.final_state}, {}};
  for (const Tensor& t : in) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

bool finite(const Tensor& t) {
  for (double v : t.to_doubles()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// Every output and gradient of a against b, relative error ≤ tol (max(1, |b|) as the scale).
void expect_close(const Outcome& a, const Outcome& b, double tol, const std::string& what) {
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    EXPECT_LE(max_rel_error(a.outputs[i], b.outputs[i]), tol) << what << ": output " << i;
  }
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << what << ": gradient " << i;
    if (a.grads[i].defined()) {
      EXPECT_LE(max_rel_error(a.grads[i], b.grads[i]), tol) << what << ": gradient " << i;
    }
  }
}

const S4Discretisation kDiscs[] = {S4Discretisation::zoh, S4Discretisation::bilinear};
const S4Form kForms[] = {S4Form::convolution, S4Form::recurrent};

TEST(S4, FormsAgreeInF64AndF32) {
  for (S4Discretisation disc : kDiscs) {
    for (DType dtype : {DType::f64, DType::f32}) {
      const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
      for (bool with_d : {true, false}) {
        const Inputs in = make_inputs(2, 13, 3, 3, dtype, 11, -2.5, 0.0, 0.2, 1.5, with_d, with_d);
        const Outcome conv = run(in, options(S4Form::convolution, disc));
        const Outcome rec = run(in, options(S4Form::recurrent, disc));
        expect_close(conv, rec, tol, std::string(s4_discretisation_name(disc)) + " " + dtype_name(dtype));
      }
    }
  }
}

// f32 against f64: the kernels compute in double whatever the dtype, so only the inputs' and outputs'
// roundings remain.
TEST(S4, F32MatchesF64) {
  for (S4Form form : kForms) {
    const Inputs in64 = make_inputs(2, 9, 3, 2, DType::f64, 5);
    Inputs in32;
    std::vector<Tensor> l64 = in64.list(), l32;
    for (const Tensor& t : l64) l32.push_back(t.defined() ? to_dtype(t, DType::f32) : t);
    in32 = {l32[0], l32[1], l32[2], l32[3], l32[4], l32[5], l32[6]};
    const Outcome a = run(in32, options(form, S4Discretisation::zoh)), b = run(in64, options(form, S4Discretisation::zoh));
    expect_close(a, b, 1e-4, s4_form_name(form));
  }
}

// Finite differences of every input, each form and discretisation, at ordinary and extreme steps:
// Δ ≈ 1e-4 (Ā ≈ 1: decay near 1, the series branch of zoh), Δ ≈ 10 with Re Λ ≈ −3 (Ā ≈ e^-30: decay
// near 0), and T = 1.
TEST(S4, GradcheckEveryInputEveryForm) {
  struct Case {
    int64_t Bn, T, H, N2;
    double dt_lo, dt_hi, re_lo, re_hi;
    const char* what;
  };
  const Case cases[] = {{2, 7, 3, 2, -2.5, 0.0, 0.2, 1.5, "ordinary"},
                        {1, 5, 2, 2, std::log(1e-4), std::log(1.2e-4), 0.2, 1.5, "dt 1e-4"},
                        {1, 5, 2, 2, std::log(9.0), std::log(10.0), 0.2, 0.4, "dt 10"},
                        {1, 5, 2, 2, std::log(9.0), std::log(10.0), 2.5, 3.0, "decay near 0"},
                        {2, 1, 3, 3, -2.5, 0.0, 0.2, 1.5, "T = 1"}};
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c.Bn, c.T, c.H, c.N2, DType::f64, 3, c.dt_lo, c.dt_hi, c.re_lo, c.re_hi);
    for (S4Form form : kForms) {
      for (S4Discretisation disc : kDiscs) {
        const S4Options o = options(form, disc);
        GradcheckResult r = gradcheck(
            [&](const std::vector<Tensor>& x) {
              S4Output out = s4(x[0], x[1], x[2], x[3], x[4], x[5], x[6], o);
              return std::vector<Tensor>{out.y, out.final_state};
            },
            in.list());
        EXPECT_EQ(r.elements_checked, in.u.numel() + 3 * in.A.numel() + 2 * in.log_dt.numel() + in.x0.numel());
        EXPECT_LE(r.max_error, 1e-6) << c.what << " " << s4_form_name(form) << " " << s4_discretisation_name(disc)
                                     << ": " << r.worst;
      }
    }
  }
}

// Long sequences at the extremes: every output and gradient finite, and the forms still equal.
TEST(S4, ExtremeStepsStayFinite) {
  struct Case {
    double dt, re;
  };
  for (const Case c : {Case{1e-4, 0.01}, Case{1e-4, 50}, Case{10, 0.01}, Case{10, 50}}) {
    for (S4Discretisation disc : kDiscs) {
      for (DType dtype : {DType::f32, DType::f64}) {
        const Inputs in = make_inputs(1, 64, 2, 4, dtype, 9, std::log(c.dt), std::log(c.dt), c.re, c.re);
        const Outcome conv = run(in, options(S4Form::convolution, disc));
        const Outcome rec = run(in, options(S4Form::recurrent, disc));
        for (const Outcome* o : {&conv, &rec}) {
          for (const Tensor& t : o->outputs) EXPECT_TRUE(finite(t)) << c.dt << " " << c.re;
          for (const Tensor& t : o->grads) EXPECT_TRUE(finite(t)) << c.dt << " " << c.re;
        }
        expect_close(conv, rec, dtype == DType::f64 ? 1e-9 : 1e-4,
                     "dt " + std::to_string(c.dt) + " re " + std::to_string(c.re));
      }
    }
  }
}

// Running [0, t1) and then [t1, T) from its final state equals running [0, T); token by token (the
// decode step) too.
TEST(S4, SplitSequenceAndDecodingEqualWhole) {
  const Inputs in = make_inputs(2, 11, 3, 3, DType::f64, 21);
  for (S4Form form : kForms) {
    for (S4Discretisation disc : kDiscs) {
      const S4Options o = options(form, disc);
      const S4Output whole = s4(in.u, in.log_dt, in.A, in.B, in.C, in.D, in.x0, o);
      const S4Output first = s4(narrow(in.u, 1, 0, 4), in.log_dt, in.A, in.B, in.C, in.D, in.x0, o);
      const S4Output second = s4(narrow(in.u, 1, 4, 7), in.log_dt, in.A, in.B, in.C, in.D, first.final_state, o);
      EXPECT_LE(max_rel_error(concat({first.y, second.y}, 1), whole.y), 1e-12);
      EXPECT_LE(max_rel_error(second.final_state, whole.final_state), 1e-12);
      Tensor state = in.x0;
      std::vector<Tensor> ys;
      for (int64_t t = 0; t < 11; ++t) {
        S4Output step = s4(narrow(in.u, 1, t, 1), in.log_dt, in.A, in.B, in.C, in.D, state, options(S4Form::recurrent, disc));
        ys.push_back(step.y);
        state = step.final_state;
      }
      EXPECT_LE(max_rel_error(concat(ys, 1), whole.y), 1e-12);
      EXPECT_LE(max_rel_error(state, whole.final_state), 1e-12);
    }
  }
}

// T = 0: no output, the state passes through unchanged, and its gradient is d final_state, in every form.
TEST(S4, EmptySequenceKeepsTheState) {
  const Inputs in = make_inputs(2, 0, 3, 2, DType::f64, 23);
  for (S4Form form : kForms) {
    const Outcome r = run(in, options(form, S4Discretisation::zoh));
    EXPECT_EQ(r.outputs[0].shape(), (Shape{2, 0, 3}));
    EXPECT_LE(max_rel_error(r.outputs[1], in.x0), 0.0) << s4_form_name(form);
    Generator gen(7);  // run()'s cotangents: the second is d final_state
    Tensor::randn({2, 0, 3}, gen, DType::f64);
    EXPECT_LE(max_rel_error(r.grads[6], Tensor::randn({2, 3, 2, 2}, gen, DType::f64)), 0.0) << s4_form_name(form);
    for (size_t i = 1; i < 6; ++i) EXPECT_TRUE(finite(r.grads[i])) << i;
  }
}

// Against the discrete recurrence written out here with std::complex (zoh: Ā = e^{ΔΛ}).
TEST(S4, MatchesLoopWrittenHere) {
  const Inputs in = make_inputs(1, 6, 2, 2, DType::f64, 33);
  const S4Output out = s4(in.u, in.log_dt, in.A, in.B, in.C, in.D, in.x0, options(S4Form::convolution, S4Discretisation::zoh));
  const std::vector<double> u = in.u.to_doubles(), ldt = in.log_dt.to_doubles(), a = in.A.to_doubles(),
                            b = in.B.to_doubles(), c = in.C.to_doubles(), d = in.D.to_doubles(), x0 = in.x0.to_doubles();
  std::vector<double> y(6 * 2);
  for (int64_t h = 0; h < 2; ++h) {
    const double dt = std::exp(ldt[h]);
    std::complex<double> x[2];
    for (int n = 0; n < 2; ++n) x[n] = {x0[(h * 2 + n) * 2], x0[(h * 2 + n) * 2 + 1]};
    for (int64_t t = 0; t < 6; ++t) {
      double acc = d[h] * u[t * 2 + h];
      for (int n = 0; n < 2; ++n) {
        const int64_t i = (h * 2 + n) * 2;
        const std::complex<double> lam(a[i], a[i + 1]), Bn(b[i], b[i + 1]), Cn(c[i], c[i + 1]);
        const std::complex<double> Ab = std::exp(dt * lam);
        x[n] = Ab * x[n] + (Ab - 1.0) / lam * Bn * u[t * 2 + h];
        acc += 2 * (Cn * x[n]).real();
      }
      y[t * 2 + h] = acc;
    }
  }
  EXPECT_LE(max_rel_error(out.y, Tensor::from_vector(y, {1, 6, 2}, DType::f64)), 1e-12);
}

TEST(S4, HippoLegsMatrixAndItsNormalPlusLowRankForm) {
  const std::vector<double> A3 = hippo_legs_matrix(3);
  const std::vector<double> expect3{-1, 0, 0, -std::sqrt(3.0), -2, 0, -std::sqrt(5.0), -std::sqrt(15.0), -3};
  for (size_t i = 0; i < 9; ++i) EXPECT_NEAR(A3[i], expect3[i], 1e-15);
  for (int64_t N : {2, 8, 64}) {
    const HippoNplr r = hippo_legs_nplr(N);
    const std::vector<double> A = hippo_legs_matrix(N);
    const int64_t N2 = N / 2;
    double worst_lr = 0, worst_eig = 0, worst_orth = 0, worst_rec = 0;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        worst_lr = std::max(worst_lr, std::abs(r.S[i * N + j] - r.P[i] * r.P[j] - A[i * N + j]));
        // S = V Λ V* + conj(V Λ V*) = 2·Re(V Λ V*): the conjugate pairs make up the other half.
        std::complex<double> acc = 0;
        for (int64_t m = 0; m < N2; ++m) acc += r.V[i * N2 + m] * r.lambda[m] * std::conj(r.V[j * N2 + m]);
        worst_rec = std::max(worst_rec, std::abs(2 * acc.real() - r.S[i * N + j]));
      }
    }
    for (int64_t m = 0; m < N2; ++m) {
      EXPECT_NEAR(r.lambda[m].real(), -0.5, 1e-12);
      EXPECT_GT(r.lambda[m].imag(), 0);
      if (m) {
        EXPECT_GE(r.lambda[m].imag(), r.lambda[m - 1].imag());
      }
      for (int64_t i = 0; i < N; ++i) {  // S v = λ v
        std::complex<double> sv = 0;
        for (int64_t k = 0; k < N; ++k) sv += r.S[i * N + k] * r.V[k * N2 + m];
        worst_eig = std::max(worst_eig, std::abs(sv - r.lambda[m] * r.V[i * N2 + m]));
      }
      for (int64_t m2 = 0; m2 < N2; ++m2) {  // V* V = I
        std::complex<double> dot = 0;
        for (int64_t i = 0; i < N; ++i) dot += std::conj(r.V[i * N2 + m]) * r.V[i * N2 + m2];
        worst_orth = std::max(worst_orth, std::abs(dot - (m == m2 ? 1.0 : 0.0)));
      }
    }
    const double scale = static_cast<double>(N);
    EXPECT_LE(worst_lr, 1e-12 * scale) << N;
    EXPECT_LE(worst_eig, 1e-9 * scale) << N;
    EXPECT_LE(worst_orth, 1e-9) << N;
    EXPECT_LE(worst_rec, 1e-9 * scale) << N;
  }
  EXPECT_THROW(hippo_legs_nplr(5), std::invalid_argument);
}

// ---- the diagonal-plus-low-rank form ----

struct LowRank {
  Tensor P, Q;
};
LowRank make_low_rank(int64_t H, int64_t N2, DType dtype, uint64_t seed, double scale = 0.3) {
  Generator gen(seed);
  return {Tensor::randn({H, N2, 2}, gen, dtype, scale), Tensor::randn({H, N2, 2}, gen, dtype, scale)};
}

Outcome run_dplr(const Inputs& x, const LowRank& lr, const S4Options& o, uint64_t cot_seed = 7) {
  std::vector<Tensor> in = {x.u, x.log_dt, x.A, lr.P, lr.Q, x.B, x.C, x.D, x.x0};
  for (Tensor& t : in) {
    if (t.defined()) t = set_requires_grad(t.detach());
  }
  S4Output out = s4_dplr(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], o);
  Generator gen(cot_seed);
  const std::vector<Tensor> cot{Tensor::randn(out.y.shape(), gen, out.y.dtype()),
                                Tensor::randn(out.final_state.shape(), gen, out.y.dtype())};
  backward({out.y, out.final_state}, cot);
  Outcome r{{out.y, out.final_state}, {}};
  for (const Tensor& t : in) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

TEST(S4Dplr, FormsAgreeInF64AndF32) {
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
    for (bool with_state : {true, false}) {
      const Inputs in = make_inputs(2, 13, 3, 3, dtype, 12, -2.5, 0.0, 0.2, 1.5, with_state, with_state);
      const LowRank lr = make_low_rank(3, 3, dtype, 13);
      expect_close(run_dplr(in, lr, options(S4Form::convolution, S4Discretisation::bilinear)),
                   run_dplr(in, lr, options(S4Form::recurrent, S4Discretisation::bilinear)), tol, dtype_name(dtype));
    }
  }
}

// With P = Q = 0 the dense Ā is diag(Ā_n): the same outputs and gradients as the diagonal form (bilinear).
TEST(S4Dplr, ZeroLowRankIsTheDiagonalForm) {
  const Inputs in = make_inputs(2, 9, 3, 4, DType::f64, 14);
  const LowRank zero{Tensor::zeros({3, 4, 2}, DType::f64), Tensor::zeros({3, 4, 2}, DType::f64)};
  for (S4Form form : kForms) {
    const Outcome dplr = run_dplr(in, zero, options(form, S4Discretisation::bilinear));
    const Outcome diag = run(in, options(form, S4Discretisation::bilinear));
    Outcome same{dplr.outputs, {dplr.grads[0], dplr.grads[1], dplr.grads[2], dplr.grads[5], dplr.grads[6],
                                dplr.grads[7], dplr.grads[8]}};
    expect_close(same, diag, 1e-12, s4_form_name(form));
  }
}

// A dense recurrence written out here: M = I − ΔA/2 solved by the test's own elimination.
TEST(S4Dplr, MatchesDenseBilinearRecurrenceWrittenHere) {
  const int64_t H = 1, n = 3, T = 6;
  const Inputs in = make_inputs(1, T, H, n, DType::f64, 15);
  const LowRank lr = make_low_rank(H, n, DType::f64, 16, 0.5);
  const S4Output out = s4_dplr(in.u, in.log_dt, in.A, lr.P, lr.Q, in.B, in.C, in.D, in.x0,
                               options(S4Form::convolution, S4Discretisation::bilinear));
  using c = std::complex<double>;
  auto pairs = [](const Tensor& t) {
    std::vector<double> v = t.to_doubles();
    std::vector<c> z(v.size() / 2);
    for (size_t i = 0; i < z.size(); ++i) z[i] = c(v[2 * i], v[2 * i + 1]);
    return z;
  };
  const std::vector<c> lam = pairs(in.A), P = pairs(lr.P), Q = pairs(lr.Q), Bv = pairs(in.B), Cv = pairs(in.C),
                       x0 = pairs(in.x0);
  const double dt = std::exp(in.log_dt.to_doubles()[0]), D = in.D.to_doubles()[0];
  const std::vector<double> u = in.u.to_doubles();
  // Solve M X = [I + ΔA/2 | Δ B] (Gaussian elimination, no pivoting needed: M is close to I here).
  std::vector<std::vector<c>> M(n, std::vector<c>(n)), rhs(n, std::vector<c>(n + 1));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const c a = (i == j ? lam[i] : c(0)) - P[i] * std::conj(Q[j]);
      M[i][j] = (i == j ? 1.0 : 0.0) - 0.5 * dt * a;
      rhs[i][j] = (i == j ? 1.0 : 0.0) + 0.5 * dt * a;
    }
    rhs[i][n] = dt * Bv[i];
  }
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t i = k + 1; i < n; ++i) {
      const c f = M[i][k] / M[k][k];
      for (int64_t j = 0; j < n; ++j) M[i][j] -= f * M[k][j];
      for (int64_t j = 0; j <= n; ++j) rhs[i][j] -= f * rhs[k][j];
    }
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    for (int64_t j = 0; j <= n; ++j) {
      for (int64_t k = i + 1; k < n; ++k) rhs[i][j] -= M[i][k] * rhs[k][j];
      rhs[i][j] /= M[i][i];
    }
  }
  std::vector<c> x = x0;
  std::vector<double> y(T);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<c> nx(n);
    for (int64_t i = 0; i < n; ++i) {
      nx[i] = rhs[i][n] * u[t];
      for (int64_t j = 0; j < n; ++j) nx[i] += rhs[i][j] * x[j];
    }
    x = nx;
    c acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += Cv[i] * x[i];
    y[t] = 2 * acc.real() + D * u[t];
  }
  EXPECT_LE(max_rel_error(out.y, Tensor::from_vector(y, {1, T, 1}, DType::f64)), 1e-12);
}

TEST(S4Dplr, GradcheckEveryInputBothForms) {
  const Inputs ordinary = make_inputs(2, 7, 2, 3, DType::f64, 17);
  const Inputs small_dt = make_inputs(1, 5, 2, 3, DType::f64, 18, std::log(1e-4), std::log(1.2e-4));
  const Inputs large_dt = make_inputs(1, 5, 2, 2, DType::f64, 19, std::log(9.0), std::log(10.0));
  for (const Inputs* in : {&ordinary, &small_dt, &large_dt}) {
    const LowRank lr = make_low_rank(in->A.size(0), in->A.size(1), DType::f64, 20);
    for (S4Form form : kForms) {
      const S4Options o = options(form, S4Discretisation::bilinear);
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& x) {
            S4Output out = s4_dplr(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], o);
            return std::vector<Tensor>{out.y, out.final_state};
          },
          {in->u, in->log_dt, in->A, lr.P, lr.Q, in->B, in->C, in->D, in->x0});
      EXPECT_EQ(r.elements_checked, in->u.numel() + 5 * in->A.numel() + 2 * in->log_dt.numel() + in->x0.numel());
      EXPECT_LE(r.max_error, 1e-6) << s4_form_name(form) << ": " << r.worst;
    }
  }
}

TEST(S4Dplr, RefusesZohAndAHalfGivenLowRank) {
  const Inputs in = make_inputs(1, 4, 2, 2, DType::f64, 1);
  const LowRank lr = make_low_rank(2, 2, DType::f64, 2);
  try {
    s4_dplr(in.u, in.log_dt, in.A, lr.P, lr.Q, in.B, in.C, in.D, in.x0, options(S4Form::recurrent, S4Discretisation::zoh));
    ADD_FAILURE() << "zoh accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("discretised bilinearly"), std::string::npos) << e.what();
  }
  try {
    s4_dplr(in.u, in.log_dt, in.A, lr.P, Tensor(), in.B, in.C, in.D, in.x0,
            options(S4Form::recurrent, S4Discretisation::bilinear));
    ADD_FAILURE() << "P without Q accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("must all be given"), std::string::npos) << e.what();
  }
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(S4, RefusesBadInputsInOneLine) {
  const Inputs in = make_inputs(1, 4, 2, 2, DType::f64, 1);
  expect_error([&] { s4(in.u, in.log_dt, in.A, narrow(in.B, 1, 0, 1), in.C); }, "B must be [H, N2, 2]");
  expect_error([&] { s4(reshape(in.u, {4, 2}), in.log_dt, in.A, in.B, in.C); }, "u must be [B, T, H]");
  expect_error([&] { s4(in.u, narrow(in.log_dt, 0, 0, 1), in.A, in.B, in.C); }, "log_dt must be [H]");
  expect_error([&] { s4(in.u, in.log_dt, in.A, in.B, in.C, in.D, narrow(in.x0, 2, 0, 1)); },
               "initial_state must be [B, H, N2, 2]");
  expect_error([&] { s4(in.u, to_dtype(in.log_dt, DType::f32), in.A, in.B, in.C); }, "share one dtype");
  expect_error([] { parse_s4_form("fft"); }, "unknown form 'fft'");
  expect_error([] { parse_s4_discretisation("euler"); }, "unknown discretisation 'euler'");
}

}  // namespace
}  // namespace seqlab
