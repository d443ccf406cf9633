// Mamba-2's SSD: the chunkwise form against the recurrent form (outputs, final state and every gradient,
// f32 and f64, with and without D and an initial state, G = 1, 1 < G < H and G = H, P ≠ N, odd shapes),
// finite-difference gradients of every input for both forms, token-by-token decoding and a split sequence
// through the states, Δ from 1e-4 to 10 and per-step log-decays from −1e-7 to −30, a hand-computed value,
// the registry entry and shape errors.
#include "layers/ssm/ssd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "test_util.h"
#include "variant_cases.h"

namespace seqlab {
namespace {

using testing::all_finite;
using testing::max_rel_error;

struct Case {
  const char* name;
  int64_t B, T, H, P, G, N, chunk;
  bool with_D, with_h0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

struct Inputs {
  Tensor x, dt, A, Bm, Cm, D, h0;
  std::vector<Tensor> list() const { return {x, dt, A, Bm, Cm, D, h0}; }
};

// Δ uniform in [dt_lo, dt_hi], A uniform in [a_lo, a_hi] (≤ 0).
Inputs make_inputs(const Case& c, DType dtype, uint64_t seed, double dt_lo = 0.05, double dt_hi = 1.2,
                   double a_lo = -1.5, double a_hi = -0.1) {
  Generator gen(seed);
  Inputs in;
  in.x = Tensor::randn({c.B, c.T, c.H, c.P}, gen, dtype);
  in.dt = Tensor::rand({c.B, c.T, c.H}, gen, dtype, dt_lo, dt_hi);
  in.A = Tensor::rand({c.H}, gen, dtype, a_lo, a_hi);
  in.Bm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype);
  in.Cm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype);
  if (c.with_D) in.D = Tensor::randn({c.H}, gen, dtype);
  if (c.with_h0) in.h0 = Tensor::randn({c.B, c.H, c.P, c.N}, gen, dtype);
  return in;
}

struct Result {
  Tensor y, fs;
  std::vector<Tensor> grads;  // x, dt, A, B, C, D, h0 (undefined for absent inputs)
};

// Forward, then one backward with the cotangents gy (for y) and gs (for final_state).
Result forward_backward(const Inputs& in, const SsdOptions& opts, const Tensor& gy, const Tensor& gs) {
  std::vector<Tensor> x;
  for (const Tensor& t : in.list()) x.push_back(t.defined() ? set_requires_grad(t.detach()) : t);
  SsdOutput out = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], opts);
  backward({out.y, out.final_state}, {gy, gs});
  Result r{out.y.detach(), out.final_state.detach(), {}};
  for (const Tensor& t : x) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

Result forward_backward(const Inputs& in, const SsdOptions& opts, uint64_t seed) {
  Generator gen(seed);
  const DType dtype = in.x.dtype();
  Tensor gy = Tensor::randn(in.x.shape(), gen, dtype);
  Tensor gs = Tensor::randn({in.x.size(0), in.x.size(2), in.x.size(3), in.Bm.size(3)}, gen, dtype);
  return forward_backward(in, opts, gy, gs);
}

SsdOptions chunkwise(const Case& c) { return {SsdForm::chunkwise, c.chunk}; }
SsdOptions recurrent(const Case& c) { return {SsdForm::recurrent, c.chunk}; }

const char* kInputNames[7] = {"x", "dt", "A", "B", "C", "D", "initial_state"};

void expect_same(const Result& a, const Result& b, double tol) {
  EXPECT_LE(max_rel_error(a.y, b.y), tol) << "y";
  EXPECT_LE(max_rel_error(a.fs, b.fs), tol) << "final_state";
  for (size_t i = 0; i < 7; ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << kInputNames[i];
    if (a.grads[i].defined()) {
      EXPECT_LE(max_rel_error(a.grads[i], b.grads[i]), tol) << "d" << kInputNames[i];
    }
  }
}

class SsdFormsAgree : public ::testing::TestWithParam<Case> {};

void expect_forms_agree(const Case& c, DType dtype, double tol) {
  Inputs in = make_inputs(c, dtype, 7);
  Result chunk = forward_backward(in, chunkwise(c), 11);
  Result rec = forward_backward(in, recurrent(c), 11);
  EXPECT_EQ(chunk.y.shape(), (Shape{c.B, c.T, c.H, c.P}));
  EXPECT_EQ(chunk.fs.shape(), (Shape{c.B, c.H, c.P, c.N}));
  EXPECT_EQ(chunk.y.dtype(), dtype);
  for (size_t i = 0; i < 7; ++i) {
    const bool present = i < 5 || (i == 5 ? c.with_D : c.with_h0);
    EXPECT_EQ(chunk.grads[i].defined(), present) << kInputNames[i];
  }
  expect_same(chunk, rec, tol);
}

Inputs widened(const Inputs& in);
std::vector<Tensor> all_of(const Result& r);
const char* kOutputNames[9] = {"y", "final_state", "dx", "ddt", "dA", "dB", "dC", "dD", "dinitial_state"};

// f64: the two forms element by element. f32: each form norm-wise against the f64 recurrent form on the same
// (f32-rounded) inputs and cotangents, so that only the arithmetic differs. (Element by element two f32 runs
// of a long sum differ by their own rounding: dA sums every token's log-decay gradient, and the f32 recurrent
// form's dA is 3.5e-5 off the exact value at T = 150 by max_rel_error, the chunkwise form's 5e-6.)
TEST_P(SsdFormsAgree, F64) { expect_forms_agree(GetParam(), DType::f64, 1e-10); }
TEST_P(SsdFormsAgree, F32) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, DType::f32, 7), in64 = widened(in);
  Generator gen(11);
  const Tensor gy = Tensor::randn(in.x.shape(), gen, DType::f32), gs = Tensor::randn({c.B, c.H, c.P, c.N}, gen, DType::f32);
  const Result exact =
      forward_backward(in64, recurrent(c), kernel::to_dtype(gy, DType::f64), kernel::to_dtype(gs, DType::f64));
  testing::expect_normwise(all_of(forward_backward(in, chunkwise(c), gy, gs)), all_of(exact), kOutputNames, 1e-5,
                           "f32 chunkwise", c.name);
  testing::expect_normwise(all_of(forward_backward(in, recurrent(c), gy, gs)), all_of(exact), kOutputNames, 1e-5,
                           "f32 recurrent", c.name);
}

// name, B, T, H, P, G, N, chunk, D, initial state
INSTANTIATE_TEST_SUITE_P(
    Shapes, SsdFormsAgree,
    ::testing::Values(Case{"odd_T_groups", 2, 11, 4, 3, 2, 5, 4, true, true},  // 1 < G < H, T not a multiple
                      Case{"one_group", 2, 11, 3, 4, 1, 3, 4, false, false},   // G = 1: every head shares B, C
                      Case{"group_per_head", 1, 13, 3, 2, 3, 4, 5, true, false},  // G = H
                      Case{"T_below_chunk", 2, 5, 2, 3, 1, 4, 8, true, true},
                      Case{"T_one", 2, 1, 2, 3, 2, 4, 4, true, true},  // one token (a decode step)
                      Case{"T_one_plain", 1, 1, 1, 2, 1, 3, 4, false, false},
                      Case{"chunk_one", 1, 6, 2, 2, 1, 3, 1, true, true},
                      Case{"defaults_long", 1, 150, 4, 8, 2, 6, 64, true, true},  // default chunk, partial chunk
                      Case{"many_tasks_threads", 2, 100, 6, 16, 3, 24, 16, true, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- finite differences (f64) of every input, both forms ----
void expect_gradcheck(const Case& c, SsdForm form, double dt_lo = 0.05, double dt_hi = 1.2) {
  Inputs in = make_inputs(c, DType::f64, 3, dt_lo, dt_hi);
  SsdOptions opts{form, c.chunk};
  GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& x) {
        SsdOutput out = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], opts);
        return std::vector<Tensor>{out.y, out.final_state};
      },
      in.list());
  int64_t expected = c.B * c.T * c.H * c.P + c.B * c.T * c.H + c.H + 2 * c.B * c.T * c.G * c.N;
  if (c.with_D) expected += c.H;
  if (c.with_h0) expected += c.B * c.H * c.P * c.N;
  EXPECT_EQ(r.elements_checked, expected);
  EXPECT_LE(r.max_error, 1e-6) << ssd_form_name(form) << ": " << r.worst;
}

TEST(SsdGradcheck, ChunkwiseAllInputs) { expect_gradcheck({"", 2, 7, 4, 3, 2, 2, 3, true, true}, SsdForm::chunkwise); }
TEST(SsdGradcheck, RecurrentAllInputs) { expect_gradcheck({"", 2, 7, 4, 3, 2, 2, 3, true, true}, SsdForm::recurrent); }
TEST(SsdGradcheck, OneGroupNoOptionalInputs) {
  expect_gradcheck({"", 1, 6, 2, 2, 1, 3, 4, false, false}, SsdForm::chunkwise);
  expect_gradcheck({"", 1, 6, 2, 2, 1, 3, 4, false, false}, SsdForm::recurrent);
}
TEST(SsdGradcheck, ChunkwiseShortT) { expect_gradcheck({"", 1, 3, 2, 3, 2, 2, 8, true, true}, SsdForm::chunkwise); }
TEST(SsdGradcheck, DecodeStep) {
  expect_gradcheck({"", 2, 1, 2, 3, 1, 2, 4, true, true}, SsdForm::recurrent);
  expect_gradcheck({"", 2, 1, 2, 3, 1, 2, 4, true, true}, SsdForm::chunkwise);
}
// Δ small (1e-4 … 1e-3: decays within 1e-3 of 1) and large (5 … 10: down to e^{−15} per step).
TEST(SsdGradcheck, SmallAndLargeDelta) {
  for (SsdForm form : {SsdForm::chunkwise, SsdForm::recurrent}) {
    expect_gradcheck({"", 1, 6, 2, 2, 2, 3, 4, true, true}, form, 1e-4, 1e-3);
    expect_gradcheck({"", 1, 6, 2, 2, 2, 3, 4, true, true}, form, 5.0, 10.0);
  }
}

// Gradients through final_state alone (y gets no cotangent) and through y alone.
TEST(SsdGradcheck, EachOutputAlone) {
  Case c{"", 1, 5, 2, 3, 1, 2, 2, true, true};
  Inputs in = make_inputs(c, DType::f64, 5);
  for (SsdForm form : {SsdForm::chunkwise, SsdForm::recurrent}) {
    for (int which = 0; which < 2; ++which) {
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& x) {
            SsdOutput out = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], {form, 2});
            return std::vector<Tensor>{which == 0 ? out.y : out.final_state};
          },
          in.list());
      EXPECT_LE(r.max_error, 1e-6) << ssd_form_name(form) << " output " << which << ": " << r.worst;
    }
  }
}

// ---- decoding: token by token, carrying the state, equals the full sequence; so does a split ----
TEST(Ssd, DecodeTokenByTokenAndSplitEqualFullSequence) {
  Case c{"", 2, 9, 4, 3, 2, 4, 4, true, true};
  Inputs in = make_inputs(c, DType::f64, 13);
  auto part = [&](const Tensor& x, int64_t s, int64_t n) { return kernel::narrow(x, 1, s, n); };
  for (SsdForm form : {SsdForm::chunkwise, SsdForm::recurrent}) {
    SsdOutput full = ssd(in.x, in.dt, in.A, in.Bm, in.Cm, in.D, in.h0, {form, 4});
    Tensor state = in.h0;
    for (int64_t t = 0; t < c.T; ++t) {
      SsdOutput step = ssd(part(in.x, t, 1), part(in.dt, t, 1), in.A, part(in.Bm, t, 1), part(in.Cm, t, 1), in.D,
                           state, {SsdForm::recurrent, 4});
      EXPECT_LE(max_rel_error(step.y, part(full.y, t, 1)), 1e-13) << ssd_form_name(form) << " t=" << t;
      state = step.final_state;
    }
    EXPECT_LE(max_rel_error(state, full.final_state), 1e-13) << ssd_form_name(form);
    // A prefill of 5 tokens then the other 4, carrying the state.
    SsdOutput a = ssd(part(in.x, 0, 5), part(in.dt, 0, 5), in.A, part(in.Bm, 0, 5), part(in.Cm, 0, 5), in.D, in.h0,
                      {form, 4});
    SsdOutput b = ssd(part(in.x, 5, 4), part(in.dt, 5, 4), in.A, part(in.Bm, 5, 4), part(in.Cm, 5, 4), in.D,
                      a.final_state, {form, 4});
    EXPECT_LE(max_rel_error(a.y, part(full.y, 0, 5)), 1e-13) << ssd_form_name(form);
    EXPECT_LE(max_rel_error(b.y, part(full.y, 5, 4)), 1e-13) << ssd_form_name(form);
    EXPECT_LE(max_rel_error(b.final_state, full.final_state), 1e-13) << ssd_form_name(form);
  }
}

// ---- Δ from 1e-4 to 10 and per-step log-decays Δ·A from −1e-7 to −30 ----
Inputs widened(const Inputs& in) {
  Inputs w;
  const std::vector<const Tensor*> src = {&in.x, &in.dt, &in.A, &in.Bm, &in.Cm, &in.D, &in.h0};
  const std::vector<Tensor*> dst = {&w.x, &w.dt, &w.A, &w.Bm, &w.Cm, &w.D, &w.h0};
  for (size_t i = 0; i < src.size(); ++i) *dst[i] = testing::cast_or_none(*src[i], DType::f64);
  return w;
}

std::vector<Tensor> all_of(const Result& r) {
  std::vector<Tensor> t{r.y, r.fs};
  t.insert(t.end(), r.grads.begin(), r.grads.end());
  return t;
}

// Δ log-uniform in [dt_lo, dt_hi] per element.
Tensor log_uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& e : v) e = std::exp(std::log(lo) + gen.uniform() * std::log(hi / lo));
  return Tensor::from_vector(v, shape, dtype);
}

// Over a chunk of 64 the cumulative log-decays reach −1920: exp(−c) would overflow in any precision, the
// differences taken in the direction of time do not. Every output and gradient is finite and, norm-wise
// against the f64 recurrent form on the same (f32-rounded) inputs, each f32 form is within 1e-5 and the f64
// chunkwise form within 1e-12.
TEST(Ssd, ExtremeDeltaStaysFiniteAndAgrees) {
  struct Range {
    double dt_lo, dt_hi, a_lo, a_hi;
  };
  // Δ·A: [−1e-7, −1e-3] (decays ≈ 1); [−30, −10] (forgets at once); Δ over [1e-4, 10] with A in [−3, −1e-3]:
  // every scale from −1e-7 to −30 at once.
  for (const Range& rg : {Range{1e-4, 1e-3, -1.0, -1e-3}, Range{5.0, 10.0, -3.0, -2.0}, Range{1e-4, 10.0, -3.0, -1e-3}}) {
    for (int64_t chunk : {64, 7}) {
      Case c{"", 1, 80, 4, 6, 2, 5, chunk, true, true};
      Inputs in = make_inputs(c, DType::f32, 17, 0.1, 0.2, rg.a_lo, rg.a_hi);
      Generator gen(19);
      in.dt = log_uniform({c.B, c.T, c.H}, rg.dt_lo, rg.dt_hi, gen, DType::f32);
      const Inputs in64 = widened(in);
      Generator cot(23);
      const Tensor gy = Tensor::randn(in.x.shape(), cot, DType::f32),
                   gs = Tensor::randn({c.B, c.H, c.P, c.N}, cot, DType::f32);
      const Tensor gy64 = kernel::to_dtype(gy, DType::f64), gs64 = kernel::to_dtype(gs, DType::f64);
      const Result exact = forward_backward(in64, recurrent(c), gy64, gs64);
      const Result chunk32 = forward_backward(in, chunkwise(c), gy, gs), rec32 = forward_backward(in, recurrent(c), gy, gs),
                   chunk64 = forward_backward(in64, chunkwise(c), gy64, gs64);
      for (const Result* r : {&chunk32, &rec32, &chunk64, &exact}) {
        for (const Tensor& t : all_of(*r)) EXPECT_TRUE(!t.defined() || all_finite(t)) << rg.dt_lo << " " << rg.dt_hi;
      }
      std::ostringstream name;
      name << "dt in [" << rg.dt_lo << ", " << rg.dt_hi << "], A in [" << rg.a_lo << ", " << rg.a_hi << "], chunk "
           << chunk;
      testing::expect_normwise(all_of(chunk32), all_of(exact), kOutputNames, 1e-5, "f32 chunkwise", name.str());
      testing::expect_normwise(all_of(rec32), all_of(exact), kOutputNames, 1e-5, "f32 recurrent", name.str());
      testing::expect_normwise(all_of(chunk64), all_of(exact), kOutputNames, 1e-12, "f64 chunkwise", name.str());
    }
  }
  // A decay of e^{−30} per step forgets: the final state is the last token's Δ x Bᵀ alone (to 1e-13).
  Case c{"", 1, 6, 1, 2, 1, 3, 4, false, true};
  Inputs in = make_inputs(c, DType::f64, 29, 10.0, 10.0 + 1e-12, -3.0, -3.0 + 1e-12);
  SsdOutput out = ssd(in.x, in.dt, in.A, in.Bm, in.Cm, Tensor(), in.h0);
  Tensor last = kernel::matmul(kernel::reshape(kernel::narrow(in.x, 1, 5, 1), {2, 1}),
                               kernel::reshape(kernel::narrow(in.Bm, 1, 5, 1), {1, 3}));
  EXPECT_LE(max_rel_error(kernel::reshape(out.final_state, {2, 3}), mul(last, in.dt.to_doubles()[5])), 1e-12);
}

// ---- a value by hand: P = N = 1, two tokens ----
TEST(Ssd, HandComputedValues) {
  auto t4 = [](std::vector<double> v) {
    return Tensor::from_vector(v, {1, static_cast<int64_t>(v.size()), 1, 1}, DType::f64);
  };
  Tensor x = t4({1.0, -2.0}), Bm = t4({3.0, 0.5}), Cm = t4({0.25, 4.0});
  Tensor dt = Tensor::from_vector({0.5, 2.0}, {1, 2, 1}, DType::f64);
  Tensor A = Tensor::from_vector({-0.8}, {1}, DType::f64), D = Tensor::from_vector({1.5}, {1}, DType::f64);
  Tensor h0 = Tensor::from_vector({2.0}, {1, 1, 1, 1}, DType::f64);
  const double s1 = std::exp(0.5 * -0.8) * 2.0 + 0.5 * 1.0 * 3.0;
  const double s2 = std::exp(2.0 * -0.8) * s1 + 2.0 * -2.0 * 0.5;
  for (SsdForm form : {SsdForm::chunkwise, SsdForm::recurrent}) {
    SsdOutput out = ssd(x, dt, A, Bm, Cm, D, h0, {form, 2});
    std::vector<double> y = out.y.to_doubles();
    EXPECT_NEAR(y[0], s1 * 0.25 + 1.5 * 1.0, 1e-14) << ssd_form_name(form);
    EXPECT_NEAR(y[1], s2 * 4.0 + 1.5 * -2.0, 1e-14) << ssd_form_name(form);
    EXPECT_NEAR(out.final_state.to_doubles()[0], s2, 1e-14) << ssd_form_name(form);
  }
}

// Only the gradients asked for are returned; the others stay undefined.
TEST(Ssd, ComputesOnlyNeededGradients) {
  Case c{"", 1, 7, 4, 3, 2, 4, 4, true, true};
  Inputs in = make_inputs(c, DType::f64, 37);
  Result all = forward_backward(in, chunkwise(c), 41);
  for (int which = 0; which < 7; ++which) {
    std::vector<Tensor> x;
    for (const Tensor& t : in.list()) x.push_back(kernel::clone(t));
    set_requires_grad(x[which]);
    SsdOutput out = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], chunkwise(c));
    Generator gen(41);
    Tensor gy = Tensor::randn(out.y.shape(), gen, DType::f64), gs = Tensor::randn(out.final_state.shape(), gen, DType::f64);
    backward({out.y, out.final_state}, {gy, gs});
    for (int i = 0; i < 7; ++i) EXPECT_EQ(grad_of(x[i]).defined(), i == which) << which;
    EXPECT_LE(max_rel_error(grad_of(x[which]), all.grads[which]), 1e-14) << kInputNames[which];
  }
}

// Strided inputs (x as a permuted view, B a narrowed one) give the same results as contiguous ones.
TEST(Ssd, AcceptsStridedInputs) {
  Case c{"", 2, 6, 2, 3, 1, 4, 4, true, true};
  Inputs in = make_inputs(c, DType::f64, 43);
  Inputs strided = in;
  strided.x = kernel::permute(kernel::contiguous(kernel::permute(in.x, {0, 2, 1, 3})), {0, 2, 1, 3});
  ASSERT_FALSE(strided.x.is_contiguous());
  strided.Bm = kernel::narrow(concat({in.Bm, in.Cm}, 3), 3, 0, c.N);
  ASSERT_FALSE(strided.Bm.is_contiguous());
  expect_same(forward_backward(in, chunkwise(c), 47), forward_backward(strided, chunkwise(c), 47), 1e-15);
}

// Through the op registry, as `./train op ssd` runs it.
TEST(Ssd, RegistryEntry) {
  const OpSpec* op = find_op("ssd");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"y", "final_state"}));
  ASSERT_EQ(op->inputs.size(), 7u);
  EXPECT_TRUE(op->inputs[5].optional);
  EXPECT_TRUE(op->inputs[6].optional);
  Generator gen(53);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  const SsdOutput ref = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], {SsdForm::recurrent, 64});
  for (const char* form : {"chunkwise", "recurrent"}) {
    std::vector<Tensor> y = op->forward(x, OpAttrs::parse("ssd", op->attrs, {{"form", form}, {"chunk", "3"}}));
    ASSERT_EQ(y.size(), 2u);
    EXPECT_LE(max_rel_error(y[0], ref.y), 1e-12) << form;
    EXPECT_LE(max_rel_error(y[1], ref.final_state), 1e-12) << form;
  }
  x[5] = Tensor();
  x[6] = Tensor();
  std::vector<Tensor> y = op->forward(x, OpAttrs::parse("ssd", op->attrs, {}));
  EXPECT_LE(max_rel_error(y[0], ssd(x[0], x[1], x[2], x[3], x[4], {}, {}, {SsdForm::recurrent}).y), 1e-12);
  EXPECT_THROW(op->forward(x, OpAttrs::parse("ssd", op->attrs, {{"form", "parallel"}})), std::invalid_argument);
}

// ---- errors ----
std::string error_of(const Inputs& in, SsdOptions opts = {}) {
  return testing::error_message_of([&] { ssd(in.x, in.dt, in.A, in.Bm, in.Cm, in.D, in.h0, opts); });
}

TEST(Ssd, ShapeErrorsNameTheShapes) {
  auto t = [](Shape s) { return Tensor::zeros(s, DType::f32); };
  const Inputs ok{t({2, 5, 4, 3}), t({2, 5, 4}), t({4}), t({2, 5, 2, 6}), t({2, 5, 2, 6}), t({4}), t({2, 4, 3, 6})};
  EXPECT_EQ(error_of(ok), "no error");
  Inputs bad = ok;
  bad.Bm = t({2, 5, 3, 6});
  bad.Cm = t({2, 5, 3, 6});
  std::string e = error_of(bad);
  EXPECT_NE(e.find("multiple of the groups"), std::string::npos) << e;
  EXPECT_NE(e.find("B [2, 5, 3, 6]"), std::string::npos) << e;
  bad = ok;
  bad.Cm = t({2, 5, 2, 5});
  e = error_of(bad);
  EXPECT_NE(e.find("C must be [B, T, G, N] (B's shape)"), std::string::npos) << e;
  bad = ok;
  bad.dt = t({2, 5, 4, 1});
  EXPECT_NE(error_of(bad).find("dt must be [B, T, H]"), std::string::npos);
  bad = ok;
  bad.A = t({2});
  EXPECT_NE(error_of(bad).find("A must be [H]"), std::string::npos);
  bad = ok;
  bad.D = t({4, 1});
  EXPECT_NE(error_of(bad).find("D must be [H]"), std::string::npos);
  bad = ok;
  bad.h0 = t({2, 4, 6, 3});
  EXPECT_NE(error_of(bad).find("initial_state must be [B, H, P, N]"), std::string::npos);
  bad = ok;
  bad.Bm = t({2, 4, 2, 6});
  bad.Cm = t({2, 4, 2, 6});
  EXPECT_NE(error_of(bad).find("B differs from x"), std::string::npos);
  bad = ok;
  bad.dt = Tensor::zeros({2, 5, 4}, DType::f64);
  EXPECT_NE(error_of(bad).find("dtype"), std::string::npos);
  bad = ok;
  bad.x = t({2, 5, 12});
  EXPECT_NE(error_of(bad).find("x must have 4 dimensions"), std::string::npos);
  bad = ok;
  bad.Cm = Tensor();
  EXPECT_NE(error_of(bad).find("must all be given"), std::string::npos);
  EXPECT_NE(error_of(ok, {SsdForm::chunkwise, 0}).find("chunk must be positive"), std::string::npos);
}

}  // namespace
}  // namespace seqlab
