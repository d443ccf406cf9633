// Helpers shared by the GPU tests (tests/cuda_*_gpu_test.cc): the device, the tolerance by dtype, the
// reference dtype for bf16, outputs poisoned before a kernel runs, and the skip where no GPU is usable.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

inline const Device kGpu = cuda_device(0);

// |got − want| ≤ rtol · max(|want|, 1): 1e-5 for f32, 1e-10 for f64, 1e-2 for bf16 (its stored rounding).
inline double gpu_rtol(DType d) { return d == DType::bf16 ? 1e-2 : d == DType::f64 ? 1e-10 : 1e-5; }
// The CPU kernels take no bf16: references run in f32 on the same (rounded) values.
inline DType reference_type(DType d) { return d == DType::bf16 ? DType::f32 : d; }

// An output buffer on the GPU whose every element is a value no kernel should leave behind (NaN, or a
// sentinel for integers), so an element a kernel fails to write shows up.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  return Tensor::full(shape, is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : -123456789.0, dtype,
                      kGpu);
}

// In a fixture's SetUp: GTEST_SKIP() with the reason when no GPU is usable.
#define SEQLAB_SKIP_WITHOUT_GPU()                                                                                 \
  do {                                                                                                            \
    if (!::seqlab::cuda_available()) {                                                                            \
      GTEST_SKIP() << (::seqlab::cuda_backend() ? ::seqlab::cuda_backend()->describe()                            \
                                                : std::string("this build has no CUDA backend"));                 \
    }                                                                                                             \
  } while (0)

}  // namespace seqlab::testing
