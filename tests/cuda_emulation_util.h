// Helpers shared by the tests that run CUDA kernel source on the CPU over tests/cuda_emulation.h
// (tests/*_cuda_emulation_test.cc): the element types a kernel is instantiated for, and the check of
// an output written between guard bands. Include it first, before the kernel headers.
#pragma once

#include <string>

#include "cuda_emulation.h"
#include "cuda_test_util.h"
#include "tensor/tensor.h"

// After the emulation, which provides CUDA's built-ins and bf16 type to the host compiler.
#include "cuda/device_common.cuh"

namespace seqlab::testing {

// fn(T{}, dtype) for each element type the kernels take (f32, f64, bf16), T being the kernels' own
// (cuda::bf16_t for bf16).
template <class Fn>
void for_each_type(Fn&& fn) {
  fn(float{}, DType::f32);
  fn(double{}, DType::f64);
  fn(cuda::bf16_t{}, DType::bf16);
}

// The output's values against the reference (expect_values_close, with an optional error scale), and
// nothing written in the guard bands around it.
inline void expect_output(const GuardedOutput& got, const Tensor& want, double tol, const std::string& what,
                          const Tensor& scale = Tensor()) {
  expect_values_close(got.value(), want, tol, what, scale);
  got.expect_guards_intact(what);
}

}  // namespace seqlab::testing
