// CUDA against CPU for the fused attention slots (src/cuda/attention/attention.cu and, for bf16 with
// Dk = Dv ∈ {64, 128}, the tensor-core kernels of src/cuda/attention/attention_tc.cu, against the CPU kernels in
// src/layers/attention/attention.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random q, k, v (and dO, dlse for the backward) in the dtype under test,
// fills every CUDA output with NaN first (an element the kernels fail to write shows up), and
// compares o, lse, dq, dk and dv element by element with the CPU slots. The CPU kernels take f32 and
// f64; for bf16 the reference runs in f32 on the same bf16 values (exactly representable), so the
// difference is the CUDA kernel's f32 arithmetic plus rounding the result to bf16. The backward gets
// the same o and lse on both sides (the CPU forward's: o rounded to the dtype under test, lse in its
// accumulate_dtype, f32 for bf16).
// Shapes cover causal and bidirectional, T = S, T < S, T > S (bidirectional only), decoding (T = 1),
// MHA, GQA and MQA, Dk ≠ Dv, head dims from 1 to 128, and T and S that are not multiples of any tile.
// The cases with Dk = Dv = 64 or 128 send bf16 to the tensor-core kernels (64-row query and key tiles):
// there they cover several tiles each way, partial tiles of queries and keys, causal with S − T not a
// multiple of the tile (the diagonal crosses tiles), bidirectional with T > S, GQA, MQA and decoding.
// The masks (kMaskCases, on both kernel families): query and key lengths of 0, partial and full (batch rows
// of padding, rows that see no key, key tiles cut at k_len, query blocks part padding), with the padded
// rows of q, k, v, dO and dlse set to NaN on the CUDA side (nothing read from them may reach an output); a
// bias of 1 and of B rows with −∞ in it, and dbias with the other gradients and alone; rows whose every
// visible key has −∞ bias, which must end as rows that see no key do; and determinism with all of them.
// Tolerance: |got − want| ≤ rtol · max(|want|, 1); rtol 1e-4 for f32 (the two sides sum scores and
// gradients over up to a few hundred terms in different orders and use different exp routines),
// 1e-10 for f64, 2e-2 for bf16. The case struct, inputs and references: tests/attention_cases.h, shared
// with the emulation tests (tests/attention_emulation_test.cc, attention_tc_emulation_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using testing::expect_close;
using testing::GradientsNeeded;
using testing::kCpu;
using testing::kFloatTypes;
using testing::kGpu;
using testing::on_gpu;
using testing::poisoned;
using Case = testing::AttentionCase;

double rtol(DType d) { return testing::fused_op_rtol(d); }

const Case kCases[] = {
    {2, 37, 37, 4, 4, 16, 16, true, 0},       // MHA, T = S, odd
    {1, 5, 70, 4, 2, 24, 40, true, 0},        // GQA, a block of new queries against a longer cache, Dk ≠ Dv
    {2, 1, 33, 6, 1, 32, 32, true, 0},        // decoding, MQA
    {1, 45, 19, 3, 1, 8, 12, false, 0},       // bidirectional with T > S, MQA
    {1, 20, 50, 8, 2, 128, 128, false, 0.3},  // the largest head dim, explicit scale
    {1, 17, 17, 2, 2, 1, 3, true, 0},         // a head dim of 1
    {1, 70, 70, 2, 1, 64, 48, true, 0},       // several query and key tiles
    {3, 33, 65, 6, 3, 40, 72, false, 0},      // bidirectional GQA, dims not multiples of 32
    {1, 1, 1, 1, 1, 5, 7, true, 0},           // one query, one key
    // bf16 on tensor cores from here on (and the f32/f64 kernels on larger shapes).
    {2, 100, 100, 4, 4, 64, 64, true, 0},        // MHA, T = S, a partial second tile
    {1, 77, 150, 8, 2, 128, 128, true, 0},       // GQA, queries at the end of a longer cache (S − T = 73)
    {2, 130, 61, 6, 3, 64, 64, false, 0},        // bidirectional GQA, T > S, partial tiles both ways
    {1, 1, 200, 4, 1, 128, 128, true, 0},        // decoding, MQA
    {1, 128, 192, 2, 1, 64, 64, true, 0},        // exact multiples of the tile, S − T = 64
    {1, 150, 150, 2, 2, 128, 128, false, 0.05},  // bidirectional, explicit scale
};

// With masks: {B, T, S, H, Hk, Dk, Dv, causal, scale, subsets, q_lengths, k_lengths, bias rows}. The last
// four send bf16 to the tensor-core kernels.
const Case kMaskCases[] = {
    {2, 37, 45, 2, 1, 16, 24, true, 0, false, {37, 20}, {45, 30}, 0},          // causal GQA, Dk ≠ Dv, lengths only
    {3, 20, 13, 3, 1, 8, 12, false, 0, true, {0, 20, 9}, {13, 0, 5}, 3},       // T > S, empty rows, bias of B rows
    {2, 1, 33, 2, 2, 32, 32, true, 0, true, {1, 1}, {33, 17}, 1},              // decoding, a shared bias
    {1, 40, 40, 1, 1, 24, 16, true, 0.2, false, {}, {}, 1},                    // a bias only, two key tiles
    {2, 9, 70, 2, 1, 40, 40, false, 0, false, {9, 4}, {70, 33}, 2},            // cross attention, one key in a tile
    {2, 100, 130, 4, 2, 64, 64, true, 0, false, {100, 37}, {130, 70}, 0},      // causal GQA, cut tiles
    {3, 130, 61, 4, 2, 64, 64, false, 0, true, {0, 130, 65}, {61, 0, 1}, 3},   // T > S, empty rows, bias of B rows
    {2, 1, 200, 4, 1, 128, 128, true, 0, true, {1, 0}, {150, 200}, 1},         // decoding, MQA, a shared bias
    {2, 150, 150, 2, 1, 128, 128, true, 0.1, false, {150, 80}, {150, 90}, 2},  // causal, several tiles, everything
};

// The masks on the GPU (the lengths too: the slots take them on the inputs' device).
kernel::AttentionMasks masks_on_gpu(const kernel::AttentionMasks& m) {
  return {on_gpu(m.q_lengths), on_gpu(m.k_lengths), on_gpu(m.bias)};
}

// One case's forward on the GPU (inputs as the CUDA side gets them: with_padding_poisoned) against the CPU's.
void check_forward(const Case& c, DType dtype, Generator& gen) {
  const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
  const testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen, false);
  const testing::AttentionInputs x = testing::with_padding_poisoned(c, in);
  Tensor o = poisoned(c.o_shape(), dtype), lse = poisoned(c.lse_shape(), accumulate_dtype(dtype));
  kernel::attention_forward_kernel(kGpu, on_gpu(x.q), on_gpu(x.k), on_gpu(x.v), masks_on_gpu(x.masks), c.params(), o,
                                   lse);
  const testing::AttentionOutputs want = testing::attention_forward_reference(c, in);
  expect_close(o, want.o, rtol(dtype), what + " o");
  expect_close(lse, want.lse, rtol(dtype), what + " lse");
}

// One case's backward on the GPU, for one set of gradients, against the CPU's.
void check_backward(const Case& c, DType dtype, GradientsNeeded need, Generator& gen) {
  const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + need.names();
  const testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen, true);
  const testing::AttentionInputs x = testing::with_padding_poisoned(c, in);
  // The saved outputs as the dtype under test holds them; both sides read these values.
  const testing::AttentionOutputs saved = testing::saved_attention_outputs(c, in);

  kernel::AttentionGrads got;
  if (need.dq) got.dq = poisoned(c.q_shape(), dtype);
  if (need.dk) got.dk = poisoned(c.k_shape(), dtype);
  if (need.dv) got.dv = poisoned(c.v_shape(), dtype);
  if (need.dbias) got.dbias = poisoned(c.dbias_shape(), dtype);
  kernel::attention_backward_kernel(kGpu, on_gpu(x.dout), on_gpu(x.dlse), on_gpu(x.q), on_gpu(x.k), on_gpu(x.v),
                                    masks_on_gpu(x.masks), on_gpu(saved.o), on_gpu(saved.lse), c.params(), got);
  const kernel::AttentionGrads want = testing::attention_backward_reference(c, in, saved, need);
  if (need.dq) expect_close(got.dq, want.dq, rtol(dtype), what + " → dq");
  if (need.dk) expect_close(got.dk, want.dk, rtol(dtype), what + " → dk");
  if (need.dv) expect_close(got.dv, want.dv, rtol(dtype), what + " → dv");
  if (need.dbias) expect_close(got.dbias, want.dbias, rtol(dtype), what + " → dbias");
}

class CudaAttentionVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{testing::test_seed(41)};
};

TEST_F(CudaAttentionVsCpu, Forward) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) check_forward(c, dtype, gen_);
  }
}

TEST_F(CudaAttentionVsCpu, BackwardAllAndSomeGradients) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      for (GradientsNeeded need : {GradientsNeeded{true, true, true}, GradientsNeeded{false, false, true},
                                   GradientsNeeded{true, false, false}, GradientsNeeded{false, true, false}}) {
        check_backward(c, dtype, need, gen_);
      }
    }
  }
}

TEST_F(CudaAttentionVsCpu, ForwardWithMasks) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kMaskCases) check_forward(c, dtype, gen_);
  }
}

// Every gradient (dbias too where there is a bias) and, for the cases marked `subsets`, some alone: dbias
// alone runs the dQ pass without dQ.
TEST_F(CudaAttentionVsCpu, BackwardWithMasks) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kMaskCases) {
      const bool with_bias = c.bias_rows > 0;
      std::vector<GradientsNeeded> needs = {{true, true, true, with_bias}};
      if (c.subsets) needs.insert(needs.end(), {{false, false, true}, {true, false, false}, {false, true, false}});
      if (c.subsets && with_bias) needs.push_back({false, false, false, true});
      for (GradientsNeeded need : needs) check_backward(c, dtype, need, gen_);
    }
  }
}

// The last batch row's bias is −∞ on every key, so each of its rows sees only −∞ scores: o = 0, lse = −∞
// and no gradient from them (no NaN anywhere), what the CPU gives with that row's keys cut by
// k_lengths = 0 instead. FMA kernels (f32, f64, bf16 at Dk = 24) and tensor cores (bf16 at D = 64).
TEST_F(CudaAttentionVsCpu, RowsOfMinusInfiniteBiasSeeNothing) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : {Case{2, 13, 21, 2, 1, 24, 24, true, 0, false, {}, {}, 2},
                          Case{2, 70, 90, 2, 1, 64, 64, false, 0, false, {}, {}, 2}}) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " (batch row 1 all −∞)";
      testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen_, true);
      std::vector<double> bias = in.masks.bias.to_doubles();
      std::fill(bias.begin() + static_cast<ptrdiff_t>(bias.size() / 2), bias.end(),
                -std::numeric_limits<double>::infinity());
      in.masks.bias = Tensor::from_vector(bias, c.bias_shape(), dtype);
      Case cut = c;
      cut.k_lengths = {c.S, 0};
      testing::AttentionInputs cut_in = in;
      cut_in.masks.k_lengths = Tensor::from_indices(cut.k_lengths, {c.B});

      Tensor o = poisoned(c.o_shape(), dtype), lse = poisoned(c.lse_shape(), accumulate_dtype(dtype));
      kernel::attention_forward_kernel(kGpu, on_gpu(in.q), on_gpu(in.k), on_gpu(in.v), masks_on_gpu(in.masks),
                                       c.params(), o, lse);
      const testing::AttentionOutputs want = testing::attention_forward_reference(cut, cut_in);
      expect_close(o, want.o, rtol(dtype), what + " o");
      expect_close(lse, want.lse, rtol(dtype), what + " lse");

      const testing::AttentionOutputs saved = testing::as_saved(want, dtype);
      kernel::AttentionGrads got{poisoned(c.q_shape(), dtype), poisoned(c.k_shape(), dtype),
                                 poisoned(c.v_shape(), dtype), poisoned(c.dbias_shape(), dtype)};
      kernel::attention_backward_kernel(kGpu, on_gpu(in.dout), on_gpu(in.dlse), on_gpu(in.q), on_gpu(in.k),
                                        on_gpu(in.v), masks_on_gpu(in.masks), on_gpu(saved.o), on_gpu(saved.lse),
                                        c.params(), got);
      const kernel::AttentionGrads grads =
          testing::attention_backward_reference(cut, cut_in, saved, {true, true, true, true});
      expect_close(got.dq, grads.dq, rtol(dtype), what + " → dq");
      expect_close(got.dk, grads.dk, rtol(dtype), what + " → dk");
      expect_close(got.dv, grads.dv, rtol(dtype), what + " → dv");
      expect_close(got.dbias, grads.dbias, rtol(dtype), what + " → dbias");
    }
  }
}

// The backward is deterministic: the same inputs give the same bits.
TEST_F(CudaAttentionVsCpu, BackwardIsDeterministic) {
  const Case c{2, 53, 61, 4, 2, 32, 24, true, 0};
  Tensor q = on_gpu(Tensor::randn({c.B, c.T, c.H, c.Dk}, gen_));
  Tensor k = on_gpu(Tensor::randn({c.B, c.S, c.Hk, c.Dk}, gen_));
  Tensor v = on_gpu(Tensor::randn({c.B, c.S, c.Hk, c.Dv}, gen_));
  Tensor dout = on_gpu(Tensor::randn({c.B, c.T, c.H, c.Dv}, gen_));
  Tensor dlse = on_gpu(Tensor::randn({c.B, c.T, c.H}, gen_));
  const kernel::AttentionParams p = c.params();
  Tensor o = poisoned({c.B, c.T, c.H, c.Dv}, DType::f32), lse = poisoned({c.B, c.T, c.H}, DType::f32);
  kernel::attention_forward_kernel(kGpu, q, k, v, {}, p, o, lse);
  std::vector<double> first[3];
  for (int run = 0; run < 2; ++run) {
    kernel::AttentionGrads g{poisoned(q.shape(), DType::f32), poisoned(k.shape(), DType::f32),
                             poisoned(v.shape(), DType::f32)};
    kernel::attention_backward_kernel(kGpu, dout, dlse, q, k, v, {}, o, lse, p, g);
    const Tensor* grads[3] = {&g.dq, &g.dk, &g.dv};
    for (int t = 0; t < 3; ++t) {
      std::vector<double> now = grads[t]->to_doubles();
      if (run == 0) {
        first[t] = now;
      } else {
        EXPECT_EQ(now, first[t]) << "gradient " << t << " changed between runs";
      }
    }
  }
}

// The bf16 tensor-core kernels are deterministic too: forward and backward give the same bits twice,
// for both head dims, causal and not (multi-tile shapes with partial tiles and GQA), and with the masks
// (lengths, a bias with −∞ in it, dbias). Every value is finite but the lse of rows that see no key (−∞).
TEST_F(CudaAttentionVsCpu, TensorCoreKernelsAreDeterministic) {
  const Case cases[] = {{2, 100, 130, 4, 2, 64, 64, true, 0},
                        {1, 90, 70, 4, 1, 128, 128, false, 0},
                        {2, 100, 130, 4, 2, 64, 64, true, 0, false, {100, 41}, {130, 77}, 2}};
  for (const Case& c : cases) {
    const DType bf = DType::bf16;
    const testing::AttentionInputs in = testing::attention_inputs(c, bf, gen_, true);  // lse, dlse: f32 for bf16
    const Tensor q = on_gpu(in.q), k = on_gpu(in.k), v = on_gpu(in.v), dout = on_gpu(in.dout), dlse = on_gpu(in.dlse);
    const kernel::AttentionMasks masks = masks_on_gpu(in.masks);
    const kernel::AttentionParams p = c.params();
    const bool with_bias = c.bias_rows > 0;
    std::vector<double> first[6];
    for (int run = 0; run < 2; ++run) {
      Tensor o = poisoned({c.B, c.T, c.H, c.Dv}, bf), lse = poisoned({c.B, c.T, c.H}, DType::f32);
      kernel::attention_forward_kernel(kGpu, q, k, v, masks, p, o, lse);
      kernel::AttentionGrads g{poisoned(q.shape(), bf), poisoned(k.shape(), bf), poisoned(v.shape(), bf),
                               with_bias ? poisoned(c.dbias_shape(), bf) : Tensor()};
      kernel::attention_backward_kernel(kGpu, dout, dlse, q, k, v, masks, o, lse, p, g);
      const Tensor* outs[6] = {&o, &lse, &g.dq, &g.dk, &g.dv, &g.dbias};
      const char* names[6] = {"o", "lse", "dq", "dk", "dv", "dbias"};
      for (int t = 0; t < (with_bias ? 6 : 5); ++t) {
        std::vector<double> now = outs[t]->to_doubles();
        for (double x : now) {
          ASSERT_TRUE(std::isfinite(x) || (t == 1 && x == -std::numeric_limits<double>::infinity()))
              << c.name() << " " << names[t] << " has a non-finite value";
        }
        if (run == 0) {
          first[t] = now;
        } else {
          EXPECT_EQ(now, first[t]) << c.name() << " " << names[t] << " changed between runs";
        }
      }
    }
  }
}

// Through the differentiable op: the same results as on the CPU, and head dims beyond the kernel's
// reach are refused with a clear message.
TEST_F(CudaAttentionVsCpu, EntryPointsAndHeadDimLimit) {
  Tensor q = Tensor::randn({1, 9, 2, 8}, gen_), k = Tensor::randn({1, 11, 1, 8}, gen_),
         v = Tensor::randn({1, 11, 1, 6}, gen_);
  AttentionOptions opts;
  opts.causal = true;
  kernel::AttentionParams p{true, 1.0 / std::sqrt(8.0), 64};
  AttentionOutput gpu = kernel::attention_forward(on_gpu(q), on_gpu(k), on_gpu(v), opts);
  Tensor o_ref = Tensor::empty({1, 9, 2, 6}), lse_ref = Tensor::empty({1, 9, 2});
  kernel::attention_forward_kernel(kCpu, q, k, v, {}, p, o_ref, lse_ref);
  expect_close(gpu.o, o_ref, rtol(DType::f32), "attention_forward o");
  expect_close(gpu.lse, lse_ref, rtol(DType::f32), "attention_forward lse");

  Tensor big_q = on_gpu(Tensor::randn({1, 3, 1, 129}, gen_)), big_k = on_gpu(Tensor::randn({1, 3, 1, 129}, gen_));
  try {
    kernel::attention_forward(big_q, big_k, on_gpu(Tensor::randn({1, 3, 1, 4}, gen_)), opts);
    ADD_FAILURE() << "Dk = 129 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

// Through the differentiable op on both devices: i32 lengths on the CPU (the entry point converts them and
// copies them to the inputs' device) and a bias shared by the batch rows, whose gradient the entry point sums
// over them. The padded rows' cotangents are random: both sides must ignore them.
TEST_F(CudaAttentionVsCpu, DifferentiableOpWithMasks) {
  const Tensor q = Tensor::randn({2, 9, 2, 8}, gen_), k = Tensor::randn({2, 11, 1, 8}, gen_),
               v = Tensor::randn({2, 11, 1, 6}, gen_), bias = Tensor::randn({1, 2, 9, 11}, gen_);
  const Tensor go = Tensor::randn({2, 9, 2, 6}, gen_), gl = Tensor::randn({2, 9, 2}, gen_);
  AttentionOptions opts;
  opts.causal = false;
  opts.q_lengths = Tensor::from_indices({9, 4}, {2}, DType::i32);
  opts.k_lengths = Tensor::from_indices({11, 5}, {2}, DType::i32);
  auto run = [&](Device device) {
    Tensor qd = set_requires_grad(kernel::to_device(q, device)), kd = set_requires_grad(kernel::to_device(k, device)),
           vd = set_requires_grad(kernel::to_device(v, device)),
           bd = set_requires_grad(kernel::to_device(bias, device));
    const AttentionOutput out = attention_with_lse(qd, kd, vd, opts, bd);
    backward({out.o, out.lse}, {kernel::to_device(go, device), kernel::to_device(gl, device)});
    return std::vector<Tensor>{out.o.detach(), out.lse.detach(), grad_of(qd), grad_of(kd), grad_of(vd), grad_of(bd)};
  };
  const std::vector<Tensor> gpu = run(kGpu), cpu = run(kCpu);
  const char* names[] = {"o", "lse", "dq", "dk", "dv", "dbias"};
  for (size_t t = 0; t < gpu.size(); ++t) {
    expect_close(gpu[t], cpu[t], rtol(DType::f32), std::string("attention_with_lse with masks: ") + names[t]);
  }
}

}  // namespace
}  // namespace seqlab
