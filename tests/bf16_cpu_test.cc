// bf16 on the CPU without f32 stand-ins: the conversion loops of src/tensor/bf16_convert.h, and the CPU
// kernels that take bf16 themselves (elementwise, norms, softmax, cross-entropy, embedding, row sums,
// the optimizer steps, the gradient norm and its clipping scale). Each must give the bits of the
// stand-in path, its reference by definition (src/tensor/dispatch.h): the inputs widened to f32
// tensors, the f32 kernel, each output rounded once.
// Bits are compared, not values, so signs of zero and signalling NaNs count, and NaN payloads too except
// in the norms (expect_same_bits says why); inputs have odd sizes, broadcast views and non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/slots/optim.h"

namespace seqlab {
namespace {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

Tensor f32(const Tensor& x) { return kernel::to_dtype(x, DType::f32); }
Tensor rounded(const Tensor& x) { return kernel::to_dtype(x, DType::bf16); }

// The stored bits of every element, row-major (bf16: 16 bits, f32: 32 bits).
std::vector<uint32_t> bits_of(const Tensor& t) {
  const Tensor c = kernel::contiguous(t);
  std::vector<uint32_t> out(static_cast<size_t>(c.numel()));
  if (c.dtype() == DType::bf16) {
    const bf16* p = c.data<bf16>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i].bits;
  } else {
    const float* p = c.data<float>();
    for (size_t i = 0; i < out.size(); ++i) std::memcpy(&out[i], &p[i], 4);
  }
  return out;
}

constexpr bool kAnyNan = false;  // expect_same_bits' nan_payloads

bool is_nan_bits(uint32_t b, DType d) {
  return d == DType::bf16 ? (b & 0x7fffu) > 0x7f80u : (b & 0x7fffffffu) > 0x7f800000u;
}

// `nan_payloads`: a NaN must be the same NaN (sign and payload). Off, any NaN matches any NaN: where a
// NaN meets another in a sum or product, which one x86 returns depends on the operand order the
// compiler picks (the first source), which the C++ source does not fix, so two separately compiled
// loops over the same arithmetic may differ there and nowhere else.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what, bool nan_payloads = true) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<uint32_t> g = bits_of(got), w = bits_of(want);
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = g[i] == w[i] || (!nan_payloads && is_nan_bits(g[i], got.dtype()) && is_nan_bits(w[i], got.dtype()));
    if (!same && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " of " << g.size() << " elements differ, first at "
                            << first << " (0x" << std::hex << (mismatches ? g[first] : 0) << " against 0x"
                            << (mismatches ? w[first] : 0) << ")";
}

Tensor bf16_from_bits(const std::vector<uint16_t>& bits, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  bf16* p = t.data<bf16>();
  for (size_t i = 0; i < bits.size(); ++i) p[i].bits = bits[i];
  return t;
}

// Random bf16 values with, when `specials`, non-finite and edge values mixed in at fixed places:
// quiet and signalling NaNs of both signs, ±∞, ±0, a subnormal, the largest finite bf16.
Tensor bf16_input(const Shape& shape, Generator& gen, double stddev, bool specials) {
  Tensor t = rounded(Tensor::randn(shape, gen, DType::f32, stddev));
  if (specials) {
    const uint16_t edge[] = {0x7fc0, 0x7f81, 0xffc1, 0x7f80, 0xff80, 0x0000, 0x8000, 0x0001, 0x7f7f};
    bf16* p = t.data<bf16>();
    for (size_t k = 0; k < sizeof(edge) / sizeof(edge[0]); ++k) {
      const int64_t at = (static_cast<int64_t>(k) * 7 + 3) % t.numel();
      p[at].bits = edge[k];
    }
  }
  return t;
}

// ---- the conversion loops ----------------------------------------------------------------------

// Float bit patterns that exercise rounding: every bf16 value's high half with low halves around the
// halfway point (ties to even and odd, just below and above), zero and all ones: NaNs (quiet,
// signalling, whose top bits alone would read as ∞), ∞, the values that round up to ∞, subnormals.
std::vector<uint32_t> rounding_patterns() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::vector<uint32_t> out;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) out.push_back(hi << 16 | lo);
  }
  return out;
}

TEST(Bf16Convert, RoundingIsBf16OfFloatForEveryPattern) {
  const std::vector<uint32_t> patterns = rounding_patterns();
  const int64_t n = static_cast<int64_t>(patterns.size());
  Tensor src = Tensor::empty({n}, DType::f32);
  std::memcpy(src.data<float>(), patterns.data(), patterns.size() * 4);
  std::vector<uint16_t> want(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    float f;
    std::memcpy(&f, &patterns[i], 4);
    want[i] = bf16(f).bits;
  }
  const Tensor expected = bf16_from_bits(want, {n});
  // The loop directly, then the copy kernel's three routes: one contiguous block (split over
  // threads: n is far above the grain), rows of a strided view, and element by element.
  std::vector<bf16> direct(patterns.size());
  round_to_bf16_run(src.data<float>(), direct.data(), n);
  for (size_t i = 0; i < patterns.size(); ++i) ASSERT_EQ(direct[i].bits, want[i]) << "pattern " << patterns[i];
  expect_same_bits(rounded(src), expected, "contiguous");
  const int64_t rows = n / 6;
  const Tensor narrowed = kernel::narrow(kernel::view(src, {rows, 6}), 1, 1, 4);
  expect_same_bits(rounded(narrowed), kernel::narrow(kernel::view(expected, {rows, 6}), 1, 1, 4), "row runs");
  const Tensor transposed = kernel::transpose(kernel::view(src, {rows, 6}), 0, 1);
  expect_same_bits(rounded(transposed), kernel::transpose(kernel::view(expected, {rows, 6}), 0, 1), "strided");
}

TEST(Bf16Convert, WideningIsExactForEveryBf16) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t b = 0; b < 0x10000; ++b) all[b] = static_cast<uint16_t>(b);
  const Tensor x = bf16_from_bits(all, {0x10000});
  std::vector<float> direct(all.size());
  widen_bf16_run(x.data<bf16>(), direct.data(), 0x10000);
  const Tensor wide = f32(x);
  const std::vector<uint32_t> got = bits_of(wide);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint32_t d;
    std::memcpy(&d, &direct[b], 4);
    ASSERT_EQ(got[b], b << 16) << "bf16 0x" << std::hex << b;
    ASSERT_EQ(d, b << 16) << "bf16 0x" << std::hex << b;
  }
  // And back: every bf16, NaNs included, survives f32 and rounding unchanged except that a
  // signalling NaN comes back quiet (bf16(float) sets the quiet bit).
  const std::vector<uint32_t> again = bits_of(rounded(wide));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const bool nan = (b & 0x7fff) > 0x7f80;
    ASSERT_EQ(again[b], nan ? (b | 0x40) : b) << "bf16 0x" << std::hex << b;
  }
}

// ---- elementwise ----------------------------------------------------------------------------------

const UnaryOp kUnaryOps[] = {UnaryOp::neg,    UnaryOp::exp,  UnaryOp::log,     UnaryOp::sqrt, UnaryOp::rsqrt,
                             UnaryOp::square, UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::silu, UnaryOp::gelu,
                             UnaryOp::relu,   UnaryOp::elu,  UnaryOp::softplus};

TEST(Bf16Kernels, UnaryAndItsBackwardAreTheF32KernelsRounded) {
  Generator gen(11);
  // Odd sizes: one below the threads' grain, one above it (split over threads, with a vector tail).
  for (const Shape& shape : {Shape{7, 13}, Shape{3, 40001}}) {
    const Tensor x = bf16_input(shape, gen, 2.0, true), dy = bf16_input(shape, gen, 1.0, true);
    for (UnaryOp op : kUnaryOps) {
      const std::string what = std::string(kernel::unary_name(op)) + " " + shape_str(shape);
      const double alpha = op == UnaryOp::elu ? 0.7 : 1.0;
      const Tensor y = kernel::unary(op, x, alpha);
      expect_same_bits(y, rounded(kernel::unary(op, f32(x), alpha)), what);
      expect_same_bits(kernel::unary_backward(op, dy, x, y, alpha),
                       rounded(kernel::unary_backward(op, f32(dy), f32(x), f32(y), alpha)), what + " backward");
    }
  }
}

TEST(Bf16Kernels, BinaryIsTheF32KernelRoundedOnEveryRoute) {
  Generator gen(12);
  const Tensor a = bf16_input({5, 9}, gen, 1.0, true), b = bf16_input({5, 9}, gen, 1.0, true);
  const Tensor row = bf16_input({9}, gen, 1.0, true), col = bf16_input({5, 1}, gen, 1.0, false);
  const Tensor one = bf16_input({1}, gen, 1.0, false);
  const Tensor at = kernel::transpose(bf16_input({9, 5}, gen, 1.0, true), 0, 1);  // strided, not rows
  const Tensor big = bf16_input({3, 20011}, gen, 1.0, true), big_b = bf16_input({3, 20011}, gen, 1.0, false);
  struct Case {
    const char* name;
    Tensor x, y;
  };
  const Case cases[] = {{"same shape", a, b},        {"row broadcast", a, row}, {"column broadcast", a, col},
                        {"outer", col, row},         {"scalar", one, a},        {"transposed", at, b},
                        {"many threads", big, big_b}};
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
    for (const Case& c : cases) {
      expect_same_bits(kernel::binary(op, c.x, c.y), rounded(kernel::binary(op, f32(c.x), f32(c.y))),
                       std::string(kernel::binary_name(op)) + " " + c.name);
    }
  }
  // In place, as the norms' backward adds dsum onto dx: out aliases an input.
  Tensor dx = kernel::clone(a);
  kernel::binary_kernel(cpu_device(), BinaryOp::add, dx, b, dx);
  expect_same_bits(dx, rounded(kernel::binary(BinaryOp::add, f32(a), f32(b))), "add in place");
}

TEST(Bf16Kernels, ScalarOpsAreTheF32KernelRounded) {
  Generator gen(13);
  const Tensor x = bf16_input({3, 11}, gen, 2.0, true);
  for (ScalarOp op : {ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv}) {
    for (double s : {0.3, -2.0, 1e-3}) {
      expect_same_bits(kernel::scalar_op(op, x, s), rounded(kernel::scalar_op(op, f32(x), s)),
                       "scalar op " + std::to_string(static_cast<int>(op)) + " s = " + std::to_string(s));
    }
  }
}

// ---- norms ------------------------------------------------------------------------------------------

TEST(Bf16Kernels, NormsForwardAndBackwardAreTheF32KernelsRounded) {
  Generator gen(14);
  for (const Shape& shape : {Shape{1, 1}, Shape{5, 37}, Shape{2, 3, 129}}) {
    const int64_t c = shape.back();
    const std::string dims = " " + shape_str(shape);
    // A row with a NaN and one with ∞ only in the larger cases: their rows are NaN throughout.
    const bool specials = shape[0] > 1;
    const Tensor x = bf16_input(shape, gen, 3.0, specials), dy = bf16_input(shape, gen, 1.0, false);
    const Tensor w = bf16_input({c}, gen, 1.0, false), b = bf16_input({c}, gen, 1.0, false);
    const Tensor dsum = bf16_input(shape, gen, 1.0, false);
    for (bool centered : {true, false}) {
      const std::string name = (centered ? "layer_norm" : "rms_norm") + dims;
      const Tensor bias = centered ? b : Tensor();
      auto norm = [&](const Tensor& in, const Tensor& weight, const Tensor& bi) {
        return centered ? kernel::layer_norm(in, weight, bi, 1e-5) : kernel::rms_norm(in, weight, 1e-5);
      };
      const kernel::NormOutput got = norm(x, w, bias);
      const kernel::NormOutput want = norm(f32(x), f32(w), centered ? f32(bias) : Tensor());
      expect_same_bits(got.y, rounded(want.y), name + " y", kAnyNan);
      expect_same_bits(got.rstd, want.rstd, name + " rstd (f32)", kAnyNan);
      if (centered) expect_same_bits(got.mean, want.mean, name + " mean (f32)", kAnyNan);

      auto backward = [&](const Tensor& g, const Tensor& in, const Tensor& weight, const kernel::NormOutput& st,
                          const Tensor& ds) {
        return centered ? kernel::layer_norm_backward(g, in, weight, st.mean, st.rstd, true, true, true, ds)
                        : kernel::rms_norm_backward(g, in, weight, st.rstd, true, true, ds);
      };
      const kernel::NormGrads g16 = backward(dy, x, w, got, Tensor());
      const kernel::NormGrads g32 = backward(f32(dy), f32(x), f32(w), want, Tensor());
      expect_same_bits(g16.dx, rounded(g32.dx), name + " dx", kAnyNan);
      expect_same_bits(g16.dweight, rounded(g32.dweight), name + " dweight", kAnyNan);
      if (centered) expect_same_bits(g16.dbias, rounded(g32.dbias), name + " dbias", kAnyNan);
      // With dsum: dnorm rounded, then the add, as norm backward followed by binary add gives it.
      const kernel::NormGrads with_sum = backward(dy, x, w, got, dsum);
      expect_same_bits(with_sum.dx, rounded(kernel::binary(BinaryOp::add, f32(rounded(g32.dx)), f32(dsum))),
                       name + " dx + dsum", kAnyNan);

      // The fused residual add: s = bf16(x + r), then the norm of s, as the two unfused steps.
      const Tensor r = bf16_input(shape, gen, 1.0, false);
      const kernel::AddNormOutput fused =
          centered ? kernel::add_layer_norm(x, r, w, bias, 1e-5) : kernel::add_rms_norm(x, r, w, 1e-5);
      const Tensor s = rounded(kernel::binary(BinaryOp::add, f32(x), f32(r)));
      const kernel::NormOutput of_s = norm(f32(s), f32(w), centered ? f32(bias) : Tensor());
      expect_same_bits(fused.sum, s, name + " fused sum", kAnyNan);
      expect_same_bits(fused.norm.y, rounded(of_s.y), name + " fused y", kAnyNan);
      expect_same_bits(fused.norm.rstd, of_s.rstd, name + " fused rstd", kAnyNan);
    }
  }
}

// ---- softmax and cross-entropy ----------------------------------------------------------------------

TEST(Bf16Kernels, SoftmaxAndLogSoftmaxAreTheF32KernelsRounded) {
  Generator gen(15);
  for (const Shape& shape : {Shape{4, 1}, Shape{6, 13}, Shape{3, 301}}) {
    Tensor x = bf16_input(shape, gen, 3.0, shape.back() > 1);
    // A masked row: −∞ everywhere but one place, as causal masks give.
    bf16* p = x.data<bf16>();
    for (int64_t i = 1; i < shape.back(); ++i) p[i].bits = 0xff80;
    const Tensor dy = bf16_input(shape, gen, 1.0, false);
    const std::string dims = " " + shape_str(shape);
    const Tensor y = kernel::softmax(x), ly = kernel::log_softmax(x);
    expect_same_bits(y, rounded(kernel::softmax(f32(x))), "softmax" + dims);
    expect_same_bits(ly, rounded(kernel::log_softmax(f32(x))), "log_softmax" + dims);
    expect_same_bits(kernel::softmax_backward(dy, y), rounded(kernel::softmax_backward(f32(dy), f32(y))),
                     "softmax backward" + dims);
    expect_same_bits(kernel::log_softmax_backward(dy, ly), rounded(kernel::log_softmax_backward(f32(dy), f32(ly))),
                     "log_softmax backward" + dims);
  }
}

TEST(Bf16Kernels, CrossEntropyIsTheF32KernelWithF32LossesAndRoundedGradient) {
  Generator gen(16);
  const int64_t n = 7, v = 37;
  Tensor logits = bf16_input({n, v}, gen, 3.0, false);
  logits.data<bf16>()[2 * v + 5].bits = 0xff80;  // a −∞ logit (a masked class)
  const Tensor targets = Tensor::from_indices({0, 36, 5, -1, 12, 12, 30}, {n});
  const kernel::CrossEntropyOutput got = kernel::cross_entropy(logits, targets, -1);
  const kernel::CrossEntropyOutput want = kernel::cross_entropy(f32(logits), targets, -1);
  expect_same_bits(got.lse, want.lse, "lse (f32)");
  expect_same_bits(got.losses, want.losses, "losses (f32)");
  expect_same_bits(got.loss, want.loss, "loss (f32)");
  const Tensor dloss = Tensor::scalar(1.0);
  expect_same_bits(
      kernel::cross_entropy_backward(dloss, logits, targets, got.lse, -1, got.total_weight),
      rounded(kernel::cross_entropy_backward(dloss, f32(logits), targets, want.lse, -1, want.total_weight)), "dlogits");
}

// ---- embedding and sums -----------------------------------------------------------------------------

TEST(Bf16Kernels, EmbeddingAndItsBackwardAreTheF32KernelsRounded) {
  Generator gen(17);
  const int64_t vocab = 11, c = 9;
  const Tensor weight = bf16_input({vocab, c}, gen, 1.0, true);  // a signalling NaN comes out quiet
  const Tensor index = Tensor::from_indices({3, 0, 10, 3, 7, 3, 1}, {7});
  expect_same_bits(kernel::embedding(weight, index), rounded(kernel::embedding(f32(weight), index)), "gather");
  const Tensor dy = bf16_input({7, c}, gen, 1.0, false);
  expect_same_bits(kernel::embedding_backward(dy, index, vocab),
                   rounded(kernel::embedding_backward(f32(dy), index, vocab)), "scatter-add");
}

TEST(Bf16Kernels, SumsAreTheF32KernelRounded) {
  Generator gen(18);
  const Tensor x = bf16_input({5, 3, 17}, gen, 1.0, true);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{2}, {0}, {0, 1}, {}}) {
    std::string name = "sum over";
    for (int64_t d : dims) name += " " + std::to_string(d);
    expect_same_bits(kernel::sum(x, dims, false), rounded(kernel::sum(f32(x), dims, false)), name);
  }
}

// ---- optimizer steps, gradient norm ---------------------------------------------------------------

TEST(Bf16Kernels, AdamWOnABf16ParameterIsTheF32StepWithPRounded) {
  Generator gen(19);
  const int64_t n = 40013;  // above the threads' grain, odd
  kernel::AdamWStep s{3e-3, 0.1, 0.9, 0.999, 1e-8, 1.0 - 0.9 * 0.9, 1.0 - 0.999 * 0.999};
  for (DType gdtype : {DType::bf16, DType::f32}) {
    const std::string what = std::string("adamw, gradient in ") + dtype_name(gdtype);
    const Tensor w0 = Tensor::randn({n}, gen, DType::f32), m0 = Tensor::randn({n}, gen, DType::f32, 0.1);
    const Tensor v0 = kernel::unary(UnaryOp::square, Tensor::randn({n}, gen, DType::f32, 0.1));
    Tensor g = Tensor::randn({n}, gen, DType::f32, 0.5);
    if (gdtype == DType::bf16) g = rounded(g);
    // The bf16 kernel, in place on p = bf16(w) and its state.
    Tensor p = rounded(w0), w = kernel::clone(w0), m = kernel::clone(m0), v = kernel::clone(v0);
    kernel::adamw_step_kernel(cpu_device(), s, p, g, m, v, w);
    // The stand-in path: p widened, the f32 step, p rounded back.
    Tensor p32 = f32(rounded(w0)), w32 = kernel::clone(w0), m32 = kernel::clone(m0), v32 = kernel::clone(v0);
    kernel::adamw_step_kernel(cpu_device(), s, p32, f32(g), m32, v32, w32);
    expect_same_bits(p, rounded(p32), what + ": p");
    expect_same_bits(w, w32, what + ": master");
    expect_same_bits(m, m32, what + ": m");
    expect_same_bits(v, v32, what + ": v");
  }
}

TEST(Bf16Kernels, SgdOnABf16ParameterIsTheF32StepWithPRounded) {
  Generator gen(20);
  const int64_t n = 40013;
  for (bool nesterov : {false, true}) {
    for (DType gdtype : {DType::bf16, DType::f32}) {
      const std::string what = std::string("sgd") + (nesterov ? " nesterov" : "") + ", gradient in " +
                               dtype_name(gdtype);
      const kernel::SgdStep s{0.05, 0.01, 0.9, nesterov};
      const Tensor w0 = Tensor::randn({n}, gen, DType::f32), b0 = Tensor::randn({n}, gen, DType::f32, 0.1);
      Tensor g = Tensor::randn({n}, gen, DType::f32, 0.5);
      if (gdtype == DType::bf16) g = rounded(g);
      Tensor p = rounded(w0), w = kernel::clone(w0), b = kernel::clone(b0);
      kernel::sgd_step_kernel(cpu_device(), s, p, g, b, w);
      Tensor p32 = f32(rounded(w0)), w32 = kernel::clone(w0), b32 = kernel::clone(b0);
      kernel::sgd_step_kernel(cpu_device(), s, p32, f32(g), b32, w32);
      expect_same_bits(p, rounded(p32), what + ": p");
      expect_same_bits(w, w32, what + ": master");
      expect_same_bits(b, b32, what + ": momentum");
    }
  }
}

TEST(Bf16Kernels, GradientNormAndClippingScaleAreTheF32KernelsRounded) {
  Generator gen(21);
  const Tensor g = bf16_input({3 * (1 << 15) + 7}, gen, 1.0, false);  // several fixed blocks
  const double got = kernel::squared_norm(g), want = kernel::squared_norm(f32(g));
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << got << " against " << want;
  Tensor scaled = bf16_input({5, 1001}, gen, 1.0, true);
  Tensor scaled32 = f32(scaled);
  kernel::scale_inplace_kernel(cpu_device(), scaled, 0.37);
  kernel::scale_inplace_kernel(cpu_device(), scaled32, 0.37);
  expect_same_bits(scaled, rounded(scaled32), "scale in place");
}

}  // namespace
}  // namespace seqlab
