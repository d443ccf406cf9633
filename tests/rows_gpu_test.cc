// CUDA against CPU for the row-wise slots: layer and RMS norm (forward, dx, dweight, dbias; fused with
// the residual add before them, and dx with the residual's gradient added), softmax
// and log-softmax (forward and backward), fused cross-entropy (forward and backward, ignore_index, i32
// and i64 targets), embedding (gather and deterministic scatter-add), max over rows with its argmax
// and scatter, and cumsum (both directions). Skipped where no GPU is usable.
//
// Each case draws fresh random inputs in the dtype under test and computes the reference with the CPU
// slot from the same values (in f32 for bf16, which the CPU kernels do not take). Every slot is called
// directly with outputs filled with NaN (a sentinel for integers), so an element the CUDA kernel fails
// to write shows up. Sizes are odd on purpose: rows not a multiple of any block, C = 1, C in the
// thousands, no rows at all. Tolerance: |got − want| ≤ rtol · max(|want|, 1) with rtol 1e-5 for f32,
// 1e-10 for f64 and 1e-2 for bf16 (for dx = dnorm + dsum, whose dnorm is rounded before the add,
// max(|want|, |dnorm|, 1)); argmax indices, gathers and scatters must match exactly.
// Inputs and references of the row kernels come from tests/rows_cases.h, shared with the emulation
// test (tests/rows_emulation_test.cc). Inputs come from a fixed seed;
// --gtest_random_seed=N draws others.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "rows_cases.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using kernel::CrossEntropyOutput;
using kernel::NormGrads;
using kernel::NormOutput;

using testing::cpu_empty;
using testing::expect_close;
using testing::kCpu;
using testing::kFloatTypes;
using testing::kGpu;
using testing::kIgnoreIndex;
using testing::kLossScale;
using testing::on_gpu;
using testing::poisoned;
using testing::reference_type;

double rtol(DType d) { return testing::gpu_rtol(d); }
// `x` (already in the dtype under test) as the CPU reference computes from it.
Tensor ref(const Tensor& x) { return testing::as_reference(x); }
std::string case_name(const char* op, DType dtype, int64_t rows, int64_t cols) {
  return testing::rows_case_name(op, dtype, rows, cols);
}

class CudaRowsVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }

  // Uniform integers in [0, n), with about `ignored_share` of them replaced by `ignored`.
  Tensor indices(int64_t count, int64_t n, DType dtype, double ignored_share = 0.0, int64_t ignored = kIgnoreIndex) {
    return testing::random_indices(gen_, count, n, dtype, ignored_share, ignored);
  }

  Generator gen_{testing::test_seed(29)};
};

// [rows, C]: one element, one column, a few short rows, rows of a few hundred (not a multiple of 32),
// C in the thousands (several elements per thread), and no rows at all.
const std::pair<int64_t, int64_t> kRowShapes[] = {{1, 1}, {37, 1}, {5, 7}, {300, 33}, {3, 4099}, {0, 5}};

// ---- layer norm and RMS norm ---------------------------------------------------------------------

TEST_F(CudaRowsVsCpu, NormForward) {
  for (DType dtype : kFloatTypes) {
    for (auto [n, c] : kRowShapes) {
      // An offset mean (3) so the centering matters.
      const Tensor x = testing::offset_rows(n, c, 3.0, dtype, gen_);
      Tensor w = Tensor::randn({c}, gen_, dtype), b = Tensor::randn({c}, gen_, dtype);
      for (bool with_bias : {true, false}) {
        const std::string what = case_name(with_bias ? "layer_norm" : "layer_norm without bias", dtype, n, c);
        const NormOutput want = testing::norm_reference(x, w, with_bias ? b : Tensor(), true);
        NormOutput got{poisoned({n, c}, dtype), poisoned({n}, accumulate_dtype(dtype)),
                       poisoned({n}, accumulate_dtype(dtype))};
        kernel::layer_norm_kernel(kGpu, on_gpu(x), on_gpu(w), with_bias ? on_gpu(b) : Tensor(), 1e-5, got);
        expect_close(got.y, want.y, rtol(dtype), what + " y");
        expect_close(got.mean, want.mean, rtol(dtype), what + " mean");
        expect_close(got.rstd, want.rstd, rtol(dtype), what + " rstd");
      }
      const std::string what = case_name("rms_norm", dtype, n, c);
      const NormOutput want = testing::norm_reference(x, w, Tensor(), false);
      NormOutput got{poisoned({n, c}, dtype), Tensor(), poisoned({n}, accumulate_dtype(dtype))};
      kernel::rms_norm_kernel(kGpu, on_gpu(x), on_gpu(w), 1e-6, got);
      expect_close(got.y, want.y, rtol(dtype), what + " y");
      expect_close(got.rstd, want.rstd, rtol(dtype), what + " rstd");
    }
  }
}

TEST_F(CudaRowsVsCpu, NormBackward) {
  for (DType dtype : kFloatTypes) {
    for (auto [n, c] : kRowShapes) {
      const testing::NormBackwardInputs in = testing::norm_backward_inputs(n, c, dtype, gen_);
      const Tensor x = on_gpu(in.x), w = on_gpu(in.weight), dy = on_gpu(in.dy);
      for (bool centered : {true, false}) {
        const std::string what = case_name(centered ? "layer_norm backward" : "rms_norm backward", dtype, n, c);
        const testing::NormStatistics saved = testing::saved_norm_statistics(in, centered);
        const Tensor mean = on_gpu(saved.mean), rstd = on_gpu(saved.rstd);
        // Every gradient, then only the parameter gradients (dx skipped), then only dx; each asking for
        // dx again with dsum, the gradient of a fused residual sum, added onto it.
        for (int ask = 0; ask < 3; ++ask) {
          const bool need_dx = ask != 1, need_params = ask != 2;
          const NormGrads want = testing::norm_backward_reference(in, saved, centered, need_dx, need_params);
          for (bool with_dsum : {false, true}) {
            if (with_dsum && !need_dx) continue;
            NormGrads got{need_dx ? poisoned({n, c}, dtype) : Tensor(), need_params ? poisoned({c}, dtype) : Tensor(),
                          need_params && centered ? poisoned({c}, dtype) : Tensor()};
            const Tensor ds = with_dsum ? on_gpu(in.dsum) : Tensor();
            if (centered) {
              kernel::layer_norm_backward_kernel(kGpu, dy, x, w, mean, rstd, ds, got);
            } else {
              kernel::rms_norm_backward_kernel(kGpu, dy, x, w, rstd, ds, got);
            }
            const Tensor want_dx = with_dsum ? testing::dx_plus_dsum(want.dx, in.dsum) : want.dx;
            const std::string asked = what + " (ask " + std::to_string(ask) + (with_dsum ? ", with dsum)" : ")");
            if (need_dx) expect_close(got.dx, want_dx, rtol(dtype), asked + " dx", with_dsum ? want.dx : Tensor());
            if (need_params) expect_close(got.dweight, want.dweight, rtol(dtype), asked + " dweight");
            if (need_params && centered) expect_close(got.dbias, want.dbias, rtol(dtype), asked + " dbias");
          }
        }
      }
    }
  }
}

// s = x + residual written and normalised in one kernel. The reference sum comes from the CPU's fused
// slot; y and the statistics from the CPU's plain norm of that sum as stored in the dtype under test
// (for bf16 the kernel normalises the rounded s it writes, which the backward reads back).
TEST_F(CudaRowsVsCpu, AddNormForward) {
  for (DType dtype : kFloatTypes) {
    for (auto [n, c] : kRowShapes) {
      const testing::AddNormInputs in = testing::add_norm_inputs(n, c, dtype, gen_);
      const Tensor x = on_gpu(in.x), res = on_gpu(in.residual), w = on_gpu(in.weight);
      for (int kind = 0; kind < 3; ++kind) {  // layer norm, layer norm without bias, rms norm
        const bool centered = kind < 2, with_bias = kind == 0;
        const std::string what = case_name(kind == 0   ? "add_layer_norm"
                                           : kind == 1 ? "add_layer_norm without bias"
                                                       : "add_rms_norm",
                                           dtype, n, c);
        const testing::AddNormReference want = testing::add_norm_reference(in, centered, with_bias);
        Tensor got_sum = poisoned({n, c}, dtype);
        NormOutput got{poisoned({n, c}, dtype), centered ? poisoned({n}, accumulate_dtype(dtype)) : Tensor(),
                       poisoned({n}, accumulate_dtype(dtype))};
        if (centered) {
          const Tensor bias = with_bias ? on_gpu(in.bias) : Tensor();
          kernel::add_layer_norm_kernel(kGpu, x, res, w, bias, 1e-5, got_sum, got);
        } else {
          kernel::add_rms_norm_kernel(kGpu, x, res, w, 1e-6, got_sum, got);
        }
        expect_close(got_sum, want.sum, rtol(dtype), what + " sum");
        expect_close(got.y, want.norm.y, rtol(dtype), what + " y");
        if (centered) expect_close(got.mean, want.norm.mean, rtol(dtype), what + " mean");
        expect_close(got.rstd, want.norm.rstd, rtol(dtype), what + " rstd");
      }
    }
  }
}

TEST_F(CudaRowsVsCpu, NormThroughTheEntryPoints) {
  // [B, T, C] through layer_norm / rms_norm and their backward: the reshape to rows, the saved
  // statistics and the gradient allocation, on both devices.
  for (DType dtype : kFloatTypes) {
    Tensor x = Tensor::randn({3, 17, 70}, gen_, dtype, 1.5), w = Tensor::randn({70}, gen_, dtype);
    Tensor b = Tensor::randn({70}, gen_, dtype), dy = Tensor::randn({3, 17, 70}, gen_, dtype);
    NormOutput want = kernel::layer_norm(ref(x), ref(w), ref(b), 1e-5);
    NormOutput got = kernel::layer_norm(on_gpu(x), on_gpu(w), on_gpu(b), 1e-5);
    expect_close(got.y, want.y, rtol(dtype), std::string("layer_norm entry ") + dtype_name(dtype));
    NormGrads gw =
        kernel::layer_norm_backward(ref(dy), ref(x), ref(w), ref(kernel::to_dtype(want.mean, accumulate_dtype(dtype))),
                                    ref(kernel::to_dtype(want.rstd, accumulate_dtype(dtype))), true, true, true);
    NormGrads gg = kernel::layer_norm_backward(
        on_gpu(dy), on_gpu(x), on_gpu(w), on_gpu(kernel::to_dtype(want.mean, accumulate_dtype(dtype))),
        on_gpu(kernel::to_dtype(want.rstd, accumulate_dtype(dtype))), true, true, true);
    expect_close(gg.dx, gw.dx, rtol(dtype), std::string("layer_norm backward entry dx ") + dtype_name(dtype));
    expect_close(gg.dweight, gw.dweight, rtol(dtype), std::string("layer_norm backward entry dw ") + dtype_name(dtype));
    expect_close(gg.dbias, gw.dbias, rtol(dtype), std::string("layer_norm backward entry db ") + dtype_name(dtype));
    NormOutput rwant = kernel::rms_norm(ref(x), ref(w), 1e-6);
    NormOutput rgot = kernel::rms_norm(on_gpu(x), on_gpu(w), 1e-6);
    expect_close(rgot.y, rwant.y, rtol(dtype), std::string("rms_norm entry ") + dtype_name(dtype));
  }
}

TEST_F(CudaRowsVsCpu, AddNormThroughTheEntryPoints) {
  // [B, T, C] through add_layer_norm / add_rms_norm and the backward with dsum: the sum, the norm of
  // the sum as stored, and dx = dnorm + dsum, on both devices (CPU references in f32 for bf16).
  for (DType dtype : kFloatTypes) {
    Tensor x = Tensor::randn({3, 17, 70}, gen_, dtype, 1.5), res = Tensor::randn({3, 17, 70}, gen_, dtype);
    Tensor w = Tensor::randn({70}, gen_, dtype), b = Tensor::randn({70}, gen_, dtype);
    Tensor dy = Tensor::randn({3, 17, 70}, gen_, dtype), ds = Tensor::randn({3, 17, 70}, gen_, dtype);
    const std::string type = dtype_name(dtype);
    for (bool centered : {true, false}) {
      const std::string op = centered ? "add_layer_norm" : "add_rms_norm";
      kernel::AddNormOutput got = centered ? kernel::add_layer_norm(on_gpu(x), on_gpu(res), on_gpu(w), on_gpu(b), 1e-5)
                                           : kernel::add_rms_norm(on_gpu(x), on_gpu(res), on_gpu(w), 1e-6);
      kernel::AddNormOutput fused = centered ? kernel::add_layer_norm(ref(x), ref(res), ref(w), ref(b), 1e-5)
                                             : kernel::add_rms_norm(ref(x), ref(res), ref(w), 1e-6);
      const Tensor sum = kernel::to_dtype(fused.sum, dtype);  // s as the dtype under test stores it
      NormOutput want =
          centered ? kernel::layer_norm(ref(sum), ref(w), ref(b), 1e-5) : kernel::rms_norm(ref(sum), ref(w), 1e-6);
      expect_close(got.sum, fused.sum, rtol(dtype), op + " entry sum " + type);
      expect_close(got.norm.y, want.y, rtol(dtype), op + " entry y " + type);

      const Tensor mean = centered ? kernel::to_dtype(want.mean, accumulate_dtype(dtype)) : Tensor();
      const Tensor rstd = kernel::to_dtype(want.rstd, accumulate_dtype(dtype));
      NormGrads gw =
          centered ? kernel::layer_norm_backward(ref(dy), ref(sum), ref(w), ref(mean), ref(rstd), true, true, true)
                   : kernel::rms_norm_backward(ref(dy), ref(sum), ref(w), ref(rstd), true, true);
      NormGrads gg = centered ? kernel::layer_norm_backward(on_gpu(dy), on_gpu(sum), on_gpu(w), on_gpu(mean),
                                                            on_gpu(rstd), true, true, true, on_gpu(ds))
                              : kernel::rms_norm_backward(on_gpu(dy), on_gpu(sum), on_gpu(w), on_gpu(rstd), true, true,
                                                          on_gpu(ds));
      const Tensor want_dx = kernel::binary(kernel::BinaryOp::add, ref(kernel::to_dtype(gw.dx, dtype)), ref(ds));
      expect_close(gg.dx, want_dx, rtol(dtype), op + " backward entry dx + dsum " + type, gw.dx);
      expect_close(gg.dweight, gw.dweight, rtol(dtype), op + " backward entry dw " + type);
      if (centered) expect_close(gg.dbias, gw.dbias, rtol(dtype), op + " backward entry db " + type);
    }
  }
}

// ---- softmax -------------------------------------------------------------------------------------

TEST_F(CudaRowsVsCpu, SoftmaxForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    for (auto [n, c] : kRowShapes) {
      const testing::SoftmaxInputs in = testing::softmax_inputs(n, c, dtype, gen_);
      for (bool log : {false, true}) {
        const std::string what = case_name(log ? "log_softmax" : "softmax", dtype, n, c);
        const Tensor want = testing::softmax_reference(in.x, log);
        Tensor got = poisoned({n, c}, dtype);
        kernel::softmax_kernel(kGpu, on_gpu(in.x), log, got);
        expect_close(got, want, rtol(dtype), what);

        const Tensor y = kernel::to_dtype(want, dtype);  // y as the forward stored it
        const Tensor dwant = testing::softmax_backward_reference(in.dy, y, log);
        Tensor dgot = poisoned({n, c}, dtype);
        kernel::softmax_backward_kernel(kGpu, on_gpu(in.dy), on_gpu(y), log, dgot);
        expect_close(dgot, dwant, rtol(dtype), what + " backward");
      }
    }
  }
}

TEST_F(CudaRowsVsCpu, SoftmaxOfLargeLogitsAndNaN) {
  for (DType dtype : kFloatTypes) {
    const Tensor x = testing::large_logits_with_nan(dtype, gen_);
    for (bool log : {false, true}) {
      const Tensor want = testing::softmax_reference(x, log);
      Tensor got = poisoned({4, 100}, dtype);
      kernel::softmax_kernel(kGpu, on_gpu(x), log, got);
      expect_close(got, want, rtol(dtype),
                   std::string(log ? "log_softmax" : "softmax") + " large " + dtype_name(dtype));
    }
  }
}

// ---- cross-entropy -------------------------------------------------------------------------------

TEST_F(CudaRowsVsCpu, CrossEntropyForwardAndBackward) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {37, 1}, {13, 7}, {33, 300}, {4, 5001}, {0, 9}};
  for (DType dtype : kFloatTypes) {
    for (DType target_type : {DType::i32, DType::i64}) {
      for (auto [n, v] : shapes) {
        const std::string what = case_name("cross_entropy", dtype, n, v) + " " + dtype_name(target_type);
        const testing::CrossEntropyInputs in = testing::cross_entropy_inputs(n, v, dtype, target_type, gen_);
        const testing::CrossEntropyReference want = testing::cross_entropy_reference(in);
        const Tensor logits = on_gpu(in.logits), targets = on_gpu(in.targets);
        Tensor loss_got = poisoned({n}, accumulate_dtype(dtype)), lse_got = poisoned({n}, accumulate_dtype(dtype));
        kernel::cross_entropy_kernel(kGpu, logits, targets, kIgnoreIndex, loss_got, lse_got);
        expect_close(loss_got, want.losses, rtol(dtype), what + " losses");
        expect_close(lse_got, want.lse, rtol(dtype), what + " lse");

        // The backward reads lse as the forward stored it.
        Tensor dgot = poisoned({n, v}, dtype);
        kernel::cross_entropy_backward_kernel(kGpu, kLossScale, logits, targets, on_gpu(want.saved_lse), kIgnoreIndex,
                                              dgot);
        expect_close(dgot, want.dlogits, rtol(dtype), what + " backward");
      }
    }
  }
}

TEST_F(CudaRowsVsCpu, CrossEntropyThroughTheEntryPoints) {
  for (DType dtype : kFloatTypes) {
    Tensor logits = Tensor::randn({3, 11, 257}, gen_, dtype, 2.0);
    Tensor targets = kernel::reshape(indices(33, 257, DType::i64, 0.3, 5), {3, 11});  // ignore_index 5, a real class
    CrossEntropyOutput want = kernel::cross_entropy(ref(logits), targets, 5);
    CrossEntropyOutput got = kernel::cross_entropy(on_gpu(logits), on_gpu(targets), 5);
    EXPECT_EQ(got.count, want.count);
    expect_close(got.loss, want.loss, rtol(dtype), std::string("cross_entropy entry loss ") + dtype_name(dtype));
    Tensor dloss = Tensor::scalar(1.0, dtype);
    Tensor dwant = kernel::cross_entropy_backward(
        ref(dloss), ref(logits), targets, ref(kernel::to_dtype(want.lse, accumulate_dtype(dtype))), 5, want.count);
    Tensor dgot =
        kernel::cross_entropy_backward(on_gpu(dloss), on_gpu(logits), on_gpu(targets),
                                       on_gpu(kernel::to_dtype(want.lse, accumulate_dtype(dtype))), 5, want.count);
    expect_close(dgot, dwant, rtol(dtype), std::string("cross_entropy entry backward ") + dtype_name(dtype));
  }
}

// ---- embedding -----------------------------------------------------------------------------------

TEST_F(CudaRowsVsCpu, EmbeddingGatherAndScatterAdd) {
  struct Case {
    int64_t v, c, n;
  };
  // Many tokens per row (V = 7, N = 3000), one row, C = 1, C not a multiple of a warp, rows no token
  // picks (V = 1000, N = 37), and no tokens at all.
  const Case cases[] = {{7, 5, 3000}, {1, 3, 10}, {1000, 1, 37}, {1000, 257, 37}, {50, 129, 2001}, {9, 4, 0}};
  for (DType dtype : kFloatTypes) {
    const DType rt = reference_type(dtype);
    for (DType index_type : {DType::i32, DType::i64}) {
      for (const Case& k : cases) {
        const std::string what = std::string("embedding ") + dtype_name(dtype) + " " + dtype_name(index_type) + " V " +
                                 std::to_string(k.v) + " C " + std::to_string(k.c) + " N " + std::to_string(k.n);
        Tensor weight = Tensor::randn({k.v, k.c}, gen_, dtype);
        Tensor index = indices(k.n, k.v, index_type);
        Tensor want = cpu_empty({k.n, k.c}, rt);
        kernel::embedding_kernel(kCpu, ref(weight), index, want);
        Tensor got = poisoned({k.n, k.c}, dtype);
        kernel::embedding_kernel(kGpu, on_gpu(weight), on_gpu(index), got);
        expect_close(got, want, 0.0, what + " gather");

        Tensor dy = Tensor::randn({k.n, k.c}, gen_, dtype);
        Tensor dwant = cpu_empty({k.v, k.c}, rt);
        kernel::embedding_backward_kernel(kCpu, ref(dy), index, dwant);
        Tensor dgot = poisoned({k.v, k.c}, dtype);
        kernel::embedding_backward_kernel(kGpu, on_gpu(dy), on_gpu(index), dgot);
        expect_close(dgot, dwant, rtol(dtype), what + " backward");
        // Deterministic: the same inputs give the same bits.
        Tensor again = poisoned({k.v, k.c}, dtype);
        kernel::embedding_backward_kernel(kGpu, on_gpu(dy), on_gpu(index), again);
        expect_close(again, kernel::to_device(dgot, kCpu), 0.0, what + " backward, second run");
      }
    }
  }
}

// ---- max over rows, its scatter, cumsum ----------------------------------------------------------

TEST_F(CudaRowsVsCpu, MaxRowsFirstArgmaxTiesAndNaN) {
  for (DType dtype : kFloatTypes) {
    const DType rt = reference_type(dtype);
    for (auto [n, c] : kRowShapes) {
      const std::string what = case_name("max_rows", dtype, n, c);
      // Ties (the first max must win) and NaN rows.
      Tensor x = Tensor::from_vector(testing::max_rows_values(n, c, gen_), {n, c}, dtype);
      Tensor want = cpu_empty({n}, rt), want_index = cpu_empty({n}, DType::i64);
      kernel::max_rows_kernel(kCpu, ref(x), want, want_index);
      Tensor got = poisoned({n}, dtype), got_index = poisoned({n}, DType::i64);
      kernel::max_rows_kernel(kGpu, on_gpu(x), got, got_index);
      expect_close(got, want, 0.0, what + " values");
      expect_close(got_index, want_index, 0.0, what + " indices");

      Tensor dy = Tensor::randn({n}, gen_, dtype);
      Tensor dwant = Tensor::zeros({n, c}, rt);
      kernel::scatter_rows_kernel(kCpu, ref(dy), want_index, dwant);
      Tensor dgot = Tensor::zeros({n, c}, dtype, kGpu);
      kernel::scatter_rows_kernel(kGpu, on_gpu(dy), on_gpu(want_index), dgot);
      expect_close(dgot, dwant, 0.0, what + " scatter");
    }
  }
}

TEST_F(CudaRowsVsCpu, Cumsum) {
  const Shape shapes[] = {{1, 1, 1}, {3, 37, 1}, {2, 5, 129}, {1, 1000, 3}, {4, 0, 3}, {2, 3, 0}};
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : shapes) {
      for (bool reverse : {false, true}) {
        const std::string what =
            std::string("cumsum ") + dtype_name(dtype) + " " + shape_str(shape) + (reverse ? " reverse" : "");
        Tensor x = Tensor::rand(shape, gen_, dtype, -1.0, 2.0);  // mean 0.5: the sums grow
        Tensor want = cpu_empty(shape, reference_type(dtype));
        kernel::cumsum_kernel(kCpu, ref(x), reverse, want);
        Tensor got = poisoned(shape, dtype);
        kernel::cumsum_kernel(kGpu, on_gpu(x), reverse, got);
        expect_close(got, want, rtol(dtype), what);
      }
    }
  }
}

}  // namespace
}  // namespace seqlab
