// The causal depthwise convolution: the fused op against a naive reference written here (outputs, final
// state and every gradient, f32 and f64, widths 1 … 4, T = 1, T < W − 1, odd C, with and without bias,
// initial state and SiLU), finite-difference gradients of every input, a sequence split anywhere and run
// piece by piece from the carried state (and token by token, the decode step) equal to the whole, the
// f32 arithmetic equal to the last bit to the primitive composition ShortConv used before the op,
// extreme values, ShortConv's options, the registry entry and the errors.
#include "layers/ssm/conv1d.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/basic.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

struct Case {
  int64_t B, T, C, W;
  bool bias, h0, silu;
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " C" + std::to_string(c.C) + " W" +
         std::to_string(c.W) + (c.bias ? " bias" : "") + (c.h0 ? " h0" : "") + (c.silu ? " silu" : "");
}

// Every width, T = 1, T < W − 1, T > W, odd C, each optional part on and off.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t W = 1; W <= 4; ++W) {
    for (int64_t T : {1, 2, 7}) {
      for (int flags = 0; flags < 8; ++flags)
        out.push_back({2, T, 5, W, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0});
    }
  }
  return out;
}

struct Inputs {
  Tensor x, w, b, h0;
  std::vector<Tensor> list() const { return {x, w, b, h0}; }
};

Inputs make_inputs(const Case& c, DType dt, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  Inputs in;
  in.x = kernel::scalar_op(kernel::ScalarOp::mul, Tensor::randn({c.B, c.T, c.C}, gen, dt), scale);
  in.w = Tensor::randn({c.W, c.C}, gen, dt, 0.5);
  if (c.bias) in.b = Tensor::randn({c.C}, gen, dt);
  if (c.h0) in.h0 = kernel::scalar_op(kernel::ScalarOp::mul, Tensor::randn({c.B, c.W - 1, c.C}, gen, dt), scale);
  return in;
}

// The naive reference in double, straight from the equations of conv1d.h, and its vector-Jacobian
// product for the cotangents gy, gf.
struct Reference {
  std::vector<double> y, final_state, dx, dw, db, dh0;
};

Reference reference(const Case& c, const Inputs& in, const std::vector<double>& gy, const std::vector<double>& gf) {
  const int64_t B = c.B, T = c.T, C = c.C, W = c.W, H = W - 1;
  const std::vector<double> x = in.x.to_doubles(), w = in.w.to_doubles();
  const std::vector<double> b = c.bias ? in.b.to_doubles() : std::vector<double>(C, 0.0);
  const std::vector<double> h0 = c.h0 ? in.h0.to_doubles() : std::vector<double>(B * H * C, 0.0);
  // p [B, H + T, C] = h0 ++ x
  auto p = [&](int64_t bi, int64_t u, int64_t ci) {
    return u < H ? h0[(bi * H + u) * C + ci] : x[(bi * T + u - H) * C + ci];
  };
  Reference r;
  r.y.assign(B * T * C, 0.0);
  r.final_state.assign(B * H * C, 0.0);
  r.dx.assign(B * T * C, 0.0);
  r.dw.assign(W * C, 0.0);
  r.db.assign(C, 0.0);
  r.dh0.assign(B * H * C, 0.0);
  std::vector<double> dp(B * (H + T) * C, 0.0);
  for (int64_t bi = 0; bi < B; ++bi) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t ci = 0; ci < C; ++ci) {
        double z = b[ci];
        for (int64_t j = 0; j < W; ++j) z += w[j * C + ci] * p(bi, t + H - j, ci);
        const double s = 1.0 / (1.0 + std::exp(-z));
        const size_t o = (bi * T + t) * C + ci;
        r.y[o] = c.silu ? z * s : z;
        const double dz = gy[o] * (c.silu ? s * (1.0 + z * (1.0 - s)) : 1.0);
        r.db[ci] += dz;
        for (int64_t j = 0; j < W; ++j) {
          r.dw[j * C + ci] += dz * p(bi, t + H - j, ci);
          dp[(bi * (H + T) + t + H - j) * C + ci] += dz * w[j * C + ci];
        }
      }
    }
    for (int64_t i = 0; i < H; ++i) {
      for (int64_t ci = 0; ci < C; ++ci) {
        r.final_state[(bi * H + i) * C + ci] = p(bi, T + i, ci);
        dp[(bi * (H + T) + T + i) * C + ci] += gf[(bi * H + i) * C + ci];
      }
    }
    for (int64_t u = 0; u < H + T; ++u) {
      for (int64_t ci = 0; ci < C; ++ci) {
        const double d = dp[(bi * (H + T) + u) * C + ci];
        if (u < H) {
          r.dh0[(bi * H + u) * C + ci] = d;
        } else {
          r.dx[(bi * T + u - H) * C + ci] = d;
        }
      }
    }
  }
  return r;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  }
  return worst;
}

struct Result {
  Tensor y, final_state;
  std::vector<Tensor> grads;  // x, weight, bias, initial_state (undefined for absent inputs)
};

Result forward_backward(const Inputs& in, bool silu, const Tensor& gy, const Tensor& gf) {
  std::vector<Tensor> v;
  for (const Tensor& t : in.list()) v.push_back(t.defined() ? set_requires_grad(t.detach()) : t);
  Conv1dOutput out = causal_conv1d(v[0], v[1], v[2], v[3], silu);
  backward({out.y, out.final_state}, {gy, gf});
  Result r{out.y.detach(), out.final_state.detach(), {}};
  for (const Tensor& t : v) r.grads.push_back(t.defined() ? grad_of(t) : Tensor());
  return r;
}

TEST(Conv1d, MatchesTheNaiveReferenceInEveryCase) {
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-6;
    for (const Case& c : cases()) {
      SCOPED_TRACE(name(c) + " " + dtype_name(dt));
      const Inputs in = make_inputs(c, dt, 7 + c.T + 10 * c.W);
      Generator gen(99);
      const Tensor gy = Tensor::randn({c.B, c.T, c.C}, gen, dt), gf = Tensor::randn({c.B, c.W - 1, c.C}, gen, dt);
      const Reference ref = reference(c, in, gy.to_doubles(), gf.to_doubles());
      const Result r = forward_backward(in, c.silu, gy, gf);
      EXPECT_LE(max_rel(r.y.to_doubles(), ref.y), tol);
      EXPECT_LE(max_rel(r.final_state.to_doubles(), ref.final_state), tol);
      EXPECT_EQ(r.final_state.shape(), (Shape{c.B, c.W - 1, c.C}));
      EXPECT_LE(max_rel(r.grads[0].to_doubles(), ref.dx), tol);
      EXPECT_LE(max_rel(r.grads[1].to_doubles(), ref.dw), 5 * tol);  // sums over B·T
      if (c.bias) {
        EXPECT_LE(max_rel(r.grads[2].to_doubles(), ref.db), 5 * tol);
      }
      if (c.h0) {
        EXPECT_LE(max_rel(r.grads[3].to_doubles(), ref.dh0), tol);
      }
    }
  }
}

TEST(Conv1d, GradientsMatchFiniteDifferences) {
  for (const Case& c : cases()) {
    if (!(c.bias && c.h0) && c.T != 2) continue;  // every input present, plus T < W − 1 in every combination
    SCOPED_TRACE(name(c));
    const Inputs in = make_inputs(c, DType::f64, 3 + c.W);
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& v) {
          Conv1dOutput o = causal_conv1d(v[0], v[1], v[2], v[3], c.silu);
          return std::vector<Tensor>{o.y, o.final_state};
        },
        in.list());
    EXPECT_GT(r.elements_checked, 0);
    EXPECT_LE(r.max_error, 1e-6) << r.worst;
  }
}

// Running [0, t) and then [t, T) from the carried state is the same computation per output element as
// the whole: outputs and final state equal to the last bit; every gradient (through the state) equal.
TEST(Conv1d, SplitSequenceEqualsTheWhole) {
  for (DType dt : {DType::f64, DType::f32}) {
    for (int64_t W = 1; W <= 4; ++W) {
      const Case c{2, 9, 5, W, true, true, true};
      const Inputs in = make_inputs(c, dt, 21 + W);
      Generator gen(5);
      const Tensor gy = Tensor::randn({c.B, c.T, c.C}, gen, dt), gf = Tensor::randn({c.B, W - 1, c.C}, gen, dt);
      const Result whole = forward_backward(in, true, gy, gf);
      for (int64_t t : {1, 2, 5, 8}) {
        SCOPED_TRACE("W " + std::to_string(W) + " split at " + std::to_string(t) + " " + dtype_name(dt));
        std::vector<Tensor> v;
        for (const Tensor& u : in.list()) v.push_back(set_requires_grad(u.detach()));
        Conv1dOutput a = causal_conv1d(narrow(v[0], 1, 0, t), v[1], v[2], v[3], true);
        Conv1dOutput b = causal_conv1d(narrow(v[0], 1, t, c.T - t), v[1], v[2], a.final_state, true);
        const Tensor y = concat({a.y, b.y}, 1);
        backward({y, b.final_state}, {gy, gf});
        EXPECT_EQ(max_rel_error(y, whole.y), 0.0);
        EXPECT_EQ(max_rel_error(b.final_state, whole.final_state), 0.0);
        // Across the split, dx_t sums the first piece's products and the second's (through dfinal) in
        // another order; dw and db sum the two pieces' sums: equal up to rounding.
        EXPECT_LE(max_rel_error(grad_of(v[0]), whole.grads[0]), dt == DType::f64 ? 1e-15 : 1e-6);
        EXPECT_LE(max_rel_error(grad_of(v[3]), whole.grads[3]), dt == DType::f64 ? 1e-15 : 1e-6);
        EXPECT_LE(max_rel_error(grad_of(v[1]), whole.grads[1]), dt == DType::f64 ? 1e-13 : 1e-6);
        EXPECT_LE(max_rel_error(grad_of(v[2]), whole.grads[2]), dt == DType::f64 ? 1e-13 : 1e-6);
      }
    }
  }
}

// The decode step: the op at T = 1, token by token from the previous step's final state.
TEST(Conv1d, TokenByTokenEqualsTheWhole) {
  for (int64_t W = 1; W <= 4; ++W) {
    const Case c{3, 6, 7, W, true, false, true};
    const Inputs in = make_inputs(c, DType::f32, 40 + W);
    const Conv1dOutput whole = causal_conv1d(in.x, in.w, in.b, Tensor(), true);
    Tensor state;  // zeros before the first token
    std::vector<Tensor> ys;
    for (int64_t t = 0; t < c.T; ++t) {
      Conv1dOutput step = causal_conv1d(narrow(in.x, 1, t, 1), in.w, in.b, state, true);
      ys.push_back(step.y);
      state = step.final_state;
    }
    EXPECT_EQ(max_rel_error(concat(ys, 1), whole.y), 0.0) << "W " << W;
    EXPECT_EQ(max_rel_error(state, whole.final_state), 0.0) << "W " << W;
  }
}

// The composition of primitive ops that ShortConv computed before the op existed (concat, shifted
// narrows, mul, add in the order j = 0 … W−1, then silu): the fused op's f32 output is the same to the
// last bit, with and without the SiLU, so that models trained before keep their numbers.
Tensor composed(const Tensor& x, const Tensor& w, const Tensor& h0, bool with_silu) {
  const int64_t T = x.size(1), W = w.size(0), C = w.size(1);
  const Tensor padded = W > 1 ? concat({h0, x}, 1) : x;
  Tensor y;
  for (int64_t j = 0; j < W; ++j) {
    Tensor term = mul(narrow(padded, 1, W - 1 - j, T), reshape(narrow(w, 0, j, 1), {C}));
    y = j == 0 ? term : add(y, term);
  }
  return with_silu ? silu(y) : y;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ac = kernel::contiguous(a), bc = kernel::contiguous(b);
  return std::memcmp(ac.raw_data(), bc.raw_data(), static_cast<size_t>(ac.numel()) * dtype_size(ac.dtype())) == 0;
}

TEST(Conv1d, F32ForwardIsBitwiseTheComposedConvolution) {
  for (int64_t W = 1; W <= 4; ++W) {
    for (bool with_silu : {false, true}) {
      SCOPED_TRACE("W " + std::to_string(W) + (with_silu ? " silu" : ""));
      // C = 67: more than one vector of channels and a remainder; T = 37 rows.
      const Case c{2, 37, 67, W, false, true, with_silu};
      const Inputs in = make_inputs(c, DType::f32, 77 + W);
      const Tensor fused = causal_conv1d(in.x, in.w, Tensor(), in.h0, with_silu).y;
      EXPECT_TRUE(bitwise_equal(fused, composed(in.x, in.w, in.h0, with_silu)));
    }
  }
}

// dx sums the shifted products w_j dz in the order the autograd engine accumulated them for the
// composition (j = W−1 down to 0): the same f32 bits. (dw is a sum over B·T whose order differs: it is
// compared to rounding.)
TEST(Conv1d, F32InputGradientIsBitwiseTheComposedConvolution) {
  for (int64_t W = 1; W <= 4; ++W) {
    SCOPED_TRACE("W " + std::to_string(W));
    const Case c{2, 37, 67, W, false, false, true};
    const Inputs in = make_inputs(c, DType::f32, 177 + W);
    Generator gen(8);
    const Tensor gy = Tensor::randn({c.B, c.T, c.C}, gen, DType::f32);
    const Tensor x1 = set_requires_grad(in.x.detach()), w1 = set_requires_grad(in.w.detach());
    backward({causal_conv1d(x1, w1, Tensor(), Tensor(), true).y}, {gy});
    const Tensor x2 = set_requires_grad(in.x.detach()), w2 = set_requires_grad(in.w.detach());
    backward({composed(x2, w2, Tensor::zeros({c.B, W - 1, c.C}), true)}, {gy});
    EXPECT_TRUE(bitwise_equal(grad_of(x1), grad_of(x2)));
    EXPECT_LE(max_rel_error(grad_of(w1), grad_of(w2)), 1e-5);
  }
}

// Large inputs drive the SiLU far into both tails (σ(z) → 0 and 1): outputs and gradients stay finite.
TEST(Conv1d, ExtremeValuesStayFinite) {
  for (DType dt : {DType::f32, DType::f64}) {
    const Case c{2, 7, 5, 4, true, true, true};
    const Inputs in = make_inputs(c, dt, 11, 1e4);
    Generator gen(2);
    const Result r = forward_backward(in, true, Tensor::randn({c.B, c.T, c.C}, gen, dt),
                                      Tensor::randn({c.B, c.W - 1, c.C}, gen, dt));
    for (const Tensor& t : {r.y, r.final_state, r.grads[0], r.grads[1], r.grads[2], r.grads[3]}) {
      for (double v : t.to_doubles()) ASSERT_TRUE(std::isfinite(v)) << dtype_name(dt);
    }
  }
}

// T = 0: no output, and the state passes through unchanged (its gradient is dfinal's).
TEST(Conv1d, EmptySequencePassesTheStateThrough) {
  const Case c{2, 0, 3, 4, true, true, true};
  const Inputs in = make_inputs(c, DType::f64, 5);
  Generator gen(6);
  const Tensor gf = Tensor::randn({c.B, c.W - 1, c.C}, gen, DType::f64);
  const Result r = forward_backward(in, true, Tensor::zeros({c.B, 0, c.C}, DType::f64), gf);
  EXPECT_EQ(r.y.shape(), (Shape{c.B, 0, c.C}));
  EXPECT_EQ(max_rel_error(r.final_state, in.h0), 0.0);
  EXPECT_EQ(max_rel_error(r.grads[3], gf), 0.0);
  EXPECT_EQ(max_rel_error(r.grads[1], Tensor::zeros({c.W, c.C}, DType::f64)), 0.0);
}

// bf16 on the CPU: the slot computes on f32 stand-ins and rounds the outputs once, so the bf16 op is the
// f32 op on the same values, rounded: bit for bit.
TEST(Conv1d, Bf16IsTheF32OpRoundedOnce) {
  const Case c{2, 7, 9, 4, true, true, true};
  const Inputs in = make_inputs(c, DType::bf16, 61);
  const Conv1dOutput got = causal_conv1d(in.x, in.w, in.b, in.h0, true);
  auto f32 = [](const Tensor& t) { return kernel::to_dtype(t, DType::f32); };
  const Conv1dOutput want = causal_conv1d(f32(in.x), f32(in.w), f32(in.b), f32(in.h0), true);
  EXPECT_TRUE(bitwise_equal(got.y, kernel::to_dtype(want.y, DType::bf16)));
  EXPECT_TRUE(bitwise_equal(got.final_state, narrow(in.x, 1, c.T - 3, 3)));  // a copy of the last W − 1 inputs
}

// No gradient reached an output (final_state unused, as in training) and inputs that need none: the
// backward computes only what is asked.
TEST(Conv1d, BackwardWithoutTheFinalStatesGradient) {
  const Case c{2, 5, 3, 3, true, true, false};
  const Inputs in = make_inputs(c, DType::f64, 4);
  const Tensor w = set_requires_grad(in.w.detach());
  Conv1dOutput out = causal_conv1d(in.x, w, in.b, in.h0, false);
  backward(sum(out.y));
  const Reference ref =
      reference(c, in, std::vector<double>(c.B * c.T * c.C, 1.0), std::vector<double>(c.B * (c.W - 1) * c.C, 0.0));
  EXPECT_LE(max_rel(grad_of(w).to_doubles(), ref.dw), 1e-12);
}

TEST(Conv1d, ShortConvOptionsAndDecodeState) {
  Generator gen(3);
  ShortConv plain(6, 3, gen);
  EXPECT_EQ(plain.parameters().size(), 1u);  // weight only: existing users unchanged
  Generator gen2(3);
  ShortConv fused(6, 3, gen2, ShortConvOptions{true, true});
  ASSERT_EQ(fused.parameters().size(), 2u);
  EXPECT_EQ(fused.parameters()[1].name, "bias");
  const Tensor x = Tensor::randn({2, 5, 6}, gen);
  const Tensor w = fused.parameters()[0].tensor->detach();
  const Tensor b = fused.parameters()[1].tensor->detach();
  EXPECT_EQ(max_rel_error(fused.forward(x, nullptr), causal_conv1d(x, w, b, Tensor(), true).y), 0.0);
  // The same weights drawn: the bias is zeros and draws nothing.
  EXPECT_EQ(max_rel_error(plain.parameters()[0].tensor->detach(), w), 0.0);
  // Decoding: the state carried call to call.
  Tensor state;
  const Tensor a = fused.forward(narrow(x, 1, 0, 2), &state);
  EXPECT_EQ(state.shape(), (Shape{2, 2, 6}));
  const Tensor rest = fused.forward(narrow(x, 1, 2, 3), &state);
  EXPECT_EQ(max_rel_error(concat({a, rest}, 1), fused.forward(x, nullptr)), 0.0);
}

TEST(Conv1d, RegisteredInTheOpRegistry) {
  const OpSpec* op = find_op("causal_conv1d");
  ASSERT_NE(op, nullptr);
  Generator gen(1);
  const std::vector<Tensor> in = op->example(gen, DType::f64);
  const OpAttrs attrs = OpAttrs::parse(op->name, op->attrs, op->example_attrs);
  const std::vector<Tensor> out = op->forward(in, attrs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(max_rel_error(out[0], causal_conv1d(in[0], in[1], in[2], in[3], true).y), 0.0);
}

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Conv1d, RefusesBadInputsWithOneClearMessage) {
  Generator gen(1);
  const Tensor x = Tensor::randn({2, 5, 3}, gen), w = Tensor::randn({3, 3}, gen), none;
  auto conv = [&](const Tensor& xx, const Tensor& ww, const Tensor& bb, const Tensor& hh) {
    return [=] { causal_conv1d(xx, ww, bb, hh, false); };
  };
  expect_invalid(conv(x, Tensor::randn({5, 3}, gen), none, none), "W = 5");
  expect_invalid(conv(x, Tensor::randn({0, 3}, gen), none, none), "W = 0");
  expect_invalid(conv(x, Tensor::randn({3, 4}, gen), none, none), "one column per channel");
  expect_invalid(conv(x, w, Tensor::randn({4}, gen), none), "bias must be [C]");
  expect_invalid(conv(x, w, none, Tensor::randn({2, 3, 3}, gen)), "initial_state must be [B, W−1, C]");
  expect_invalid(conv(Tensor::randn({5, 3}, gen), w, none, none), "x must have 3 dimensions");
  expect_invalid(conv(x, Tensor::randn({3, 3}, gen, DType::f64), none, none), "one dtype");
  expect_invalid(conv(x, none, none, none), "must all be given");
  expect_invalid([&] { ShortConv(4, 5, gen); }, "kernel size 5");
}

}  // namespace
}  // namespace seqlab
