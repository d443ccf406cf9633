// RetNet retention: the parallel, chunkwise and recurrent forms against each other and against a
// loop written out here (values and every gradient, f32 and f64, odd shapes), float64 finite
// differences of every input for every form, decays near 0 and near 1, token-by-token decoding,
// the default decays, the registry entry and errors.
#include "layers/scan/retention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
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

struct Shape5 {
  int64_t B, T, H, Dk, Dv, chunk;
};

struct Inputs {
  Tensor q, k, v, s0;
};

Inputs make_inputs(const Shape5& s, DType dtype, uint64_t seed, bool with_state = true) {
  Generator gen(seed);
  Inputs in{Tensor::randn({s.B, s.T, s.H, s.Dk}, gen, dtype), Tensor::randn({s.B, s.T, s.H, s.Dk}, gen, dtype),
            Tensor::randn({s.B, s.T, s.H, s.Dv}, gen, dtype), Tensor()};
  if (with_state) in.s0 = Tensor::randn({s.B, s.H, s.Dk, s.Dv}, gen, dtype);
  return in;
}

// The recurrence in doubles: o and S_T.
std::vector<Tensor> loop_reference(const Inputs& in, const std::vector<double>& gammas, double scale) {
  const int64_t B = in.q.size(0), T = in.q.size(1), H = in.q.size(2), Dk = in.q.size(3), Dv = in.v.size(3);
  std::vector<double> q = in.q.to_doubles(), k = in.k.to_doubles(), v = in.v.to_doubles();
  std::vector<double> S = in.s0.defined() ? in.s0.to_doubles() : std::vector<double>(B * H * Dk * Dv, 0.0);
  std::vector<double> o(B * T * H * Dv, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      double* Sh = &S[(b * H + h) * Dk * Dv];
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = (b * T + t) * H + h;
        for (int64_t i = 0; i < Dk; ++i) {
          for (int64_t j = 0; j < Dv; ++j)
            Sh[i * Dv + j] = gammas[h] * Sh[i * Dv + j] + k[row * Dk + i] * v[row * Dv + j];
        }
        for (int64_t j = 0; j < Dv; ++j) {
          for (int64_t i = 0; i < Dk; ++i) o[row * Dv + j] += scale * q[row * Dk + i] * Sh[i * Dv + j];
        }
      }
    }
  }
  return {Tensor::from_vector(o, {B, T, H, Dv}, DType::f64), Tensor::from_vector(S, {B, H, Dk, Dv}, DType::f64)};
}

struct Outcome {
  std::vector<Tensor> outputs, grads;  // o, S_T; dq, dk, dv, dS_0
};

// Both outputs with the cotangents cot = {for o, for final_state}.
Outcome run(const Inputs& x, const RetentionOptions& o, const std::vector<Tensor>& cot) {
  Inputs in{set_requires_grad(x.q.detach()), set_requires_grad(x.k.detach()), set_requires_grad(x.v.detach()),
            x.s0.defined() ? set_requires_grad(x.s0.detach()) : Tensor()};
  RetentionOutput out = retention(in.q, in.k, in.v, in.s0, o);
  std::vector<Tensor> roots{out.o, out.final_state};
  backward(roots, cot);
  Outcome res;
  for (const Tensor& r : roots) res.outputs.push_back(r.detach());
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.s0}) res.grads.push_back(t->defined() ? grad_of(*t) : Tensor());
  return res;
}

// The same with random cotangents drawn from `seed`.
Outcome run(const Inputs& x, const RetentionOptions& o, uint64_t seed) {
  Generator gen(seed);
  const DType dt = x.q.dtype();
  return run(x, o,
             {Tensor::randn({x.q.size(0), x.q.size(1), x.q.size(2), x.v.size(3)}, gen, dt),
              Tensor::randn({x.q.size(0), x.q.size(2), x.q.size(3), x.v.size(3)}, gen, dt)});
}

const std::vector<RetentionForm> kForms = {RetentionForm::parallel, RetentionForm::chunkwise, RetentionForm::recurrent};
const char* form_name(RetentionForm f) {
  return f == RetentionForm::parallel ? "parallel" : f == RetentionForm::chunkwise ? "chunkwise" : "recurrent";
}

// T not a multiple of the chunk, T smaller than one chunk, T = 1, dk ≠ dv, a multiple, chunk 1.
const std::vector<Shape5> kShapes = {
    {2, 7, 2, 3, 4, 3}, {1, 2, 3, 3, 2, 5}, {2, 1, 2, 4, 3, 4}, {1, 12, 2, 5, 3, 4}, {1, 9, 1, 2, 5, 1}};

void expect_forms_equal(DType dtype, double tol) {
  for (const Shape5& s : kShapes) {
    for (bool with_state : {true, false}) {
      for (bool custom : {false, true}) {
        Inputs in = make_inputs(s, dtype, 3 + s.T, with_state);
        RetentionOptions o;
        o.chunk = s.chunk;
        if (custom) {
          o.scale = 0.7;
          for (int64_t h = 0; h < s.H; ++h) o.gammas.push_back(0.5 + 0.2 * h);
        }
        const std::vector<double> gammas = custom ? o.gammas : retention_default_gammas(s.H);
        std::vector<Tensor> ref = loop_reference(in, gammas, custom ? 0.7 : 1.0 / std::sqrt(double(s.Dk)));
        o.form = RetentionForm::recurrent;
        Outcome rec = run(in, o, 7);
        for (RetentionForm f : kForms) {
          o.form = f;
          Outcome r = run(in, o, 7);
          const std::string what = std::string(form_name(f)) + " T=" + std::to_string(s.T) +
                                   " chunk=" + std::to_string(s.chunk) + (with_state ? " with state" : "") +
                                   (custom ? " custom gammas" : "");
          for (size_t i = 0; i < 2; ++i) EXPECT_LE(max_rel_error(r.outputs[i], ref[i]), tol) << what << " output " << i;
          for (size_t i = 0; i < 4; ++i) {
            ASSERT_EQ(r.grads[i].defined(), rec.grads[i].defined()) << what;
            if (r.grads[i].defined()) {
              EXPECT_LE(max_rel_error(r.grads[i], rec.grads[i]), tol) << what << " grad " << i;
            }
          }
        }
      }
    }
  }
}

TEST(Retention, FormsAgreeF64) { expect_forms_equal(DType::f64, 1e-10); }
TEST(Retention, FormsAgreeF32) { expect_forms_equal(DType::f32, 1e-5); }

// Finite differences of q, k, v and S_0 through o and S_T, every form, at decays from moderate to
// near 0 (e^−20) and near 1 (e^−1e-6).
TEST(Retention, GradcheckEveryFormAndInput) {
  for (RetentionForm f : kForms) {
    for (std::vector<double> gammas :
         {std::vector<double>{0.6, 0.9}, std::vector<double>{std::exp(-20.0), std::exp(-1e-6)}}) {
      const Shape5 s{2, 5, 2, 3, 2, 2};
      Inputs in = make_inputs(s, DType::f64, 13);
      RetentionOptions o;
      o.form = f;
      o.chunk = s.chunk;
      o.gammas = gammas;
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& x) {
            RetentionOutput out = retention(x[0], x[1], x[2], x[3], o);
            return std::vector<Tensor>{out.o, out.final_state};
          },
          {in.q, in.k, in.v, in.s0});
      EXPECT_EQ(r.elements_checked, 2 * 5 * 2 * (3 + 3 + 2) + 2 * 2 * 3 * 2);
      EXPECT_LE(r.max_error, 1e-6) << form_name(f) << " γ " << gammas[0] << ": " << r.worst;
    }
  }
}

// Decays at the extremes (log γ = −20, −1e-6, and exactly 0 or 1) over a long-ish sequence: finite
// values and gradients in f32 and f64, and all forms equal. γ = 0 keeps only the current token:
// o_n = c (q_n·k_n) v_n; γ = 1 is plain (unnormalised) causal linear attention.
TEST(Retention, ExtremeDecays) {
  for (DType dtype : {DType::f64, DType::f32}) {
    const Shape5 s{1, 70, 4, 3, 2, 16};
    Inputs in = make_inputs(s, dtype, 17);
    RetentionOptions o;
    o.chunk = s.chunk;
    o.gammas = {std::exp(-20.0), std::exp(-1e-6), 0.0, 1.0};
    o.form = RetentionForm::recurrent;
    Outcome rec = run(in, o, 19);
    for (RetentionForm f : kForms) {
      o.form = f;
      Outcome r = run(in, o, 19);
      for (const Tensor& t : r.outputs) EXPECT_TRUE(all_finite(t)) << form_name(f);
      for (const Tensor& t : r.grads) EXPECT_TRUE(all_finite(t)) << form_name(f);
      const double tol = dtype == DType::f64 ? 1e-10 : 2e-5;
      EXPECT_LE(max_rel_error(r.outputs[0], rec.outputs[0]), tol) << form_name(f);
      for (size_t i = 0; i < 4; ++i) EXPECT_LE(max_rel_error(r.grads[i], rec.grads[i]), tol) << form_name(f) << i;
    }
    std::vector<Tensor> ref = loop_reference(in, o.gammas, 1.0 / std::sqrt(3.0));
    EXPECT_LE(max_rel_error(rec.outputs[0], ref[0]), dtype == DType::f64 ? 1e-10 : 2e-5);
    // γ = 0 (head 2): o_n = c (q_n·k_n) v_n.
    std::vector<double> q = in.q.to_doubles(), k = in.k.to_doubles(), v = in.v.to_doubles(),
                        out = rec.outputs[0].to_doubles();
    for (int64_t t = 0; t < s.T; t += 13) {
      const int64_t row = t * s.H + 2;
      double qk = 0;
      for (int64_t i = 0; i < 3; ++i) qk += q[row * 3 + i] * k[row * 3 + i];
      for (int64_t j = 0; j < 2; ++j) {
        EXPECT_NEAR(out[row * 2 + j], qk * v[row * 2 + j] / std::sqrt(3.0), dtype == DType::f64 ? 1e-12 : 1e-5);
      }
    }
  }
}

// ---- bf16 on the CPU ----
// The CPU kernels take bf16 tensors themselves (layers/variant_rows.h): rows widened per head, states and
// decays in f32, the parallel and chunkwise forms' GEMMs on bf16 operands with f32 sums, outputs rounded
// once. Against the f32 op on the same bf16 values, with the GEMMs on the CPU's bf16 instructions and forced
// onto widened operands: the parallel and chunkwise forms within testing::expect_bf16_close's tolerances, the
// recurrent form (no GEMM) exactly the f32 result rounded. Shapes: T = 1, T below a chunk, odd sizes with a
// partial chunk, dk ≠ dv, a 64 × 64 head over a partial third chunk; decays 0, e^−20, 0.5, the defaults
// (near 1) and 1 − 1e-6. Retention has no separate key/value heads, so there is no GQA case.
TEST(RetentionBf16, WithinBf16OfF32AndRecurrentExact) {
  testing::Bf16GemmPath restore;
  const std::vector<Shape5> shapes = {{2, 1, 2, 8, 8, 64}, {1, 11, 3, 16, 8, 64}, {2, 37, 3, 5, 7, 16},
                                      {1, 45, 2, 24, 10, 16}, {1, 150, 2, 64, 64, 64}};
  testing::Bf16Worst worst;
  for (bool widened_gemm : {false, true}) {
    kernel::set_cpu_bf16_gemm_widened(widened_gemm);
    for (const Shape5& sh : shapes) {
      for (bool strong : {false, true}) {
        const Inputs in = make_inputs(sh, DType::bf16, 61 + sh.T, sh.T != 11);
        const Inputs in32{kernel::to_dtype(in.q, DType::f32), kernel::to_dtype(in.k, DType::f32),
                          kernel::to_dtype(in.v, DType::f32), testing::cast_or_none(in.s0, DType::f32)};
        Generator gen(67);
        const std::vector<Tensor> cot{Tensor::randn({sh.B, sh.T, sh.H, sh.Dv}, gen, DType::bf16),
                                      Tensor::randn({sh.B, sh.H, sh.Dk, sh.Dv}, gen, DType::bf16)};
        const std::vector<Tensor> cot32{kernel::to_dtype(cot[0], DType::f32), kernel::to_dtype(cot[1], DType::f32)};
        RetentionOptions o;
        o.chunk = sh.chunk;
        if (strong) {  // 0, e^−20, 0.5 (one per head, as many as there are)
          const double g[3] = {0.0, std::exp(-20.0), 0.5};
          for (int64_t h = 0; h < sh.H; ++h) o.gammas.push_back(g[h]);
        } else if (sh.H > 1) {
          o.gammas = retention_default_gammas(sh.H);
          o.gammas.back() = 1.0 - 1e-6;
        }
        for (RetentionForm f : kForms) {
          o.form = f;
          const Outcome got = run(in, o, cot), want = run(in32, o, cot32);
          const std::string what = std::string(form_name(f)) + " T=" + std::to_string(sh.T) + " dk=" +
                                   std::to_string(sh.Dk) + " dv=" + std::to_string(sh.Dv) +
                                   (strong ? " strong decays" : " weak decays") +
                                   (widened_gemm ? ", widened GEMM" : ", native GEMM");
          const char* names[6] = {"o", "final_state", "dq", "dk", "dv", "d initial_state"};
          std::vector<Tensor> g = got.outputs, w = want.outputs;
          g.insert(g.end(), got.grads.begin(), got.grads.end());
          w.insert(w.end(), want.grads.begin(), want.grads.end());
          for (size_t i = 0; i < g.size(); ++i) {
            ASSERT_EQ(g[i].defined(), w[i].defined()) << names[i] << " " << what;
            if (!g[i].defined()) continue;
            if (f == RetentionForm::recurrent) {
              testing::expect_rounded_from(g[i], w[i], std::string(names[i]) + " " + what);
            } else {
              testing::expect_bf16_close(g[i], w[i], std::string(names[i]) + " " + what, worst);
            }
          }
        }
      }
    }
  }
  worst.print("retention parallel and chunkwise");
}

// ---- numerics at every decay (docs/reliability.md, "Numerics at every decay") ----
// γ across [0, 1] — 0, 1e-30, e^−30, e^−20, 0.5, 1 − 1e-7 and 1, one per head — over the (chunk, T,
// initial state) points of testing::numerics_sweep() (chunks 1 to 128, T from 1 to 300): every output and
// gradient of the f32 parallel, chunkwise and recurrent forms within 1e-5 (norm-wise) of the f64 recurrent
// form, the f64 parallel and chunkwise forms within 1e-12. Same f32-rounded inputs and cotangents for all
// (widened for f64). The worst errors are printed.
TEST(RetentionNumerics, EveryDecayChunkAndLength) {
  const std::vector<double> gammas = {0.0, 1e-30, std::exp(-30.0), std::exp(-20.0), 0.5, 1.0 - 1e-7, 1.0};
  const int64_t H = static_cast<int64_t>(gammas.size());
  const char* kOutputs[6] = {"o", "final_state", "dq", "dk", "dv", "dinitial_state"};
  struct Run {
    RetentionForm form;
    DType dtype;
    const char* name;
  };
  const Run kRuns[5] = {{RetentionForm::parallel, DType::f32, "f32 parallel"},
                        {RetentionForm::chunkwise, DType::f32, "f32 chunkwise"},
                        {RetentionForm::recurrent, DType::f32, "f32 recurrent"},
                        {RetentionForm::parallel, DType::f64, "f64 parallel"},
                        {RetentionForm::chunkwise, DType::f64, "f64 chunkwise"}};
  std::vector<testing::WorstError> worst;
  for (const Run& r : kRuns) {
    for (const char* what : kOutputs) worst.emplace_back(std::string(r.name) + " " + what);
  }
  std::vector<std::tuple<int64_t, int64_t, bool>> seen;  // the decay profile does not apply: each point once
  for (const testing::SweepPoint& pt : testing::numerics_sweep()) {
    if (std::find(seen.begin(), seen.end(), std::make_tuple(pt.chunk, pt.T, pt.with_h0)) != seen.end()) continue;
    seen.emplace_back(pt.chunk, pt.T, pt.with_h0);
    const uint64_t seed = 3000 + 2 * seen.size();
    const Shape5 s{1, pt.T, H, 3, 5, pt.chunk};
    const Inputs in32 = make_inputs(s, DType::f32, seed, pt.with_h0);
    Generator gen(seed + 1);
    const std::vector<Tensor> cot32 = {Tensor::randn({1, pt.T, H, 5}, gen, DType::f32),
                                       Tensor::randn({1, H, 3, 5}, gen, DType::f32)};
    const Inputs in64{kernel::to_dtype(in32.q, DType::f64), kernel::to_dtype(in32.k, DType::f64),
                      kernel::to_dtype(in32.v, DType::f64), testing::cast_or_none(in32.s0, DType::f64)};
    const std::vector<Tensor> cot64 = {kernel::to_dtype(cot32[0], DType::f64), kernel::to_dtype(cot32[1], DType::f64)};
    RetentionOptions o;
    o.chunk = pt.chunk;
    o.gammas = gammas;
    o.form = RetentionForm::recurrent;
    const Outcome exact = run(in64, o, cot64);
    const std::string at =
        "chunk " + std::to_string(pt.chunk) + " T " + std::to_string(pt.T) + (pt.with_h0 ? " h0" : "");
    for (size_t r = 0; r < std::size(kRuns); ++r) {
      o.form = kRuns[r].form;
      const bool f32 = kRuns[r].dtype == DType::f32;
      const Outcome got = f32 ? run(in32, o, cot32) : run(in64, o, cot64);
      auto all = [](const Outcome& x) {
        std::vector<Tensor> t = x.outputs;
        t.insert(t.end(), x.grads.begin(), x.grads.end());
        return t;
      };
      testing::expect_normwise(all(got), all(exact), kOutputs, f32 ? 1e-5 : 1e-12, kRuns[r].name, at, &worst[r * 6]);
    }
  }
  std::printf("  worst norm-wise errors against the f64 recurrent form over %zu points:\n", seen.size());
  for (const testing::WorstError& w : worst) w.print();
}

// Decoding: recurrent steps with T = 1 carrying the state equal the full chunkwise run; two halves
// with the state carried equal the whole for the parallel form.
TEST(Retention, DecodingCarriesTheState) {
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    const Shape5 s{2, 9, 3, 3, 4, 4};
    Inputs in = make_inputs(s, dtype, 23);
    RetentionOptions o;
    o.chunk = 4;
    RetentionOutput full = retention(in.q, in.k, in.v, in.s0, o);
    RetentionOptions step = o;
    step.form = RetentionForm::recurrent;
    Tensor S = in.s0;
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < s.T; ++t) {
      RetentionOutput one = retention(narrow(in.q, 1, t, 1), narrow(in.k, 1, t, 1), narrow(in.v, 1, t, 1), S, step);
      outs.push_back(one.o);
      S = one.final_state;
    }
    EXPECT_LE(max_rel_error(concat(outs, 1), full.o), tol);
    EXPECT_LE(max_rel_error(S, full.final_state), tol);
    RetentionOptions par = o;
    par.form = RetentionForm::parallel;
    RetentionOutput a = retention(narrow(in.q, 1, 0, 4), narrow(in.k, 1, 0, 4), narrow(in.v, 1, 0, 4), in.s0, par);
    RetentionOutput b =
        retention(narrow(in.q, 1, 4, 5), narrow(in.k, 1, 4, 5), narrow(in.v, 1, 4, 5), a.final_state, par);
    EXPECT_LE(max_rel_error(concat({a.o, b.o}, 1), full.o), tol);
    EXPECT_LE(max_rel_error(b.final_state, full.final_state), tol);
  }
}

TEST(Retention, DefaultGammas) {
  std::vector<double> g = retention_default_gammas(3);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_DOUBLE_EQ(g[0], 1 - 1.0 / 32);
  EXPECT_DOUBLE_EQ(g[1], 1 - 1.0 / 64);
  EXPECT_DOUBLE_EQ(g[2], 1 - 1.0 / 128);
  // Empty gammas and scale 0 mean these decays and 1/√dk.
  Inputs in = make_inputs({1, 5, 3, 4, 2, 2}, DType::f64, 29);
  RetentionOptions explicit_opts;
  explicit_opts.gammas = g;
  explicit_opts.scale = 0.5;
  EXPECT_LE(max_rel_error(retention(in.q, in.k, in.v, in.s0).o, retention(in.q, in.k, in.v, in.s0, explicit_opts).o),
            1e-14);
}

TEST(Retention, RegistryEntry) {
  const OpSpec* op = find_op("retention");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"o", "final_state"}));
  Generator gen(31);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  std::vector<Tensor> y =
      op->forward(x, OpAttrs::parse("retention", op->attrs, {{"form", "parallel"}, {"gammas", "0.5,0.75"}}));
  RetentionOptions o;
  o.form = RetentionForm::parallel;
  o.gammas = {0.5, 0.75};
  RetentionOutput ref = retention(x[0], x[1], x[2], x[3], o);
  EXPECT_LE(max_rel_error(y[0], ref.o), 0.0);
  EXPECT_LE(max_rel_error(y[1], ref.final_state), 0.0);
  EXPECT_THROW(op->forward(x, OpAttrs::parse("retention", op->attrs, {{"gammas", "0.5,x"}})), std::invalid_argument);
  EXPECT_THROW(op->forward(x, OpAttrs::parse("retention", op->attrs, {{"form", "chunked"}})), std::invalid_argument);
}

std::string error_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0 = Tensor(),
                     RetentionOptions o = {}) {
  return testing::error_message_of([&] { retention(q, k, v, s0, o); });
}

TEST(Retention, ErrorsNameTheShapes) {
  testing::expect_qkv_state_shape_errors(
      [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0) { return error_of(q, k, v, s0); });
  const Tensor q = Tensor::zeros({2, 5, 3, 4}), v = Tensor::zeros({2, 5, 3, 6});
  RetentionOptions o;
  o.gammas = {0.9, 0.9};
  std::string e = error_of(q, q, v, Tensor(), o);
  EXPECT_NE(e.find("2 values for 3 heads"), std::string::npos) << e;
  o.gammas = {0.9, 0.9, 1.5};
  e = error_of(q, q, v, Tensor(), o);
  EXPECT_NE(e.find("[0, 1]"), std::string::npos) << e;
  o = {};
  o.chunk = -1;
  e = error_of(q, q, v, Tensor(), o);
  EXPECT_NE(e.find("chunk must be positive"), std::string::npos) << e;
}

}  // namespace
}  // namespace seqlab
