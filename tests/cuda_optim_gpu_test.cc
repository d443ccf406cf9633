// CUDA against CPU for the optimizer slots (src/cuda/optim.cu against src/train/optim.cpp) and the
// rotary-embedding slot (src/cuda/rope.cu against src/layers/rope.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random inputs in the dtype under test, runs the CPU slot on one copy and the
// CUDA slot on another, and compares every element. The in-place kernels (AdamW, SGD, scale) are
// checked on every tensor they write (p, m, v, the momentum buffer); rope's output is first filled
// with NaN, so an element the kernel fails to write shows up. Sizes are odd and straddle the block
// size, the sum's per-block chunk and its single final block (more than 256 partials). Tolerance:
// |got − want| ≤ rtol · max(|want|, 1) with rtol 1e-5 for f32, 1e-10 for f64 and 1e-2 for bf16.
// Inputs come from a fixed seed; --gtest_shuffle (or --gtest_random_seed=N) draws others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/rope.h"
#include "tensor/kernels.h"
#include "train/optim.h"

namespace seqlab {
namespace {

using testing::kGpu;
using testing::kCpu;
using testing::kFloatTypes;
// Empty, one element, around the 256-thread block, and large enough for many blocks of each grid.
const int64_t kSizes[] = {0, 1, 255, 257, 4099, 100003};

double rtol(DType d) { return testing::gpu_rtol(d); }
DType state_type(DType param) { return param == DType::f64 ? DType::f64 : DType::f32; }
std::string size_name(int64_t n, DType d) { return std::string(dtype_name(d)) + " n=" + std::to_string(n); }

using testing::on_gpu;
Tensor on_cpu_copy(const Tensor& x) { return kernel::clone(x); }

using testing::expect_close;

class CudaOptimVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 29};
};

TEST_F(CudaOptimVsCpu, AdamWStep) {
  for (DType dtype : kFloatTypes) {
    const DType sdt = state_type(dtype);
    for (int64_t n : kSizes) {
      for (int t : {1, 7}) {
        AdamWStep s;
        s.lr = 1e-2;
        s.weight_decay = t == 1 ? 0.0 : 0.1;
        s.beta1 = 0.9;
        s.beta2 = 0.95;
        s.eps = 1e-8;
        s.bias_correction1 = 1.0 - std::pow(s.beta1, t);
        s.bias_correction2 = 1.0 - std::pow(s.beta2, t);
        const std::string what = "adamw " + size_name(n, dtype) + " t=" + std::to_string(t);
        Tensor p = Tensor::randn({n}, gen_, dtype);
        Tensor g = Tensor::randn({n}, gen_, dtype, 0.5);
        Tensor m = Tensor::randn({n}, gen_, sdt, 0.1);
        Tensor v = Tensor::rand({n}, gen_, sdt, 0.01, 1.0);
        // bf16 parameters carry an f32 master (mixed precision), p = bf16(master).
        Tensor w = dtype == DType::bf16 ? Tensor::randn({n}, gen_, DType::f32) : Tensor();
        if (w.defined()) p = kernel::to_dtype(w, DType::bf16);
        // Beside a master, the gradient may also be an f32 sum of micro-batch gradients.
        if (w.defined() && t == 7) g = Tensor::randn({n}, gen_, DType::f32, 0.5);
        Tensor pg = on_gpu(p), gg = on_gpu(g), mg = on_gpu(m), vg = on_gpu(v), wg = w.defined() ? on_gpu(w) : w;
        adamw_step_kernel(kGpu, s, pg, gg, mg, vg, wg);
        Tensor pc = on_cpu_copy(p), mc = on_cpu_copy(m), vc = on_cpu_copy(v), wc = w.defined() ? on_cpu_copy(w) : w;
        adamw_step_kernel(kCpu, s, pc, g, mc, vc, wc);
        expect_close(pg, pc, rtol(dtype), what + " p");
        if (w.defined()) expect_close(wg, wc, rtol(DType::f32), what + " master");
        expect_close(mg, mc, rtol(sdt), what + " m");
        expect_close(vg, vc, rtol(sdt), what + " v");
        expect_close(gg, g, 0.0, what + " g (read only)");
      }
    }
  }
}

TEST_F(CudaOptimVsCpu, SgdStepPlainMomentumAndNesterov) {
  struct Case {
    double momentum;
    bool nesterov;
  };
  for (DType dtype : kFloatTypes) {
    const DType sdt = state_type(dtype);
    for (int64_t n : kSizes) {
      for (Case c : {Case{0.0, false}, Case{0.9, false}, Case{0.9, true}}) {
        SgdStep s;
        s.lr = 5e-2;
        s.weight_decay = 0.01;
        s.momentum = c.momentum;
        s.nesterov = c.nesterov;
        const std::string what =
            "sgd " + size_name(n, dtype) + " momentum=" + std::to_string(c.momentum) + (c.nesterov ? " nesterov" : "");
        Tensor p = Tensor::randn({n}, gen_, dtype);
        Tensor g = Tensor::randn({n}, gen_, dtype);
        Tensor b = c.momentum > 0 ? Tensor::randn({n}, gen_, sdt) : Tensor();
        Tensor w = dtype == DType::bf16 ? Tensor::randn({n}, gen_, DType::f32) : Tensor();
        if (w.defined()) p = kernel::to_dtype(w, DType::bf16);
        Tensor pg = on_gpu(p), gg = on_gpu(g), bg = b.defined() ? on_gpu(b) : Tensor();
        Tensor wg = w.defined() ? on_gpu(w) : w;
        sgd_step_kernel(kGpu, s, pg, gg, bg, wg);
        Tensor pc = on_cpu_copy(p), bc = b.defined() ? on_cpu_copy(b) : Tensor();
        Tensor wc = w.defined() ? on_cpu_copy(w) : w;
        sgd_step_kernel(kCpu, s, pc, g, bc, wc);
        expect_close(pg, pc, rtol(dtype), what + " p");
        if (w.defined()) expect_close(wg, wc, rtol(DType::f32), what + " master");
        if (b.defined()) expect_close(bg, bc, rtol(sdt), what + " momentum buffer");
      }
    }
  }
}

TEST_F(CudaOptimVsCpu, SumSquaresMatchesCpuAndIsDeterministic) {
  for (DType dtype : kFloatTypes) {
    // 3000017 elements give more than 256 per-block partials for the final block to reduce.
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{8193}, int64_t{100003}, int64_t{3000017}}) {
      const std::string what = "sum_squares " + size_name(n, dtype);
      Tensor x = Tensor::randn({n}, gen_, dtype, 1.5);
      Tensor xg = on_gpu(x);
      const double want = sum_squares_kernel(kCpu, x);
      const double got = sum_squares_kernel(kGpu, xg);
      // Summed in double from the same values: only the order differs.
      EXPECT_NEAR(got, want, 1e-10 * std::max(std::fabs(want), 1.0)) << what;
      if (n == 0) {
        EXPECT_EQ(got, 0.0) << what;
      }
      for (int run = 0; run < 3; ++run) {
        const double again = sum_squares_kernel(kGpu, xg);
        EXPECT_EQ(std::memcmp(&again, &got, sizeof(double)), 0)
            << what << ": run " << run << " gave " << again << ", the first " << got;
      }
    }
  }
}

TEST_F(CudaOptimVsCpu, SumSquaresOfNonFiniteIsNonFinite) {
  Tensor x = Tensor::randn({1000}, gen_, DType::f32);
  std::vector<double> values = x.to_doubles();
  values[517] = std::numeric_limits<double>::infinity();
  const double got = sum_squares_kernel(kGpu, on_gpu(Tensor::from_vector(values, {1000}, DType::f32)));
  EXPECT_TRUE(std::isinf(got)) << got;
}

TEST_F(CudaOptimVsCpu, ScaleInplace) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      for (double k : {0.37, -2.5}) {
        const std::string what = "scale " + size_name(n, dtype) + " by " + std::to_string(k);
        Tensor x = Tensor::randn({n}, gen_, dtype);
        Tensor xg = on_gpu(x);
        scale_inplace_kernel(kGpu, xg, k);
        Tensor xc = on_cpu_copy(x);
        scale_inplace_kernel(kCpu, xc, k);
        expect_close(xg, xc, rtol(dtype), what);
      }
    }
  }
}

TEST_F(CudaOptimVsCpu, RopeForwardAndInverse) {
  struct Case {
    Shape shape;
    double base;
    int64_t start;
  };
  const Case cases[] = {
      {{2, 7, 3, 10}, 10000.0, 0},        // odd T and H, D/2 odd
      {{1, 33, 5, 64}, 10000.0, 123457},  // far positions: the angle must be formed in double
      {{3, 1, 1, 2}, 500.0, 9},           // one pair per head
      {{2, 129, 4, 34}, 10000.0, 17},     // pairs not a multiple of the block
      {{0, 5, 2, 8}, 10000.0, 0},         // empty
  };
  for (DType dtype : kFloatTypes) {  // bf16: computed in f32 on both sides, rounded on store
    for (const Case& c : cases) {
      for (bool inverse : {false, true}) {
        RopeOptions opts;
        opts.base = c.base;
        opts.start = c.start;
        const std::string what = std::string("rope ") + dtype_name(dtype) + " " + shape_str(c.shape) +
                                 " start=" + std::to_string(c.start) + (inverse ? " inverse" : "");
        Tensor x = Tensor::randn(c.shape, gen_, dtype);
        Tensor want = Tensor::empty(c.shape, dtype, kCpu);
        if (want.numel() > 0) kernel::rope_kernel(kCpu, x, opts, inverse, want);
        Tensor got = Tensor::full(c.shape, std::numeric_limits<double>::quiet_NaN(), dtype, kGpu);
        kernel::rope_kernel(kGpu, on_gpu(x), opts, inverse, got);
        expect_close(got, want, rtol(dtype), what);
        // The raw entry point (which allocates y itself) and the inverse undoing the forward.
        expect_close(kernel::rope_rotate(on_gpu(x), opts, inverse), want, rtol(dtype), what + " via rope_rotate");
        Tensor back = kernel::rope_rotate(kernel::rope_rotate(on_gpu(x), opts, inverse), opts, !inverse);
        expect_close(back, x, rtol(dtype) * 10, what + " then its inverse");
      }
    }
  }
}

}  // namespace
}  // namespace seqlab
