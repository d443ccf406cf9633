// Helpers shared by the GPU tests (tests/cuda_*_gpu_test.cc): the device, the tolerance by dtype, the
// reference dtype for bf16, copies to the GPU and to the reference dtype, outputs poisoned before a
// kernel runs, the element-by-element comparison with the CPU, and the skip where no GPU is usable.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

inline const Device kGpu = cuda_device(0);
inline const Device kCpu = cpu_device();
// Every floating dtype the CUDA kernels take.
inline const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16};

// |got − want| ≤ rtol · max(|want|, 1): 1e-5 for f32, 1e-10 for f64, 1e-2 for bf16 (its stored rounding).
inline double gpu_rtol(DType d) { return d == DType::bf16 ? 1e-2 : d == DType::f64 ? 1e-10 : 1e-5; }
// The fused ops (attention, the recurrent variants) sum in another order on the GPU than on the CPU:
// 1e-4 for f32, 1e-10 for f64, 2e-2 for bf16.
inline double fused_op_rtol(DType d) { return d == DType::bf16 ? 2e-2 : d == DType::f64 ? 1e-10 : 1e-4; }
// A test program's seed: its own salt (so that programs draw different inputs), plus N when the program
// runs with --gtest_random_seed=N. Without that flag the inputs are the same on every run, so a failure
// can be reproduced; GoogleTest's own random_seed() would come from the clock.
inline uint64_t test_seed(uint64_t salt) {
  const int flag = GTEST_FLAG_GET(random_seed);
  return (flag == 0 ? 0 : static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed())) + salt;
}

// The CPU kernels take no bf16: references run in f32 on the same (rounded) values.
inline DType reference_type(DType d) { return d == DType::bf16 ? DType::f32 : d; }

// x on the GPU, and x in its reference dtype on its device (undefined stays undefined).
inline Tensor on_gpu(const Tensor& x) { return x.defined() ? kernel::to_device(x, kGpu) : x; }
inline Tensor as_reference(const Tensor& x) { return x.defined() ? kernel::to_dtype(x, reference_type(x.dtype())) : x; }

// got against want (the CPU's), element by element, wherever got lives: equal, both NaN, or
// |got − want| ≤ tol · max(|want|, |scale|, 1), where `scale` (want's shape, optional) bounds the error of
// a sum whose terms were rounded first (dx = dnorm + dsum). Two undefined tensors agree. Reports the
// first five elements that differ. The emulation tests (cuda_emulation.h) compare host results with it.
inline void expect_values_close(const Tensor& got, const Tensor& want, double tol, const std::string& what,
                                const Tensor& scale = Tensor()) {
  ASSERT_EQ(got.defined(), want.defined()) << what << ": one side is undefined";
  if (!got.defined()) return;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  const std::vector<double> s = scale.defined() ? scale.to_doubles() : std::vector<double>(w.size(), 0.0);
  ASSERT_EQ(s.size(), w.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < g.size() && failures < 5; ++i) {
    const bool ok = g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i])) ||
                    std::fabs(g[i] - w[i]) <= tol * std::max({std::fabs(w[i]), std::fabs(s[i]), 1.0});
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on CUDA, " << w[i] << " on the CPU";
    }
  }
}

// The same for got a GPU tensor.
inline void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what,
                         const Tensor& scale = Tensor()) {
  ASSERT_TRUE(!got.defined() || got.device().is_cuda()) << what;
  expect_values_close(got, want, tol, what, scale);
}

// A value no kernel should leave behind in an output: NaN, or a sentinel for integers.
inline double poison_value(DType dtype) {
  return is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : -123456789.0;
}
// An output buffer (on the GPU unless told) filled with poison_value, so an element a kernel fails to
// write shows up.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device = kGpu) {
  return Tensor::full(shape, poison_value(dtype), dtype, device);
}

// In a fixture's SetUp: GTEST_SKIP() with the reason when no GPU is usable.
#define SEQLAB_SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                            \
    if (!::seqlab::cuda_available()) {                                                            \
      GTEST_SKIP() << (::seqlab::cuda_backend() ? ::seqlab::cuda_backend()->describe()            \
                                                : std::string("this build has no CUDA backend")); \
    }                                                                                             \
  } while (0)

}  // namespace seqlab::testing
