// Kernel slots of Mamba-2's state space duality op, SSD (the op: src/layers/ssm/ssd.h; CPU kernels in
// src/layers/ssm/ssd.cpp, CUDA kernels in src/cuda/ssm/ssd.cu).
//
//   x [B, T, H, P],  dt [B, T, H],  A [H],  Bm, Cm [B, T, G, N],  D [H],
//   initial_state, final_state [B, H, P, N],  y [B, T, H, P]
//   (Bm, Cm: the op's inputs B and C, renamed where B is also the batch size)
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class SsdForm { chunkwise, recurrent };

namespace kernel {

// Options as the kernels receive them: chunk in 1 … T.
struct SsdParams {
  SsdForm form = SsdForm::chunkwise;
  int64_t chunk = 64;
};

struct SsdGrads {
  Tensor dx, ddt, dA, dB, dC, dD, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(SsdGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.dx, g.ddt, g.dA, g.dB, g.dC, g.dD, g.dinitial_state);
}

// All tensors contiguous, one dtype, shapes as above; D and initial_state may be undefined. The
// forward writes every element of y and final_state. The backward reads dy and dfinal (zero-filled
// when unused) besides the inputs, and writes every element of dx, ddt, dA, dB, dC (always defined), and
// of dD and dinitial_state where defined.
SEQLAB_DECLARE_KERNEL(ssd_forward_kernel,
                      void (*)(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                               const Tensor& D, const Tensor& initial_state, const SsdParams& p, const Tensor& y,
                               const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(ssd_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& dt,
                               const Tensor& A, const Tensor& Bm, const Tensor& Cm, const Tensor& D,
                               const Tensor& initial_state, const SsdParams& p, const SsdGrads& grads));

}  // namespace kernel
}  // namespace seqlab
