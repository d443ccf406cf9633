// Mixed precision (train.dtype = "bf16") on the CPU, where it is the reference for the GPU:
// - bf16 kernels on the CPU are the f32 kernels on the same (exactly widened) values with the outputs
//   rounded to bf16 once, including GEMMs with strides and β = 1, in-place updates and struct outputs;
// - GEMMs on the CPU's bf16 instructions (oneDNN) give those products up to the order of the f32 sums:
//   within one bf16 rounding of the widened GEMM's, for every layout the tensor layer hands them;
// - statistics stay f32: norms' mean and rstd, cross-entropy's loss and lse, attention's lse (attention
//   rounds P to bf16 before P·V, as the GPU's kernels do: its o is within that rounding of the f32 kernel's);
// - the optimizer's f32 master weights: updates far below bf16's resolution accumulate, p = bf16(w),
//   and load_state restores the master from the f32 weight a checkpoint holds; micro-batch gradients
//   summed in f32 (F32GradAccumulator) and taken by the optimizer as they are;
// - a small GPT trained in bf16 follows its f32 twin's losses within bf16's tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"
#include "train/optim/optim.h"

namespace seqlab {
namespace {

Tensor bf16_randn(const Shape& shape, Generator& gen, double stddev = 1.0) {
  return kernel::to_dtype(Tensor::randn(shape, gen, DType::f32, stddev), DType::bf16);
}
Tensor f32(const Tensor& x) { return kernel::to_dtype(x, DType::f32); }
Tensor rounded(const Tensor& x) { return kernel::to_dtype(x, DType::bf16); }

// Bit equality of two bf16 tensors (as their exactly widened f32 values).
void expect_same_bf16(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::bf16) << what;
  ASSERT_EQ(want.dtype(), DType::bf16) << what;
  EXPECT_EQ(f32(got).to_doubles(), f32(want).to_doubles()) << what;
}

// Forces bf16 GEMMs onto the widened f32 path for the life of the object.
struct WidenedBf16Gemm {
  WidenedBf16Gemm() { kernel::set_cpu_bf16_gemm_widened(true); }
  ~WidenedBf16Gemm() { kernel::set_cpu_bf16_gemm_widened(false); }
};

TEST(Bf16OnCpu, KernelsAreTheF32KernelsRoundedOnce) {
  const WidenedBf16Gemm widened;  // bit equality needs the f32 GEMM's order of sums
  Generator gen(1);
  const Tensor x = bf16_randn({6, 10}, gen), y = bf16_randn({6, 10}, gen), w = bf16_randn({10}, gen);
  const Tensor b = bf16_randn({10}, gen);
  using kernel::BinaryOp;
  using kernel::UnaryOp;
  expect_same_bf16(kernel::unary(UnaryOp::gelu, x), rounded(kernel::unary(UnaryOp::gelu, f32(x))), "gelu");
  expect_same_bf16(kernel::binary(BinaryOp::mul, x, w), rounded(kernel::binary(BinaryOp::mul, f32(x), f32(w))),
                   "broadcast mul");
  expect_same_bf16(kernel::softmax(x), rounded(kernel::softmax(f32(x))), "softmax");
  const kernel::NormOutput n16 = kernel::layer_norm(x, w, b, 1e-5),
                           n32 = kernel::layer_norm(f32(x), f32(w), f32(b), 1e-5);
  expect_same_bf16(n16.y, rounded(n32.y), "layer_norm y");
  // GEMM: transposed operands, a batch of strided views, and β = 1 onto an existing C.
  expect_same_bf16(kernel::matmul(x, y, false, true), rounded(kernel::matmul(f32(x), f32(y), false, true)), "x yᵀ");
  const Tensor a3 = bf16_randn({3, 4, 5}, gen), b3 = bf16_randn({3, 5, 2}, gen);
  expect_same_bf16(kernel::matmul(a3, b3), rounded(kernel::matmul(f32(a3), f32(b3))), "batched");
  const Tensor onto = bf16_randn({6, 6}, gen);
  const Tensor want = rounded(kernel::matmul(f32(x), f32(y), false, true, kernel::clone(f32(onto))));
  expect_same_bf16(kernel::matmul(x, y, false, true, kernel::clone(onto)), want, "onto (β = 1)");
  // linear with GELU: pre and y each rounded once from the f32 slot's, as cuBLASLt's epilogue rounds them.
  const Tensor b6 = kernel::narrow(b, 0, 0, 6);  // y as the weight: 6 outputs
  const kernel::LinearOutput lg16 = kernel::linear(x, y, b6, kernel::Activation::gelu),
                             lg32 = kernel::linear(f32(x), f32(y), f32(b6), kernel::Activation::gelu);
  expect_same_bf16(lg16.pre, rounded(lg32.pre), "linear_gelu pre");
  expect_same_bf16(lg16.y, rounded(lg32.y), "linear_gelu y");
  // Without a bias or an activation the GEMM writes y itself, its f32 sums rounded once.
  const kernel::LinearOutput l16 = kernel::linear(x, y, Tensor(), kernel::Activation::none),
                             l32 = kernel::linear(f32(x), f32(y), Tensor(), kernel::Activation::none);
  expect_same_bf16(l16.y, rounded(l32.y), "linear without bias");
  // With a bias and no activation: y is the GELU path's pre, the f32 sums plus the bias rounded once, also
  // where the GEMM splits a long k.
  // (1536 × 1400 is a weight past linear.cpp's kRowBlockWeightBytes: one GEMM over all rows, not row blocks.)
  // (in = 0: the sums are 0, y the bias rounded.)
  for (const auto& [rows, in, out] : {std::tuple{6, 10, 6}, std::tuple{37, 1024, 301}, std::tuple{1, 300, 64},
                                      std::tuple{600, 64, 40}, std::tuple{3, 1536, 1400}, std::tuple{5, 0, 7}}) {
    const Tensor xb = bf16_randn({rows, in}, gen), wb = bf16_randn({out, in}, gen), bb = bf16_randn({out}, gen);
    expect_same_bf16(kernel::linear(xb, wb, bb, kernel::Activation::none).y,
                     kernel::linear(xb, wb, bb, kernel::Activation::gelu).pre,
                     "linear with bias, " + std::to_string(rows) + " x " + std::to_string(in) + " x " +
                         std::to_string(out));
  }
  // A kernel with a struct of outputs, and one that reads and writes one tensor in place.
  const kernel::NormGrads g16 = kernel::layer_norm_backward(y, x, w, n16.mean, n16.rstd, true, true, true);
  EXPECT_EQ(n16.rstd.dtype(), DType::f32);  // statistics stay f32, the same values as the f32 kernel's
  EXPECT_EQ(n16.rstd.to_doubles(), n32.rstd.to_doubles());
  const kernel::NormGrads g32 =
      kernel::layer_norm_backward(f32(y), f32(x), f32(w), n16.mean, n16.rstd, true, true, true);
  expect_same_bf16(g16.dx, rounded(g32.dx), "layer_norm dx");
  expect_same_bf16(g16.dweight, rounded(g32.dweight), "layer_norm dweight");
}

// Each element of `got` (bf16) within one bf16 rounding of `want` (bf16, the widened GEMM's) plus the
// f32 rounding of a different order of the sums, bounded by scale = |A| |B| (f64).
void expect_within_a_rounding(const Tensor& got, const Tensor& want, const Tensor& scale, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = f32(got).to_doubles(), w = f32(want).to_doubles(), s = scale.to_doubles();
  ASSERT_EQ(g.size(), w.size()) << what;
  const double bound_bits = got.dtype() == DType::bf16 ? std::ldexp(1.0, -7) : 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_LE(std::abs(g[i] - w[i]), bound_bits * std::abs(w[i]) + 1e-5 * s[i]) << what << " at " << i;
  }
}

// |x| in f64, as relu(x) + relu(−x).
Tensor abs64(const Tensor& x) {
  const Tensor x64 = kernel::to_dtype(x, DType::f64);
  return kernel::binary(kernel::BinaryOp::add, kernel::unary(kernel::UnaryOp::relu, x64),
                        kernel::unary(kernel::UnaryOp::relu, kernel::unary(kernel::UnaryOp::neg, x64)));
}

TEST(Bf16OnCpu, GemmOnBf16InstructionsMatchesTheWidenedGemm) {
  RecordProperty("cpu_bf16_gemm", kernel::cpu_bf16_gemm_config());
  Generator gen(3);
  // Odd sizes, both transposes, batches of their own or shared B (stride 0), β = 1 onto C.
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const int64_t m = 37, n = 19, k = 70;
      const Tensor a = ta ? bf16_randn({3, k, m}, gen) : bf16_randn({3, m, k}, gen);
      const Tensor b = tb ? bf16_randn({n, k}, gen) : bf16_randn({k, n}, gen);
      const Tensor b3 = tb ? bf16_randn({3, n, k}, gen) : bf16_randn({3, k, n}, gen);
      const Tensor onto = bf16_randn({3, m, n}, gen);
      const std::string layout = std::string(ta ? "Aᵀ" : "A") + (tb ? "Bᵀ" : "B");
      for (const auto& [bb, what] : {std::pair<Tensor, std::string>{b, layout + " shared B"}, {b3, layout + " batched"}}) {
        Tensor want, want_onto;
        {
          const WidenedBf16Gemm widened;
          want = kernel::matmul(a, bb, ta, tb);
          want_onto = kernel::matmul(a, bb, ta, tb, kernel::clone(onto));
        }
        // |A| |B| (+ |C| for β = 1): how large the f32 sums' rounding can be.
        const Tensor scale = kernel::matmul(abs64(a), abs64(bb), ta, tb);
        expect_within_a_rounding(kernel::matmul(a, bb, ta, tb), want, scale, what);
        expect_within_a_rounding(kernel::matmul(a, bb, ta, tb, kernel::clone(onto)), want_onto,
                                 kernel::binary(kernel::BinaryOp::add, scale, abs64(onto)), what + " onto (β = 1)");
      }
    }
  }
  // linear: f32 sums, bias added in f32, pre and y each rounded once; a single row and a wide one.
  // 1100 rows: several threads' ranges of row blocks; 1536 × 1400: one GEMM over all rows.
  for (const auto& [rows, in, out] : {std::tuple{1, 33, 21}, std::tuple{45, 33, 21}, std::tuple{1100, 40, 48},
                                      std::tuple{4, 1536, 1400}}) {
    const Tensor x = bf16_randn({rows, in}, gen), w = bf16_randn({out, in}, gen), bias = bf16_randn({out}, gen);
    kernel::LinearOutput want;
    {
      const WidenedBf16Gemm widened;
      want = kernel::linear(x, w, bias, kernel::Activation::gelu);
    }
    const kernel::LinearOutput got = kernel::linear(x, w, bias, kernel::Activation::gelu);
    const Tensor scale =
        kernel::binary(kernel::BinaryOp::add, kernel::matmul(abs64(x), abs64(w), false, true), abs64(bias));
    expect_within_a_rounding(got.pre, want.pre, scale, "linear pre, rows " + std::to_string(rows));
    expect_within_a_rounding(got.y, want.y, scale, "linear gelu y, rows " + std::to_string(rows));
  }
}

TEST(Bf16OnCpu, StatisticsAndLossesStayF32) {
  Generator gen(2);
  const Tensor logits = bf16_randn({5, 7}, gen, 3.0);
  const Tensor targets = Tensor::from_indices({0, 6, 3, 3, 1}, {5});
  const kernel::CrossEntropyOutput ce = kernel::cross_entropy(logits, targets, -1);
  EXPECT_EQ(ce.loss.dtype(), DType::f32);
  EXPECT_EQ(ce.lse.dtype(), DType::f32);
  const kernel::CrossEntropyOutput ref = kernel::cross_entropy(f32(logits), targets, -1);
  EXPECT_EQ(ce.loss.item(), ref.loss.item());  // the same f32 arithmetic on the same values

  const Tensor q = bf16_randn({1, 4, 2, 8}, gen), k = bf16_randn({1, 4, 2, 8}, gen), v = bf16_randn({1, 4, 2, 8}, gen);
  const AttentionOutput a16 = kernel::attention_forward(q, k, v, AttentionOptions{});
  const AttentionOutput a32 = kernel::attention_forward(f32(q), f32(k), f32(v), AttentionOptions{});
  EXPECT_EQ(a16.lse.dtype(), DType::f32);
  EXPECT_EQ(a16.lse.to_doubles(), a32.lse.to_doubles());
  // o: P is rounded to bf16 before P·V, as the GPU's kernels round it, so o is within a rounding of P
  // (2⁻⁸ relative, times max |v|) of the f32 kernel's, plus its own rounding once.
  const std::vector<double> o16 = f32(a16.o).to_doubles(), o32 = a32.o.to_doubles(), vs = f32(v).to_doubles();
  double vmax = 0;
  for (double x : vs) vmax = std::max(vmax, std::abs(x));
  for (size_t i = 0; i < o16.size(); ++i) {
    EXPECT_LE(std::abs(o16[i] - o32[i]), std::ldexp(std::abs(o32[i]), -8) + std::ldexp(vmax, -8)) << "attention o " << i;
  }
}

OptimConfig plain_sgd() {
  OptimConfig c;
  c.name = "sgd";
  c.momentum = 0;
  c.weight_decay = 0;
  return c;
}

TEST(MasterWeights, SmallUpdatesAccumulateInTheMaster) {
  // 1 + 100 · 1e-4 = 1.01, but bf16 has no number between 1 and 1 + 2⁻⁷ ≈ 1.0078: updated in bf16,
  // p would stay at 1 forever; through the master it crosses 1.0078.
  Tensor p = Tensor::from_vector({1.0, -1.0}, {2}, DType::bf16);
  set_requires_grad(p, true);
  Optimizer opt(plain_sgd(), {Parameter{"p", &p, ParamRole::matrix}});
  for (int i = 0; i < 100; ++i) {
    set_grad(p, Tensor::from_vector({-1.0, 1.0}, {2}, DType::bf16));
    opt.step(1e-4);
  }
  const Tensor w = opt.master_weights().at("p");
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_NEAR(w.to_doubles()[0], 1.01, 1e-5);
  EXPECT_NEAR(w.to_doubles()[1], -1.01, 1e-5);
  EXPECT_EQ(p.to_doubles(), rounded(w).to_doubles());
  EXPECT_EQ(p.to_doubles()[0], 1.0078125);
}

TEST(MasterWeights, AdamWKeepsP_AsTheRoundedMasterAndLoadStateRestoresIt) {
  OptimConfig c;
  c.name = "adamw";
  Tensor p = Tensor::from_vector({0.3, -0.7, 2.0}, {3}, DType::bf16);
  set_requires_grad(p, true);
  Optimizer opt(c, {Parameter{"p", &p, ParamRole::matrix}});
  for (int i = 0; i < 3; ++i) {
    set_grad(p, Tensor::from_vector({0.5, -0.25, 1.0}, {3}, DType::bf16));
    opt.step(1e-3);
  }
  const Tensor w = kernel::clone(opt.master_weights().at("p"));
  EXPECT_EQ(p.to_doubles(), rounded(w).to_doubles());

  // A checkpoint holds the master as the weight "p": a fresh optimizer takes it back exactly.
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : opt.state_tensors()) state[name] = kernel::clone(t);
  state["p"] = w;
  Tensor p2 = rounded(w);
  set_requires_grad(p2, true);
  Optimizer again(c, {Parameter{"p", &p2, ParamRole::matrix}});
  ASSERT_TRUE(again.load_state(state).ok());
  EXPECT_EQ(again.master_weights().at("p").to_doubles(), w.to_doubles());

  state.erase("p");
  const absl::Status missing = again.load_state(state);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.message()).find("master weight of bf16 parameter 'p'"), std::string::npos)
      << missing.message();
}

TEST(MasterWeights, MicroBatchGradientsAddInF32) {
  // 1 + 2⁻⁹ is not a bf16 number: added in bf16, the second micro-batch's 2⁻⁹ would vanish.
  Tensor p = Tensor::from_vector({0.5, 0.5}, {2}, DType::bf16), q = Tensor::from_vector({0.5}, {1}, DType::f32);
  set_requires_grad(p, true);
  set_requires_grad(q, true);
  const std::vector<Parameter> params{{"p", &p, ParamRole::matrix}, {"q", &q, ParamRole::matrix}};
  F32GradAccumulator sums(params);
  set_grad(p, Tensor::from_vector({1.0, -3.0}, {2}, DType::bf16));
  set_grad(q, Tensor::from_vector({1.0}, {1}, DType::f32));
  sums.add();
  EXPECT_FALSE(grad_of(p).defined()) << "the next backward starts from no gradient";
  EXPECT_TRUE(grad_of(q).defined()) << "non-bf16 gradients are the engine's to add";
  set_grad(p, Tensor::from_vector({1.0 / 512, 0.25}, {2}, DType::bf16));
  sums.add();
  sums.finish();
  ASSERT_EQ(grad_of(p).dtype(), DType::f32);
  EXPECT_EQ(grad_of(p).to_doubles(), (std::vector<double>{1.0 + 1.0 / 512, -2.75}));

  // The optimizer takes the f32 sum for the bf16 parameter: SGD with lr 1 moves the master by exactly it.
  Optimizer opt(plain_sgd(), params);
  opt.step(1.0);
  EXPECT_EQ(opt.master_weights().at("p").to_doubles(), (std::vector<double>{0.5 - (1.0 + 1.0 / 512), 3.25}));
  EXPECT_EQ(p.to_doubles(), rounded(opt.master_weights().at("p")).to_doubles());
}

TEST(MixedPrecisionDecoder, FollowsTheF32LossesWithinBf16Tolerance) {
  const ModelConfig cfg = gpt2_config(13, 16, 2, 2, 8);
  Generator gen_a(5), gen_b(5);
  Decoder full(cfg, gen_a), mixed(cfg, gen_b);
  mixed.to(cpu_device(), DType::bf16);
  OptimConfig c;
  c.lr = 3e-3;
  Optimizer opt_full(c, full.parameters()), opt_mixed(c, mixed.parameters());
  Generator data(9);
  std::vector<int64_t> ids(2 * 9);
  for (int64_t& t : ids) t = static_cast<int64_t>(data.next_u64() % 13);
  std::vector<int64_t> in, out;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 8; ++t) {
      in.push_back(ids[static_cast<size_t>(b * 9 + t)]);
      out.push_back(ids[static_cast<size_t>(b * 9 + t + 1)]);
    }
  }
  const Tensor inputs = Tensor::from_indices(in, {2, 8}), targets = Tensor::from_indices(out, {2, 8});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor lf = full.loss({inputs, targets}), lm = mixed.loss({inputs, targets});
    EXPECT_EQ(lm.dtype(), DType::f32);
    EXPECT_NEAR(lm.item(), lf.item(), 2e-2 * lf.item()) << "step " << step;
    opt_full.zero_grad();
    opt_mixed.zero_grad();
    backward(lf);
    backward(lm);
    opt_full.step(c.lr);
    opt_mixed.step(c.lr);
    (step == 0 ? first : last) = lm.item();
  }
  EXPECT_LT(last, first - 0.3) << "the bf16 model learns the batch";
  for (const Parameter& p : mixed.parameters()) {
    EXPECT_EQ(p.tensor->dtype(), DType::bf16) << p.name;
    EXPECT_EQ(p.tensor->to_doubles(), rounded(opt_mixed.master_weights().at(p.name)).to_doubles()) << p.name;
  }
}

}  // namespace
}  // namespace seqlab
