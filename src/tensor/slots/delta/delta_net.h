// Kernel slots of DeltaNet and Gated DeltaNet (the op: src/layers/delta/delta_net.h; CPU kernels in
// src/layers/delta/delta_net.cpp, CUDA kernels in src/cuda/delta/delta_net.cu).
//
//   q, k [B, T, H, dk],  v [B, T, H, dv],  beta, g [B, T, H],  initial_state, final_state [B, H, dk, dv]
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class DeltaNetForm { chunkwise, recurrent };

namespace kernel {

// Options with the scale resolved (> 0) and the chunk validated, as the kernels receive them.
struct DeltaNetParams {
  DeltaNetForm form = DeltaNetForm::chunkwise;
  int64_t chunk = 64;
  double scale = 1;
};

struct DeltaNetGrads {
  Tensor dq, dk, dv, dbeta;   // always defined by the entry point
  Tensor dg, dinitial_state;  // defined when the input is
};
inline auto tensor_fields(DeltaNetGrads& g) {  // see tensor/dispatch.h
  return std::tie(g.dq, g.dk, g.dv, g.dbeta, g.dg, g.dinitial_state);
}

// All tensors contiguous, one dtype, shapes as above; g and initial_state may be undefined.
// The forward writes every element of o and final_state. The backward reads dout [B, T, H, dv] and
// dfinal [B, H, dk, dv] (zeros when unused) and writes every element of each defined gradient.
SEQLAB_DECLARE_KERNEL(delta_net_forward_kernel,
                      void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& g,
                               const Tensor& initial_state, const DeltaNetParams& p, const Tensor& o,
                               const Tensor& final_state));
SEQLAB_DECLARE_KERNEL(delta_net_backward_kernel,
                      void (*)(const Tensor& dout, const Tensor& dfinal, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& beta, const Tensor& g, const Tensor& initial_state,
                               const DeltaNetParams& p, const DeltaNetGrads& grads));

}  // namespace kernel
}  // namespace seqlab
