// The Mamba selective scan: the chunked form against the recurrent form and against a plain
// reference loop written here (outputs, final state and every gradient, f32 and f64, with and without
// each optional input, odd shapes), finite-difference gradients of every input for both forms, Δ from
// 1e-4 to 10 and decays near 0 and near 1, token-by-token decoding and a split sequence through the
// states, the segment decay used by sequence parallelism, the chunked form's peak memory against all
// T states, the registry entry and shape errors.
#include "layers/ssm/selective_scan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/device.h"
#include "tensor/kernels.h"
#include "test_util.h"
#include "variant_cases.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

struct Case {
  const char* name;
  int64_t B, T, D, N, chunk;
  bool with_D, with_z, with_bias, with_h0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

struct Inputs {
  Tensor u, delta, A, B, C, D, z, bias, h0;
  std::vector<Tensor> list() const { return {u, delta, A, B, C, D, z, bias, h0}; }
};

// The raw delta whose softplus is Δ: log(eᐞ − 1).
double raw_delta(double dt) { return std::log(std::expm1(dt)); }

// delta raw uniform in [d_lo, d_hi] (Δ = softplus: 0.31 … 1.31 by default), A uniform in [a_lo, a_hi] < 0.
Inputs make_inputs(const Case& c, DType dtype, uint64_t seed, double d_lo = -1.0, double d_hi = 1.0,
                   double a_lo = -2.0, double a_hi = -0.1) {
  Generator gen(seed);
  Inputs in;
  in.u = Tensor::randn({c.B, c.T, c.D}, gen, dtype);
  in.delta = Tensor::rand({c.B, c.T, c.D}, gen, dtype, d_lo, d_hi);
  in.A = Tensor::rand({c.D, c.N}, gen, dtype, a_lo, a_hi);
  in.B = Tensor::randn({c.B, c.T, c.N}, gen, dtype);
  in.C = Tensor::randn({c.B, c.T, c.N}, gen, dtype);
  if (c.with_D) in.D = Tensor::randn({c.D}, gen, dtype);
  if (c.with_z) in.z = Tensor::randn({c.B, c.T, c.D}, gen, dtype);
  if (c.with_bias) in.bias = Tensor::rand({c.D}, gen, dtype, -0.3, 0.3);
  if (c.with_h0) in.h0 = Tensor::randn({c.B, c.D, c.N}, gen, dtype);
  return in;
}

SelectiveScanOutput run(const std::vector<Tensor>& x, const SelectiveScanOptions& o) {
  return selective_scan(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], o);
}

struct Result {
  Tensor y, fs;
  std::vector<Tensor> grads;  // u, delta, A, B, C, D, z, delta_bias, initial_state
};

Result forward_backward(const Inputs& in, const SelectiveScanOptions& opts, uint64_t seed) {
  std::vector<Tensor> x;
  for (const Tensor& t : in.list()) x.push_back(t.defined() ? set_requires_grad(t.detach()) : t);
  SelectiveScanOutput out = run(x, opts);
  Generator gen(seed);
  const Tensor gy = Tensor::randn(out.y.shape(), gen, in.u.dtype());
  const Tensor gs = Tensor::randn(out.final_state.shape(), gen, in.u.dtype());
  backward({out.y, out.final_state}, {gy, gs});
  Result r{out.y.detach(), out.final_state.detach(), {}};
  for (const Tensor& t : x) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

const char* kInputNames[9] = {"u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"};

void expect_same(const Result& a, const Result& b, double tol, const std::string& what) {
  EXPECT_LE(max_rel_error(a.y, b.y), tol) << what << " y";
  EXPECT_LE(max_rel_error(a.fs, b.fs), tol) << what << " final_state";
  for (size_t i = 0; i < 9; ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << what << " d" << kInputNames[i];
    if (a.grads[i].defined()) EXPECT_LE(max_rel_error(a.grads[i], b.grads[i]), tol) << what << " d" << kInputNames[i];
  }
}

// The recurrence as the header states it, in double, one channel at a time: y and the final state.
std::pair<std::vector<double>, std::vector<double>> reference(const Inputs& in, const Case& c) {
  const std::vector<double> u = in.u.to_doubles(), dl = in.delta.to_doubles(), A = in.A.to_doubles(),
                            Bm = in.B.to_doubles(), Cm = in.C.to_doubles();
  const std::vector<double> D = in.D.defined() ? in.D.to_doubles() : std::vector<double>(c.D, 0.0);
  const std::vector<double> bias = in.bias.defined() ? in.bias.to_doubles() : std::vector<double>(c.D, 0.0);
  const std::vector<double> z = in.z.defined() ? in.z.to_doubles() : std::vector<double>();
  std::vector<double> h = in.h0.defined() ? in.h0.to_doubles() : std::vector<double>(c.B * c.D * c.N, 0.0);
  std::vector<double> y(c.B * c.T * c.D);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t d = 0; d < c.D; ++d) {
        const int64_t i = (b * c.T + t) * c.D + d;
        const double x = dl[i] + bias[d], dt = x > 30 ? x : std::log1p(std::exp(x));
        double acc = D[d] * u[i];
        for (int64_t n = 0; n < c.N; ++n) {
          double& hs = h[(b * c.D + d) * c.N + n];
          hs = std::exp(dt * A[d * c.N + n]) * hs + dt * u[i] * Bm[(b * c.T + t) * c.N + n];
          acc += Cm[(b * c.T + t) * c.N + n] * hs;
        }
        if (!z.empty()) acc *= z[i] / (1 + std::exp(-z[i]));
        y[i] = acc;
      }
    }
  }
  return {y, h};
}

double max_rel_vs(const Tensor& t, const std::vector<double>& want) {
  const std::vector<double> got = t.to_doubles();
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
  }
  return worst;
}

bool finite(const Result& r) {
  bool ok = testing::all_finite(r.y) && testing::all_finite(r.fs);
  for (const Tensor& g : r.grads) ok = ok && (!g.defined() || testing::all_finite(g));
  return ok;
}

// ---- every form against every other and against the reference loop ----
class SelectiveScanForms : public ::testing::TestWithParam<Case> {};

void expect_forms_agree(const Case& c, DType dtype, double tol) {
  const Inputs in = make_inputs(c, dtype, 7);
  const Result chunked = forward_backward(in, {SelectiveScanForm::chunked, c.chunk, true}, 11);
  const Result rec = forward_backward(in, {SelectiveScanForm::recurrent, c.chunk, true}, 11);
  EXPECT_EQ(chunked.y.shape(), (Shape{c.B, c.T, c.D}));
  EXPECT_EQ(chunked.fs.shape(), (Shape{c.B, c.D, c.N}));
  EXPECT_EQ(chunked.y.dtype(), dtype);
  const bool present[9] = {true, true, true, true, true, c.with_D, c.with_z, c.with_bias, c.with_h0};
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(chunked.grads[i].defined(), present[i]) << kInputNames[i];
  expect_same(chunked, rec, tol, "chunked vs recurrent");
  const auto [y, h] = reference(in, c);
  EXPECT_LE(max_rel_vs(chunked.y, y), tol) << "y vs reference";
  EXPECT_LE(max_rel_vs(chunked.fs, h), tol) << "final_state vs reference";
  EXPECT_TRUE(finite(chunked));
}

TEST_P(SelectiveScanForms, F64) { expect_forms_agree(GetParam(), DType::f64, 1e-10); }
TEST_P(SelectiveScanForms, F32) { expect_forms_agree(GetParam(), DType::f32, 1e-5); }

// name, B, T, D, N, chunk, D skip, z, delta_bias, initial state
INSTANTIATE_TEST_SUITE_P(
    Shapes, SelectiveScanForms,
    ::testing::Values(Case{"odd_T_all", 2, 11, 5, 3, 4, true, true, true, true},  // T not a multiple of the chunk
                      Case{"odd_T_none", 2, 11, 5, 3, 4, false, false, false, false},
                      Case{"skip_and_gate", 1, 13, 3, 7, 5, true, true, false, false},
                      Case{"bias_and_h0", 1, 13, 3, 7, 5, false, false, true, true},
                      Case{"T_below_chunk", 2, 5, 3, 4, 8, true, true, true, true},  // T smaller than one chunk
                      Case{"T_one", 2, 1, 3, 4, 4, true, true, true, true},          // one token (a decode step)
                      Case{"chunk_one", 1, 6, 3, 2, 1, true, true, true, true},
                      Case{"N_one", 1, 9, 4, 1, 4, true, false, true, true},
                      Case{"more_channels_than_groups", 2, 37, 19, 5, 16, true, true, true, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- finite differences (f64) of every input, both forms ----
void expect_gradcheck(const Case& c, SelectiveScanForm form, const Inputs& in) {
  const SelectiveScanOptions opts{form, c.chunk, true};
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& x) {
        SelectiveScanOutput out = run(x, opts);
        return std::vector<Tensor>{out.y, out.final_state};
      },
      in.list());
  int64_t expected = 2 * c.B * c.T * c.D + c.D * c.N + 2 * c.B * c.T * c.N;
  if (c.with_D) expected += c.D;
  if (c.with_z) expected += c.B * c.T * c.D;
  if (c.with_bias) expected += c.D;
  if (c.with_h0) expected += c.B * c.D * c.N;
  EXPECT_EQ(r.elements_checked, expected);
  EXPECT_LE(r.max_error, 1e-6) << selective_scan_form_name(form) << " " << c.name << ": " << r.worst;
}

void expect_gradcheck(const Case& c, SelectiveScanForm form) { expect_gradcheck(c, form, make_inputs(c, DType::f64, 3)); }

TEST(SelectiveScanGradcheck, ChunkedAllInputs) {
  expect_gradcheck({"all", 2, 7, 3, 4, 3, true, true, true, true}, SelectiveScanForm::chunked);
}
TEST(SelectiveScanGradcheck, RecurrentAllInputs) {
  expect_gradcheck({"all", 2, 7, 3, 4, 3, true, true, true, true}, SelectiveScanForm::recurrent);
}
TEST(SelectiveScanGradcheck, NoOptionalInputs) {
  expect_gradcheck({"none", 1, 6, 3, 2, 4, false, false, false, false}, SelectiveScanForm::chunked);
  expect_gradcheck({"none", 1, 6, 3, 2, 4, false, false, false, false}, SelectiveScanForm::recurrent);
}
TEST(SelectiveScanGradcheck, ShortTAndDecodeStep) {
  expect_gradcheck({"T_below_chunk", 1, 3, 2, 3, 8, true, true, true, true}, SelectiveScanForm::chunked);
  expect_gradcheck({"T_one", 2, 1, 3, 2, 4, true, true, true, true}, SelectiveScanForm::chunked);
  expect_gradcheck({"T_one", 2, 1, 3, 2, 4, true, true, true, true}, SelectiveScanForm::recurrent);
}
// Δ from 1e-4 to 10 and A from −6 to −1e-4: decays from e^{−60} to ≈ 1 − 1e-8.
TEST(SelectiveScanGradcheck, ExtremeStepsAndDecays) {
  const Case c{"extreme", 1, 9, 4, 3, 4, true, true, true, true};
  expect_gradcheck(c, SelectiveScanForm::chunked, make_inputs(c, DType::f64, 5, raw_delta(1e-4), raw_delta(10.0), -6.0, -1e-4));
}
// Without softplus Δ = delta + delta_bias, taken as given.
TEST(SelectiveScanGradcheck, WithoutSoftplus) {
  const Case c{"plain", 1, 6, 3, 2, 4, true, true, true, true};
  const Inputs in = make_inputs(c, DType::f64, 9, 0.05, 1.0);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& x) {
        SelectiveScanOutput out = run(x, {SelectiveScanForm::chunked, 4, false});
        return std::vector<Tensor>{out.y, out.final_state};
      },
      in.list());
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

// ---- Δ from 1e-4 to 10, decays near 0 and near 1: finite, and the forms and the reference agree ----
TEST(SelectiveScan, ExtremeStepsAndDecaysStayFiniteAndAgree) {
  struct Range {
    double dt_lo, dt_hi, a_lo, a_hi;
  };
  // Tiny steps and tiny decay rates (decay ≈ 1 − 1e-10: the state keeps everything); large steps and
  // very negative A (decay e^{−10⁴}: underflows to 0, the state is the last input); everything at once.
  for (const Range r : {Range{1e-4, 2e-4, -1e-6, -1e-7}, Range{5.0, 10.0, -1000.0, -100.0},
                        Range{1e-4, 10.0, -1000.0, -1e-6}}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      const Case c{"", 2, 70, 5, 4, 16, true, true, true, true};
      const Inputs in = make_inputs(c, dtype, 17, raw_delta(r.dt_lo), raw_delta(r.dt_hi), r.a_lo, r.a_hi);
      const Result chunked = forward_backward(in, {SelectiveScanForm::chunked, 16, true}, 3);
      const Result rec = forward_backward(in, {SelectiveScanForm::recurrent, 16, true}, 3);
      const std::string at = std::string(dtype_name(dtype)) + " Δ ∈ [" + std::to_string(r.dt_lo) + ", " +
                             std::to_string(r.dt_hi) + "], A ∈ [" + std::to_string(r.a_lo) + ", " +
                             std::to_string(r.a_hi) + "]";
      EXPECT_TRUE(finite(chunked)) << at;
      EXPECT_TRUE(finite(rec)) << at;
      const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
      expect_same(chunked, rec, tol, at);
      const auto [y, h] = reference(in, c);
      EXPECT_LE(max_rel_vs(chunked.y, y), dtype == DType::f64 ? 1e-10 : 1e-4) << at;
      EXPECT_LE(max_rel_vs(chunked.fs, h), dtype == DType::f64 ? 1e-10 : 1e-4) << at;
    }
  }
}

// softplus of a large argument is the argument, of a very negative one e^x: no overflow, no log(0).
TEST(SelectiveScan, SoftplusIsStableAtBothEnds) {
  const Case c{"", 1, 3, 2, 2, 4, false, false, false, false};
  Inputs in = make_inputs(c, DType::f64, 1);
  in.delta = Tensor::from_vector({800.0, -800.0, 40.0, -40.0, 0.0, 1e-3}, {1, 3, 2}, DType::f64);
  const Result r = forward_backward(in, {}, 2);
  EXPECT_TRUE(finite(r));
  const auto [y, h] = reference(in, c);
  EXPECT_LE(max_rel_vs(r.y, y), 1e-12);
}

// ---- a hand-computed value: one channel, N = 1 ----
TEST(SelectiveScan, HandComputedValue) {
  // Δ = softplus(0) = ln 2, A = −1: a = 1/2. u = (1, 2), B = (1, 1), C = (1, 3), D = 0.5, h₀ = 4:
  // h₀' = 4/2 + ln2·1 = 2 + ln2;  y₀ = 2 + ln2 + 0.5;  h₁ = (2 + ln2)/2 + 2 ln2;  y₁ = 3 h₁ + 1.
  const double l2 = std::log(2.0);
  const Tensor u = Tensor::from_vector({1, 2}, {1, 2, 1}, DType::f64), delta = Tensor::zeros({1, 2, 1}, DType::f64);
  const Tensor A = Tensor::from_vector({-1}, {1, 1}, DType::f64), B = Tensor::from_vector({1, 1}, {1, 2, 1}, DType::f64),
               C = Tensor::from_vector({1, 3}, {1, 2, 1}, DType::f64), D = Tensor::from_vector({0.5}, {1}, DType::f64),
               h0 = Tensor::from_vector({4}, {1, 1, 1}, DType::f64);
  for (SelectiveScanForm form : {SelectiveScanForm::chunked, SelectiveScanForm::recurrent}) {
    const SelectiveScanOutput out = selective_scan(u, delta, A, B, C, D, Tensor(), Tensor(), h0, {form, 1, true});
    const double h1 = (2 + l2) / 2 + 2 * l2;
    const std::vector<double> y = out.y.to_doubles();
    EXPECT_NEAR(y[0], 2 + l2 + 0.5, 1e-14);
    EXPECT_NEAR(y[1], 3 * h1 + 1, 1e-14);
    EXPECT_NEAR(out.final_state.to_doubles()[0], h1, 1e-14);
  }
}

// ---- decoding and splitting through the states ----
TEST(SelectiveScan, DecodeTokenByTokenAndSplitSequenceEqualWhole) {
  const Case c{"", 2, 9, 4, 3, 4, true, true, true, true};
  const Inputs in = make_inputs(c, DType::f64, 13);
  const SelectiveScanOutput full = run(in.list(), {SelectiveScanForm::chunked, 4, true});
  auto at = [](const Tensor& x, int64_t s, int64_t n) { return kernel::narrow(x, 1, s, n); };
  Tensor state = in.h0;
  for (int64_t t = 0; t < c.T; ++t) {
    const SelectiveScanOutput step = selective_scan(at(in.u, t, 1), at(in.delta, t, 1), in.A, at(in.B, t, 1),
                                                    at(in.C, t, 1), in.D, at(in.z, t, 1), in.bias, state,
                                                    {SelectiveScanForm::recurrent, 4, true});
    EXPECT_LE(max_rel_error(step.y, at(full.y, t, 1)), 1e-13) << "t=" << t;
    state = step.final_state;
  }
  EXPECT_LE(max_rel_error(state, full.final_state), 1e-13);
  // 5 tokens, then the other 4 from the state the first part left (both chunked).
  auto part = [&](int64_t s, int64_t n, const Tensor& h) {
    return selective_scan(at(in.u, s, n), at(in.delta, s, n), in.A, at(in.B, s, n), at(in.C, s, n), in.D,
                          at(in.z, s, n), in.bias, h, {SelectiveScanForm::chunked, 4, true});
  };
  const SelectiveScanOutput a = part(0, 5, in.h0), b = part(5, 4, a.final_state);
  EXPECT_LE(max_rel_error(a.y, at(full.y, 0, 5)), 1e-13);
  EXPECT_LE(max_rel_error(b.y, at(full.y, 5, 4)), 1e-13);
  EXPECT_LE(max_rel_error(b.final_state, full.final_state), 1e-13);
}

// The segment decay of sequence parallelism: from h₀ with u = 0 the scan's final state is decay ⊙ h₀.
TEST(SelectiveScan, DecayIsTheTransitionOfTheState) {
  const Case c{"", 2, 7, 3, 4, 4, false, false, true, true};
  const Inputs in = make_inputs(c, DType::f64, 21);
  const Tensor zero_u = Tensor::zeros(in.u.shape(), DType::f64);
  for (bool sp : {true, false}) {
    const Tensor delta = sp ? in.delta : add(mul(in.delta, 0.4), 0.5);
    const SelectiveScanOutput out =
        selective_scan(zero_u, delta, in.A, in.B, in.C, Tensor(), Tensor(), in.bias, in.h0, {SelectiveScanForm::chunked, 4, sp});
    const Tensor decay = selective_scan_decay(delta, in.A, in.bias, sp);
    EXPECT_EQ(decay.shape(), (Shape{c.B, c.D, c.N}));
    EXPECT_LE(max_rel_error(out.final_state, mul(decay, in.h0)), 1e-13) << sp;
  }
  EXPECT_THROW(selective_scan_decay(in.delta, kernel::narrow(in.A, 0, 0, 2), Tensor(), true), std::invalid_argument);
}

// ---- memory: the chunked form keeps chunk checkpoints, never all T states ----
// The CPU allocator's peak over a forward and backward (graph included, every buffer of the kernels
// from the allocator), above what was live before, against B·T·D·N elements — what storing every
// state would take on top of everything else. What the op needs instead: y, the gradients of u, delta
// and z and the autograd temporaries (a few B·T·D), the dB/dC partials (2·8·B·T·N) and the checkpoints
// (B·⌈T/chunk⌉·D·N). At B = 2, T = 256, D = 128: with N = 16 below all states, with N = 64 (all
// states 4× larger) below a quarter of them.
int64_t chunked_peak_bytes(const Case& c) {
  const Inputs in = make_inputs(c, DType::f32, 31);
  std::vector<Tensor> x;
  for (const Tensor& t : in.list()) x.push_back(t.defined() ? set_requires_grad(t.detach()) : t);
  Generator gen(5);
  const Tensor gy = Tensor::randn({c.B, c.T, c.D}, gen, DType::f32);
  Allocator& alloc = cpu_allocator();
  alloc.reset_peak();
  const int64_t before = alloc.stats().live_bytes;
  {
    SelectiveScanOutput out = run(x, {SelectiveScanForm::chunked, c.chunk, true});
    backward({out.y}, {gy});
  }
  const int64_t peak = alloc.stats().peak_bytes - before;
  for (const Tensor& t : x) {
    if (t.defined()) EXPECT_TRUE(testing::all_finite(grad_of(t)));
  }
  return peak;
}

TEST(SelectiveScan, ChunkedPeakMemoryIsBelowAllStates) {
  for (int64_t N : {16, 64}) {
    const Case c{"", 2, 256, 128, N, 64, true, true, true, false};
    const int64_t peak = chunked_peak_bytes(c);
    const int64_t all_states = c.B * c.T * c.D * c.N * static_cast<int64_t>(sizeof(float));
    EXPECT_GT(peak, 0);
    EXPECT_LT(peak, N == 16 ? all_states : all_states / 4) << "N = " << N << ": peak " << peak << " bytes, all states "
                                                           << all_states;
  }
}

// ---- the registry entry and errors ----
TEST(SelectiveScan, RegisteredForTheOpRunner) {
  const OpSpec* spec = find_op("selective_scan");
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->inputs.size(), 9u);
  EXPECT_EQ(spec->outputs, (std::vector<std::string>{"y", "final_state"}));
  EXPECT_EQ(parse_selective_scan_form("recurrent"), SelectiveScanForm::recurrent);
  EXPECT_STREQ(selective_scan_form_name(SelectiveScanForm::chunked), "chunked");
  try {
    parse_selective_scan_form("chunkwise");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown form 'chunkwise' (expected chunked or recurrent)"), std::string::npos)
        << e.what();
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(SelectiveScan, BadInputsAreRefusedWithTheShapes) {
  const Case c{"", 2, 5, 3, 4, 4, true, true, true, true};
  const Inputs in = make_inputs(c, DType::f64, 1);
  auto with = [&](int which, const Tensor& t) {
    std::vector<Tensor> x = in.list();
    x[which] = t;
    return error_of([&] { run(x, {}); });
  };
  std::string e = with(3, Tensor::zeros({2, 5, 3}, DType::f64));
  EXPECT_NE(e.find("selective_scan: B must be [B, T, N] (N = A's last dim) (got u [2, 5, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("B [2, 5, 3]"), std::string::npos) << e;
  e = with(2, Tensor::zeros({4, 4}, DType::f64));
  EXPECT_NE(e.find("A must be [D, N]"), std::string::npos) << e;
  e = with(5, Tensor::zeros({2}, DType::f64));
  EXPECT_NE(e.find("D must be [D]"), std::string::npos) << e;
  e = with(8, Tensor::zeros({2, 4, 3}, DType::f64));
  EXPECT_NE(e.find("initial_state must be [B, D, N]"), std::string::npos) << e;
  e = with(6, Tensor::zeros({2, 5, 3}, DType::f32));
  EXPECT_NE(e.find("inputs must share one dtype, got u f64 and z f32"), std::string::npos) << e;
  e = with(4, Tensor());
  EXPECT_NE(e.find("u, delta, A, B and C must all be given"), std::string::npos) << e;
  e = with(0, Tensor::zeros({2, 5}, DType::f64));
  EXPECT_NE(e.find("u must have 3 dimensions"), std::string::npos) << e;
  e = error_of([&] { run(in.list(), {SelectiveScanForm::chunked, 0, true}); });
  EXPECT_NE(e.find("selective_scan: chunk must be positive, got 0"), std::string::npos) << e;
}

}  // namespace
}  // namespace seqlab
