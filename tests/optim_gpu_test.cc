// CUDA against CPU for the optimizer slots (src/cuda/optim.cu against src/train/optim/optim.cpp) and the
// rotary-embedding slot (src/cuda/attention/rope.cu against src/layers/attention/rope.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random inputs in the dtype under test, runs the CPU slot on one copy and the
// CUDA slot on another, and compares every element. The in-place kernels (AdamW, SGD, scale) are
// checked on every tensor they write (p, m, v, the momentum buffer); rope's output is first filled
// with NaN, so an element the kernel fails to write shows up. Sizes are odd and straddle the block
// size, the sum's per-block chunk and its single final block (more than 256 partials). Tolerance:
// |got − want| ≤ rtol · max(|want|, 1) with rtol 1e-5 for f32, 1e-10 for f64 and 1e-2 for bf16.
// Sizes, steps, inputs and rope cases: tests/optim_cases.h and tests/rope_cases.h, shared with the
// emulation tests (tests/{optim,rope}_cuda_emulation_test.cc). Inputs come from a fixed seed;
// --gtest_random_seed=N draws others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/attention/rope.h"
#include "optim_cases.h"
#include "rope_cases.h"
#include "tensor/kernels.h"
#include "tensor/slots/optim.h"

namespace seqlab {
namespace {

using testing::kCpu;
using testing::kFloatTypes;
using testing::kGpu;
using testing::kOptimSizes;
using testing::size_name;
using testing::state_type;

double rtol(DType d) { return testing::gpu_rtol(d); }

using testing::on_gpu;
Tensor on_cpu_copy(const Tensor& x) { return kernel::clone(x); }

using testing::expect_close;

class CudaOptimVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{testing::test_seed(29)};
};

TEST_F(CudaOptimVsCpu, AdamWStep) {
  for (DType dtype : kFloatTypes) {
    const DType sdt = state_type(dtype);
    for (int64_t n : kOptimSizes) {
      for (int t : testing::kAdamWSteps) {
        const kernel::AdamWStep s = testing::adamw_step(t);
        const std::string what = testing::adamw_name(n, dtype, t);
        // bf16 parameters carry an f32 master (mixed precision); beside it the gradient may be f32.
        const testing::AdamWInputs in = testing::adamw_inputs(n, dtype, t, gen_);
        const Tensor &p = in.p, &g = in.g, &m = in.m, &v = in.v, &w = in.w;
        Tensor pg = on_gpu(p), gg = on_gpu(g), mg = on_gpu(m), vg = on_gpu(v), wg = w.defined() ? on_gpu(w) : w;
        kernel::adamw_step_kernel(kGpu, s, pg, gg, mg, vg, wg);
        Tensor pc = on_cpu_copy(p), mc = on_cpu_copy(m), vc = on_cpu_copy(v), wc = w.defined() ? on_cpu_copy(w) : w;
        kernel::adamw_step_kernel(kCpu, s, pc, g, mc, vc, wc);
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
  for (DType dtype : kFloatTypes) {
    const DType sdt = state_type(dtype);
    for (int64_t n : kOptimSizes) {
      for (const testing::SgdCase& c : testing::kSgdCases) {
        const kernel::SgdStep s = testing::sgd_step(c);
        const std::string what = testing::sgd_name(n, dtype, c);
        const testing::SgdInputs in = testing::sgd_inputs(n, dtype, c, gen_);
        const Tensor &p = in.p, &g = in.g, &b = in.b, &w = in.w;
        Tensor pg = on_gpu(p), gg = on_gpu(g), bg = b.defined() ? on_gpu(b) : Tensor();
        Tensor wg = w.defined() ? on_gpu(w) : w;
        kernel::sgd_step_kernel(kGpu, s, pg, gg, bg, wg);
        Tensor pc = on_cpu_copy(p), bc = b.defined() ? on_cpu_copy(b) : Tensor();
        Tensor wc = w.defined() ? on_cpu_copy(w) : w;
        kernel::sgd_step_kernel(kCpu, s, pc, g, bc, wc);
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
      const double want = kernel::squared_norm(x);
      const double got = kernel::squared_norm(xg);
      // Summed in double from the same values: only the order differs.
      EXPECT_NEAR(got, want, 1e-10 * std::max(std::fabs(want), 1.0)) << what;
      if (n == 0) {
        EXPECT_EQ(got, 0.0) << what;
      }
      for (int run = 0; run < 3; ++run) {
        const double again = kernel::squared_norm(xg);
        EXPECT_EQ(std::memcmp(&again, &got, sizeof(double)), 0)
            << what << ": run " << run << " gave " << again << ", the first " << got;
      }
    }
  }
}

// Several tensors (the gradient norm's path: queued sums, one copy back): the same value as the CPU's, and
// the sum of each tensor's own squared_norm in order, bit for bit.
TEST_F(CudaOptimVsCpu, SquaredNormOfSeveralTensors) {
  std::vector<Tensor> cpu, gpu;
  for (DType dtype : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{100003}}) {
      cpu.push_back(Tensor::randn({n}, gen_, dtype));
      gpu.push_back(on_gpu(cpu.back()));
    }
  }
  double in_order = 0.0;
  for (const Tensor& t : gpu) in_order += kernel::squared_norm(t);
  const double got = kernel::squared_norm(gpu), want = kernel::squared_norm(cpu);
  EXPECT_EQ(std::memcmp(&got, &in_order, sizeof(double)), 0) << got << " against " << in_order;
  EXPECT_NEAR(got, want, 1e-10 * std::max(std::fabs(want), 1.0));
}

TEST_F(CudaOptimVsCpu, SumSquaresOfNonFiniteIsNonFinite) {
  Tensor x = Tensor::randn({1000}, gen_, DType::f32);
  std::vector<double> values = x.to_doubles();
  values[517] = std::numeric_limits<double>::infinity();
  const double got = kernel::squared_norm(on_gpu(Tensor::from_vector(values, {1000}, DType::f32)));
  EXPECT_TRUE(std::isinf(got)) << got;
}

TEST_F(CudaOptimVsCpu, ScaleInplace) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kOptimSizes) {
      for (double k : testing::kScaleFactors) {
        const std::string what = testing::scale_name(n, dtype, k);
        Tensor x = Tensor::randn({n}, gen_, dtype);
        Tensor xg = on_gpu(x);
        kernel::scale_inplace_kernel(kGpu, xg, k);
        Tensor xc = on_cpu_copy(x);
        kernel::scale_inplace_kernel(kCpu, xc, k);
        expect_close(xg, xc, rtol(dtype), what);
      }
    }
  }
}

TEST_F(CudaOptimVsCpu, RopeForwardAndInverse) {
  // The shared cases, and an empty one.
  std::vector<testing::RopeCase> cases(std::begin(testing::kRopeCases), std::end(testing::kRopeCases));
  cases.push_back({{0, 5, 2, 8}, 10000.0, 0});
  for (DType dtype : kFloatTypes) {  // bf16: computed in f32 on both sides, rounded on store
    for (const testing::RopeCase& c : cases) {
      for (bool inverse : {false, true}) {
        const RopeOptions opts = testing::rope_options(c);
        const std::string what = testing::rope_name(dtype, c, inverse);
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
