// Kernel slots of the causal depthwise convolution (the op: src/layers/ssm/conv1d.h; CPU kernels in
// src/layers/ssm/conv1d.cpp, CUDA kernels in src/cuda/ssm/conv1d.cu).
//
//   x, y [B, T, C],  weight [W, C],  bias [C],  initial_state, final_state [B, W−1, C],  1 ≤ W ≤ 4
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

// The widest convolution the op takes. Short convolutions are 2 to 4 taps in every model that uses
// them (Mamba, Mamba-2, DeltaNet, H3); the CUDA kernels keep a thread's W taps in registers, sized by
// this bound, and a wide convolution wants another algorithm (a GEMM or an FFT over time), not this op.
constexpr int64_t kMaxConv1dWidth = 4;

namespace kernel {

struct Conv1dGrads {
  Tensor dx, dweight, dbias, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(Conv1dGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.dx, g.dweight, g.dbias, g.dinitial_state);
}

// All tensors contiguous, one dtype, shapes as above; bias and initial_state may be undefined (zeros).
// The forward writes every element of y and of final_state (when W > 1). The backward reads dy and
// dfinal (zero-filled when unused) besides the inputs, and writes every element of each defined
// gradient (dinitial_state only when initial_state is given).
SEQLAB_DECLARE_KERNEL(conv1d_forward_kernel,
                      void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                               bool silu, const Tensor& y, const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(conv1d_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight,
                               const Tensor& bias, const Tensor& initial_state, bool silu, const Conv1dGrads& grads));

}  // namespace kernel
}  // namespace seqlab
