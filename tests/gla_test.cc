// Gated linear attention: the chunkwise form against the recurrent form (outputs, final state and
// every gradient, f32 and f64, with and without gv and an initial state, on odd shapes),
// finite-difference gradients of every input for both forms, token-by-token decoding, strong and
// weak gates, a hand-computed value, the registry entry and shape errors.
#include "layers/scan/gla.h"

#include <gtest/gtest.h>

#include <algorithm>
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
  int64_t B, T, H, dk, dv, chunk, sub_chunk;
  bool with_gv, with_h0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

struct Inputs {
  Tensor q, k, v, g, gv, h0;
  std::vector<Tensor> list() const { return {q, k, v, g, gv, h0}; }
};

// Log-gates uniform in [g_lo, g_hi] (≤ 0).
Inputs make_inputs(const Case& c, DType dtype, uint64_t seed, double g_lo = -1.5, double g_hi = -0.02) {
  Generator gen(seed);
  Inputs in;
  in.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.k = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  in.g = Tensor::rand({c.B, c.T, c.H, c.dk}, gen, dtype, g_lo, g_hi);
  if (c.with_gv) in.gv = Tensor::rand({c.B, c.T, c.H, c.dv}, gen, dtype, -1.0, -0.02);
  if (c.with_h0) in.h0 = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype);
  return in;
}

struct Result {
  Tensor o, fs;
  std::vector<Tensor> grads;  // q, k, v, g, gv, h0 (undefined for absent inputs)
};

// Forward, then one backward with the cotangents go (for o) and gs (for final_state).
Result forward_backward(const Inputs& in, const GlaOptions& opts, const Tensor& go, const Tensor& gs) {
  std::vector<Tensor> x;
  for (const Tensor& t : in.list()) x.push_back(t.defined() ? set_requires_grad(t.detach()) : t);
  GlaOutput out = gla(x[0], x[1], x[2], x[3], x[4], x[5], opts);
  backward({out.o, out.final_state}, {go, gs});
  Result r{out.o.detach(), out.final_state.detach(), {}};
  for (const Tensor& t : x) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

// The same with random cotangents drawn from `seed`.
Result forward_backward(const Inputs& in, const GlaOptions& opts, uint64_t seed) {
  Generator gen(seed);
  const DType dt = in.q.dtype();
  Tensor go = Tensor::randn({in.q.size(0), in.q.size(1), in.q.size(2), in.v.size(3)}, gen, dt);
  Tensor gs = Tensor::randn({in.q.size(0), in.q.size(2), in.q.size(3), in.v.size(3)}, gen, dt);
  return forward_backward(in, opts, go, gs);
}

GlaOptions chunkwise(const Case& c) { return {GlaForm::chunkwise, c.chunk, c.sub_chunk, 0.0}; }
GlaOptions recurrent(const Case& c) { return {GlaForm::recurrent, c.chunk, c.sub_chunk, 0.0}; }

const char* kInputNames[6] = {"q", "k", "v", "g", "gv", "initial_state"};

void expect_same(const Result& a, const Result& b, double tol) {
  EXPECT_LE(max_rel_error(a.o, b.o), tol) << "o";
  EXPECT_LE(max_rel_error(a.fs, b.fs), tol) << "final_state";
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << kInputNames[i];
    if (a.grads[i].defined()) {
      EXPECT_LE(max_rel_error(a.grads[i], b.grads[i]), tol) << "d" << kInputNames[i];
    }
  }
}

class GlaFormsAgree : public ::testing::TestWithParam<Case> {};

void expect_forms_agree(const Case& c, DType dtype, double tol) {
  Inputs in = make_inputs(c, dtype, 7);
  Result chunk = forward_backward(in, chunkwise(c), 11);
  Result rec = forward_backward(in, recurrent(c), 11);
  EXPECT_EQ(chunk.o.shape(), (Shape{c.B, c.T, c.H, c.dv}));
  EXPECT_EQ(chunk.fs.shape(), (Shape{c.B, c.H, c.dk, c.dv}));
  EXPECT_EQ(chunk.o.dtype(), dtype);
  for (size_t i = 0; i < 6; ++i) {
    const bool present = i < 4 || (i == 4 ? c.with_gv : c.with_h0);
    EXPECT_EQ(chunk.grads[i].defined(), present) << kInputNames[i];
  }
  expect_same(chunk, rec, tol);
}

TEST_P(GlaFormsAgree, F64) { expect_forms_agree(GetParam(), DType::f64, 1e-10); }
TEST_P(GlaFormsAgree, F32) { expect_forms_agree(GetParam(), DType::f32, 1e-5); }

// name, B, T, H, dk, dv, chunk, sub_chunk, gv, initial state
INSTANTIATE_TEST_SUITE_P(
    Shapes, GlaFormsAgree,
    ::testing::Values(Case{"odd_T_gv_h0", 2, 11, 2, 3, 5, 4, 2, true, true},  // T not a multiple of the chunk
                      Case{"odd_T_plain", 2, 11, 2, 3, 5, 4, 2, false, false},
                      Case{"odd_T_h0_only", 1, 13, 3, 4, 3, 5, 2, false, true},  // sub-chunk not dividing the chunk
                      Case{"odd_T_gv_only", 1, 13, 3, 4, 3, 5, 3, true, false},
                      Case{"T_below_chunk", 2, 5, 2, 3, 4, 8, 3, true, true},  // T smaller than one chunk
                      Case{"T_one", 2, 1, 2, 3, 4, 4, 2, true, true},          // one token (a decode step)
                      Case{"T_one_plain", 1, 1, 1, 2, 3, 4, 2, false, false},
                      Case{"sub_chunk_one", 1, 9, 2, 3, 2, 4, 1, true, true},       // every sub-chunk one token
                      Case{"sub_chunk_is_chunk", 1, 9, 2, 3, 2, 4, 4, true, true},  // no secondary tiling
                      Case{"sub_chunk_beyond_chunk", 1, 9, 2, 3, 2, 4, 9, false, true},
                      Case{"chunk_one", 1, 6, 2, 2, 3, 1, 1, true, true},
                      Case{"defaults_long", 1, 150, 2, 8, 6, 64, 16, true, true},  // default tiling, partial chunk
                      Case{"many_tasks_threads", 2, 100, 3, 16, 24, 16, 4, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- finite differences (f64) of every input, both forms ----
void expect_gradcheck(const Case& c, GlaForm form) {
  Inputs in = make_inputs(c, DType::f64, 3);
  GlaOptions opts{form, c.chunk, c.sub_chunk, 0.0};
  GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& x) {
        GlaOutput out = gla(x[0], x[1], x[2], x[3], x[4], x[5], opts);
        return std::vector<Tensor>{out.o, out.final_state};
      },
      in.list());
  int64_t expected = 3 * c.B * c.T * c.H * c.dk + c.B * c.T * c.H * c.dv;
  if (c.with_gv) expected += c.B * c.T * c.H * c.dv;
  if (c.with_h0) expected += c.B * c.H * c.dk * c.dv;
  EXPECT_EQ(r.elements_checked, expected);
  EXPECT_LE(r.max_error, 1e-6) << gla_form_name(form) << ": " << r.worst;
}

TEST(GlaGradcheck, ChunkwiseAllInputs) { expect_gradcheck({"", 2, 7, 2, 3, 4, 3, 2, true, true}, GlaForm::chunkwise); }
TEST(GlaGradcheck, RecurrentAllInputs) { expect_gradcheck({"", 2, 7, 2, 3, 4, 3, 2, true, true}, GlaForm::recurrent); }
TEST(GlaGradcheck, ChunkwiseNoOptionalInputs) {
  expect_gradcheck({"", 1, 6, 2, 4, 3, 4, 3, false, false}, GlaForm::chunkwise);
}
TEST(GlaGradcheck, RecurrentNoOptionalInputs) {
  expect_gradcheck({"", 1, 6, 2, 4, 3, 4, 3, false, false}, GlaForm::recurrent);
}
TEST(GlaGradcheck, ChunkwiseShortT) { expect_gradcheck({"", 1, 3, 2, 3, 2, 8, 2, true, true}, GlaForm::chunkwise); }
TEST(GlaGradcheck, DecodeStep) {
  expect_gradcheck({"", 2, 1, 2, 3, 2, 4, 2, true, true}, GlaForm::recurrent);
  expect_gradcheck({"", 2, 1, 2, 3, 2, 4, 2, true, true}, GlaForm::chunkwise);
}

// Gradients through final_state alone (o gets no cotangent) and through o alone.
TEST(GlaGradcheck, EachOutputAlone) {
  Case c{"", 1, 5, 2, 3, 2, 2, 1, true, true};
  Inputs in = make_inputs(c, DType::f64, 5);
  for (GlaForm form : {GlaForm::chunkwise, GlaForm::recurrent}) {
    for (int which = 0; which < 2; ++which) {
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& x) {
            GlaOutput out = gla(x[0], x[1], x[2], x[3], x[4], x[5], {form, 2, 1, 0.0});
            return std::vector<Tensor>{which == 0 ? out.o : out.final_state};
          },
          in.list());
      EXPECT_LE(r.max_error, 1e-6) << gla_form_name(form) << " output " << which << ": " << r.worst;
    }
  }
}

// ---- decoding: token by token, carrying the state, equals the full sequence ----
TEST(Gla, DecodeTokenByTokenEqualsFullSequence) {
  Case c{"", 2, 9, 3, 4, 3, 4, 2, true, true};
  Inputs in = make_inputs(c, DType::f64, 13);
  for (GlaForm form : {GlaForm::chunkwise, GlaForm::recurrent}) {
    GlaOutput full = gla(in.q, in.k, in.v, in.g, in.gv, in.h0, {form, 4, 2, 0.0});
    Tensor state = in.h0;
    for (int64_t t = 0; t < c.T; ++t) {
      auto at = [&](const Tensor& x) { return kernel::narrow(x, 1, t, 1); };
      GlaOutput step = gla(at(in.q), at(in.k), at(in.v), at(in.g), at(in.gv), state, {GlaForm::recurrent, 4, 2, 0.0});
      EXPECT_LE(max_rel_error(step.o, at(full.o)), 1e-13) << gla_form_name(form) << " t=" << t;
      state = step.final_state;
    }
    EXPECT_LE(max_rel_error(state, full.final_state), 1e-13) << gla_form_name(form);
  }
  // A prefill of 5 tokens (chunkwise) then the rest (chunkwise), carrying the state.
  auto part = [&](const Tensor& x, int64_t s, int64_t n) { return kernel::narrow(x, 1, s, n); };
  GlaOutput full = gla(in.q, in.k, in.v, in.g, in.gv, in.h0, {GlaForm::chunkwise, 4, 2, 0.0});
  GlaOutput a = gla(part(in.q, 0, 5), part(in.k, 0, 5), part(in.v, 0, 5), part(in.g, 0, 5), part(in.gv, 0, 5), in.h0,
                    {GlaForm::chunkwise, 4, 2, 0.0});
  GlaOutput b = gla(part(in.q, 5, 4), part(in.k, 5, 4), part(in.v, 5, 4), part(in.g, 5, 4), part(in.gv, 5, 4),
                    a.final_state, {GlaForm::chunkwise, 4, 2, 0.0});
  EXPECT_LE(max_rel_error(a.o, part(full.o, 0, 5)), 1e-13);
  EXPECT_LE(max_rel_error(b.o, part(full.o, 5, 4)), 1e-13);
  EXPECT_LE(max_rel_error(b.final_state, full.final_state), 1e-13);
}

// ---- norm-wise comparison against the f64 recurrent form ----
const char* kOutputNames[8] = {"o", "final_state", "dq", "dk", "dv", "dg", "dgv", "dinitial_state"};

// The f64 copy of f32 inputs (the same values), so that an f64 reference differs only in arithmetic.
Inputs widened(const Inputs& in) {
  Inputs w;
  std::vector<const Tensor*> src = {&in.q, &in.k, &in.v, &in.g, &in.gv, &in.h0};
  std::vector<Tensor*> dst = {&w.q, &w.k, &w.v, &w.g, &w.gv, &w.h0};
  for (size_t i = 0; i < src.size(); ++i) *dst[i] = testing::cast_or_none(*src[i], DType::f64);
  return w;
}

// Every output and gradient of `got` (the run `run`, at `at`) within tol of `want`, norm-wise
// (testing::expect_normwise); each error also goes to worst[i] (8 entries, in kOutputNames' order) where given.
void expect_normwise(const Result& got, const Result& want, double tol, const std::string& run, const std::string& at,
                     testing::WorstError* worst = nullptr) {
  auto all = [](const Result& r) {
    std::vector<Tensor> t{r.o, r.fs};
    t.insert(t.end(), r.grads.begin(), r.grads.end());
    return t;
  };
  testing::expect_normwise(all(got), all(want), kOutputNames, tol, run, at, worst);
}

// ---- gate range: log-gates from −20 (α ≈ 2e-9) to −1e-6 (α ≈ 1) ----
// Over a chunk of 64 the cumulative log-gates reach −1280: exp(−b) would overflow in any precision, the
// sub-chunk factors do not. Every output and gradient is finite, and, norm-wise against the f64
// recurrent form on the same (f32-rounded) inputs, each f32 form is within 1e-5 and the f64 chunkwise
// form within 1e-12. Strong gates ([−20, −10]) are where the gate gradients of the chunkwise form used to
// cancel (docs/reliability.md, "Numerics at every decay"): before the fix dg was off by 3.2e-2 (f32) and
// 6.6e-11 (f64) norm-wise there, 1.9e3 and 9.0e-6 with gv.
TEST(Gla, ExtremeGatesStayFiniteAndAgree) {
  for (auto [lo, hi] : {std::pair<double, double>{-20.0, -10.0}, {-1e-6, -1e-7}, {-20.0, -1e-6}}) {
    for (bool with_gv : {false, true}) {
      Case c{"", 1, 80, 2, 8, 6, 64, 16, with_gv, true};
      Inputs in = make_inputs(c, DType::f32, 17, lo, hi);
      Generator gen(19);
      if (with_gv) in.gv = Tensor::rand({c.B, c.T, c.H, c.dv}, gen, DType::f32, lo, hi);
      const Inputs in64 = widened(in);
      Generator cot(23);
      const Tensor go = Tensor::randn({c.B, c.T, c.H, c.dv}, cot, DType::f32),
                   gs = Tensor::randn({c.B, c.H, c.dk, c.dv}, cot, DType::f32);
      const Tensor go64 = kernel::to_dtype(go, DType::f64), gs64 = kernel::to_dtype(gs, DType::f64);
      const Result exact = forward_backward(in64, recurrent(c), go64, gs64);
      const Result chunk32 = forward_backward(in, chunkwise(c), go, gs),
                   rec32 = forward_backward(in, recurrent(c), go, gs),
                   chunk64 = forward_backward(in64, chunkwise(c), go64, gs64);
      for (const Result* r : {&chunk32, &rec32, &chunk64, &exact}) {
        EXPECT_TRUE(all_finite(r->o) && all_finite(r->fs)) << lo;
        for (const Tensor& gr : r->grads) EXPECT_TRUE(!gr.defined() || all_finite(gr)) << lo;
      }
      std::ostringstream name;
      name << "gates in [" << lo << ", " << hi << "]" << (with_gv ? " with gv" : "");
      const std::string range = name.str();
      expect_normwise(chunk32, exact, 1e-5, "f32 chunkwise", range);
      expect_normwise(rec32, exact, 1e-5, "f32 recurrent", range);
      expect_normwise(chunk64, exact, 1e-12, "f64 chunkwise", range);
      std::printf("    %s: dg norm-wise error f32 chunkwise %.3g, f32 recurrent %.3g, f64 chunkwise %.3g\n",
                  range.c_str(), testing::norm_rel_error(chunk32.grads[3], exact.grads[3]),
                  testing::norm_rel_error(rec32.grads[3], exact.grads[3]),
                  testing::norm_rel_error(chunk64.grads[3], exact.grads[3]));
    }
  }
  // Strong gates forget: with α = e^{−40} the final state is the last token's kᵀv alone.
  Case c{"", 1, 6, 1, 2, 3, 4, 2, false, true};
  Inputs in = make_inputs(c, DType::f64, 29, -40.0, -40.0 + 1e-9);
  GlaOutput out = gla(in.q, in.k, in.v, in.g, Tensor(), in.h0);
  Tensor kv = kernel::matmul(kernel::reshape(kernel::narrow(in.k, 1, 5, 1), {2, 1}),
                             kernel::reshape(kernel::narrow(in.v, 1, 5, 1), {1, 3}));
  EXPECT_LE(max_rel_error(kernel::reshape(out.final_state, {2, 3}), kv), 1e-15);
}

// ---- numerics at every decay (docs/reliability.md, "Numerics at every decay") ----
// Over the sampled grid of testing::numerics_sweep() — per-step log-gates from −1e-7 to −30 (constant
// −20 and −30, uniform, log-uniform and bimodal mixtures), chunks 1 to 128 with sub-chunks of 1, 4, 16
// and the whole chunk, T from 1 to 300, with and without gv and the initial state, dk ≠ dv — every output
// and gradient of the f32 chunkwise and f32 recurrent forms lies within 1e-5 (norm-wise) of the f64
// recurrent form, and the f64 chunkwise form within 1e-12. All forms run on the same f32-rounded inputs
// and cotangents (widened for f64), so only the arithmetic differs. The worst errors are printed.
TEST(GlaNumerics, EveryDecayChunkAndLength) {
  const char* kRuns[3] = {"f32 chunkwise", "f32 recurrent", "f64 chunkwise"};
  testing::WorstError worst[3][8];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 8; ++i) worst[r][i].what = std::string(kRuns[r]) + " " + kOutputNames[i];
  }
  const std::vector<testing::SweepPoint> points = testing::numerics_sweep();
  for (size_t n = 0; n < points.size(); ++n) {
    const testing::SweepPoint& pt = points[n];
    const int64_t B = 1, H = 2, dk = 3, dv = 5, subs[4] = {pt.chunk, 1, 4, 16};
    const int64_t sub = std::min(pt.chunk, subs[n % 4]);
    Generator gen(1000 + n);
    Inputs in32;
    in32.q = Tensor::randn({B, pt.T, H, dk}, gen, DType::f32);
    in32.k = Tensor::randn({B, pt.T, H, dk}, gen, DType::f32);
    in32.v = Tensor::randn({B, pt.T, H, dv}, gen, DType::f32);
    in32.g = testing::draw_log_decays(pt.decay, {B, pt.T, H, dk}, gen, DType::f32);
    if (pt.with_gv) in32.gv = testing::draw_log_decays(pt.decay, {B, pt.T, H, dv}, gen, DType::f32);
    if (pt.with_h0) in32.h0 = Tensor::randn({B, H, dk, dv}, gen, DType::f32);
    const Tensor go32 = Tensor::randn({B, pt.T, H, dv}, gen, DType::f32);
    const Tensor gs32 = Tensor::randn({B, H, dk, dv}, gen, DType::f32);
    const Inputs in64 = widened(in32);
    const Tensor go64 = kernel::to_dtype(go32, DType::f64), gs64 = kernel::to_dtype(gs32, DType::f64);
    const GlaOptions chunk{GlaForm::chunkwise, pt.chunk, sub, 0.0}, rec{GlaForm::recurrent, pt.chunk, sub, 0.0};
    const Result exact = forward_backward(in64, rec, go64, gs64);
    const std::string at = pt.name() + " sub-chunk " + std::to_string(sub);
    expect_normwise(forward_backward(in32, chunk, go32, gs32), exact, 1e-5, kRuns[0], at, worst[0]);
    expect_normwise(forward_backward(in32, rec, go32, gs32), exact, 1e-5, kRuns[1], at, worst[1]);
    expect_normwise(forward_backward(in64, chunk, go64, gs64), exact, 1e-12, kRuns[2], at, worst[2]);
  }
  std::printf("  worst norm-wise errors against the f64 recurrent form over %zu points:\n", points.size());
  for (const auto& run : worst) {
    for (const testing::WorstError& w : run) w.print();
  }
}

// ---- a value by hand: dk = dv = 1, two tokens, scale 0.5 ----
TEST(Gla, HandComputedValues) {
  auto t4 = [](std::vector<double> x) {
    return Tensor::from_vector(x, {1, static_cast<int64_t>(x.size()), 1, 1}, DType::f64);
  };
  Tensor q = t4({1.0, 2.0}), k = t4({3.0, -1.0}), v = t4({0.5, 4.0}), g = t4({-0.1, -0.7}), gv = t4({-0.2, -0.3});
  Tensor h0 = Tensor::from_vector({2.0}, {1, 1, 1, 1}, DType::f64);
  const double s1 = std::exp(-0.1 - 0.2) * 2.0 + 3.0 * 0.5, s2 = std::exp(-0.7 - 0.3) * s1 + (-1.0) * 4.0;
  for (GlaForm form : {GlaForm::chunkwise, GlaForm::recurrent}) {
    GlaOutput out = gla(q, k, v, g, gv, h0, {form, 2, 1, 0.5});
    std::vector<double> o = out.o.to_doubles();
    EXPECT_NEAR(o[0], 0.5 * 1.0 * s1, 1e-14) << gla_form_name(form);
    EXPECT_NEAR(o[1], 0.5 * 2.0 * s2, 1e-14) << gla_form_name(form);
    EXPECT_NEAR(out.final_state.to_doubles()[0], s2, 1e-14) << gla_form_name(form);
  }
  // Default scale: 1/√dk.
  Case c{"", 1, 5, 2, 4, 3, 4, 2, false, false};
  Inputs in = make_inputs(c, DType::f64, 31);
  EXPECT_LE(max_rel_error(gla(in.q, in.k, in.v, in.g).o,
                          gla(in.q, in.k, in.v, in.g, {}, {}, {GlaForm::chunkwise, 64, 16, 0.5}).o),
            1e-15);
}

// Only the gradients asked for are returned; the others stay undefined.
TEST(Gla, ComputesOnlyNeededGradients) {
  Case c{"", 1, 7, 2, 3, 4, 4, 2, true, true};
  Inputs in = make_inputs(c, DType::f64, 37);
  Result all = forward_backward(in, chunkwise(c), 41);
  for (int which = 0; which < 6; ++which) {
    std::vector<Tensor> x;
    for (const Tensor& t : in.list()) x.push_back(kernel::clone(t));
    set_requires_grad(x[which]);
    GlaOutput out = gla(x[0], x[1], x[2], x[3], x[4], x[5], chunkwise(c));
    Generator gen(41);
    Tensor go = Tensor::randn(out.o.shape(), gen, DType::f64),
           gs = Tensor::randn(out.final_state.shape(), gen, DType::f64);
    backward({out.o, out.final_state}, {go, gs});
    for (int i = 0; i < 6; ++i) EXPECT_EQ(grad_of(x[i]).defined(), i == which) << which;
    EXPECT_LE(max_rel_error(grad_of(x[which]), all.grads[which]), 1e-14) << kInputNames[which];
  }
}

// Strided inputs (q as a permuted view) give the same results as contiguous ones.
TEST(Gla, AcceptsStridedInputs) {
  Case c{"", 2, 6, 2, 3, 4, 4, 2, true, true};
  Inputs in = make_inputs(c, DType::f64, 43);
  Inputs strided = in;
  strided.q = kernel::permute(kernel::contiguous(kernel::permute(in.q, {0, 2, 1, 3})), {0, 2, 1, 3});
  ASSERT_FALSE(strided.q.is_contiguous());
  expect_same(forward_backward(in, chunkwise(c), 47), forward_backward(strided, chunkwise(c), 47), 1e-15);
}

// Through the op registry, as `./train op gla` runs it.
TEST(Gla, RegistryEntry) {
  const OpSpec* op = find_op("gla");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"o", "final_state"}));
  ASSERT_EQ(op->inputs.size(), 6u);
  EXPECT_TRUE(op->inputs[4].optional);
  EXPECT_TRUE(op->inputs[5].optional);
  Generator gen(53);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  for (const char* form : {"chunkwise", "recurrent"}) {
    OpAttrs attrs =
        OpAttrs::parse("gla", op->attrs, {{"form", form}, {"chunk", "4"}, {"sub_chunk", "3"}, {"scale", "0.7"}});
    std::vector<Tensor> y = op->forward(x, attrs);
    GlaOutput ref = gla(x[0], x[1], x[2], x[3], x[4], x[5], {GlaForm::recurrent, 64, 16, 0.7});
    ASSERT_EQ(y.size(), 2u);
    EXPECT_LE(max_rel_error(y[0], ref.o), 1e-12) << form;
    EXPECT_LE(max_rel_error(y[1], ref.final_state), 1e-12) << form;
  }
  // Absent optional inputs.
  x[4] = Tensor();
  x[5] = Tensor();
  std::vector<Tensor> y = op->forward(x, OpAttrs::parse("gla", op->attrs, {}));
  EXPECT_LE(max_rel_error(y[0], gla(x[0], x[1], x[2], x[3], {}, {}, {GlaForm::recurrent}).o), 1e-12);
  EXPECT_THROW(op->forward(x, OpAttrs::parse("gla", op->attrs, {{"form", "parallel"}})), std::invalid_argument);
}

// ---- bf16 on the CPU ----
// The CPU kernels take bf16 tensors themselves: a head's rows widened to f32, every recurrence, state and gate
// in f32, GEMMs included, outputs rounded once (layers/variant_rows.h).
// Against the f32 kernel of the same form on the same bf16 values, with the GEMMs on the CPU's bf16
// instructions and forced onto widened operands (SEQLAB_CPU_BF16_GEMM=widened): chunkwise within the bf16
// tolerances of testing::expect_bf16_close; the recurrent form has no GEMM, so its bf16 result is exactly the
// f32 result rounded to bf16. GLA has no separate key/value heads, so there is no GQA case.
struct Bf16Run {
  std::vector<Tensor> all;  // o, final_state, dq, dk, dv, dg, dgv, dinitial_state (undefined when absent)
};

Bf16Run run_kernels(const Inputs& in, const GlaOptions& opts, const Tensor& dout, const Tensor& dfinal) {
  const GlaOutput out = kernel::gla_forward(in.q, in.k, in.v, in.g, in.gv, in.h0, opts);
  const kernel::GlaGrads gr = kernel::gla_backward(dout, dfinal, in.q, in.k, in.v, in.g, in.gv, in.h0, opts,
                                                   {true, true, true, true, true, true});
  return {{out.o, out.final_state, gr.dq, gr.dk, gr.dv, gr.dg, gr.dgv, gr.dinitial_state}};
}

Inputs as_f32(const Inputs& in) {
  Inputs w;
  std::vector<const Tensor*> src = {&in.q, &in.k, &in.v, &in.g, &in.gv, &in.h0};
  std::vector<Tensor*> dst = {&w.q, &w.k, &w.v, &w.g, &w.gv, &w.h0};
  for (size_t i = 0; i < src.size(); ++i) *dst[i] = testing::cast_or_none(*src[i], DType::f32);
  return w;
}

TEST(GlaBf16, ChunkwiseWithinBf16OfF32AndRecurrentExact) {
  testing::Bf16GemmPath restore;
  struct Gates {
    const char* name;
    double lo, hi;
  };
  const Gates gates[3] = {{"gates in [-1.5, -0.02]", -1.5, -0.02},
                          {"gates near 0", -1e-6, -1e-7},
                          {"very negative gates", -20.0, -10.0}};
  // T = 1; T below a chunk; odd sizes with a partial chunk and sub-chunk; dk ≠ dv both ways; gla_small's
  // head (64 × 64, chunks of 64, sub-chunks of 16) over two chunks and a partial third.
  const Case cases[] = {{"T = 1", 2, 1, 2, 8, 8, 64, 16, true, true},
                        {"T < chunk", 1, 11, 3, 16, 8, 64, 16, false, true},
                        {"odd sizes", 2, 37, 3, 5, 7, 16, 4, true, false},
                        {"dk > dv", 1, 45, 2, 24, 10, 16, 8, false, false},
                        {"gla_small head", 1, 150, 2, 64, 64, 64, 16, true, true}};
  testing::Bf16Worst worst;
  for (bool widened_gemm : {false, true}) {
    kernel::set_cpu_bf16_gemm_widened(widened_gemm);
    for (const Case& c : cases) {
      for (const Gates& gt : gates) {
        const Inputs in = make_inputs(c, DType::bf16, 41, gt.lo, gt.hi), in32 = as_f32(in);
        Generator cot(43);
        const Tensor dout = Tensor::randn({c.B, c.T, c.H, c.dv}, cot, DType::bf16),
                     dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, cot, DType::bf16);
        const Tensor dout32 = kernel::to_dtype(dout, DType::f32), dfinal32 = kernel::to_dtype(dfinal, DType::f32);
        for (const GlaOptions& opts : {chunkwise(c), recurrent(c)}) {
          const Bf16Run got = run_kernels(in, opts, dout, dfinal);
          const Bf16Run want = run_kernels(in32, opts, dout32, dfinal32);
          for (size_t i = 0; i < 8; ++i) {
            const std::string at = std::string(kOutputNames[i]) + " at " + c.name + ", " + gt.name + ", " +
                                   gla_form_name(opts.form) + (widened_gemm ? ", widened GEMM" : ", native GEMM");
            ASSERT_EQ(got.all[i].defined(), want.all[i].defined()) << at;
            if (!got.all[i].defined()) continue;
            if (opts.form == GlaForm::recurrent) {
              testing::expect_rounded_from(got.all[i], want.all[i], at);
            } else {
              testing::expect_bf16_close(got.all[i], want.all[i], at, worst);
            }
          }
        }
      }
    }
  }
  worst.print("gla chunkwise");
}

// Through the differentiable op: bf16 tensors in, bf16 gradients out, as the f32 op on the same values.
TEST(GlaBf16, DifferentiableOp) {
  const Case c{"", 2, 70, 2, 16, 12, 32, 8, true, true};
  const Inputs in = make_inputs(c, DType::bf16, 47), in32 = as_f32(in);
  Generator cot(53);
  const Tensor go = Tensor::randn({c.B, c.T, c.H, c.dv}, cot, DType::bf16),
               gs = Tensor::randn({c.B, c.H, c.dk, c.dv}, cot, DType::bf16);
  const Result got = forward_backward(in, chunkwise(c), go, gs);
  const Result want = forward_backward(in32, chunkwise(c), kernel::to_dtype(go, DType::f32),
                                       kernel::to_dtype(gs, DType::f32));
  testing::Bf16Worst worst;
  testing::expect_bf16_close(got.o, want.o, "o", worst);
  testing::expect_bf16_close(got.fs, want.fs, "final_state", worst);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << kInputNames[i];
    testing::expect_bf16_close(got.grads[i], want.grads[i], std::string("d") + kInputNames[i], worst);
  }
}

// ---- errors ----
std::string error_of(const Inputs& in, GlaOptions opts = {}) {
  return testing::error_message_of([&] { gla(in.q, in.k, in.v, in.g, in.gv, in.h0, opts); });
}

TEST(Gla, ShapeErrorsNameTheShapes) {
  auto t = [](Shape s) { return Tensor::zeros(s, DType::f32); };
  Inputs ok{t({2, 5, 3, 4}), t({2, 5, 3, 4}), t({2, 5, 3, 6}), t({2, 5, 3, 4}), t({2, 5, 3, 6}), t({2, 3, 4, 6})};
  EXPECT_EQ(error_of(ok), "no error");
  Inputs bad = ok;
  bad.k = t({2, 5, 3, 5});
  std::string e = error_of(bad);
  EXPECT_NE(e.find("same shape"), std::string::npos) << e;
  EXPECT_NE(e.find("k [2, 5, 3, 5]"), std::string::npos) << e;
  bad = ok;
  bad.v = t({2, 4, 3, 6});
  e = error_of(bad);
  EXPECT_NE(e.find("v differs"), std::string::npos) << e;
  bad = ok;
  bad.gv = t({2, 5, 3, 4});
  e = error_of(bad);
  EXPECT_NE(e.find("gv must be [B, T, H, dv] (v's shape)"), std::string::npos) << e;
  EXPECT_NE(e.find("gv [2, 5, 3, 4]"), std::string::npos) << e;
  bad = ok;
  bad.h0 = t({2, 3, 6, 4});
  e = error_of(bad);
  EXPECT_NE(e.find("initial_state must be"), std::string::npos) << e;
  bad = ok;
  bad.g = Tensor::zeros({2, 5, 3, 4}, DType::f64);
  EXPECT_NE(error_of(bad).find("dtype"), std::string::npos);
  bad = ok;
  bad.q = t({2, 5, 12});
  EXPECT_NE(error_of(bad).find("4 dimensions"), std::string::npos);
  EXPECT_NE(error_of(ok, {GlaForm::chunkwise, 0, 16, 0}).find("chunk must be positive"), std::string::npos);
  EXPECT_NE(error_of(ok, {GlaForm::chunkwise, 64, 0, 0}).find("sub_chunk must be positive"), std::string::npos);
  EXPECT_NE(error_of(ok, {GlaForm::recurrent, 64, 16, -1}).find("scale"), std::string::npos);
}

}  // namespace
}  // namespace seqlab
