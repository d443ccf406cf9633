// DeltaNet / Gated DeltaNet: the chunkwise (UT representation) and recurrent forms against each other
// (outputs, final state and every gradient, f64 and f32) on odd shapes, against a dense loop written
// here, finite-difference gradients of every input for both forms, token-by-token decoding, extreme
// gates, the delta rule's read-back property, chunk-size independence, the registry entry and errors.
#include "layers/delta/delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "test_util.h"
#include "variant_cases.h"

namespace seqlab {
namespace {

using testing::all_finite;
using testing::max_rel_error;

// The measured error, printed so that a run documents how close the forms are, not only that they pass.
void report(const std::string& what, double error) { std::printf("    %s: max rel error %.3g\n", what.c_str(), error); }

// q, unit-norm k, v, β, log-gates g ∈ (g_lo, g_hi) (gated), an initial state (init); the cotangents the
// shared generator also draws are not used here.
using Inputs = testing::DeltaNetData;

const char* kNames[] = {"q", "k", "v", "beta", "g", "initial_state"};

Inputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, bool gated, bool init, DType dtype,
                   uint64_t seed, double g_lo = -1.0, double g_hi = -0.02) {
  Generator gen(seed);
  return testing::make_delta_net_data({B, T, H, dk, dv, gated, init, 0}, dtype, gen, g_lo, g_hi);
}

struct Result {
  Tensor o, fin;
  std::vector<Tensor> grads;  // per input, undefined where the input is absent
};

// Both outputs with the cotangents go (for o) and gf (for final_state), gradients of every given input.
Result run(const Inputs& in, const DeltaNetOptions& opts, const Tensor& go, const Tensor& gf) {
  std::vector<Tensor> xs;
  for (const Tensor& t : in.inputs()) xs.push_back(t.defined() ? set_requires_grad(kernel::clone(t)) : Tensor());
  DeltaNetOutput out = delta_net(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], opts);
  backward({out.o, out.final_state}, {go, gf});
  Result r{out.o.detach(), out.final_state.detach(), {}};
  for (const Tensor& x : xs) r.grads.push_back(x.defined() ? grad_of(x) : Tensor());
  return r;
}

// The same with random cotangents drawn from `seed`.
Result run(const Inputs& in, const DeltaNetOptions& opts, uint64_t seed = 99) {
  Generator gen(seed);
  const DType dt = in.q.dtype();
  Tensor go = Tensor::randn({in.q.size(0), in.q.size(1), in.q.size(2), in.v.size(3)}, gen, dt);
  Tensor gf = Tensor::randn({in.q.size(0), in.q.size(2), in.q.size(3), in.v.size(3)}, gen, dt);
  return run(in, opts, go, gf);
}

// The largest difference between two runs over o, final_state and every gradient.
double compare(const Result& a, const Result& b, std::string* where) {
  double worst = 0;
  auto take = [&](double e, const std::string& what) {
    if (e > worst) {
      worst = e;
      *where = what;
    }
  };
  take(max_rel_error(a.o, b.o), "o");
  take(max_rel_error(a.fin, b.fin), "final_state");
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_EQ(a.grads[i].defined(), b.grads[i].defined()) << kNames[i];
    if (a.grads[i].defined() && b.grads[i].defined())
      take(max_rel_error(a.grads[i], b.grads[i]), std::string("d") + kNames[i]);
  }
  return worst;
}

DeltaNetOptions chunkwise(int64_t chunk, double scale = 0) { return {DeltaNetForm::chunkwise, chunk, scale}; }
DeltaNetOptions recurrent(int64_t chunk = 64, double scale = 0) { return {DeltaNetForm::recurrent, chunk, scale}; }

struct Case {
  int64_t B, T, H, dk, dv, chunk;
  bool gated, init;
};

class DeltaNetForms : public ::testing::TestWithParam<Case> {};

void expect_forms_agree(const Case& c, DType dtype, double tol) {
  Inputs in = make_inputs(c.B, c.T, c.H, c.dk, c.dv, c.gated, c.init, dtype, 7);
  Result ch = run(in, chunkwise(c.chunk)), rec = run(in, recurrent(c.chunk));
  // The recurrent backward checkpoints every `chunk` steps; a different segment length must not matter.
  Result rec3 = run(in, recurrent(3));
  EXPECT_EQ(ch.o.shape(), (Shape{c.B, c.T, c.H, c.dv}));
  EXPECT_EQ(ch.fin.shape(), (Shape{c.B, c.H, c.dk, c.dv}));
  EXPECT_EQ(ch.o.dtype(), dtype);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(ch.grads[i].defined()) << kNames[i];
  EXPECT_EQ(ch.grads[4].defined(), c.gated);
  EXPECT_EQ(ch.grads[5].defined(), c.init);
  std::string where;
  const double e = compare(ch, rec, &where);
  EXPECT_LE(e, tol) << "chunkwise vs recurrent, worst at " << where;
  report(std::string(dtype_name(dtype)) + " chunkwise vs recurrent (" + where + ")", e);
  const double e3 = compare(rec3, rec, &where);
  EXPECT_LE(e3, tol) << "recurrent with other checkpoints, worst at " << where;
  // Not trivially zero.
  EXPECT_GT(max_rel_error(ch.o, Tensor::zeros(ch.o.shape(), dtype)), 1e-3);
  EXPECT_GT(max_rel_error(ch.grads[1], Tensor::zeros(ch.grads[1].shape(), dtype)), 1e-3);
}

TEST_P(DeltaNetForms, F64) { expect_forms_agree(GetParam(), DType::f64, 1e-10); }
TEST_P(DeltaNetForms, F32) { expect_forms_agree(GetParam(), DType::f32, 1e-5); }

// B, T, H, dk, dv, chunk, gated, initial state
INSTANTIATE_TEST_SUITE_P(Shapes, DeltaNetForms,
                         ::testing::Values(Case{2, 7, 3, 4, 5, 3, true, true},   // T not a multiple of the chunk
                                           Case{2, 7, 3, 4, 5, 3, false, true},  // DeltaNet
                                           Case{1, 5, 2, 3, 6, 8, true, false},  // T below one chunk, no initial state
                                           Case{2, 1, 2, 5, 3, 4, true, true},   // T = 1
                                           Case{1, 1, 1, 4, 4, 64, false, false},  // T = 1, DeltaNet from zeros
                                           Case{1, 12, 2, 3, 4, 4, false, false},  // T a multiple of the chunk
                                           Case{1, 9, 2, 6, 2, 1, true, true},     // chunks of one token
                                           Case{2, 70, 2, 8, 6, 64, true,
                                                true},  // default chunk, a partial second chunk
                                           Case{3, 40, 4, 16, 16, 16, true, true}  // enough work for several threads
                                           ));

// The recurrence written densely here: S ← α (I − β kᵀk) S + β kᵀ v, o = c q S, in plain loops.
std::vector<double> dense_reference(const Inputs& in, double scale, std::vector<double>* fin) {
  const int64_t B = in.q.size(0), T = in.q.size(1), H = in.q.size(2), dk = in.q.size(3), dv = in.v.size(3);
  const std::vector<double> q = in.q.to_doubles(), k = in.k.to_doubles(), v = in.v.to_doubles(),
                            be = in.beta.to_doubles();
  const std::vector<double> g = in.g.defined() ? in.g.to_doubles() : std::vector<double>(be.size(), 0.0);
  const std::vector<double> s0 = in.s0.defined() ? in.s0.to_doubles() : std::vector<double>(B * H * dk * dv, 0.0);
  std::vector<double> o(B * T * H * dv);
  fin->assign(B * H * dk * dv, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> S(s0.begin() + (b * H + h) * dk * dv, s0.begin() + (b * H + h + 1) * dk * dv);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = (b * T + t) * H + h;
        const double alpha = std::exp(g[r]), beta = be[r];
        std::vector<double> M(dk * dk);  // α (I − β kᵀk)
        for (int64_t i = 0; i < dk; ++i) {
          for (int64_t j = 0; j < dk; ++j) M[i * dk + j] = alpha * ((i == j) - beta * k[r * dk + i] * k[r * dk + j]);
        }
        std::vector<double> N(dk * dv, 0.0);
        for (int64_t i = 0; i < dk; ++i) {
          for (int64_t c = 0; c < dv; ++c) {
            double acc = beta * k[r * dk + i] * v[r * dv + c];
            for (int64_t j = 0; j < dk; ++j) acc += M[i * dk + j] * S[j * dv + c];
            N[i * dv + c] = acc;
          }
        }
        S = N;
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < dk; ++i) acc += q[r * dk + i] * S[i * dv + c];
          o[r * dv + c] = scale * acc;
        }
      }
      std::copy(S.begin(), S.end(), fin->begin() + (b * H + h) * dk * dv);
    }
  }
  return o;
}

TEST(DeltaNet, MatchesDenseLoops) {
  for (bool gated : {false, true}) {
    Inputs in = make_inputs(2, 6, 2, 3, 5, gated, true, DType::f64, 3);
    std::vector<double> fin;
    const std::vector<double> o = dense_reference(in, 0.7, &fin);
    for (DeltaNetOptions opts : {recurrent(64, 0.7), chunkwise(4, 0.7)}) {
      DeltaNetOutput out = delta_net(in.q, in.k, in.v, in.beta, in.g, in.s0, opts);
      EXPECT_LE(max_rel_error(out.o, Tensor::from_vector(o, out.o.shape(), DType::f64)), 1e-12)
          << delta_net_form_name(opts.form) << " gated " << gated;
      EXPECT_LE(max_rel_error(out.final_state, Tensor::from_vector(fin, out.final_state.shape(), DType::f64)), 1e-12);
    }
  }
  // The default scale is 1/√dk.
  Inputs in = make_inputs(1, 4, 1, 4, 2, true, false, DType::f64, 5);
  std::vector<double> fin;
  const std::vector<double> o = dense_reference(in, 0.5, &fin);
  EXPECT_LE(
      max_rel_error(delta_net(in.q, in.k, in.v, in.beta, in.g).o, Tensor::from_vector(o, {1, 4, 1, 2}, DType::f64)),
      1e-12);
}

// With β = 1 and a unit key the write replaces what the key read: k_t S_t = v_t, so reading with
// q_t = k_t at scale 1 returns v_t exactly (the delta rule), for DeltaNet and for any gate.
TEST(DeltaNet, ReadsBackWhatItWrote) {
  for (bool gated : {false, true}) {
    Inputs in = make_inputs(1, 9, 2, 4, 3, gated, true, DType::f64, 11);
    in.beta = Tensor::ones(in.beta.shape(), DType::f64);
    for (DeltaNetOptions opts : {recurrent(64, 1.0), chunkwise(4, 1.0)}) {
      DeltaNetOutput out = delta_net(in.k, in.k, in.v, in.beta, in.g, in.s0, opts);
      EXPECT_LE(max_rel_error(out.o, in.v), 1e-12) << delta_net_form_name(opts.form) << " gated " << gated;
    }
  }
}

// Decoding token by token (recurrent, T = 1, carrying the state) equals the full sequence.
TEST(DeltaNet, DecodingTokenByTokenMatchesFullSequence) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (bool gated : {false, true}) {
      Inputs in = make_inputs(2, 11, 3, 4, 5, gated, true, dtype, 13);
      DeltaNetOutput full = delta_net(in.q, in.k, in.v, in.beta, in.g, in.s0, chunkwise(4));
      Tensor state = in.s0;
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
      for (int64_t t = 0; t < 11; ++t) {
        auto at = [&](const Tensor& x) { return narrow(x, 1, t, 1); };
        DeltaNetOutput step =
            delta_net(at(in.q), at(in.k), at(in.v), at(in.beta), gated ? at(in.g) : Tensor(), state, recurrent());
        EXPECT_LE(max_rel_error(step.o, at(full.o)), tol) << "token " << t << " gated " << gated;
        state = step.final_state;
      }
      EXPECT_LE(max_rel_error(state, full.final_state), tol) << "gated " << gated;
      // Prefill then decode: the chunkwise form over the first 7 tokens, recurrent after.
      DeltaNetOutput pre =
          delta_net(narrow(in.q, 1, 0, 7), narrow(in.k, 1, 0, 7), narrow(in.v, 1, 0, 7), narrow(in.beta, 1, 0, 7),
                    gated ? narrow(in.g, 1, 0, 7) : Tensor(), in.s0, chunkwise(3));
      DeltaNetOutput rest =
          delta_net(narrow(in.q, 1, 7, 4), narrow(in.k, 1, 7, 4), narrow(in.v, 1, 7, 4), narrow(in.beta, 1, 7, 4),
                    gated ? narrow(in.g, 1, 7, 4) : Tensor(), pre.final_state, recurrent());
      EXPECT_LE(max_rel_error(rest.o, narrow(full.o, 1, 7, 4)), tol);
      EXPECT_LE(max_rel_error(rest.final_state, full.final_state), tol);
    }
  }
}

// Every input, both forms, with and without the gate, with and without an initial state.
TEST(DeltaNetGradcheck, EveryInputBothForms) {
  struct Shape5 {
    int64_t B, T, H, dk, dv, chunk;
  };
  for (Shape5 s : {Shape5{2, 5, 2, 3, 4, 2}, Shape5{1, 7, 1, 4, 3, 3}, Shape5{2, 1, 1, 2, 3, 4}}) {
    for (bool gated : {false, true}) {
      for (bool init : {false, true}) {
        Inputs in = make_inputs(s.B, s.T, s.H, s.dk, s.dv, gated, init, DType::f64, 17);
        for (DeltaNetOptions opts : {chunkwise(s.chunk), recurrent(s.chunk)}) {
          GradcheckResult r = gradcheck(
              [&](const std::vector<Tensor>& x) {
                DeltaNetOutput out = delta_net(x[0], x[1], x[2], x[3], x[4], x[5], opts);
                return std::vector<Tensor>{out.o, out.final_state};
              },
              in.inputs());
          const int64_t expected =
              s.B * s.T * s.H * (2 * s.dk + s.dv + 1 + (gated ? 1 : 0)) + (init ? s.B * s.H * s.dk * s.dv : 0);
          EXPECT_EQ(r.elements_checked, expected);
          report(std::string("gradcheck ") + delta_net_form_name(opts.form) + " T " + std::to_string(s.T) +
                     (gated ? " gated" : "") + (init ? " init" : ""),
                 r.max_error);
          EXPECT_LE(r.max_error, 1e-6) << delta_net_form_name(opts.form) << " T " << s.T << " gated " << gated
                                       << " init " << init << ": " << r.worst;
        }
      }
    }
  }
}

// ---- norm-wise comparison against the f64 recurrent form ----
const char* kOutputNames[8] = {"o", "final_state", "dq", "dk", "dv", "dbeta", "dg", "dinitial_state"};

// The f64 copy of f32 inputs (the same values), so that an f64 reference differs only in arithmetic.
Inputs widened(const Inputs& in) {
  Inputs w;
  w.q = testing::cast_or_none(in.q, DType::f64);
  w.k = testing::cast_or_none(in.k, DType::f64);
  w.v = testing::cast_or_none(in.v, DType::f64);
  w.beta = testing::cast_or_none(in.beta, DType::f64);
  w.g = testing::cast_or_none(in.g, DType::f64);
  w.s0 = testing::cast_or_none(in.s0, DType::f64);
  return w;
}

// Every output and gradient of `got` (the run `run`, at `at`) within tol of `want`, norm-wise
// (testing::expect_normwise); each error also goes to worst[i] (8 entries, in kOutputNames' order) where given.
void expect_normwise(const Result& got, const Result& want, double tol, const std::string& run, const std::string& at,
                     testing::WorstError* worst = nullptr) {
  auto all = [](const Result& r) {
    std::vector<Tensor> t{r.o, r.fin};
    t.insert(t.end(), r.grads.begin(), r.grads.end());
    return t;
  };
  testing::expect_normwise(all(got), all(want), kOutputNames, tol, run, at, worst);
}

// Log-gates from −20 to −1e-6 (α from 2e-9 to 1 − 1e-6), and a run of −20s long enough that the
// cumulative gate of a 64-token chunk (−1280) underflows e^b: no ∞ or NaN anywhere, and norm-wise
// against the f64 recurrent form on the same (f32-rounded) inputs every f32 form within 1e-5 and the f64
// chunkwise forms within 1e-12. Before the gate gradient was summed over straddling pairs only
// (docs/reliability.md, "Numerics at every decay") dg was off by 3.4e-3 (f32) and 8.6e-12 (f64) at the
// gates in [−20, −10] (chunks of 64).
TEST(DeltaNet, ExtremeGatesStayFinite) {
  for (bool mixed : {true, false}) {
    Inputs in = make_inputs(2, 70, 2, 4, 3, true, true, DType::f32, 23, mixed ? -20.0 : -20.0, mixed ? -1e-6 : -10.0);
    if (mixed) {  // every fifth gate −20, every fifth −1e-6, the first batch entry all −20
      std::vector<double> g = in.g.to_doubles();
      for (size_t i = 0; i < g.size(); ++i) {
        if (i % 5 == 0) g[i] = -20.0;
        if (i % 5 == 1) g[i] = -1e-6;
      }
      for (size_t i = 0; i < 2 * 70 * 2 / 2; ++i) g[i] = -20.0;
      in.g = Tensor::from_vector(g, in.g.shape(), DType::f32);
    }
    const std::string gates = mixed ? "gates in [-20, -1e-6]" : "gates in [-20, -10]";
    const Inputs in64 = widened(in);
    Generator cot(99);
    const Tensor go = Tensor::randn({2, 70, 2, 3}, cot, DType::f32), gf = Tensor::randn({2, 2, 4, 3}, cot, DType::f32);
    const Tensor go64 = kernel::to_dtype(go, DType::f64), gf64 = kernel::to_dtype(gf, DType::f64);
    const Result exact = run(in64, recurrent(64), go64, gf64);
    const Result ch = run(in, chunkwise(64), go, gf), ch16 = run(in, chunkwise(16), go, gf),
                 rec = run(in, recurrent(64), go, gf), ch64 = run(in64, chunkwise(64), go64, gf64),
                 ch16_64 = run(in64, chunkwise(16), go64, gf64);
    for (const Result* r : {&ch, &ch16, &rec, &ch64, &ch16_64, &exact}) {
      EXPECT_TRUE(all_finite(r->o));
      EXPECT_TRUE(all_finite(r->fin));
      for (size_t i = 0; i < r->grads.size(); ++i) EXPECT_TRUE(all_finite(r->grads[i])) << kNames[i];
    }
    expect_normwise(ch, exact, 1e-5, "f32 chunkwise", gates + ", chunk 64");
    expect_normwise(ch16, exact, 1e-5, "f32 chunkwise", gates + ", chunk 16");
    expect_normwise(rec, exact, 1e-5, "f32 recurrent", gates);
    expect_normwise(ch64, exact, 1e-12, "f64 chunkwise", gates + ", chunk 64");
    expect_normwise(ch16_64, exact, 1e-12, "f64 chunkwise", gates + ", chunk 16");
    for (auto [what, r] : {std::pair<const char*, const Result*>{"f32 chunkwise, chunk 64", &ch},
                           {"f32 chunkwise, chunk 16", &ch16},
                           {"f32 recurrent", &rec},
                           {"f64 chunkwise, chunk 64", &ch64},
                           {"f64 chunkwise, chunk 16", &ch16_64}}) {
      report(gates + ", " + what + " vs f64 recurrent, dg norm-wise",
             testing::norm_rel_error(r->grads[4], exact.grads[4]));
    }
  }
  // Gradients at those gates against finite differences (f64, small shape).
  Inputs small = make_inputs(1, 6, 2, 3, 2, true, true, DType::f64, 29);
  small.g = Tensor::from_vector({-20, -1e-6, -20, -1e-6, -3, -1e-6, -1e-6, -20, -0.5, -20, -1e-6, -1e-6}, {1, 6, 2},
                                DType::f64);
  for (DeltaNetOptions opts : {chunkwise(4), recurrent(4)}) {
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& x) {
          DeltaNetOutput out = delta_net(x[0], x[1], x[2], x[3], x[4], x[5], opts);
          return std::vector<Tensor>{out.o, out.final_state};
        },
        small.inputs());
    report(std::string("gradcheck at extreme gates, ") + delta_net_form_name(opts.form), r.max_error);
    EXPECT_LE(r.max_error, 1e-6) << delta_net_form_name(opts.form) << ": " << r.worst;
  }
}

// ---- numerics at every decay (docs/reliability.md, "Numerics at every decay") ----
// Gated DeltaNet over the sampled grid of testing::numerics_sweep() — per-step log-gates from −1e-7 to −30
// (constant −20 and −30, uniform, log-uniform and bimodal mixtures), chunks 1 to 128, T from 1 to 300,
// with and without the initial state, dk ≠ dv: every output and gradient of the f32 chunkwise and f32
// recurrent forms within 1e-5 (norm-wise) of the f64 recurrent form, the f64 chunkwise form within 1e-12.
// All forms run on the same f32-rounded inputs and cotangents (widened for f64). The worst errors are
// printed.
TEST(DeltaNetNumerics, EveryDecayChunkAndLength) {
  const char* kRuns[3] = {"f32 chunkwise", "f32 recurrent", "f64 chunkwise"};
  testing::WorstError worst[3][8];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 8; ++i) worst[r][i].what = std::string(kRuns[r]) + " " + kOutputNames[i];
  }
  const std::vector<testing::SweepPoint> points = testing::numerics_sweep();
  for (size_t n = 0; n < points.size(); ++n) {
    testing::SweepPoint pt = points[n];
    pt.with_gv = false;  // no value gate here
    const int64_t B = 1, H = 2, dk = 4, dv = 3;
    Generator gen(2000 + n);
    Inputs in32;
    in32.q = Tensor::randn({B, pt.T, H, dk}, gen, DType::f32);
    in32.k = testing::unit_rows({B, pt.T, H, dk}, gen, DType::f32);
    in32.v = Tensor::randn({B, pt.T, H, dv}, gen, DType::f32);
    in32.beta = Tensor::rand({B, pt.T, H}, gen, DType::f32, 0.05, 0.95);
    in32.g = testing::draw_log_decays(pt.decay, {B, pt.T, H}, gen, DType::f32);
    if (pt.with_h0) in32.s0 = Tensor::randn({B, H, dk, dv}, gen, DType::f32, 0.5);
    const Tensor go32 = Tensor::randn({B, pt.T, H, dv}, gen, DType::f32);
    const Tensor gf32 = Tensor::randn({B, H, dk, dv}, gen, DType::f32);
    const Inputs in64 = widened(in32);
    const Tensor go64 = kernel::to_dtype(go32, DType::f64), gf64 = kernel::to_dtype(gf32, DType::f64);
    const Result exact = run(in64, recurrent(pt.chunk), go64, gf64);
    const std::string at = pt.name();
    expect_normwise(run(in32, chunkwise(pt.chunk), go32, gf32), exact, 1e-5, kRuns[0], at, worst[0]);
    expect_normwise(run(in32, recurrent(pt.chunk), go32, gf32), exact, 1e-5, kRuns[1], at, worst[1]);
    expect_normwise(run(in64, chunkwise(pt.chunk), go64, gf64), exact, 1e-12, kRuns[2], at, worst[2]);
  }
  std::printf("  worst norm-wise errors against the f64 recurrent form over %zu points:\n", points.size());
  for (const auto& r : worst) {
    for (const testing::WorstError& w : r) w.print();
  }
}

// Gated DeltaNet with g = 0 is DeltaNet; without g there is no gate gradient.
TEST(DeltaNet, ZeroGateIsDeltaNet) {
  Inputs in = make_inputs(2, 7, 2, 3, 4, false, true, DType::f64, 31);
  Inputs gated = in;
  gated.g = Tensor::zeros(in.beta.shape(), DType::f64);
  for (DeltaNetOptions opts : {chunkwise(3), recurrent()}) {
    Result a = run(in, opts), b = run(gated, opts);
    EXPECT_FALSE(a.grads[4].defined());
    ASSERT_TRUE(b.grads[4].defined());
    b.grads[4] = Tensor();
    std::string where;
    EXPECT_LE(compare(a, b, &where), 1e-12) << where;
  }
}

// The chunk size changes how the work is cut, not the result.
TEST(DeltaNet, ChunkSizeDoesNotMatter) {
  Inputs in = make_inputs(1, 13, 2, 5, 3, true, true, DType::f64, 37);
  Result base = run(in, chunkwise(64));
  for (int64_t c : {1, 2, 5, 12, 13}) {
    std::string where;
    EXPECT_LE(compare(run(in, chunkwise(c)), base, &where), 1e-10) << "chunk " << c << " at " << where;
  }
}

// Strided views (q and k columns of a fused projection) give the same results as copies.
TEST(DeltaNet, AcceptsStridedInputs) {
  Generator gen(41);
  Tensor qk = Tensor::randn({2, 5, 2 * 2 * 3}, gen, DType::f64);
  Tensor q = Tensor::make_view(qk.storage(), {2, 5, 2, 3}, {5 * 12, 12, 3, 1}, 0, DType::f64);
  Inputs in = make_inputs(2, 5, 2, 3, 4, true, true, DType::f64, 43);
  ASSERT_FALSE(q.is_contiguous());
  for (DeltaNetOptions opts : {chunkwise(2), recurrent()}) {
    DeltaNetOutput a = delta_net(q, in.k, in.v, in.beta, in.g, in.s0, opts);
    DeltaNetOutput b = delta_net(kernel::contiguous(q), in.k, in.v, in.beta, in.g, in.s0, opts);
    EXPECT_LE(max_rel_error(a.o, b.o), 0.0);
  }
}

TEST(DeltaNet, RegistryEntry) {
  const OpSpec* op = find_op("delta_net");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"o", "final_state"}));
  ASSERT_EQ(op->inputs.size(), 6u);
  EXPECT_TRUE(op->inputs[4].optional);
  EXPECT_TRUE(op->inputs[5].optional);
  Generator gen(47);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  for (const char* form : {"chunkwise", "recurrent"}) {
    OpAttrs attrs = OpAttrs::parse("delta_net", op->attrs, {{"form", form}, {"chunk", "2"}, {"scale", "0.8"}});
    std::vector<Tensor> y = op->forward(x, attrs);
    ASSERT_EQ(y.size(), 2u);
    DeltaNetOutput ref = delta_net(x[0], x[1], x[2], x[3], x[4], x[5], recurrent(64, 0.8));
    EXPECT_LE(max_rel_error(y[0], ref.o), 1e-12) << form;
    EXPECT_LE(max_rel_error(y[1], ref.final_state), 1e-12) << form;
  }
  // Absent optional inputs: DeltaNet from a zero state.
  OpAttrs defaults = OpAttrs::parse("delta_net", op->attrs, {});
  std::vector<Tensor> y = op->forward({x[0], x[1], x[2], x[3], Tensor(), Tensor()}, defaults);
  EXPECT_LE(max_rel_error(y[0], delta_net(x[0], x[1], x[2], x[3]).o), 0.0);
  OpAttrs bad = OpAttrs::parse("delta_net", op->attrs, {{"form", "parallel"}});
  EXPECT_THROW(op->forward(x, bad), std::invalid_argument);
}

std::string error_of(const Inputs& in, DeltaNetOptions opts = {}) {
  return testing::error_message_of([&] { delta_net(in.q, in.k, in.v, in.beta, in.g, in.s0, opts); });
}

TEST(DeltaNet, ErrorsNameTheShapes) {
  const Inputs good = make_inputs(2, 5, 3, 4, 6, true, true, DType::f64, 53);
  Inputs in = good;
  in.k = Tensor::zeros({2, 5, 3, 5}, DType::f64);
  std::string e = error_of(in);
  EXPECT_NE(e.find("q and k differ"), std::string::npos) << e;
  EXPECT_NE(e.find("k [2, 5, 3, 5]"), std::string::npos) << e;
  in = good;
  in.beta = Tensor::zeros({2, 5}, DType::f64);
  e = error_of(in);
  EXPECT_NE(e.find("beta must be [B, T, H]"), std::string::npos) << e;
  in = good;
  in.g = Tensor::zeros({2, 5, 2}, DType::f64);
  EXPECT_NE(error_of(in).find("g must be"), std::string::npos);
  in = good;
  in.s0 = Tensor::zeros({2, 3, 6, 4}, DType::f64);
  e = error_of(in);
  EXPECT_NE(e.find("initial_state must be [B, H, dk, dv]"), std::string::npos) << e;
  EXPECT_NE(e.find("initial_state [2, 3, 6, 4]"), std::string::npos) << e;
  in = good;
  in.v = Tensor::zeros({2, 4, 3, 6}, DType::f64);
  EXPECT_NE(error_of(in).find("v differs"), std::string::npos);
  in = good;
  in.beta = Tensor::zeros({2, 5, 3}, DType::f32);
  EXPECT_NE(error_of(in).find("one dtype"), std::string::npos);
  in = good;
  in.q = Tensor::zeros({2, 5, 12}, DType::f64);
  EXPECT_NE(error_of(in).find("4 dimensions"), std::string::npos);
  EXPECT_NE(error_of(good, chunkwise(0)).find("chunk must be positive"), std::string::npos);
  EXPECT_THROW(parse_delta_net_form("parallel"), std::invalid_argument);
  EXPECT_EQ(parse_delta_net_form("recurrent"), DeltaNetForm::recurrent);
}

}  // namespace
}  // namespace seqlab
