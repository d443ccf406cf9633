// Fused softmax attention: the tiled online-softmax op against the naive materialised reference
// (outputs, lse and every gradient), finite-difference gradients including the lse output's,
// the KV-cache (decode) and lse-merge properties, numerical range, and shape errors.
#include "layers/attention/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

struct Case {
  const char* name;
  int64_t B, T, S, H, Hk, Dk, Dv, block;
  bool causal;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

using testing::max_rel_error;

struct Inputs {
  Tensor q, k, v;
};

Inputs make_inputs(const Case& c, DType dtype, uint64_t seed, double stddev = 1.0) {
  Generator gen(seed);
  return {Tensor::randn({c.B, c.T, c.H, c.Dk}, gen, dtype, stddev),
          Tensor::randn({c.B, c.S, c.Hk, c.Dk}, gen, dtype, stddev), Tensor::randn({c.B, c.S, c.Hk, c.Dv}, gen, dtype)};
}

struct Result {
  Tensor o, lse, dq, dk, dv;
};

// Forward, then one backward seeded with the same cotangents for o and lse.
template <class Fn>
Result forward_backward(Fn fn, const Inputs& in, uint64_t seed) {
  Tensor q = set_requires_grad(in.q.detach()), k = set_requires_grad(in.k.detach()),
         v = set_requires_grad(in.v.detach());
  AttentionOutput out = fn(q, k, v);
  Generator gen(seed);
  Tensor go = Tensor::randn(out.o.shape(), gen, out.o.dtype()), gl = Tensor::randn(out.lse.shape(), gen, out.o.dtype());
  backward({out.o, out.lse}, {go, gl});
  return {out.o.detach(), out.lse.detach(), grad_of(q), grad_of(k), grad_of(v)};
}

auto fused_op(AttentionOptions opts) {
  return [opts](const Tensor& q, const Tensor& k, const Tensor& v) { return attention_with_lse(q, k, v, opts); };
}
auto reference_op(bool causal) {
  return [causal](const Tensor& q, const Tensor& k, const Tensor& v) { return attention_reference(q, k, v, causal); };
}

class AttentionMatchesReference : public ::testing::TestWithParam<Case> {};

void expect_match(const Case& c, DType dtype, double tol) {
  Inputs in = make_inputs(c, dtype, 7);
  AttentionOptions opts{c.causal, 0.0, c.block};
  Result fused = forward_backward(fused_op(opts), in, 11);
  Result ref = forward_backward(reference_op(c.causal), in, 11);
  ASSERT_TRUE(fused.dq.defined() && fused.dk.defined() && fused.dv.defined());
  EXPECT_LE(max_rel_error(fused.o, ref.o), tol) << "o";
  EXPECT_LE(max_rel_error(fused.lse, ref.lse), tol) << "lse";
  EXPECT_LE(max_rel_error(fused.dq, ref.dq), tol) << "dq";
  EXPECT_LE(max_rel_error(fused.dk, ref.dk), tol) << "dk";
  EXPECT_LE(max_rel_error(fused.dv, ref.dv), tol) << "dv";
  EXPECT_EQ(fused.o.shape(), (Shape{c.B, c.T, c.H, c.Dv}));
  EXPECT_EQ(fused.lse.shape(), (Shape{c.B, c.T, c.H}));
}

TEST_P(AttentionMatchesReference, F64) { expect_match(GetParam(), DType::f64, 1e-10); }
TEST_P(AttentionMatchesReference, F32) { expect_match(GetParam(), DType::f32, 1e-5); }

// name, B, T, S, H, Hk, Dk, Dv, block, causal
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionMatchesReference,
    ::testing::Values(Case{"square_causal", 2, 7, 7, 2, 2, 4, 4, 2, true},
                      Case{"square_bidirectional", 2, 7, 7, 2, 2, 4, 4, 2, false},
                      Case{"cache_causal", 2, 5, 9, 2, 2, 4, 4, 4, true},  // T < S: queries at the end
                      Case{"cache_bidirectional", 2, 5, 9, 2, 2, 4, 4, 4, false},
                      Case{"decode_causal", 2, 1, 9, 2, 2, 4, 4, 4, true},  // one new token against a cache
                      Case{"decode_bidirectional", 1, 1, 9, 2, 1, 4, 4, 4, false},
                      Case{"short_T_causal", 2, 3, 6, 2, 2, 4, 4, 4, true},  // T smaller than one block
                      Case{"block_beyond_S_causal", 1, 9, 9, 2, 2, 4, 4, 16, true},
                      Case{"block_beyond_S_bidirectional", 1, 6, 9, 2, 2, 4, 4, 16, false},
                      Case{"gqa_causal", 2, 5, 7, 4, 2, 3, 3, 2, true},
                      Case{"gqa_bidirectional", 2, 5, 7, 4, 2, 3, 3, 2, false},
                      Case{"mqa_causal", 1, 6, 6, 3, 1, 4, 4, 4, true},
                      Case{"mqa_bidirectional", 1, 6, 8, 3, 1, 4, 4, 4, false},
                      Case{"dk_ne_dv_causal", 2, 5, 7, 4, 2, 3, 5, 2, true},
                      Case{"cross_T_gt_S_bidirectional", 2, 6, 4, 2, 1, 3, 2, 3, false},
                      Case{"block_of_one_causal", 1, 4, 5, 2, 2, 3, 3, 1, true},
                      Case{"many_blocks_causal", 2, 37, 45, 4, 2, 16, 8, 8, true},  // several tasks and threads
                      Case{"many_blocks_bidirectional", 2, 37, 45, 4, 2, 16, 8, 8, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- finite differences (f64), through both outputs and through lse alone ----
GradcheckResult check(const Case& c, bool lse_only) {
  Inputs in = make_inputs(c, DType::f64, 3);
  AttentionOptions opts{c.causal, 0.0, c.block};
  return gradcheck(
      [&](const std::vector<Tensor>& x) {
        AttentionOutput out = attention_with_lse(x[0], x[1], x[2], opts);
        return lse_only ? std::vector<Tensor>{out.lse} : std::vector<Tensor>{out.o, out.lse};
      },
      {in.q, in.k, in.v});
}

TEST(AttentionGradcheck, CausalGqa) {
  GradcheckResult r = check({"", 2, 5, 7, 4, 2, 3, 4, 2, true}, false);
  EXPECT_EQ(r.elements_checked, 2 * 5 * 4 * 3 + 2 * 7 * 2 * 3 + 2 * 7 * 2 * 4);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

TEST(AttentionGradcheck, BidirectionalGqa) {
  GradcheckResult r = check({"", 2, 5, 7, 4, 2, 3, 4, 2, false}, false);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

TEST(AttentionGradcheck, CausalMqaSquare) {
  GradcheckResult r = check({"", 1, 6, 6, 3, 1, 3, 3, 4, true}, false);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

TEST(AttentionGradcheck, Decode) {
  GradcheckResult r = check({"", 2, 1, 5, 2, 1, 3, 3, 2, true}, false);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

// The dlse term alone: only lse gets a cotangent, so o contributes nothing.
TEST(AttentionGradcheck, LseOutputCausal) {
  GradcheckResult r = check({"", 2, 5, 7, 4, 2, 3, 4, 2, true}, true);
  EXPECT_GT(r.elements_checked, 0);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

TEST(AttentionGradcheck, LseOutputBidirectional) {
  GradcheckResult r = check({"", 1, 4, 6, 2, 2, 3, 3, 4, false}, true);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

TEST(AttentionGradcheck, ExplicitScale) {
  Inputs in = make_inputs({"", 1, 4, 5, 2, 1, 3, 3, 2, true}, DType::f64, 5);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& x) {
        AttentionOutput out = attention_with_lse(x[0], x[1], x[2], {true, 0.37, 2});
        return std::vector<Tensor>{out.o, out.lse};
      },
      {in.q, in.k, in.v});
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

// ---- properties ----

// Scale ≤ 0 means 1/√Dk; an explicit scale matches the reference with the same scale.
TEST(Attention, ScaleAttribute) {
  Case c{"", 1, 5, 7, 2, 2, 4, 4, 2, true};
  Inputs in = make_inputs(c, DType::f64, 9);
  AttentionOutput def = attention_with_lse(in.q, in.k, in.v, {true, 0.0, 2});
  AttentionOutput half = attention_with_lse(in.q, in.k, in.v, {true, 0.5, 2});  // 1/√4
  EXPECT_LE(max_rel_error(def.o, half.o), 1e-14);
  AttentionOutput s3 = attention_with_lse(in.q, in.k, in.v, {true, 3.0, 2});
  AttentionOutput r3 = attention_reference(in.q, in.k, in.v, true, 3.0);
  EXPECT_LE(max_rel_error(s3.o, r3.o), 1e-10);
  EXPECT_LE(max_rel_error(s3.lse, r3.lse), 1e-10);
  EXPECT_GT(max_rel_error(s3.o, def.o), 1e-3);
}

// Decoding: the last query alone against the whole cache equals the last row of the full pass.
TEST(Attention, DecodeEqualsLastRowOfFullPass) {
  Case c{"", 2, 9, 9, 4, 2, 4, 3, 4, true};
  Inputs in = make_inputs(c, DType::f64, 13);
  AttentionOutput full = attention_with_lse(in.q, in.k, in.v, {true, 0.0, 4});
  AttentionOutput step = attention_with_lse(kernel::narrow(in.q, 1, 8, 1), in.k, in.v, {true, 0.0, 4});
  EXPECT_LE(max_rel_error(step.o, kernel::narrow(full.o, 1, 8, 1)), 1e-13);
  EXPECT_LE(max_rel_error(step.lse, kernel::narrow(full.lse, 1, 8, 1)), 1e-13);
  // And a block of three new queries against the cache equals the last three rows.
  AttentionOutput chunk = attention_with_lse(kernel::narrow(in.q, 1, 6, 3), in.k, in.v, {true, 0.0, 2});
  EXPECT_LE(max_rel_error(chunk.o, kernel::narrow(full.o, 1, 6, 3)), 1e-13);
}

// Ring attention's merge: attending to two halves of the keys and combining by lse,
// o = (e^{lse₁} o₁ + e^{lse₂} o₂) / (e^{lse₁} + e^{lse₂}), lse = log(e^{lse₁} + e^{lse₂}), gives the full result.
TEST(Attention, PartialResultsMergeByLse) {
  Case c{"", 1, 4, 10, 2, 1, 3, 3, 3, false};
  Inputs in = make_inputs(c, DType::f64, 17);
  AttentionOptions opts{false, 0.0, 3};
  AttentionOutput full = attention_with_lse(in.q, in.k, in.v, opts);
  AttentionOutput a = attention_with_lse(in.q, kernel::narrow(in.k, 1, 0, 6), kernel::narrow(in.v, 1, 0, 6), opts);
  AttentionOutput b = attention_with_lse(in.q, kernel::narrow(in.k, 1, 6, 4), kernel::narrow(in.v, 1, 6, 4), opts);
  std::vector<double> oa = a.o.to_doubles(), ob = b.o.to_doubles(), la = a.lse.to_doubles(), lb = b.lse.to_doubles();
  std::vector<double> of = full.o.to_doubles(), lf = full.lse.to_doubles();
  const size_t D = 3;
  for (size_t r = 0; r < la.size(); ++r) {
    const double lse = std::log(std::exp(la[r]) + std::exp(lb[r]));
    EXPECT_NEAR(lse, lf[r], 1e-12);
    for (size_t d = 0; d < D; ++d) {
      EXPECT_NEAR(std::exp(la[r] - lse) * oa[r * D + d] + std::exp(lb[r] - lse) * ob[r * D + d], of[r * D + d], 1e-12);
    }
  }
}

// Scores around 1e3 (far beyond exp's range) stay finite and exact, forward and backward.
TEST(Attention, LargeLogitsStayFinite) {
  for (DType dtype : {DType::f64, DType::f32}) {
    Case c{"", 1, 6, 8, 2, 1, 4, 4, 3, true};
    Inputs in = make_inputs(c, dtype, 19, 30.0);  // |q·k|/√D ~ 900 · 2/2
    Result fused = forward_backward(fused_op({true, 0.0, 3}), in, 23);
    Result ref = forward_backward(reference_op(true), in, 23);
    double max_lse = 0;
    for (const Tensor* t : {&fused.o, &fused.lse, &fused.dq, &fused.dk, &fused.dv}) {
      for (double x : t->to_doubles()) ASSERT_TRUE(std::isfinite(x));
    }
    for (double x : fused.lse.to_doubles()) max_lse = std::max(max_lse, std::abs(x));
    EXPECT_GT(max_lse, 300.0);
    const double tol = dtype == DType::f64 ? 1e-10 : 1e-4;
    EXPECT_LE(max_rel_error(fused.o, ref.o), tol);
    EXPECT_LE(max_rel_error(fused.lse, ref.lse), tol);
    EXPECT_LE(max_rel_error(fused.dv, ref.dv), tol);
  }
}

// Only the gradients asked for are computed; the others stay undefined.
TEST(Attention, ComputesOnlyNeededGradients) {
  Case c{"", 2, 5, 7, 4, 2, 3, 3, 2, true};
  Inputs in = make_inputs(c, DType::f64, 29);
  Result ref = forward_backward(reference_op(true), in, 31);
  for (int which = 0; which < 3; ++which) {
    Tensor q = kernel::clone(in.q), k = kernel::clone(in.k), v = kernel::clone(in.v);
    Tensor* x[3] = {&q, &k, &v};
    set_requires_grad(*x[which]);
    AttentionOutput out = attention_with_lse(q, k, v, {true, 0.0, 2});
    Generator gen(31);
    Tensor go = Tensor::randn(out.o.shape(), gen, DType::f64), gl = Tensor::randn(out.lse.shape(), gen, DType::f64);
    backward({out.o, out.lse}, {go, gl});
    const Tensor* expected[3] = {&ref.dq, &ref.dk, &ref.dv};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(grad_of(*x[i]).defined(), i == which);
    EXPECT_LE(max_rel_error(grad_of(*x[which]), *expected[which]), 1e-10);
  }
  // And through the raw entry point.
  AttentionOutput out = kernel::attention_forward(in.q, in.k, in.v, {true, 0.0, 2});
  kernel::AttentionGrads g =
      kernel::attention_backward(out.o, Tensor(), in.q, in.k, in.v, out.o, out.lse, {true, 0.0, 2}, false, true, false);
  EXPECT_FALSE(g.dq.defined());
  EXPECT_TRUE(g.dk.defined());
  EXPECT_FALSE(g.dv.defined());
}

// Strided views (q as a permuted [B, H, T, D] tensor) give the same result as contiguous inputs.
TEST(Attention, AcceptsStridedInputs) {
  Case c{"", 2, 5, 7, 2, 2, 4, 4, 2, true};
  Inputs in = make_inputs(c, DType::f64, 37);
  Tensor q_bhtd = kernel::contiguous(kernel::permute(in.q, {0, 2, 1, 3}));
  Tensor q_view = kernel::permute(q_bhtd, {0, 2, 1, 3});
  ASSERT_FALSE(q_view.is_contiguous());
  Result a = forward_backward(fused_op({true, 0.0, 2}), in, 41);
  Result b = forward_backward(fused_op({true, 0.0, 2}), {q_view, in.k, in.v}, 41);
  EXPECT_LE(max_rel_error(a.o, b.o), 1e-15);
  EXPECT_LE(max_rel_error(a.dq, b.dq), 1e-15);
  EXPECT_LE(max_rel_error(a.dk, b.dk), 1e-15);
}

// Through the op registry, as `./train op attention` runs it.
TEST(Attention, RegistryEntry) {
  const OpSpec* op = find_op("attention");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"o", "lse"}));
  Generator gen(43);
  std::vector<Tensor> x = op->example(gen, DType::f64);
  for (bool causal : {true, false}) {
    OpAttrs attrs = OpAttrs::parse("attention", op->attrs, {{"block", "2"}, {"causal", causal ? "true" : "false"}});
    std::vector<Tensor> y = op->forward(x, attrs);
    AttentionOutput ref = attention_reference(x[0], x[1], x[2], causal);
    ASSERT_EQ(y.size(), 2u);
    EXPECT_LE(max_rel_error(y[0], ref.o), 1e-10);
    EXPECT_LE(max_rel_error(y[1], ref.lse), 1e-10);
  }
}

// ---- errors ----
std::string error_of(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions opts = {}) {
  try {
    attention_with_lse(q, k, v, opts);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Attention, ShapeErrorsNameTheShapes) {
  auto t = [](Shape s) { return Tensor::zeros(s, DType::f32); };
  std::string e = error_of(t({2, 5, 3, 4}), t({2, 7, 2, 4}), t({2, 7, 2, 4}));
  EXPECT_NE(e.find("multiple of kv heads"), std::string::npos) << e;
  EXPECT_NE(e.find("q [2, 5, 3, 4]"), std::string::npos) << e;
  EXPECT_NE(e.find("k [2, 7, 2, 4]"), std::string::npos) << e;

  e = error_of(t({2, 5, 4, 4}), t({2, 7, 2, 3}), t({2, 7, 2, 4}));
  EXPECT_NE(e.find("head dims differ"), std::string::npos) << e;
  EXPECT_NE(e.find("k [2, 7, 2, 3]"), std::string::npos) << e;

  e = error_of(t({2, 9, 4, 4}), t({2, 7, 2, 4}), t({2, 7, 2, 4}));
  EXPECT_NE(e.find("T ≤ S"), std::string::npos) << e;
  EXPECT_NE(e.find("q [2, 9, 4, 4]"), std::string::npos) << e;
  // The same shapes are fine without the causal mask (cross attention).
  EXPECT_EQ(error_of(t({2, 9, 4, 4}), t({2, 7, 2, 4}), t({2, 7, 2, 4}), {false, 0.0, 64}), "no error");

  e = error_of(t({2, 5, 4, 4}), t({3, 7, 2, 4}), t({3, 7, 2, 4}));
  EXPECT_NE(e.find("batch sizes differ"), std::string::npos) << e;
  e = error_of(t({2, 5, 4, 4}), t({2, 7, 2, 4}), t({2, 6, 2, 4}));
  EXPECT_NE(e.find("k and v differ"), std::string::npos) << e;
  e = error_of(t({2, 5, 16}), t({2, 7, 2, 4}), t({2, 7, 2, 4}));
  EXPECT_NE(e.find("4 dimensions"), std::string::npos) << e;
  e = error_of(t({2, 5, 4, 4}), t({2, 0, 2, 4}), t({2, 0, 2, 4}), {false, 0.0, 64});
  EXPECT_NE(e.find("no keys"), std::string::npos) << e;
  e = error_of(t({2, 5, 4, 4}), Tensor::zeros({2, 7, 2, 4}, DType::f64), t({2, 7, 2, 4}));
  EXPECT_NE(e.find("dtype"), std::string::npos) << e;
  e = error_of(t({2, 5, 4, 4}), t({2, 7, 2, 4}), t({2, 7, 2, 4}), {true, 0.0, 0});
  EXPECT_NE(e.find("block must be positive"), std::string::npos) << e;
  // The reference applies the same checks.
  EXPECT_THROW(attention_reference(t({2, 5, 3, 4}), t({2, 7, 2, 4}), t({2, 7, 2, 4}), true), std::invalid_argument);
}

}  // namespace
}  // namespace seqlab
