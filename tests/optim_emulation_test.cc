// The optimizer CUDA kernels (src/cuda/optim_kernels.cuh: the AdamW and SGD updates, with an f32
// master beside bf16 parameters and an f32 gradient beside a master; the two-pass sum of squares
// behind the global gradient norm; the in-place scale), run on the CPU against the CPU slots of
// src/train/optim/optim.cpp. No GPU needed: this is the check these kernels get on every build until a GPU
// runs tests/optim_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA
// thread, real barriers, an emulated GPU of one multiprocessor, so a grid-stride grid stops at 32
// blocks of 256 and the larger sizes take the loops' strides). Each launch mirrors optim.cu's
// launchers: the same early returns, grids (grid_stride_blocks, sum_squares_blocks), coefficients
// (adamw_coefficients, sgd_coefficients) and arguments. Every buffer a kernel writes sits between guard
// bands; the read-only gradient is checked unchanged.
//
// Sizes: empty, one element, around the block size, several blocks, more elements than the 32-block
// grid covers in one stride. The sum of squares also runs its final one-block pass over more than 256
// partials (a thread summing several), and its result must equal, bit for bit, the order optim.cu
// documents (per-thread strided sums, then the shared-memory tree), replayed on the host.
// Tolerance: gpu_rtol (1e-5 f32, 1e-10 f64, 1e-2 bf16); the sum 1e-10 against the CPU's. Sizes,
// steps and inputs: tests/optim_cases.h, drawn as in the GPU test.
// What this cannot check: the real compiler (nvcc contracts a·b + c into FMAs, so the GPU's bits can
// differ from the replay), the hardware's scheduling and memory system, performance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "optim_cases.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"
#include "tensor/slots/optim.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/optim_kernels.cuh"

namespace seqlab {
namespace {

namespace optim = cuda::optim;
using testing::expect_values_close;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
using testing::kOptimSizes;
using testing::size_name;
using testing::state_type;
constexpr int kSMs = emu::kMultiprocessors;

double rtol(DType d) { return testing::gpu_rtol(d); }

// A kernel's in-place operand: x's values between guard bands (undefined x: none, data() null).
class InPlace {
 public:
  explicit InPlace(const Tensor& x) {
    if (!x.defined()) return;
    buffer_ = std::make_unique<GuardedOutput>(x.shape(), x.dtype());
    std::memcpy(buffer_->value().raw_data(), x.raw_data(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype()));
  }
  template <class T>
  T* data() const {
    return buffer_ ? buffer_->data<T>() : nullptr;
  }
  // Its values against want (undefined: both), and nothing written outside.
  void expect(const Tensor& want, double tol, const std::string& what) const {
    ASSERT_EQ(buffer_ != nullptr, want.defined()) << what;
    if (!buffer_) return;
    expect_values_close(buffer_->value(), want, tol, what);
    buffer_->expect_guards_intact(what);
  }

 private:
  std::unique_ptr<GuardedOutput> buffer_;
};

// optim.cu's grid for the elementwise kernels.
dim3 elementwise_grid(int64_t n) { return dim3(cuda::grid_stride_blocks(n, kSMs)); }

// optim.cu sum_squares_cuda: pass 1 into partial[0, blocks), pass 2 into partial[blocks].
template <class T>
double sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t blocks = optim::sum_squares_blocks(n);
  GuardedOutput partial({blocks}, DType::f64), out({1}, DType::f64);
  emu::launch(dim3(static_cast<unsigned>(blocks)), dim3(cuda::kThreads), 0, optim::sum_squares_partials<T>, x.data<T>(),
              n, partial.data<double>());
  emu::launch(dim3(1), dim3(cuda::kThreads), 0, optim::sum_partials, partial.data<double>(), blocks,
              out.data<double>());
  partial.expect_guards_intact("sum_squares partials");
  out.expect_guards_intact("sum_squares total");
  return out.data<double>()[0];
}

// The order optim.cu documents, on the host: thread t of a block sums elements t, t + 256, ... of its
// range; block_sum adds t + half into t for half = 128, ..., 1.
double tree_sum(std::vector<double> buf) {
  for (size_t half = buf.size() / 2; half > 0; half /= 2) {
    for (size_t t = 0; t < half; ++t) buf[t] += buf[t + half];
  }
  return buf[0];
}
double strided_tree_sum(const std::vector<double>& terms, int64_t begin, int64_t end) {
  std::vector<double> acc(cuda::kThreads, 0.0);
  for (int64_t t = 0; t < cuda::kThreads; ++t) {
    for (int64_t i = begin + t; i < end; i += cuda::kThreads) acc[t] += terms[i];
  }
  return tree_sum(acc);
}
double documented_sum_squares(const Tensor& x) {
  std::vector<double> squares = x.to_doubles();
  for (double& e : squares) e = e * e;
  const int64_t n = x.numel(), blocks = optim::sum_squares_blocks(n);
  std::vector<double> partial(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    partial[b] = strided_tree_sum(squares, b * optim::kSumChunk, std::min(n, (b + 1) * optim::kSumChunk));
  }
  return strided_tree_sum(partial, 0, blocks);
}

class OptimEmulation : public ::testing::Test {
 protected:
  Generator gen_{testing::test_seed(53)};
};

TEST_F(OptimEmulation, AdamWStep) {
  for_each_type([&](auto tag, DType dtype) {
    using P = decltype(tag);
    using S = optim::state_t<P>;
    const DType sdt = state_type(dtype);
    for (int64_t n : kOptimSizes) {
      for (int t : testing::kAdamWSteps) {
        const kernel::AdamWStep s = testing::adamw_step(t);
        const std::string what = testing::adamw_name(n, dtype, t);
        // bf16 parameters carry an f32 master (mixed precision); beside it the gradient may be f32.
        const testing::AdamWInputs in = testing::adamw_inputs(n, dtype, t, gen_);
        const Tensor &p = in.p, &g = in.g, &m = in.m, &v = in.v, &w = in.w;
        const Tensor g_before = kernel::clone(g);

        InPlace pe(p), me(m), ve(v), we(w);
        if (n > 0) {
          const optim::AdamWCoefficients<S> k = optim::adamw_coefficients<S>(s);
          const auto run = [&](auto grad) {
            using G = decltype(grad);
            emu::launch(elementwise_grid(n), dim3(cuda::kThreads), 0, optim::adamw_step_kernel_impl<P, G, S>, n, k,
                        pe.data<P>(), g.data<G>(), me.data<S>(), ve.data<S>(), we.data<S>());
          };
          if (g.dtype() == DType::f32 && dtype == DType::bf16) {
            run(float{});
          } else {
            run(P{});
          }
        }
        Tensor pc = kernel::clone(p), mc = kernel::clone(m), vc = kernel::clone(v),
               wc = w.defined() ? kernel::clone(w) : w;
        kernel::adamw_step_kernel(kCpu, s, pc, g, mc, vc, wc);
        pe.expect(pc, rtol(dtype), what + " p");
        we.expect(wc, rtol(DType::f32), what + " master");
        me.expect(mc, rtol(sdt), what + " m");
        ve.expect(vc, rtol(sdt), what + " v");
        expect_values_close(g, g_before, 0.0, what + " g (read only)");
      }
    }
  });
}

TEST_F(OptimEmulation, SgdStepPlainMomentumAndNesterov) {
  for_each_type([&](auto tag, DType dtype) {
    using P = decltype(tag);
    using S = optim::state_t<P>;
    const DType sdt = state_type(dtype);
    for (int64_t n : kOptimSizes) {
      for (const testing::SgdCase& c : testing::kSgdCases) {
        const kernel::SgdStep s = testing::sgd_step(c);
        const std::string what = testing::sgd_name(n, dtype, c);
        testing::SgdInputs in = testing::sgd_inputs(n, dtype, c, gen_);
        const Tensor &p = in.p, &b = in.b, &w = in.w;
        Tensor& g = in.g;
        // Beside a master, the momentum case with Nesterov takes an f32 gradient.
        if (w.defined() && c.nesterov) g = Tensor::randn({n}, gen_, DType::f32);
        const Tensor g_before = kernel::clone(g);

        InPlace pe(p), be(b), we(w);
        if (n > 0) {
          const optim::SgdCoefficients<S> k = optim::sgd_coefficients<S>(s);
          const auto run = [&](auto grad) {
            using G = decltype(grad);
            emu::launch(elementwise_grid(n), dim3(cuda::kThreads), 0, optim::sgd_step_kernel_impl<P, G, S>, n, k,
                        pe.data<P>(), g.data<G>(), be.data<S>(), we.data<S>());
          };
          if (g.dtype() == DType::f32 && dtype == DType::bf16) {
            run(float{});
          } else {
            run(P{});
          }
        }
        Tensor pc = kernel::clone(p), bc = b.defined() ? kernel::clone(b) : b, wc = w.defined() ? kernel::clone(w) : w;
        kernel::sgd_step_kernel(kCpu, s, pc, g, bc, wc);
        pe.expect(pc, rtol(dtype), what + " p");
        we.expect(wc, rtol(DType::f32), what + " master");
        be.expect(bc, rtol(sdt), what + " momentum buffer");
        expect_values_close(g, g_before, 0.0, what + " g (read only)");
      }
    }
  });
}

TEST_F(OptimEmulation, SumSquaresMatchesTheCpuAndTheDocumentedOrder) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    // 8193: two pass-1 blocks, the second with one element; 2100000: 257 partials, so a thread of
    // pass 2 sums two.
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{8193}, int64_t{100003}, int64_t{2100000}}) {
      const std::string what = "sum_squares " + size_name(n, dtype);
      Tensor x = Tensor::randn({n}, gen_, dtype, 1.5);
      const double got = sum_squares<T>(x);
      const double want = kernel::squared_norm(x);
      EXPECT_NEAR(got, want, 1e-10 * std::max(std::fabs(want), 1.0)) << what;
      if (n == 0) {
        EXPECT_EQ(got, 0.0) << what;
      } else {
        const double replay = documented_sum_squares(x);
        EXPECT_EQ(std::memcmp(&got, &replay, sizeof(double)), 0) << what << ": " << got << " against " << replay;
      }
    }
  });
}

// Pass 2 alone, over one partial, exactly one per thread, and several per thread.
TEST_F(OptimEmulation, SumPartialsOverMoreThanABlock) {
  for (int64_t count : {int64_t{1}, int64_t{256}, int64_t{700}}) {
    const std::vector<double> partial = Tensor::rand({count}, gen_, DType::f64, 0.0, 100.0).to_doubles();
    GuardedOutput out({1}, DType::f64);
    emu::launch(dim3(1), dim3(cuda::kThreads), 0, optim::sum_partials, partial.data(), count, out.data<double>());
    const double got = out.data<double>()[0], replay = strided_tree_sum(partial, 0, count);
    EXPECT_EQ(std::memcmp(&got, &replay, sizeof(double)), 0) << count << " partials: " << got << " against " << replay;
    double plain = 0;
    for (double p : partial) plain += p;
    EXPECT_NEAR(got, plain, 1e-12 * plain) << count << " partials";
    out.expect_guards_intact("sum_partials");
  }
}

TEST_F(OptimEmulation, SumSquaresOfNonFiniteIsNonFinite) {
  std::vector<double> values = Tensor::randn({9000}, gen_, DType::f32).to_doubles();
  values[8500] = std::numeric_limits<double>::infinity();  // in the second block
  EXPECT_TRUE(std::isinf(sum_squares<float>(Tensor::from_vector(values, {9000}, DType::f32))));
  values[8500] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_squares<float>(Tensor::from_vector(values, {9000}, DType::f32))));
}

TEST_F(OptimEmulation, ScaleInplace) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    using S = optim::state_t<T>;
    for (int64_t n : kOptimSizes) {
      for (double k : testing::kScaleFactors) {
        const std::string what = testing::scale_name(n, dtype, k);
        Tensor x = Tensor::randn({n}, gen_, dtype);
        InPlace xe(x);
        if (n > 0) {
          emu::launch(elementwise_grid(n), dim3(cuda::kThreads), 0, optim::scale_inplace_kernel_impl<T, S>, n, S(k),
                      xe.data<T>());
        }
        Tensor xc = kernel::clone(x);
        kernel::scale_inplace_kernel(kCpu, xc, k);
        xe.expect(xc, rtol(dtype), what);
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
