// Kernel slots of the Mamba selective scan (the op: src/layers/ssm/selective_scan.h; CPU kernels in
// src/layers/ssm/selective_scan.cpp, CUDA kernels in src/cuda/ssm/selective_scan.cu).
//
//   u, delta, z [B, T, D],  A [D, N],  B, C [B, T, N],  D, delta_bias [D],
//   initial_state, final_state [B, D, N],  y [B, T, D],  checkpoints [B, ⌈T/chunk⌉, D, N]
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class SelectiveScanForm { chunked, recurrent };

namespace kernel {

// Options as the kernels receive them (chunk ≥ 1, at most max(T, 1)).
struct SelectiveScanParams {
  SelectiveScanForm form = SelectiveScanForm::chunked;
  int64_t chunk = 64;
  bool delta_softplus = true;
};

// The op's inputs, contiguous, one dtype; D, z, delta_bias, initial_state may be undefined.
struct SelectiveScanInputs {
  Tensor u, delta, A, B, C, D, z, delta_bias, initial_state;
};
inline auto tensor_fields(SelectiveScanInputs& s) {  // see tensor/dispatch.h
  return std::tie(s.u, s.delta, s.A, s.B, s.C, s.D, s.z, s.delta_bias, s.initial_state);
}

struct SelectiveScanGrads {
  Tensor du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(SelectiveScanGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.du, g.ddelta, g.dA, g.dB, g.dC, g.dD, g.dz, g.ddelta_bias, g.dinitial_state);
}

// The forward writes every element of y and final_state and, when `checkpoints` is defined (the chunked
// form), the state entering every chunk: checkpoints[b, c] = h_{c·chunk − 1} (h_{−1} = initial state).
// The backward reads dy and dfinal (zero-filled when unused) and the checkpoints when defined (else it
// recomputes them), and writes every element of du, ddelta, dA, dB, dC (always defined) and of dD, dz,
// ddelta_bias, dinitial_state where defined.
SEQLAB_DECLARE_KERNEL(selective_scan_forward_kernel,
                      void (*)(const SelectiveScanInputs& in, const SelectiveScanParams& p, const Tensor& y,
                               const Tensor& final_state, const Tensor& checkpoints));
SEQLAB_DECLARE_KERNEL(selective_scan_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& dfinal, const SelectiveScanInputs& in,
                               const Tensor& checkpoints, const SelectiveScanParams& p,
                               const SelectiveScanGrads& grads));

}  // namespace kernel
}  // namespace seqlab
