// Linear attention: the chunkwise, recurrent and non-causal forms against each other and against
// loops written out here (values and every gradient, f32 and f64, odd shapes), float64 finite
// differences of every input for every form, token-by-token decoding and state carrying, the
// registry entry and errors. Performer FAVOR+: finite differences of x and ω, the orthogonal
// random features, and the statistical approximation of softmax attention.
#include "layers/linear/linear_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"
#include "test_util.h"
#include "variant_cases.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

struct Shape5 {
  int64_t B, T, H, Dk, Dv, chunk;
};

struct Inputs {
  Tensor q, k, v, s0, z0;
};

// Inputs for a feature map: identity gets positive q, k (as Performer features are), relu gets
// values away from its kink with most of them positive, so that φ(q)·z stays away from 0.
Inputs make_inputs(const Shape5& s, FeatureMap f, DType dtype, uint64_t seed, bool with_state = true) {
  Generator gen(seed);
  Inputs in;
  auto qk = [&]() {
    if (f == FeatureMap::identity) return Tensor::rand({s.B, s.T, s.H, s.Dk}, gen, dtype, 0.2, 1.5);
    if (f == FeatureMap::relu) {
      std::vector<double> x = Tensor::rand({s.B, s.T, s.H, s.Dk}, gen, DType::f64, 0.2, 1.5).to_doubles();
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 4 == 3 ? -x[i] : x[i];
      return Tensor::from_vector(x, {s.B, s.T, s.H, s.Dk}, dtype);
    }
    return Tensor::randn({s.B, s.T, s.H, s.Dk}, gen, dtype);
  };
  in.q = qk();
  in.k = qk();
  in.v = Tensor::randn({s.B, s.T, s.H, s.Dv}, gen, dtype);
  if (with_state) {
    in.s0 = Tensor::randn({s.B, s.H, s.Dk, s.Dv}, gen, dtype);
    in.z0 = Tensor::rand({s.B, s.H, s.Dk}, gen, dtype, 0.5, 1.5);
  }
  return in;
}

double phi(FeatureMap f, double x) {
  switch (f) {
    case FeatureMap::elu_plus_one:
      return x > 0 ? x + 1 : std::exp(x);
    case FeatureMap::relu:
      return x > 0 ? x : 0;
    case FeatureMap::identity:
      return x;
  }
  return x;
}

// The recurrence written out in doubles: o, S_T, z_T (causal or not).
std::vector<Tensor> loop_reference(const Inputs& in, const LinearAttentionOptions& o) {
  const int64_t B = in.q.size(0), T = in.q.size(1), H = in.q.size(2), Dk = in.q.size(3), Dv = in.v.size(3);
  std::vector<double> q = in.q.to_doubles(), k = in.k.to_doubles(), v = in.v.to_doubles();
  std::vector<double> S = in.s0.defined() ? in.s0.to_doubles() : std::vector<double>(B * H * Dk * Dv, 0.0);
  std::vector<double> z = in.z0.defined() ? in.z0.to_doubles() : std::vector<double>(B * H * Dk, 0.0);
  std::vector<double> out(B * T * H * Dv);
  const bool causal = o.form != LinearAttentionForm::noncausal;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      double* Sh = &S[(b * H + h) * Dk * Dv];
      double* zh = &z[(b * H + h) * Dk];
      auto add = [&](int64_t t) {
        for (int64_t i = 0; i < Dk; ++i) {
          const double fk = phi(o.feature_map, k[((b * T + t) * H + h) * Dk + i]);
          zh[i] += fk;
          for (int64_t j = 0; j < Dv; ++j) Sh[i * Dv + j] += fk * v[((b * T + t) * H + h) * Dv + j];
        }
      };
      if (!causal) {
        for (int64_t t = 0; t < T; ++t) add(t);
      }
      for (int64_t t = 0; t < T; ++t) {
        if (causal) add(t);
        double den = o.eps;
        for (int64_t i = 0; i < Dk; ++i) den += phi(o.feature_map, q[((b * T + t) * H + h) * Dk + i]) * zh[i];
        for (int64_t j = 0; j < Dv; ++j) {
          double num = 0;
          for (int64_t i = 0; i < Dk; ++i)
            num += phi(o.feature_map, q[((b * T + t) * H + h) * Dk + i]) * Sh[i * Dv + j];
          out[((b * T + t) * H + h) * Dv + j] = o.normalize ? num / den : num;
        }
      }
    }
  }
  return {Tensor::from_vector(out, {B, T, H, Dv}, DType::f64), Tensor::from_vector(S, {B, H, Dk, Dv}, DType::f64),
          Tensor::from_vector(z, {B, H, Dk}, DType::f64)};
}

struct Outcome {
  std::vector<Tensor> outputs, grads;  // o, S_T, z_T; dq, dk, dv, dS_0, dz_0
};

Outcome run(const Inputs& x, const LinearAttentionOptions& o, uint64_t seed) {
  Inputs in{set_requires_grad(x.q.detach()), set_requires_grad(x.k.detach()), set_requires_grad(x.v.detach()),
            x.s0.defined() ? set_requires_grad(x.s0.detach()) : Tensor(),
            x.z0.defined() ? set_requires_grad(x.z0.detach()) : Tensor()};
  LinearAttentionOutput out = linear_attention(in.q, in.k, in.v, in.s0, in.z0, o);
  Generator gen(seed);
  std::vector<Tensor> roots{out.o, out.final_state, out.final_normalizer}, cot;
  for (const Tensor& r : roots) cot.push_back(Tensor::randn(r.shape(), gen, r.dtype()));
  backward(roots, cot);
  Outcome res;
  for (const Tensor& r : roots) res.outputs.push_back(r.detach());
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.s0, &in.z0})
    res.grads.push_back(t->defined() ? grad_of(*t) : Tensor());
  return res;
}

const char* fname(FeatureMap f) {
  return f == FeatureMap::elu_plus_one ? "elu+1" : f == FeatureMap::relu ? "relu" : "identity";
}

// Odd shapes: T not a multiple of the chunk, T smaller than one chunk, T = 1, dk ≠ dv, a multiple.
const std::vector<Shape5> kShapes = {
    {2, 7, 2, 3, 4, 3}, {1, 2, 1, 3, 2, 5}, {2, 1, 3, 4, 3, 4}, {1, 12, 2, 5, 3, 4}, {1, 9, 1, 2, 5, 1}};

void expect_forms_equal(DType dtype, double tol) {
  for (const Shape5& s : kShapes) {
    for (FeatureMap f : {FeatureMap::elu_plus_one, FeatureMap::relu, FeatureMap::identity}) {
      for (bool normalize : {true, false}) {
        for (bool with_state : {true, false}) {
          Inputs in = make_inputs(s, f, dtype, 5 + s.T, with_state);
          LinearAttentionOptions o;
          o.feature_map = f;
          o.normalize = normalize;
          o.chunk = s.chunk;
          o.form = LinearAttentionForm::recurrent;
          Outcome rec = run(in, o, 9);
          o.form = LinearAttentionForm::chunkwise;
          Outcome chk = run(in, o, 9);
          const std::string what = std::string(fname(f)) + (normalize ? " normalized" : " raw") +
                                   (with_state ? " with state" : "") + " T=" + std::to_string(s.T) +
                                   " chunk=" + std::to_string(s.chunk);
          // Both against the loop in doubles (forward), and each other (forward and every gradient).
          std::vector<Tensor> ref = loop_reference(in, o);
          for (size_t i = 0; i < 3; ++i) {
            EXPECT_LE(max_rel_error(rec.outputs[i], ref[i]), tol) << what << " output " << i;
            EXPECT_LE(max_rel_error(chk.outputs[i], rec.outputs[i]), tol) << what << " output " << i;
          }
          for (size_t i = 0; i < 5; ++i) {
            ASSERT_EQ(chk.grads[i].defined(), rec.grads[i].defined()) << what;
            if (chk.grads[i].defined()) {
              EXPECT_LE(max_rel_error(chk.grads[i], rec.grads[i]), tol) << what << " grad " << i;
            }
          }
          // The non-causal form: against the loop, and its final state equals the causal one's.
          o.form = LinearAttentionForm::noncausal;
          Outcome nc = run(in, o, 9);
          std::vector<Tensor> ref_nc = loop_reference(in, o);
          for (size_t i = 0; i < 3; ++i) EXPECT_LE(max_rel_error(nc.outputs[i], ref_nc[i]), tol) << what << " nc " << i;
          EXPECT_LE(max_rel_error(nc.outputs[1], rec.outputs[1]), tol) << what;
        }
      }
    }
  }
}

TEST(LinearAttention, FormsAgreeF64) { expect_forms_equal(DType::f64, 1e-10); }
TEST(LinearAttention, FormsAgreeF32) { expect_forms_equal(DType::f32, 1e-5); }

// Finite differences of every input (q, k, v, S_0, z_0) through all three outputs, every form.
TEST(LinearAttention, GradcheckEveryFormAndInput) {
  for (LinearAttentionForm form :
       {LinearAttentionForm::chunkwise, LinearAttentionForm::recurrent, LinearAttentionForm::noncausal}) {
    for (FeatureMap f : {FeatureMap::elu_plus_one, FeatureMap::relu, FeatureMap::identity}) {
      for (bool normalize : {true, false}) {
        const Shape5 s{2, 5, 2, 3, 2, 2};
        Inputs in = make_inputs(s, f, DType::f64, 21);
        LinearAttentionOptions o;
        o.form = form;
        o.feature_map = f;
        o.normalize = normalize;
        o.chunk = s.chunk;
        GradcheckResult r = gradcheck(
            [&](const std::vector<Tensor>& x) {
              LinearAttentionOutput out = linear_attention(x[0], x[1], x[2], x[3], x[4], o);
              return std::vector<Tensor>{out.o, out.final_state, out.final_normalizer};
            },
            {in.q, in.k, in.v, in.s0, in.z0});
        EXPECT_EQ(r.elements_checked, 2 * 5 * 2 * (3 + 3 + 2) + 2 * 2 * 3 * 2 + 2 * 2 * 3);
        EXPECT_LE(r.max_error, 1e-6) << "form " << static_cast<int>(form) << " " << fname(f) << " normalize "
                                     << normalize << ": " << r.worst;
      }
    }
  }
}

// Decoding: the recurrent form with T = 1, carrying (S, z) token by token, equals the whole
// sequence; and two halves with the state carried equal the whole for the chunkwise form too.
TEST(LinearAttention, DecodingCarriesTheState) {
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    const Shape5 s{2, 9, 2, 3, 4, 4};
    Inputs in = make_inputs(s, FeatureMap::elu_plus_one, dtype, 31);
    LinearAttentionOptions o;
    o.chunk = 4;
    LinearAttentionOutput full = linear_attention(in.q, in.k, in.v, in.s0, in.z0, o);
    LinearAttentionOptions step = o;
    step.form = LinearAttentionForm::recurrent;
    Tensor S = in.s0, z = in.z0;
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < s.T; ++t) {
      LinearAttentionOutput one =
          linear_attention(narrow(in.q, 1, t, 1), narrow(in.k, 1, t, 1), narrow(in.v, 1, t, 1), S, z, step);
      outs.push_back(one.o);
      S = one.final_state;
      z = one.final_normalizer;
    }
    EXPECT_LE(max_rel_error(concat(outs, 1), full.o), tol);
    EXPECT_LE(max_rel_error(S, full.final_state), tol);
    EXPECT_LE(max_rel_error(z, full.final_normalizer), tol);
    LinearAttentionOutput a =
        linear_attention(narrow(in.q, 1, 0, 5), narrow(in.k, 1, 0, 5), narrow(in.v, 1, 0, 5), in.s0, in.z0, o);
    LinearAttentionOutput b = linear_attention(narrow(in.q, 1, 5, 4), narrow(in.k, 1, 5, 4), narrow(in.v, 1, 5, 4),
                                               a.final_state, a.final_normalizer, o);
    EXPECT_LE(max_rel_error(concat({a.o, b.o}, 1), full.o), tol);
    EXPECT_LE(max_rel_error(b.final_state, full.final_state), tol);
  }
}

// One token, one head, hand-computed: φ = elu+1, q = (1, −1), k = (0.5, −2), v = (3), no state:
// φ(q) = (2, e⁻¹), φ(k) = (1.5, e⁻²); S = φ(k) v = (4.5, 3e⁻²), z = φ(k),
// o = (2·4.5 + e⁻¹·3e⁻²) / (2·1.5 + e⁻¹·e⁻² + eps).
TEST(LinearAttention, HandWrittenValue) {
  Tensor q = Tensor::from_vector({1, -1}, {1, 1, 1, 2}, DType::f64);
  Tensor k = Tensor::from_vector({0.5, -2}, {1, 1, 1, 2}, DType::f64);
  Tensor v = Tensor::from_vector({3}, {1, 1, 1, 1}, DType::f64);
  for (LinearAttentionForm form :
       {LinearAttentionForm::chunkwise, LinearAttentionForm::recurrent, LinearAttentionForm::noncausal}) {
    LinearAttentionOptions o;
    o.form = form;
    LinearAttentionOutput out = linear_attention(q, k, v, Tensor(), Tensor(), o);
    const double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
    EXPECT_NEAR(out.o.to_doubles()[0], (9 + e1 * 3 * e2) / (3 + e1 * e2 + 1e-6), 1e-14);
    EXPECT_NEAR(out.final_state.to_doubles()[1], 3 * e2, 1e-15);
    EXPECT_NEAR(out.final_normalizer.to_doubles()[0], 1.5, 1e-15);
  }
}

// ---- Performer FAVOR+ ----
TEST(Performer, GradcheckXAndOmega) {
  for (bool stabilize : {false, true}) {
    Generator gen(41);
    Tensor x = Tensor::randn({2, 3, 2, 4}, gen, DType::f64, 0.5);
    Tensor w = Tensor::randn({6, 4}, gen, DType::f64);
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{performer_features(in[0], in[1], stabilize)}; },
        {x, w});
    EXPECT_EQ(r.elements_checked, 2 * 3 * 2 * 4 + 6 * 4);
    EXPECT_LE(r.max_error, 1e-6) << "stabilize " << stabilize << ": " << r.worst;
  }
}

TEST(Performer, FeaturesMatchTheFormula) {
  Generator gen(43);
  Tensor x = Tensor::randn({1, 2, 1, 3}, gen, DType::f64), w = Tensor::randn({4, 3}, gen, DType::f64);
  std::vector<double> xs = x.to_doubles(), ws = w.to_doubles();
  for (bool stabilize : {false, true}) {
    std::vector<double> y = performer_features(x, w, stabilize).to_doubles();
    for (int n = 0; n < 2; ++n) {
      double sq = 0, mx = -1e300;
      std::vector<double> p(4);
      for (int c = 0; c < 3; ++c) sq += xs[n * 3 + c] * xs[n * 3 + c];
      for (int i = 0; i < 4; ++i) {
        for (int c = 0; c < 3; ++c) p[i] += ws[i * 3 + c] * xs[n * 3 + c];
        mx = std::max(mx, p[i]);
      }
      for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(y[n * 4 + i], std::exp(p[i] - sq / 2 - (stabilize ? mx : 0)) / 2, 1e-14);
      }
    }
  }
  // f32 agrees with f64.
  Tensor y32 = performer_features(to_dtype(x, DType::f32), to_dtype(w, DType::f32), true);
  EXPECT_LE(max_rel_error(y32, performer_features(x, w, true)), 1e-6);
}

// Rows of one block are orthogonal; norms are χ_d samples (not all 1, mean near √d); the same
// generator state gives the same features, a different one different features.
TEST(Performer, OrthogonalRandomFeatures) {
  const int64_t d = 8, m = 20;
  Generator gen(47);
  std::vector<double> w = orthogonal_random_features(m, d, gen, DType::f64).to_doubles();
  auto row_dot = [&](int64_t a, int64_t b) {
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += w[a * d + c] * w[b * d + c];
    return s;
  };
  for (int64_t a = 0; a < m; ++a) {
    for (int64_t b = a + 1; b < m; ++b) {
      if (a / d == b / d) {
        EXPECT_NEAR(row_dot(a, b), 0.0, 1e-12) << a << " " << b;
      }
    }
  }
  EXPECT_GT(std::abs(row_dot(0, d)), 1e-6);  // different blocks are independent
  double mean_norm = 0, min_norm = 1e300, max_norm = 0;
  for (int64_t a = 0; a < m; ++a) {
    const double n = std::sqrt(row_dot(a, a));
    mean_norm += n / m;
    min_norm = std::min(min_norm, n);
    max_norm = std::max(max_norm, n);
  }
  EXPECT_GT(max_norm - min_norm, 0.1);
  EXPECT_NEAR(mean_norm, std::sqrt(static_cast<double>(d)), 1.0);
  Generator a(5), b(5), c(6);
  EXPECT_LE(max_rel_error(orthogonal_random_features(m, d, a), orthogonal_random_features(m, d, b)), 0.0);
  EXPECT_GT(max_rel_error(orthogonal_random_features(m, d, a), orthogonal_random_features(m, d, c)), 1e-3);
  EXPECT_THROW(orthogonal_random_features(0, d, a), std::invalid_argument);
}

// Performer is linear attention with feature_map = identity on FAVOR+ features: with many random
// features it approximates softmax attention (non-causal and causal). Loose, fixed seed: q, k are
// scaled by d^(−1/4) so that φ(q)·φ(k) estimates exp(q·k/√d); queries are row-stabilised.
TEST(Performer, ApproximatesSoftmaxAttention) {
  const int64_t B = 1, T = 6, H = 2, d = 4, m = 4096;
  Generator gen(53);
  Tensor q = Tensor::randn({B, T, H, d}, gen, DType::f64, 0.7), k = Tensor::randn({B, T, H, d}, gen, DType::f64, 0.7);
  Tensor v = Tensor::randn({B, T, H, 3}, gen, DType::f64);
  Generator fgen(59);
  Tensor w = orthogonal_random_features(m, d, fgen, DType::f64);
  const double s = std::pow(static_cast<double>(d), -0.25);
  Tensor fq = performer_features(q * s, w, true), fk = performer_features(k * s, w, false);
  for (bool causal : {false, true}) {
    LinearAttentionOptions o;
    o.feature_map = FeatureMap::identity;
    o.form = causal ? LinearAttentionForm::chunkwise : LinearAttentionForm::noncausal;
    o.chunk = 4;
    o.eps = 0;
    Tensor approx = linear_attention(fq, fk, v, Tensor(), Tensor(), o).o;
    Tensor exact = attention(q, k, v, {causal, 0.0, 64});
    std::vector<double> a = approx.to_doubles(), e = exact.to_doubles();
    double worst = 0, mean = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - e[i]));
      mean += std::abs(a[i] - e[i]) / a.size();
    }
    EXPECT_LT(worst, 0.15) << "causal " << causal;
    EXPECT_LT(mean, 0.05) << "causal " << causal;
    // Not trivially close: uniform attention (the mean of v) is much further away.
    LinearAttentionOptions flat = o;
    Tensor uniform = linear_attention(Tensor::ones(q.shape(), DType::f64), Tensor::ones(k.shape(), DType::f64), v,
                                      Tensor(), Tensor(), flat)
                         .o;
    EXPECT_GT(max_rel_error(uniform, exact), 3 * worst) << "causal " << causal;
  }
}

// ---- bf16 on the CPU ----
// The linear attention kernels take bf16 tensors themselves (layers/variant_rows.h): rows widened per head,
// states, normalisers and denominators in f32, the chunkwise and non-causal forms' GEMMs on bf16 operands
// with f32 sums, outputs rounded once. At the kernel slots (so φ is not in the comparison), against the f32
// kernels on the same bf16 values, with the GEMMs on the CPU's bf16 instructions and forced onto widened
// operands: chunkwise and non-causal within testing::expect_bf16_close's tolerances, the recurrent form (no
// GEMM) exactly the f32 result rounded. φ(q), φ(k) as elu+1 gives them (positive), normalised and not; T = 1,
// T below a chunk, odd sizes with a partial chunk, dk ≠ dv, a 64 × 64 head over a partial third chunk.
// Linear attention has no separate key/value heads, so there is no GQA case.
std::vector<Tensor> run_la_kernels(const std::vector<Tensor>& x, const kernel::LinearAttentionParams& p,
                                   const std::vector<Tensor>& cot) {
  const int64_t B = x[0].size(0), T = x[0].size(1), H = x[0].size(2), Dk = x[0].size(3), Dv = x[2].size(3);
  const DType dt = x[0].dtype();
  std::vector<Tensor> r{Tensor::empty({B, T, H, Dv}, dt),  Tensor::empty({B, H, Dk, Dv}, dt),
                        Tensor::empty({B, H, Dk}, dt),     Tensor::empty({B, T, H, Dk}, dt),
                        Tensor::empty({B, T, H, Dk}, dt),  Tensor::empty({B, T, H, Dv}, dt),
                        Tensor::empty({B, H, Dk, Dv}, dt), Tensor::empty({B, H, Dk}, dt)};
  kernel::linear_attention_forward_kernel(cpu_device(), x[0], x[1], x[2], x[3], x[4], p, r[0], r[1], r[2]);
  kernel::linear_attention_backward_kernel(cpu_device(), x[0], x[1], x[2], x[3], x[4], cot[0], cot[1], cot[2], p,
                                           r[3], r[4], r[5], r[6], r[7]);
  return r;  // o, S_T, z_T, dfq, dfk, dv, dS_0, dz_0
}

TEST(LinearAttentionBf16, WithinBf16OfF32AndRecurrentExact) {
  testing::Bf16GemmPath restore;
  const std::vector<Shape5> shapes = {{2, 1, 2, 8, 8, 64}, {1, 11, 3, 16, 8, 64}, {2, 37, 3, 5, 7, 16},
                                      {1, 45, 2, 24, 10, 16}, {1, 150, 2, 64, 64, 64}};
  const char* names[8] = {"o", "final_state", "final_normalizer", "dfq", "dfk", "dv", "d initial_state",
                          "d initial_normalizer"};
  testing::Bf16Worst worst;
  for (bool widened_gemm : {false, true}) {
    kernel::set_cpu_bf16_gemm_widened(widened_gemm);
    for (const Shape5& sh : shapes) {
      Generator gen(71 + sh.T);
      auto positive = [&](const Shape& s) { return Tensor::rand(s, gen, DType::bf16, 0.05, 2.0); };
      const std::vector<Tensor> x{positive({sh.B, sh.T, sh.H, sh.Dk}), positive({sh.B, sh.T, sh.H, sh.Dk}),
                                  Tensor::randn({sh.B, sh.T, sh.H, sh.Dv}, gen, DType::bf16),
                                  Tensor::randn({sh.B, sh.H, sh.Dk, sh.Dv}, gen, DType::bf16),
                                  positive({sh.B, sh.H, sh.Dk})};
      const std::vector<Tensor> cot{Tensor::randn({sh.B, sh.T, sh.H, sh.Dv}, gen, DType::bf16),
                                    Tensor::randn({sh.B, sh.H, sh.Dk, sh.Dv}, gen, DType::bf16),
                                    Tensor::randn({sh.B, sh.H, sh.Dk}, gen, DType::bf16)};
      std::vector<Tensor> x32, cot32;
      for (const Tensor& t : x) x32.push_back(kernel::to_dtype(t, DType::f32));
      for (const Tensor& t : cot) cot32.push_back(kernel::to_dtype(t, DType::f32));
      for (bool normalize : {true, false}) {
        for (LinearAttentionForm form :
             {LinearAttentionForm::chunkwise, LinearAttentionForm::noncausal, LinearAttentionForm::recurrent}) {
          const kernel::LinearAttentionParams p{form, normalize, 1e-6, sh.chunk};
          const std::vector<Tensor> got = run_la_kernels(x, p, cot), want = run_la_kernels(x32, p, cot32);
          const std::string what = std::string(form == LinearAttentionForm::chunkwise   ? "chunkwise"
                                               : form == LinearAttentionForm::noncausal ? "noncausal"
                                                                                        : "recurrent") +
                                   (normalize ? " normalized" : " raw") + " T=" + std::to_string(sh.T) +
                                   " dk=" + std::to_string(sh.Dk) + " dv=" + std::to_string(sh.Dv) +
                                   (widened_gemm ? ", widened GEMM" : ", native GEMM");
          for (size_t i = 0; i < 8; ++i) {
            if (form == LinearAttentionForm::recurrent) {
              testing::expect_rounded_from(got[i], want[i], std::string(names[i]) + " " + what);
            } else {
              testing::expect_bf16_close(got[i], want[i], std::string(names[i]) + " " + what, worst);
            }
          }
        }
      }
    }
  }
  worst.print("linear_attention chunkwise and noncausal");
}

TEST(LinearAttention, RegistryEntries) {
  const OpSpec* op = find_op("linear_attention");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"o", "final_state", "final_normalizer"}));
  Generator gen(61);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  OpAttrs attrs = OpAttrs::parse("linear_attention", op->attrs, {{"form", "recurrent"}, {"feature_map", "relu"}});
  std::vector<Tensor> y = op->forward(x, attrs);
  LinearAttentionOptions o;
  o.form = LinearAttentionForm::recurrent;
  o.feature_map = FeatureMap::relu;
  LinearAttentionOutput ref = linear_attention(x[0], x[1], x[2], x[3], x[4], o);
  ASSERT_EQ(y.size(), 3u);
  EXPECT_LE(max_rel_error(y[0], ref.o), 0.0);
  EXPECT_LE(max_rel_error(y[1], ref.final_state), 0.0);
  EXPECT_THROW(op->forward(x, OpAttrs::parse("linear_attention", op->attrs, {{"form", "parallel"}})),
               std::invalid_argument);
  ASSERT_NE(find_op("performer_features"), nullptr);
}

std::string error_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0 = Tensor(),
                     const Tensor& z0 = Tensor(), LinearAttentionOptions o = {}) {
  return testing::error_message_of([&] { linear_attention(q, k, v, s0, z0, o); });
}

TEST(LinearAttention, ErrorsNameTheShapes) {
  testing::expect_qkv_state_shape_errors(
      [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0) { return error_of(q, k, v, s0); });
  const Tensor q = Tensor::zeros({2, 5, 3, 4}), v = Tensor::zeros({2, 5, 3, 6});
  std::string e = error_of(q, q, v, Tensor(), Tensor::zeros({2, 3, 6}));
  EXPECT_NE(e.find("initial_normalizer"), std::string::npos) << e;
  e = error_of(q, q, Tensor::zeros({2, 4, 3, 6}));
  EXPECT_NE(e.find("v differs"), std::string::npos) << e;
  LinearAttentionOptions bad;
  bad.chunk = 0;
  e = error_of(q, q, v, Tensor(), Tensor(), bad);
  EXPECT_NE(e.find("chunk must be positive"), std::string::npos) << e;
  e = error_of(q, q, to_dtype(v, DType::f64));
  EXPECT_NE(e.find("dtype"), std::string::npos) << e;
  EXPECT_THROW(performer_features(q, Tensor::zeros({5, 3})), std::invalid_argument);
}

}  // namespace
}  // namespace seqlab
