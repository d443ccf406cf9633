// The causal-convolution cases shared by the two checks of the CUDA conv1d kernels — the GPU test
// (tests/conv1d_gpu_test.cc, the slots of src/cuda/ssm/conv1d.cu) and the emulation test
// (tests/conv1d_emulation_test.cc, src/cuda/ssm/conv1d_kernels.cuh run on the CPU). Each program runs the
// forward and the backward of each case on inputs ~ N(0, 1) drawn in the dtype under test (taps 0.5·N).
#pragma once

#include <cstdint>
#include <string>

#include "layers/ssm/conv1d.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// x [B, T, C], weight [W, C], bias [C] and initial_state [B, W−1, C] when asked for, y = silu(z) or z.
struct Conv1dCase {
  int64_t B, T, C, W;
  bool bias, h0, silu;
};
inline const Conv1dCase kConv1dCases[] = {
    {2, 7, 5, 4, true, true, true},     // odd T and C, the widest kernel, every input
    {2, 7, 5, 4, false, false, false},  // zeros before x_0, no bias, no activation
    {1, 2, 3, 4, true, true, true},     // T < W − 1: the final state reaches into the initial state
    {3, 1, 6, 3, false, true, true},    // one decode step
    {2, 5, 3, 2, true, false, false},   // W = 2, a bias and no state
    {1, 4, 7, 1, true, true, true},     // W = 1: no state
    {2, 41, 129, 4, true, true, true},  // 10578 outputs: more than one stride of the emulation's grid
};

inline std::string conv1d_name(DType dtype, const Conv1dCase& c) {
  return std::string("causal_conv1d ") + dtype_name(dtype) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) +
         " C" + std::to_string(c.C) + " W" + std::to_string(c.W) + (c.bias ? " bias" : "") + (c.h0 ? " h0" : "") +
         (c.silu ? " silu" : "");
}

// The inputs of one case and the cotangents of its two outputs.
struct Conv1dData {
  Tensor x, weight, bias, h0, dy, dfinal;
};
inline Conv1dData make_conv1d_data(const Conv1dCase& c, DType dtype, Generator& gen) {
  Conv1dData d;
  d.x = Tensor::randn({c.B, c.T, c.C}, gen, dtype);
  d.weight = Tensor::randn({c.W, c.C}, gen, dtype, 0.5);
  if (c.bias) d.bias = Tensor::randn({c.C}, gen, dtype);
  if (c.h0) d.h0 = Tensor::randn({c.B, c.W - 1, c.C}, gen, dtype);
  d.dy = Tensor::randn({c.B, c.T, c.C}, gen, dtype);
  d.dfinal = Tensor::randn({c.B, c.W - 1, c.C}, gen, dtype);
  return d;
}

}  // namespace seqlab::testing
