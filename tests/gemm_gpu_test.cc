// CUDA against CPU for gemm_kernel (cuBLASLt for f32 and bf16, cuBLAS for f64) and for matmul on
// CUDA tensors. Skipped where no GPU is usable.
//
// Each case draws fresh random inputs in the dtype under test and computes the reference with the CPU
// gemm_kernel from the same values (in f32 for bf16, which the CPU GEMM does not take). Operands have
// leading dimensions wider than their rows and gaps between batch entries; the output buffer is filled
// with NaN when β = 0 (so an element the GPU fails to write shows up) and with random values when
// β ≠ 0, and every element outside the m×n entries must come back untouched. A and B are drawn with
// standard deviation 1/√k so that every product is of order one whatever k is: the tolerance
// |got − want| ≤ rtol · max(|want|, 1) then bounds the summation error of a k-term dot product, with
// rtol 1e-5 for f32, 1e-10 for f64 and 1e-2 for bf16 (the rounding of the stored result).
// Inputs come from a fixed seed; --gtest_random_seed=N draws others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using kernel::GemmArgs;

using testing::kCpu;
using testing::kFloatTypes;
using testing::kGpu;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

double rtol(DType d) { return testing::gpu_rtol(d); }
using testing::reference_type;
Tensor rounded(const Tensor& x, DType dtype) { return kernel::to_dtype(x, dtype); }
Tensor on_gpu(const Tensor& x) { return kernel::to_device(x, kGpu); }

bool close(double got, double want, double tol) {
  return got == want || std::fabs(got - want) <= tol * std::max(std::fabs(want), 1.0);
}
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_TRUE(got.device().is_cuda()) << what;
  std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  int failures = 0;
  for (size_t i = 0; i < g.size() && failures < 5; ++i) {
    if (!close(g[i], w[i], tol)) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on CUDA, " << w[i] << " on the CPU";
    }
  }
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{testing::test_seed(29)};
};

// How one GEMM case lays out its operands.
struct Case {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1, batch = 1;
  bool shared_a = false, shared_b = false;  // stride 0: one matrix for every batch entry
  double alpha = 1.0, beta = 0.0;
  DType dtype = DType::f32;

  std::string str() const {
    return std::string(dtype_name(dtype)) + " trans_a=" + std::to_string(trans_a) +
           " trans_b=" + std::to_string(trans_b) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k) + " batch=" + std::to_string(batch) + (shared_a ? " A shared" : "") +
           (shared_b ? " B shared" : "") + " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta);
  }
};

// Buffers of one case, with padding: ld = columns + a few, and a gap between batch entries.
struct Buffers {
  GemmArgs g;  // pointers unset
  int64_t size_a = 0, size_b = 0, size_c = 0;
};

Buffers layout(const Case& c) {
  Buffers b;
  GemmArgs& g = b.g;
  g.trans_a = c.trans_a;
  g.trans_b = c.trans_b;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.batch = c.batch;
  const int64_t rows_a = c.trans_a ? c.k : c.m, cols_a = c.trans_a ? c.m : c.k;
  const int64_t rows_b = c.trans_b ? c.n : c.k, cols_b = c.trans_b ? c.k : c.n;
  g.lda = cols_a + 3;
  g.ldb = cols_b + 1;
  g.ldc = c.n + 2;
  g.stride_a = c.shared_a ? 0 : rows_a * g.lda + 5;
  g.stride_b = c.shared_b ? 0 : rows_b * g.ldb + 1;
  g.stride_c = c.m * g.ldc + 3;
  b.size_a = (c.batch - 1) * g.stride_a + rows_a * g.lda;
  b.size_b = (c.batch - 1) * g.stride_b + rows_b * g.ldb;
  b.size_c = (c.batch - 1) * g.stride_c + c.m * g.ldc;
  return b;
}

// Runs one case on both devices and compares every element of C's buffer.
void check_case(const Case& c, Generator& gen) {
  const std::string what = c.str();
  const DType ref = reference_type(c.dtype);
  Buffers buf = layout(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(c.k, 1)));
  Tensor a = Tensor::randn({buf.size_a}, gen, c.dtype, scale);
  Tensor b = Tensor::randn({buf.size_b}, gen, c.dtype, scale);
  // β = 0: C is not read; the GPU's buffer is NaN and the reference's zero.
  Tensor c0 = c.beta != 0.0 ? Tensor::randn({buf.size_c}, gen, c.dtype) : Tensor::full({buf.size_c}, kNaN, c.dtype);
  Tensor c_gpu = on_gpu(c0);
  Tensor c_cpu = c.beta != 0.0 ? rounded(c0, ref) : Tensor::zeros({buf.size_c}, ref);

  Tensor a_cpu = rounded(a, ref), b_cpu = rounded(b, ref), a_gpu = on_gpu(a), b_gpu = on_gpu(b);
  GemmArgs cpu = buf.g;
  cpu.dtype = ref;
  cpu.a = a_cpu.raw_data();
  cpu.b = b_cpu.raw_data();
  cpu.c = c_cpu.raw_data();
  kernel::gemm_kernel(kCpu, cpu, kCpu);
  GemmArgs gpu = buf.g;
  gpu.dtype = c.dtype;
  gpu.a = a_gpu.raw_data();
  gpu.b = b_gpu.raw_data();
  gpu.c = c_gpu.raw_data();
  kernel::gemm_kernel(kGpu, gpu, kGpu);

  std::vector<double> got = c_gpu.to_doubles(), want = c_cpu.to_doubles(), before = c0.to_doubles();
  int failures = 0;
  for (int64_t i = 0; i < buf.size_c && failures < 5; ++i) {
    const int64_t entry = i / buf.g.stride_c, within = i % buf.g.stride_c;
    const int64_t row = within / buf.g.ldc, col = within % buf.g.ldc;
    const bool in_c = entry < c.batch && row < c.m && col < c.n;
    const size_t u = static_cast<size_t>(i);
    if (in_c && !close(got[u], want[u], rtol(c.dtype))) {
      ++failures;
      ADD_FAILURE() << what << ": C[" << entry << "][" << row << "][" << col << "] is " << got[u] << " on CUDA, "
                    << want[u] << " on the CPU";
    } else if (!in_c && !same(got[u], before[u])) {
      ++failures;
      ADD_FAILURE() << what << ": padding element " << i << " was overwritten with " << got[u];
    }
  }
}

TEST_F(CudaGemm, EveryTransposeBatchStrideAndBetaMatchesTheCpu) {
  struct Size {
    int64_t m, n, k, batch;
  };
  const Size sizes[] = {{1, 1, 1, 1}, {5, 7, 3, 3}, {33, 17, 65, 2}, {131, 67, 97, 4}};
  for (DType dtype : kFloatTypes) {
    for (int trans = 0; trans < 4; ++trans) {
      for (const Size& s : sizes) {
        for (int sharing = 0; sharing < 3; ++sharing) {  // neither, A, B reused across the batch
          for (double beta : {0.0, 0.5}) {
            Case c;
            c.dtype = dtype;
            c.trans_a = trans & 1;
            c.trans_b = trans & 2;
            c.m = s.m;
            c.n = s.n;
            c.k = s.k;
            c.batch = s.batch;
            c.shared_a = sharing == 1;
            c.shared_b = sharing == 2;
            c.alpha = 0.75;
            c.beta = beta;
            check_case(c, gen_);
          }
        }
      }
    }
  }
}

TEST_F(CudaGemm, LargeSquareProductsMatchTheCpu) {
  for (DType dtype : kFloatTypes) {
    for (bool trans_b : {false, true}) {
      Case c;
      c.dtype = dtype;
      c.trans_b = trans_b;
      c.m = 257;
      c.n = 383;
      c.k = 511;
      c.beta = 1.0;
      check_case(c, gen_);
    }
  }
}

// stride_c = 0: every batch entry accumulates into the one C, in order, as the CPU's loop does.
TEST_F(CudaGemm, SharedOutputAccumulatesEveryBatchEntry) {
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    const int64_t m = 9, n = 11, k = 13, batch = 3;
    Tensor a = Tensor::randn({batch, m, k}, gen_, dtype, 0.3), b = Tensor::randn({batch, k, n}, gen_, dtype, 0.3);
    Tensor c0 = Tensor::randn({m, n}, gen_, dtype);
    Tensor a_cpu = rounded(a, ref), b_cpu = rounded(b, ref), c_cpu = rounded(c0, ref);
    Tensor a_gpu = on_gpu(a), b_gpu = on_gpu(b), c_gpu = on_gpu(c0);
    GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = k;
    g.ldb = n;
    g.ldc = n;
    g.stride_a = m * k;
    g.stride_b = k * n;
    g.stride_c = 0;
    g.batch = batch;
    g.beta = 1.0;
    GemmArgs cpu = g, gpu = g;
    cpu.dtype = ref;
    cpu.a = a_cpu.raw_data();
    cpu.b = b_cpu.raw_data();
    cpu.c = c_cpu.raw_data();
    kernel::gemm_kernel(kCpu, cpu, kCpu);
    gpu.dtype = dtype;
    gpu.a = a_gpu.raw_data();
    gpu.b = b_gpu.raw_data();
    gpu.c = c_gpu.raw_data();
    kernel::gemm_kernel(kGpu, gpu, kGpu);
    // The sum of three products: check it is not just the last one.
    expect_close(c_gpu, c_cpu, rtol(dtype), std::string("stride_c = 0 ") + dtype_name(dtype));
  }
}

// k = 0: the product is empty, so C = β C; β = 0 writes zeros over NaN without reading them.
TEST_F(CudaGemm, EmptyInnerDimensionScalesC) {
  for (DType dtype : kFloatTypes) {
    for (double beta : {0.0, 0.5}) {
      const int64_t m = 3, n = 5, batch = 2;
      Tensor c0 = beta == 0.0 ? Tensor::full({batch, m, n}, kNaN, dtype) : Tensor::randn({batch, m, n}, gen_, dtype);
      Tensor c_gpu = on_gpu(c0);
      Tensor dummy = Tensor::zeros({1}, dtype, kGpu);
      GemmArgs g;
      g.dtype = dtype;
      g.m = m;
      g.n = n;
      g.k = 0;
      g.a = dummy.raw_data();
      g.b = dummy.raw_data();
      g.c = c_gpu.raw_data();
      g.lda = 1;
      g.ldb = n;
      g.ldc = n;
      g.stride_c = m * n;
      g.batch = batch;
      g.beta = beta;
      kernel::gemm_kernel(kGpu, g, kGpu);
      std::vector<double> got = c_gpu.to_doubles(), before = c0.to_doubles();
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = beta == 0.0 ? 0.0 : beta * before[i];
        ASSERT_TRUE(close(got[i], want, rtol(dtype)))
            << dtype_name(dtype) << " beta=" << beta << " element " << i << ": " << got[i] << ", want " << want;
      }
    }
  }
}

TEST_F(CudaGemm, IntegerTypesAreRejected) {
  Tensor x = Tensor::zeros({4}, DType::i32, kGpu);
  GemmArgs g;
  g.dtype = DType::i32;
  g.m = g.n = g.k = 2;
  g.lda = g.ldb = g.ldc = 2;
  g.a = g.b = x.raw_data();
  g.c = x.raw_data();
  EXPECT_THROW(kernel::gemm_kernel(kGpu, g, kGpu), std::invalid_argument);
}

// matmul on CUDA tensors: every path by which it lowers a product onto gemm_kernel.
TEST_F(CudaGemm, MatmulMatchesTheCpu) {
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    const double tol = rtol(dtype);
    const std::string name = dtype_name(dtype);
    auto check = [&](const Tensor& a, const Tensor& b, bool ta, bool tb, const std::string& what) {
      Tensor want = kernel::matmul(rounded(a, ref), rounded(b, ref), ta, tb);
      expect_close(kernel::matmul(on_gpu(a), on_gpu(b), ta, tb), want, tol, what + " " + name);
    };
    const double s = 0.2;
    // [2, 3, M, K] @ [K, N]: folded into one [6·M, K] @ [K, N].
    check(Tensor::randn({2, 3, 7, 19}, gen_, dtype, s), Tensor::randn({19, 5}, gen_, dtype, s), false, false,
          "batched @ matrix");
    // The same with B transposed, and with A transposed (no folding: B reused with stride 0).
    check(Tensor::randn({2, 3, 7, 19}, gen_, dtype, s), Tensor::randn({5, 19}, gen_, dtype, s), false, true,
          "batched @ matrixᵀ");
    check(Tensor::randn({2, 3, 19, 7}, gen_, dtype, s), Tensor::randn({19, 5}, gen_, dtype, s), true, false,
          "batchedᵀ @ matrix");
    // Broadcast batch dimensions: [2, 3, M, K] @ [3, N, K]ᵀ, B expanded to [2, 3, N, K].
    check(Tensor::randn({2, 3, 9, 11}, gen_, dtype, s), Tensor::randn({3, 13, 11}, gen_, dtype, s), false, true,
          "broadcast batch");
    // One A for every batch entry of B: [M, K]ᵀ @ [4, K, N].
    check(Tensor::randn({17, 6}, gen_, dtype, s), Tensor::randn({4, 17, 10}, gen_, dtype, s), true, false,
          "matrixᵀ @ batched");
    // A transposed view as input: matmul makes it contiguous first.
    Tensor t = Tensor::randn({21, 15}, gen_, dtype, s);
    Tensor want_t = kernel::matmul(kernel::transpose(rounded(t, ref), 0, 1), rounded(t, ref));
    expect_close(kernel::matmul(kernel::transpose(on_gpu(t), 0, 1), on_gpu(t)), want_t, tol, "tᵀ t view " + name);

    // `onto`: the product added in place (β = 1), the same tensor returned.
    Tensor a = Tensor::randn({3, 8, 12}, gen_, dtype, s), b = Tensor::randn({12, 14}, gen_, dtype, s);
    Tensor c = Tensor::randn({3, 8, 14}, gen_, dtype);
    // The GPU's copy first: where ref is c's own dtype, rounded(c, ref) is c itself, which the reference
    // adds onto.
    Tensor onto = on_gpu(c);
    Tensor want_onto = kernel::matmul(rounded(a, ref), rounded(b, ref), false, false, rounded(c, ref));
    Tensor got_onto = kernel::matmul(on_gpu(a), on_gpu(b), false, false, onto);
    EXPECT_EQ(got_onto.raw_data(), onto.raw_data()) << name;
    expect_close(got_onto, want_onto, tol, "onto " + name);

    // K = 0: zeros of shape [M, N]; M = 0: an empty result.
    Tensor zero_k = kernel::matmul(Tensor::zeros({4, 0}, dtype, kGpu), Tensor::zeros({0, 6}, dtype, kGpu));
    expect_close(zero_k, Tensor::zeros({4, 6}, ref), tol, "k = 0 " + name);
    Tensor empty = kernel::matmul(Tensor::zeros({0, 3}, dtype, kGpu), Tensor::zeros({3, 6}, dtype, kGpu));
    EXPECT_EQ(empty.shape(), (Shape{0, 6})) << name;
  }
}

// linear_kernel: one cuBLASLt call whose epilogue adds the bias (f32, bf16) and applies GELU (bf16, out a
// multiple of 8); the unfused steps otherwise (no bias without GELU, f64, GELU in f32, and out = 20 with
// GELU, where the epilogue's GELU input cannot have its leading dimension). Outputs start as NaN; the
// reference is the CPU slot on the same values.
TEST_F(CudaGemm, LinearWithBiasAndGeluMatchesTheCpu) {
  using kernel::Activation;
  struct Shape3 {
    int64_t rows, in, out;
  };
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    for (Activation act : {Activation::none, Activation::gelu}) {
      for (Shape3 s : {Shape3{37, 48, 64}, Shape3{5, 24, 20}, Shape3{130, 96, 256}}) {
        for (bool with_bias : {true, false}) {
          const bool gelu = act == Activation::gelu;
          const std::string what = std::string("linear") + (gelu ? "+gelu " : " ") + dtype_name(dtype) +
                                   " rows=" + std::to_string(s.rows) + " in=" + std::to_string(s.in) +
                                   " out=" + std::to_string(s.out) + (with_bias ? " with bias" : " without bias");
          const double scale = 1.0 / std::sqrt(static_cast<double>(s.in));
          Tensor x = Tensor::randn({s.rows, s.in}, gen_, dtype), w = Tensor::randn({s.out, s.in}, gen_, dtype, scale);
          Tensor b = with_bias ? Tensor::randn({s.out}, gen_, dtype, 0.5) : Tensor();
          Tensor y = testing::poisoned({s.rows, s.out}, dtype);
          Tensor pre = gelu ? testing::poisoned({s.rows, s.out}, dtype) : Tensor();
          kernel::linear_kernel(kGpu, on_gpu(x), on_gpu(w), testing::on_gpu(b), act, pre, y);
          Tensor want_y = Tensor::empty({s.rows, s.out}, ref);
          Tensor want_pre = gelu ? Tensor::empty({s.rows, s.out}, ref) : Tensor();
          kernel::linear_kernel(kCpu, rounded(x, ref), rounded(w, ref), testing::as_reference(b), act, want_pre,
                                want_y);
          expect_close(y, want_y, rtol(dtype), what + " y");
          if (gelu) expect_close(pre, want_pre, rtol(dtype), what + " pre");
        }
      }
    }
  }
}

}  // namespace
}  // namespace seqlab
