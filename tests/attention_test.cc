// Fused softmax attention: the tiled online-softmax op against the naive materialised reference
// (outputs, lse and every gradient), finite-difference gradients including the lse output's,
// the KV-cache (decode) and lse-merge properties, numerical range, and shape errors; then the
// masks (query and key lengths, an additive bias) the same ways, the masked-row rule, and the
// masks' errors; last, the kernels on bf16 tensors against the f32 kernels.
#include "layers/attention/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "attention_cases.h"
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

constexpr double kInfinity = std::numeric_limits<double>::infinity();

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
                      Case{"many_blocks_bidirectional", 2, 37, 45, 4, 2, 16, 8, 8, false},
                      // head dims past a multiple of 8: the f32 transposes' 8 × 8 blocks and their edges
                      Case{"many_blocks_odd_head_dims_causal", 1, 37, 45, 2, 1, 12, 10, 8, true},
                      // tiles of 128 rows: causal diagonal blocks split into two row segments (row_segments)
                      Case{"wide_blocks_causal", 1, 300, 300, 2, 1, 8, 8, 128, true},
                      Case{"wide_blocks_cache_causal", 1, 270, 300, 2, 2, 8, 4, 128, true}),
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

// ================================================================================================
// Masks: query lengths, key lengths and an additive bias (BERT's padded batches, T5's relative
// position bias and its cross attention over a padded memory).

struct MaskCase {
  const char* name;
  int64_t B, T, S, H, Hk, Dk, Dv, block;
  bool causal;
  std::vector<int64_t> q_len, k_len;  // empty: not given
  int64_t bias_batches;               // 0: no bias, else 1 (shared) or B
  DType length_dtype = DType::i64;
};

std::ostream& operator<<(std::ostream& os, const MaskCase& c) { return os << c.name; }

struct MaskedInputs {
  Tensor q, k, v, bias;
  AttentionOptions opts;
};

MaskedInputs make_masked(const MaskCase& c, DType dtype, uint64_t seed) {
  Inputs in = make_inputs({c.name, c.B, c.T, c.S, c.H, c.Hk, c.Dk, c.Dv, c.block, c.causal}, dtype, seed);
  MaskedInputs m{in.q, in.k, in.v, Tensor(), {}};
  m.opts.causal = c.causal;
  m.opts.block = c.block;
  if (!c.q_len.empty()) m.opts.q_lengths = Tensor::from_indices(c.q_len, {c.B}, c.length_dtype);
  if (!c.k_len.empty()) m.opts.k_lengths = Tensor::from_indices(c.k_len, {c.B}, c.length_dtype);
  if (c.bias_batches > 0) {
    Generator gen(seed + 1);
    m.bias = Tensor::randn({c.bias_batches, c.H, c.T, c.S}, gen, dtype);
  }
  return m;
}

int64_t q_length(const MaskCase& c, int64_t b) { return c.q_len.empty() ? c.T : c.q_len[static_cast<size_t>(b)]; }
int64_t k_length(const MaskCase& c, int64_t b) { return c.k_len.empty() ? c.S : c.k_len[static_cast<size_t>(b)]; }

// Whether query i of batch row b sees key j.
bool visible(const MaskCase& c, int64_t b, int64_t i, int64_t j) {
  return i < q_length(c, b) && j < k_length(c, b) && (!c.causal || j <= i + c.S - c.T);
}

// [B, T, H] i64: 1 in the rows that see no key (padded queries, or no keys at all), the masked-row rule's rows.
Tensor dead_rows(const MaskCase& c) {
  std::vector<int64_t> dead(static_cast<size_t>(c.B * c.T * c.H));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.T; ++i) {
      bool any = false;
      for (int64_t j = 0; j < c.S; ++j) any = any || visible(c, b, i, j);
      for (int64_t h = 0; h < c.H; ++h) dead[static_cast<size_t>((b * c.T + i) * c.H + h)] = !any;
    }
  }
  return Tensor::from_indices(dead, {c.B, c.T, c.H});
}

// max_rel_error, except that infinities must sit in the same places with the same sign (lse is −∞ in a row
// that sees no key) and any NaN is an infinite error: max_rel_error would skip both.
double max_error_inf(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return kInfinity;
    if (x[i] == y[i]) continue;  // equal infinities included
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  }
  return worst;
}

struct MaskedResult {
  Tensor o, lse, dq, dk, dv, dbias;
};

using MaskedFn = AttentionOutput (*)(const Tensor&, const Tensor&, const Tensor&, const AttentionOptions&,
                                     const Tensor&);
AttentionOutput fused_masked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                             const Tensor& bias) {
  return attention_with_lse(q, k, v, opts, bias);
}
AttentionOutput reference_masked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                 const Tensor& bias) {
  return attention_reference(q, k, v, opts, bias);
}

// Forward, then one backward seeded with random cotangents for o and lse, also in the rows that see no key
// (which both forms must ignore).
MaskedResult masked_forward_backward(MaskedFn fn, const MaskedInputs& in, uint64_t seed) {
  Tensor q = set_requires_grad(in.q.detach()), k = set_requires_grad(in.k.detach()),
         v = set_requires_grad(in.v.detach());
  Tensor bias = in.bias.defined() ? set_requires_grad(in.bias.detach()) : Tensor();
  AttentionOutput out = fn(q, k, v, in.opts, bias);
  Generator gen(seed);
  Tensor go = Tensor::randn(out.o.shape(), gen, out.o.dtype()), gl = Tensor::randn(out.lse.shape(), gen, out.o.dtype());
  backward({out.o, out.lse}, {go, gl});
  return {out.o.detach(), out.lse.detach(), grad_of(q), grad_of(k), grad_of(v),
          bias.defined() ? grad_of(bias) : Tensor()};
}

class MaskedAttentionMatchesReference : public ::testing::TestWithParam<MaskCase> {};

void expect_masked_match(const MaskCase& c, DType dtype, double tol) {
  MaskedInputs in = make_masked(c, dtype, 51);
  MaskedResult fused = masked_forward_backward(fused_masked, in, 53);
  MaskedResult ref = masked_forward_backward(reference_masked, in, 53);
  ASSERT_TRUE(fused.dq.defined() && fused.dk.defined() && fused.dv.defined());
  EXPECT_LE(max_error_inf(fused.o, ref.o), tol) << "o";
  EXPECT_LE(max_error_inf(fused.lse, ref.lse), tol) << "lse";
  EXPECT_LE(max_error_inf(fused.dq, ref.dq), tol) << "dq";
  EXPECT_LE(max_error_inf(fused.dk, ref.dk), tol) << "dk";
  EXPECT_LE(max_error_inf(fused.dv, ref.dv), tol) << "dv";
  if (in.bias.defined()) {
    ASSERT_TRUE(fused.dbias.defined());
    EXPECT_EQ(fused.dbias.shape(), in.bias.shape());
    EXPECT_LE(max_error_inf(fused.dbias, ref.dbias), tol) << "dbias";
  }
}

TEST_P(MaskedAttentionMatchesReference, F64) { expect_masked_match(GetParam(), DType::f64, 1e-12); }
TEST_P(MaskedAttentionMatchesReference, F32) { expect_masked_match(GetParam(), DType::f32, 1e-5); }

// name, B, T, S, H, Hk, Dk, Dv, block, causal, q_lengths, k_lengths, bias batches (0: none) [, lengths' dtype]
INSTANTIATE_TEST_SUITE_P(
    Masks, MaskedAttentionMatchesReference,
    ::testing::Values(
        // BERT: bidirectional self-attention over a padded batch: a full row, a short one, an empty one.
        MaskCase{"bert_full_short_empty", 3, 6, 6, 2, 2, 3, 4, 4, false, {6, 3, 0}, {6, 3, 0}, 3},
        MaskCase{"bert_shared_bias_i32", 2, 7, 7, 2, 1, 3, 3, 3, false, {7, 5}, {7, 5}, 1, DType::i32},
        // T5 cross attention: T ≠ S, padded queries and memory, GQA, Dk ≠ Dv, a shared or per-row bias.
        MaskCase{"t5_cross_shared_bias", 2, 5, 7, 4, 2, 3, 2, 2, false, {5, 2}, {7, 1}, 1},
        MaskCase{"t5_cross_bias_per_row", 2, 5, 7, 4, 2, 3, 2, 2, false, {5, 2}, {7, 1}, 2},
        MaskCase{"cross_T_gt_S", 2, 6, 4, 3, 1, 2, 3, 4, false, {6, 5}, {4, 2}, 2},
        // T5 decoder self-attention: causal with padding and a shared bias.
        MaskCase{"decoder_causal_padded", 2, 7, 7, 2, 1, 4, 3, 3, true, {7, 4}, {7, 4}, 1},
        MaskCase{"decoder_causal_padded_mqa", 2, 7, 7, 3, 1, 4, 4, 2, true, {5, 7}, {5, 7}, 2},
        // Causal queries at the end of a longer cache, keys padded; queries padded alone.
        MaskCase{"cache_causal_key_lengths", 2, 3, 8, 2, 2, 3, 3, 4, true, {}, {8, 6}, 0},
        MaskCase{"query_lengths_only_causal", 2, 4, 4, 2, 2, 3, 3, 64, true, {1, 4}, {}, 0, DType::i32},
        // T = 1: one query against no keys in one row (o = 0, lse = −∞).
        MaskCase{"one_query_no_keys", 2, 1, 4, 2, 1, 3, 3, 2, false, {}, {0, 3}, 2},
        MaskCase{"one_query_causal_padded", 2, 1, 5, 2, 2, 3, 3, 2, true, {1, 0}, {5, 2}, 1},
        // Lengths of 0 in every row: nothing is seen anywhere.
        MaskCase{"everything_padded", 2, 3, 4, 2, 1, 3, 2, 2, false, {0, 0}, {4, 4}, 1},
        // A bias without lengths, causal or bidirectional.
        MaskCase{"bias_only_causal", 2, 5, 7, 4, 2, 3, 4, 2, true, {}, {}, 2},
        MaskCase{"bias_only_bidirectional_shared", 1, 6, 9, 2, 2, 4, 4, 4, false, {}, {}, 1},
        // Lengths that cut a tile in the middle, T and S not multiples of the block; several tasks and threads.
        MaskCase{"mid_tile_lengths", 2, 9, 11, 2, 1, 3, 3, 4, false, {9, 6}, {11, 5}, 1},
        MaskCase{"many_blocks_bidirectional", 2, 37, 45, 4, 2, 16, 8, 8, false, {37, 20}, {45, 9}, 1},
        MaskCase{"many_blocks_causal", 2, 37, 37, 4, 2, 16, 8, 8, true, {37, 21}, {37, 21}, 2}),
    [](const ::testing::TestParamInfo<MaskCase>& info) { return std::string(info.param.name); });

// ---- finite differences (f64) of q, k, v and bias through both outputs ----
// lse = −∞ in a row that sees no key has no finite difference: the check reads it through a masked fill
// with 0, which also passes those rows' cotangent to nothing (the op ignores it anyway).
GradcheckResult masked_check(const MaskCase& c) {
  MaskedInputs in = make_masked(c, DType::f64, 61);
  const Tensor dead = dead_rows(c);
  std::vector<Tensor> x{in.q, in.k, in.v};
  if (in.bias.defined()) x.push_back(in.bias);
  return gradcheck(
      [&](const std::vector<Tensor>& y) {
        AttentionOutput out = attention_with_lse(y[0], y[1], y[2], in.opts, y.size() > 3 ? y[3] : Tensor());
        return std::vector<Tensor>{out.o, masked_fill(out.lse, dead, 0.0)};
      },
      x);
}

class MaskedAttentionGradcheck : public ::testing::TestWithParam<MaskCase> {};

TEST_P(MaskedAttentionGradcheck, MatchesFiniteDifferences) {
  const MaskCase& c = GetParam();
  GradcheckResult r = masked_check(c);
  const int64_t elements = c.B * c.T * c.H * c.Dk + c.B * c.S * c.Hk * (c.Dk + c.Dv) + c.bias_batches * c.H * c.T * c.S;
  EXPECT_EQ(r.elements_checked, elements);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

INSTANTIATE_TEST_SUITE_P(
    Masks, MaskedAttentionGradcheck,
    ::testing::Values(MaskCase{"bert_full_short_empty", 3, 5, 5, 2, 1, 3, 2, 2, false, {5, 3, 0}, {5, 3, 0}, 3},
                      MaskCase{"t5_cross_shared_bias_gqa", 2, 5, 7, 4, 2, 3, 2, 2, false, {5, 2}, {7, 1}, 1},
                      MaskCase{"cross_T_gt_S_bias_per_row", 2, 6, 4, 2, 1, 2, 3, 4, false, {6, 4}, {4, 3}, 2},
                      MaskCase{"decoder_causal_padded", 2, 7, 7, 2, 1, 3, 3, 3, true, {7, 4}, {7, 4}, 1},
                      MaskCase{"one_query_no_keys", 2, 1, 4, 2, 2, 3, 3, 2, false, {1, 1}, {0, 3}, 2},
                      MaskCase{"cache_causal_full_lengths", 1, 3, 6, 2, 1, 3, 4, 2, true, {3}, {6}, 1}),
    [](const ::testing::TestParamInfo<MaskCase>& info) { return std::string(info.param.name); });

// ---- the masked-row rule ----

// Cotangents drawn at random, then NaN in the rows that see no key when `poison`.
Tensor cotangent(const Shape& shape, const Tensor& dead, int64_t row_size, uint64_t seed, bool poison) {
  Generator gen(seed);
  std::vector<double> g = Tensor::randn(shape, gen, DType::f64).to_doubles();
  const std::vector<int64_t> d = dead.to_indices();
  for (size_t r = 0; r < d.size(); ++r) {
    if (!d[r] || !poison) continue;
    for (int64_t e = 0; e < row_size; ++e) g[r * static_cast<size_t>(row_size) + static_cast<size_t>(e)] = std::nan("");
  }
  return Tensor::from_vector(g, shape, DType::f64);
}

// A row that sees no key: o = 0 and lse = −∞ exactly, no NaN anywhere, no gradient into padded queries, padded
// keys or invisible bias entries, and its dout and dlse ignored (NaN there changes no gradient).
TEST(MaskedAttention, RowsThatSeeNoKeyAreZeroAndPassNoGradient) {
  for (bool causal : {false, true}) {
    const MaskCase c{"", 3, 6, 6, 2, 1, 3, 4, 4, causal, {6, 3, 0}, {5, 3, 4}, 3};
    const MaskedInputs in = make_masked(c, DType::f64, 71);
    const Tensor dead = dead_rows(c);
    Result grads[2];
    Tensor dbias[2];
    for (int poison = 0; poison < 2; ++poison) {
      Tensor q = set_requires_grad(in.q.detach()), k = set_requires_grad(in.k.detach()),
             v = set_requires_grad(in.v.detach()), bias = set_requires_grad(in.bias.detach());
      AttentionOutput out = attention_with_lse(q, k, v, in.opts, bias);
      backward({out.o, out.lse},
               {cotangent(out.o.shape(), dead, c.Dv, 73, poison), cotangent(out.lse.shape(), dead, 1, 79, poison)});
      grads[poison] = {out.o.detach(), out.lse.detach(), grad_of(q), grad_of(k), grad_of(v)};
      dbias[poison] = grad_of(bias);
    }
    const std::vector<int64_t> d = dead.to_indices();
    const std::vector<double> o = grads[0].o.to_doubles(), lse = grads[0].lse.to_doubles();
    const std::vector<double> dq = grads[1].dq.to_doubles(), dk = grads[1].dk.to_doubles(), dv = grads[1].dv.to_doubles();
    const std::vector<double> db = dbias[1].to_doubles();
    int64_t dead_count = 0;
    for (size_t r = 0; r < d.size(); ++r) {
      dead_count += d[r];
      if (d[r]) {
        EXPECT_EQ(lse[r], -kInfinity) << "row " << r;
      } else {
        EXPECT_TRUE(std::isfinite(lse[r])) << "row " << r;
      }
      for (int64_t e = 0; e < c.Dv; ++e) {
        const double x = o[r * c.Dv + e];
        EXPECT_TRUE(d[r] ? x == 0.0 : std::isfinite(x)) << "o row " << r << ": " << x;
      }
      for (int64_t e = 0; e < c.Dk; ++e) {
        const double x = dq[r * c.Dk + e];  // [B, T, H, Dk] rows in the order of dead's
        EXPECT_TRUE(d[r] ? x == 0.0 : std::isfinite(x)) << "dq row " << r << ": " << x;
      }
    }
    EXPECT_EQ(dead_count, (0 + 3 + 6) * c.H);  // row 1: queries 3..5; row 2: every query
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t j = 0; j < c.S; ++j) {
        for (int64_t e = 0; e < c.Hk * c.Dk; ++e) {
          const double x = dk[(b * c.S + j) * c.Hk * c.Dk + e];
          EXPECT_TRUE(j >= k_length(c, b) || b == 2 ? x == 0.0 : std::isfinite(x)) << "dk " << b << ", " << j;
        }
        for (int64_t e = 0; e < c.Hk * c.Dv; ++e) {
          const double x = dv[(b * c.S + j) * c.Hk * c.Dv + e];
          EXPECT_TRUE(j >= k_length(c, b) || b == 2 ? x == 0.0 : std::isfinite(x)) << "dv " << b << ", " << j;
        }
      }
      for (int64_t h = 0; h < c.H; ++h) {
        for (int64_t i = 0; i < c.T; ++i) {
          for (int64_t j = 0; j < c.S; ++j) {
            const double x = db[((b * c.H + h) * c.T + i) * c.S + j];
            EXPECT_TRUE(visible(c, b, i, j) ? std::isfinite(x) : x == 0.0) << "dbias " << b << h << i << j << ": " << x;
          }
        }
      }
    }
    // NaN cotangents in the dead rows are never read: the gradients are the same bit for bit.
    EXPECT_EQ(max_error_inf(grads[1].dq, grads[0].dq), 0.0);
    EXPECT_EQ(max_error_inf(grads[1].dk, grads[0].dk), 0.0);
    EXPECT_EQ(max_error_inf(grads[1].dv, grads[0].dv), 0.0);
    EXPECT_EQ(max_error_inf(dbias[1], dbias[0]), 0.0);
  }
}

// A padded batch row computes what attention over its unpadded part computes: the first L_q queries against
// the first L_k keys (bidirectional), or the first L tokens (causal self-attention).
TEST(MaskedAttention, PaddedRowEqualsItsTruncatedSequence) {
  for (bool causal : {false, true}) {
    const int64_t Lq = causal ? 5 : 4, Lk = 5;
    const MaskCase c{"", 2, 7, 7, 4, 2, 3, 2, 3, causal, {7, Lq}, {7, Lk}, 2};
    const MaskedInputs in = make_masked(c, DType::f64, 83);
    const AttentionOutput padded = attention_with_lse(in.q, in.k, in.v, in.opts, in.bias);
    auto row1 = [](const Tensor& x, int64_t len) { return kernel::narrow(kernel::narrow(x, 0, 1, 1), 1, 0, len); };
    AttentionOptions plain;
    plain.causal = causal;
    plain.block = 3;
    const Tensor bias1 = kernel::narrow(kernel::narrow(kernel::narrow(in.bias, 0, 1, 1), 2, 0, Lq), 3, 0, Lk);
    const AttentionOutput alone = attention_with_lse(row1(in.q, Lq), row1(in.k, Lk), row1(in.v, Lk), plain,
                                                     kernel::contiguous(bias1));
    EXPECT_LE(max_error_inf(row1(padded.o, Lq), alone.o), 1e-13);
    EXPECT_LE(max_error_inf(row1(padded.lse, Lq), alone.lse), 1e-13);
  }
}

// A bias of −∞ on the keys j ≥ L_b masks them exactly as k_lengths = L does; a bias of −∞ on all of a row's keys
// makes it a row that sees no key (o = 0, lse = −∞), without NaN.
TEST(MaskedAttention, MinusInfinityBiasActsLikeKeyPadding) {
  const MaskCase c{"", 2, 4, 6, 2, 1, 3, 3, 4, false, {}, {6, 2}, 0};
  const MaskedInputs in = make_masked(c, DType::f64, 89);
  std::vector<double> wall(static_cast<size_t>(c.B * c.H * c.T * c.S), 0.0);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t i = 0; i < c.T; ++i) {
        for (int64_t j = 0; j < c.S; ++j) {
          const bool blocked = j >= k_length(c, b) || (b == 0 && h == 1 && i == 2);  // one row: every key
          wall[static_cast<size_t>(((b * c.H + h) * c.T + i) * c.S + j)] = blocked ? -kInfinity : 0.0;
        }
      }
    }
  }
  MaskedInputs walled{in.q, in.k, in.v, Tensor::from_vector(wall, {c.B, c.H, c.T, c.S}, DType::f64), {}};
  walled.opts.causal = false;
  walled.opts.block = 4;
  const MaskedResult by_bias = masked_forward_backward(fused_masked, walled, 97);
  const MaskedResult by_lengths = masked_forward_backward(fused_masked, in, 97);
  const std::vector<double> o = by_bias.o.to_doubles(), lse = by_bias.lse.to_doubles();
  const size_t blocked_row = static_cast<size_t>((0 * c.T + 2) * c.H + 1);
  EXPECT_EQ(lse[blocked_row], -kInfinity);
  for (int64_t e = 0; e < c.Dv; ++e) EXPECT_EQ(o[blocked_row * c.Dv + e], 0.0);
  // Every other row as with lengths; the blocked row's gradients are 0, so only its own dq differs.
  std::vector<double> l_ref = by_lengths.lse.to_doubles();
  l_ref[blocked_row] = -kInfinity;
  EXPECT_LE(max_error_inf(by_bias.lse, Tensor::from_vector(l_ref, by_lengths.lse.shape(), DType::f64)), 1e-14);
  for (const Tensor* t : {&by_bias.o, &by_bias.dq, &by_bias.dk, &by_bias.dv, &by_bias.dbias}) {
    for (double x : t->to_doubles()) ASSERT_TRUE(std::isfinite(x));
  }
  const std::vector<double> dq = by_bias.dq.to_doubles();
  for (int64_t e = 0; e < c.Dk; ++e) EXPECT_EQ(dq[blocked_row * c.Dk + e], 0.0);
  // Without the blocked row both forms agree in every output and gradient but that row's.
  MaskedInputs open = walled;
  wall[static_cast<size_t>(((0 * c.H + 1) * c.T + 2) * c.S + 0)] = 0.0;  // unblock the row again ...
  for (int64_t j = 1; j < c.S; ++j) wall[static_cast<size_t>(((0 * c.H + 1) * c.T + 2) * c.S + j)] = 0.0;
  open.bias = Tensor::from_vector(wall, {c.B, c.H, c.T, c.S}, DType::f64);
  const MaskedResult by_bias_open = masked_forward_backward(fused_masked, open, 97);
  EXPECT_LE(max_error_inf(by_bias_open.o, by_lengths.o), 1e-14);
  EXPECT_LE(max_error_inf(by_bias_open.lse, by_lengths.lse), 1e-14);
  EXPECT_LE(max_error_inf(by_bias_open.dq, by_lengths.dq), 1e-14);
  EXPECT_LE(max_error_inf(by_bias_open.dk, by_lengths.dk), 1e-14);
  EXPECT_LE(max_error_inf(by_bias_open.dv, by_lengths.dv), 1e-14);
}

// Whole key blocks of −∞ before the first finite score: the running max stays −∞ through them, and the
// exponents against it must give 0 (not exp(−∞ + ∞) = NaN) so that the later blocks' sums are not poisoned.
TEST(MaskedAttention, LeadingBlocksOfMinusInfinityBias) {
  for (bool causal : {false, true}) {
    const MaskCase c{"", 2, 5, 8, 2, 1, 3, 3, 2, causal, {}, {8, 6}, 0};
    MaskedInputs in = make_masked(c, DType::f64, 127);
    Generator gen(131);
    std::vector<double> bias = Tensor::randn({c.B, c.H, c.T, c.S}, gen, DType::f64).to_doubles();
    for (size_t e = 0; e < bias.size(); ++e) {
      if (static_cast<int64_t>(e) % c.S < 3) bias[e] = -kInfinity;  // keys 0..2: the first block and a half
    }
    in.bias = Tensor::from_vector(bias, {c.B, c.H, c.T, c.S}, DType::f64);
    const MaskedResult fused = masked_forward_backward(fused_masked, in, 137);
    const MaskedResult ref = masked_forward_backward(reference_masked, in, 137);
    EXPECT_LE(max_error_inf(fused.o, ref.o), 1e-12);
    EXPECT_LE(max_error_inf(fused.lse, ref.lse), 1e-12);
    EXPECT_LE(max_error_inf(fused.dq, ref.dq), 1e-12);
    EXPECT_LE(max_error_inf(fused.dk, ref.dk), 1e-12);
    EXPECT_LE(max_error_inf(fused.dv, ref.dv), 1e-12);
    EXPECT_LE(max_error_inf(fused.dbias, ref.dbias), 1e-12);
  }
}

// A bias shared by the batch rows (Bb = 1) computes what its copy per row does, and its gradient is the sum of
// the per-row gradients.
TEST(MaskedAttention, SharedBiasEqualsItsCopyPerBatchRow) {
  const MaskCase c{"", 3, 5, 6, 2, 2, 3, 3, 2, true, {5, 4, 2}, {6, 3, 6}, 1};
  const MaskedInputs shared = make_masked(c, DType::f64, 101);
  MaskedInputs per_row = shared;
  per_row.bias = kernel::contiguous(kernel::expand(shared.bias, {c.B, c.H, c.T, c.S}));
  const MaskedResult a = masked_forward_backward(fused_masked, shared, 103);
  const MaskedResult b = masked_forward_backward(fused_masked, per_row, 103);
  EXPECT_EQ(max_error_inf(a.o, b.o), 0.0);
  EXPECT_EQ(max_error_inf(a.lse, b.lse), 0.0);
  EXPECT_EQ(max_error_inf(a.dq, b.dq), 0.0);
  EXPECT_EQ(a.dbias.shape(), (Shape{1, c.H, c.T, c.S}));
  EXPECT_EQ(b.dbias.shape(), (Shape{c.B, c.H, c.T, c.S}));
  EXPECT_LE(max_error_inf(a.dbias, kernel::sum(b.dbias, {0}, true)), 1e-15);
}

// The raw backward computes only what is asked: dbias alone leaves dq, dk, dv undefined.
TEST(MaskedAttention, RawBackwardComputesOnlyDbiasWhenAskedAlone) {
  const MaskCase c{"", 2, 5, 7, 4, 2, 3, 2, 2, false, {5, 2}, {7, 1}, 2};
  const MaskedInputs in = make_masked(c, DType::f64, 107);
  const AttentionOutput out = kernel::attention_forward(in.q, in.k, in.v, in.opts, in.bias);
  Generator gen(109);
  const Tensor dout = Tensor::randn(out.o.shape(), gen, DType::f64);
  const kernel::AttentionGrads all = kernel::attention_backward(dout, Tensor(), in.q, in.k, in.v, out.o, out.lse,
                                                                in.opts, true, true, true, in.bias, true);
  const kernel::AttentionGrads only = kernel::attention_backward(dout, Tensor(), in.q, in.k, in.v, out.o, out.lse,
                                                                 in.opts, false, false, false, in.bias, true);
  EXPECT_FALSE(only.dq.defined() || only.dk.defined() || only.dv.defined());
  ASSERT_TRUE(only.dbias.defined());
  EXPECT_EQ(max_error_inf(only.dbias, all.dbias), 0.0);
  EXPECT_THROW(kernel::attention_backward(dout, Tensor(), in.q, in.k, in.v, out.o, out.lse, in.opts, true, false,
                                          false, Tensor(), true),
               std::invalid_argument);
}

// Through the op registry with lengths and a bias, as `./train op attention` runs them: against the
// reference, and gradient-checked (no padded queries here, so every lse is finite).
TEST(MaskedAttention, RegistryEntryTakesLengthsAndBias) {
  const OpSpec* op = find_op("attention");
  ASSERT_NE(op, nullptr);
  ASSERT_EQ(op->inputs.size(), 6u);
  EXPECT_EQ(op->inputs[3].name, "q_lengths");
  EXPECT_EQ(op->inputs[4].name, "k_lengths");
  EXPECT_EQ(op->inputs[5].name, "bias");
  Generator gen(113);
  std::vector<Tensor> x = op->example(gen, DType::f64);  // q [2, 5, 4, 3], k [2, 7, 2, 3], v [2, 7, 2, 4]
  x[3] = Tensor::from_indices({5, 3}, {2}, DType::i32);
  x[4] = Tensor::from_indices({7, 2}, {2}, DType::i64);
  x[5] = Tensor::randn({2, 4, 5, 7}, gen, DType::f64);
  for (bool causal : {true, false}) {
    const OpAttrs attrs =
        OpAttrs::parse("attention", op->attrs, {{"block", "2"}, {"causal", causal ? "true" : "false"}});
    const std::vector<Tensor> y = op->forward(x, attrs);
    AttentionOptions opts;
    opts.causal = causal;
    opts.q_lengths = x[3];
    opts.k_lengths = x[4];
    const AttentionOutput ref = attention_reference(x[0], x[1], x[2], opts, x[5]);
    ASSERT_EQ(y.size(), 2u);
    EXPECT_LE(max_error_inf(y[0], ref.o), 1e-12);
    EXPECT_LE(max_error_inf(y[1], ref.lse), 1e-12);
  }
  x[3] = Tensor::from_indices({5, 5}, {2}, DType::i32);
  x[5] = Tensor::randn({1, 4, 5, 7}, gen, DType::f64);
  const OpAttrs attrs = OpAttrs::parse("attention", op->attrs, {{"block", "2"}, {"causal", "false"}});
  GradcheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return op->forward(in, attrs); }, x);
  EXPECT_EQ(r.elements_checked, 2 * 5 * 4 * 3 + 2 * 7 * 2 * (3 + 4) + 4 * 5 * 7);
  EXPECT_LE(r.max_error, 1e-6) << r.worst;
}

// ---- the masks' errors ----
std::string masked_error_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                            const Tensor& bias) {
  try {
    attention_with_lse(q, k, v, opts, bias);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(MaskedAttention, MaskErrorsNameWhatIsWrong) {
  auto t = [](Shape s, DType d = DType::f32) { return Tensor::zeros(s, d); };
  auto lengths = [](std::vector<int64_t> v, DType d = DType::i64) {
    const int64_t n = static_cast<int64_t>(v.size());
    return Tensor::from_indices(v, {n}, d);
  };
  const Tensor q = t({2, 5, 4, 4}), k = t({2, 7, 2, 4}), v = t({2, 7, 2, 3});
  AttentionOptions opts;
  opts.causal = false;

  opts.q_lengths = lengths({5, 5, 5});
  std::string e = masked_error_of(q, k, v, opts, Tensor());
  EXPECT_NE(e.find("q_lengths must be [B] = [2]"), std::string::npos) << e;
  EXPECT_NE(e.find("q_lengths [3]"), std::string::npos) << e;
  opts.q_lengths = t({2});
  e = masked_error_of(q, k, v, opts, Tensor());
  EXPECT_NE(e.find("q_lengths must be i32 or i64, got f32"), std::string::npos) << e;
  opts.q_lengths = lengths({5, 6}, DType::i32);
  e = masked_error_of(q, k, v, opts, Tensor());
  EXPECT_NE(e.find("q_lengths must hold values in [0, T] = [0, 5], got 6 for batch row 1"), std::string::npos) << e;
  opts.q_lengths = Tensor();
  opts.k_lengths = lengths({-1, 7});
  e = masked_error_of(q, k, v, opts, Tensor());
  EXPECT_NE(e.find("k_lengths must hold values in [0, S] = [0, 7], got -1 for batch row 0"), std::string::npos) << e;
  opts.k_lengths = Tensor::from_indices({7, 7}, {2, 1});
  e = masked_error_of(q, k, v, opts, Tensor());
  EXPECT_NE(e.find("k_lengths must be [B] = [2]"), std::string::npos) << e;
  opts.k_lengths = lengths({7, 0});  // 0 is a valid length

  EXPECT_EQ(masked_error_of(q, k, v, opts, t({2, 4, 5, 7})), "no error");
  EXPECT_EQ(masked_error_of(q, k, v, opts, t({1, 4, 5, 7})), "no error");
  for (const Shape& s : {Shape{3, 4, 5, 7}, Shape{2, 2, 5, 7}, Shape{2, 4, 7, 5}, Shape{4, 5, 7}, Shape{0, 4, 5, 7}}) {
    e = masked_error_of(q, k, v, opts, t(s));
    EXPECT_NE(e.find("bias must be [1 or B, H, T, S] = [1 or 2, 4, 5, 7]"), std::string::npos) << e;
    EXPECT_NE(e.find("bias " + shape_str(s)), std::string::npos) << e;
  }
  e = masked_error_of(q, k, v, opts, t({1, 4, 5, 7}, DType::f64));
  EXPECT_NE(e.find("bias must have q's dtype f32, got f64"), std::string::npos) << e;

  // Causal attention still refuses T > S, with masks too.
  opts.causal = true;
  opts.k_lengths = lengths({3, 3});
  e = masked_error_of(t({2, 5, 4, 4}), t({2, 3, 2, 4}), t({2, 3, 2, 4}), opts, Tensor());
  EXPECT_NE(e.find("T ≤ S"), std::string::npos) << e;
  // The reference applies the same checks.
  opts.causal = false;
  opts.k_lengths = lengths({8, 7});
  EXPECT_THROW(attention_reference(q, k, v, opts, Tensor()), std::invalid_argument);
}


// ---- bf16 ----
// The CPU kernels take bf16 tensors themselves (no f32 stand-ins): bf16 GEMMs into f32 sums, on the
// CPU's bf16 instructions or, with kernel::set_cpu_bf16_gemm_widened (SEQLAB_CPU_BF16_GEMM=widened), on
// widened f32 operands; P and dS rounded to bf16 before their products, as the CUDA kernels do; o and
// the gradients rounded once. Against the f32 kernels on the same bf16 values (tests/attention_cases.h),
// at the tolerance of the CUDA bf16 checks: |got − want| ≤ 2e-2 · max(|want|, 1) (fused_op_rtol).
struct Bf16Case {
  const char* name;
  testing::AttentionCase c;
  int64_t block;
};

std::ostream& operator<<(std::ostream& os, const Bf16Case& c) { return os << c.name; }

void expect_bf16_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = testing::fused_op_rtol(DType::bf16);
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  int failures = 0;
  for (size_t i = 0; i < g.size() && failures < 5; ++i) {
    if (g[i] == w[i] || std::fabs(g[i] - w[i]) <= tol * std::max(std::fabs(w[i]), 1.0)) continue;  // == for ±∞
    ++failures;
    ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " in bf16, " << w[i] << " in f32";
  }
}

// Restores the bf16 GEMM path a test picked.
struct Bf16GemmPath {
  explicit Bf16GemmPath(bool widened) { kernel::set_cpu_bf16_gemm_widened(widened); }
  ~Bf16GemmPath() { kernel::set_cpu_bf16_gemm_widened(false); }
};

class AttentionBf16 : public ::testing::TestWithParam<std::tuple<Bf16Case, bool>> {};

TEST_P(AttentionBf16, MatchesF32KernelsOnTheSameValues) {
  const auto& [bc, widened] = GetParam();
  const testing::AttentionCase& c = bc.c;
  const Bf16GemmPath path(widened);
  ASSERT_TRUE(kernel::attention_forward_kernel.cpu_takes_bf16 && kernel::attention_backward_kernel.cpu_takes_bf16);
  Generator gen(testing::test_seed(27));
  const testing::AttentionInputs in = testing::attention_inputs(c, DType::bf16, gen, true);
  kernel::AttentionParams p = c.params();
  p.block = bc.block;

  Tensor o = Tensor::full(c.o_shape(), std::nan(""), DType::bf16);
  Tensor lse = Tensor::full(c.lse_shape(), std::nan(""), DType::f32);  // lse: f32 for bf16
  kernel::attention_forward_kernel(cpu_device(), in.q, in.k, in.v, in.masks, p, o, lse);
  const testing::AttentionOutputs want = testing::attention_forward_reference(c, in);
  expect_bf16_close(o, want.o, "o");
  expect_bf16_close(lse, want.lse, "lse");

  // Both backwards read the same saved values: o as bf16 holds it, lse in f32.
  const testing::AttentionOutputs saved = testing::as_saved(want, DType::bf16);
  const testing::GradientsNeeded need{true, true, true, c.bias_rows > 0};
  const kernel::AttentionGrads grads = testing::attention_backward_reference(c, in, saved, need);
  kernel::AttentionGrads got;
  got.dq = Tensor::full(c.q_shape(), std::nan(""), DType::bf16);
  got.dk = Tensor::full(c.k_shape(), std::nan(""), DType::bf16);
  got.dv = Tensor::full(c.v_shape(), std::nan(""), DType::bf16);
  if (need.dbias) got.dbias = Tensor::full(c.dbias_shape(), std::nan(""), DType::bf16);
  kernel::attention_backward_kernel(cpu_device(), in.dout, in.dlse, in.q, in.k, in.v, in.masks, saved.o, saved.lse, p,
                                    got);
  expect_bf16_close(got.dq, grads.dq, "dq");
  expect_bf16_close(got.dk, grads.dk, "dk");
  expect_bf16_close(got.dv, grads.dv, "dv");
  expect_bf16_close(got.dbias, grads.dbias, "dbias");

  // The same bits on a second run (every tile's work is a fixed sequence).
  Tensor o2 = Tensor::empty(c.o_shape(), DType::bf16), lse2 = Tensor::empty(c.lse_shape(), DType::f32);
  kernel::attention_forward_kernel(cpu_device(), in.q, in.k, in.v, in.masks, p, o2, lse2);
  EXPECT_EQ(o2.to_doubles(), o.to_doubles());
}

// B, T, S, H, Hk, Dk, Dv, causal, scale, subsets, q_lengths, k_lengths, bias_rows; then the block.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionBf16,
    ::testing::Combine(
        ::testing::Values(
            Bf16Case{"one_query_one_key", {1, 1, 1, 2, 1, 8, 8, true, 0.0}, 64},
            Bf16Case{"decode_causal", {2, 1, 37, 2, 2, 16, 16, true, 0.0}, 16},
            Bf16Case{"odd_T_gqa_dk_ne_dv_causal", {2, 37, 37, 4, 2, 24, 40, true, 0.0}, 16},
            Bf16Case{"odd_T_gqa_dk_ne_dv_bidirectional", {2, 37, 45, 4, 2, 24, 40, false, 0.0}, 16},
            Bf16Case{"cache_mqa_causal", {1, 19, 45, 3, 1, 16, 8, true, 0.0}, 8},
            // Past one 128-key tile of the native path, at the default block.
            Bf16Case{"long_causal", {1, 300, 300, 2, 1, 64, 64, true, 0.0}, 64},
            Bf16Case{"long_bidirectional", {1, 150, 290, 2, 2, 32, 48, false, 0.0}, 64},
            // Causal diagonal blocks split into two row segments (row_segments), against a cache (T < S), with
            // a query length that ends inside a tile, a key length that cuts the keys, and a bias.
            Bf16Case{"long_cache_causal_masks",
                     {2, 200, 260, 2, 1, 32, 16, true, 0.0, false, {200, 150}, {260, 190}, 1},
                     64},
            Bf16Case{"masks_causal", {2, 45, 45, 2, 1, 16, 12, true, 0.0, false, {45, 30}, {45, 33}, 1}, 16},
            Bf16Case{"masks_bidirectional_empty_row", {2, 21, 33, 2, 2, 8, 8, false, 0.0, false, {21, 9}, {33, 0}, 2},
                     8}),
        ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<Bf16Case, bool>>& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "_widened" : "_native");
    });

// Through autograd: bf16 q, k, v give bf16 o and gradients and an f32 lse, close to the f32 op's.
TEST(AttentionBf16, ThroughAutogradMatchesF32) {
  const Case c{"gqa", 2, 33, 33, 4, 2, 16, 24, 64, true};
  const Inputs in32 = make_inputs(c, DType::f32, 5);
  const auto bf = [](const Tensor& x) { return kernel::to_dtype(x, DType::bf16); };
  const auto f32 = [](const Tensor& x) { return kernel::to_dtype(x, DType::f32); };
  const Inputs in16{bf(in32.q), bf(in32.k), bf(in32.v)};
  const Inputs same{f32(in16.q), f32(in16.k), f32(in16.v)};  // the f32 op on the bf16 values
  AttentionOptions opts{c.causal, 0.0, c.block};
  const Result want = forward_backward(fused_op(opts), same, 9);
  Tensor q = set_requires_grad(in16.q.detach()), k = set_requires_grad(in16.k.detach()),
         v = set_requires_grad(in16.v.detach());
  AttentionOutput out = attention_with_lse(q, k, v, opts);
  EXPECT_EQ(out.o.dtype(), DType::bf16);
  EXPECT_EQ(out.lse.dtype(), DType::f32);
  // forward_backward's cotangents (drawn in f32 from the same seed), rounded to bf16 for o: the rounding
  // moves the gradients by about 2⁻⁹ relative, well inside the tolerance.
  Generator gen(9);
  Tensor go = Tensor::randn(out.o.shape(), gen, DType::f32), gl = Tensor::randn(out.lse.shape(), gen, DType::f32);
  backward({out.o, out.lse}, {bf(go), gl});
  expect_bf16_close(out.o, want.o, "o");
  expect_bf16_close(out.lse, want.lse, "lse");
  expect_bf16_close(grad_of(q), want.dq, "dq");
  expect_bf16_close(grad_of(k), want.dk, "dk");
  expect_bf16_close(grad_of(v), want.dv, "dv");
}

// q, k, v as the attention mixer makes them: head splits of one [B, T, H + 2Hk, D] projection, which the CPU
// kernels read in place and whose gradients they write side by side, so the split's backward takes them
// without a copy. Against contiguous copies of q, k, v: the same outputs and gradients, bit for bit (the
// same arithmetic on the same values), with GQA, several tiles, a padded query length, and in f64 and bf16.
TEST(Attention, HeadSplitsOfOneProjection) {
  const int64_t B = 2, T = 150, H = 4, Hk = 2, D = 16;
  for (const DType dtype : {DType::f64, DType::bf16}) {
    Generator gen(41);
    const Tensor packed = Tensor::randn({B, T, H + 2 * Hk, D}, gen, dtype);
    const Tensor dout = Tensor::randn({B, T, H, D}, gen, dtype);
    AttentionOptions opts;
    opts.q_lengths = Tensor::from_indices({150, 97}, {B});
    opts.k_lengths = opts.q_lengths;
    // In place: the split's views.
    Tensor x = set_requires_grad(packed.detach());
    const std::vector<Tensor> parts = split(x, {H, Hk, Hk}, 2);
    ASSERT_FALSE(parts[0].is_contiguous());
    const Tensor o = attention(parts[0], parts[1], parts[2], opts);
    backward({o}, {dout});
    // Copied: three contiguous leaves.
    Tensor q = set_requires_grad(kernel::contiguous(kernel::narrow(packed, 2, 0, H)));
    Tensor k = set_requires_grad(kernel::contiguous(kernel::narrow(packed, 2, H, Hk)));
    Tensor v = set_requires_grad(kernel::contiguous(kernel::narrow(packed, 2, H + Hk, Hk)));
    const Tensor o_ref = attention(q, k, v, opts);
    backward({o_ref}, {dout});
    const std::string what = dtype_name(dtype);
    EXPECT_EQ(o.to_doubles(), o_ref.to_doubles()) << what;
    const Tensor dx = grad_of(x);
    ASSERT_EQ(dx.shape(), packed.shape()) << what;
    EXPECT_EQ(kernel::narrow(dx, 2, 0, H).to_doubles(), grad_of(q).to_doubles()) << what << " dq";
    EXPECT_EQ(kernel::narrow(dx, 2, H, Hk).to_doubles(), grad_of(k).to_doubles()) << what << " dk";
    EXPECT_EQ(kernel::narrow(dx, 2, H + Hk, Hk).to_doubles(), grad_of(v).to_doubles()) << what << " dv";
  }
}

}  // namespace
}  // namespace seqlab
