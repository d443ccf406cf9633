// Kernel slots of gated linear attention (the op: src/layers/scan/gla.h; CPU kernels in
// src/layers/scan/gla.cpp, CUDA kernels in src/cuda/scan/gla.cu).
//
//   q, k, g [B, T, H, dk],  v, gv [B, T, H, dv],  initial_state, final_state [B, H, dk, dv],  o [B, T, H, dv]
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class GlaForm { chunkwise, recurrent };

namespace kernel {

// Options with the scale resolved (> 0), as the kernels receive them.
struct GlaParams {
  GlaForm form = GlaForm::chunkwise;
  int64_t chunk = 64, sub_chunk = 16;
  double scale = 1;
};

struct GlaGrads {
  Tensor dq, dk, dv, dg, dgv, dinitial_state;  // undefined where not asked for
};
inline auto tensor_fields(GlaGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.dq, g.dk, g.dv, g.dg, g.dgv, g.dinitial_state);
}

// All tensors contiguous, one dtype, shapes as above; gv, initial_state may be undefined.
// The forward writes every element of o and final_state. The backward reads dout and dfinal
// (zero-filled when unused) besides the inputs, and writes every element of dq, dk, dv (always
// defined), and of dg, dgv, dinitial_state where defined.
SEQLAB_DECLARE_KERNEL(gla_forward_kernel,
                      void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& gv,
                               const Tensor& initial_state, const GlaParams& p, const Tensor& o,
                               const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(gla_backward_kernel,
                      void (*)(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& g, const Tensor& gv, const Tensor& initial_state,
                               const GlaParams& p, const GlaGrads& grads));

}  // namespace kernel
}  // namespace seqlab
