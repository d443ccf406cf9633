// The cases and CPU references shared by the two checks of the CUDA relative position bias kernels — the GPU
// test (tests/relative_position_bias_gpu_test.cc, the slots of src/cuda/attention/relative_position_bias.cu) and
// the emulation test (tests/relative_position_bias_emulation_test.cc, relative_position_bias_kernels.cuh run on
// the CPU) — so that both draw the table and dbias the same way and compare with the same reference.
//
// The references run the CPU slots in reference_type (f32 for bf16, which the CPU kernels do not take) on
// the values as the dtype under test holds them.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/kernels.h"
#include "tensor/slots/attention/relative_position_bias.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// A table [num_buckets, H] spread over a T × S bias [1, H, T, S].
struct RelativePositionCase {
  int64_t T, S, H;
  bool bidirectional;
  int64_t num_buckets, max_distance;

  kernel::RelativePositionParams params() const { return {bidirectional, num_buckets, max_distance, T, S}; }
  Shape table_shape() const { return {num_buckets, H}; }
  Shape bias_shape() const { return {1, H, T, S}; }
  std::string name() const {
    return "T=" + std::to_string(T) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
           (bidirectional ? " bidirectional" : " causal") + " num_buckets=" + std::to_string(num_buckets) +
           " max_distance=" + std::to_string(max_distance);
  }
};

// table ~ N(0, 1) [NB, H] and dbias ~ N(0, 1) [1, H, T, S] in the dtype under test, drawn in this order.
struct RelativePositionInputs {
  Tensor table, dbias;
};
inline RelativePositionInputs relative_position_inputs(const RelativePositionCase& c, DType dtype, Generator& gen) {
  return {Tensor::randn(c.table_shape(), gen, dtype), Tensor::randn(c.bias_shape(), gen, dtype)};
}

// The CPU's bias and dtable, in reference_type.
inline Tensor relative_position_forward_reference(const RelativePositionCase& c, const Tensor& table) {
  Tensor bias = Tensor::empty(c.bias_shape(), reference_type(table.dtype()));
  kernel::relative_position_bias_forward_kernel(kCpu, as_reference(table), c.params(), bias);
  return bias;
}
inline Tensor relative_position_backward_reference(const RelativePositionCase& c, const Tensor& dbias) {
  Tensor dtable = Tensor::empty(c.table_shape(), reference_type(dbias.dtype()));
  kernel::relative_position_bias_backward_kernel(kCpu, as_reference(dbias), c.params(), dtable);
  return dtable;
}

// Σ |dbias| over the elements that each dtable entry sums (the scale of its rounding error), by the CPU
// backward of |dbias| in f64.
inline Tensor relative_position_error_scale(const RelativePositionCase& c, const Tensor& dbias) {
  std::vector<double> magnitude = dbias.to_doubles();
  for (double& x : magnitude) x = std::fabs(x);
  Tensor dtable = Tensor::empty(c.table_shape(), DType::f64);
  kernel::relative_position_bias_backward_kernel(kCpu, Tensor::from_vector(magnitude, c.bias_shape(), DType::f64),
                                                 c.params(), dtable);
  return dtable;
}

}  // namespace seqlab::testing
