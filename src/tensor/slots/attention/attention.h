// Kernel slots of fused softmax attention (the op: src/layers/attention/attention.h). The CPU kernels
// live in the op's room (src/layers/attention/attention.cpp), the CUDA kernels in
// src/cuda/attention/attention.cu; both register here.
//
//   q [B, T, H, Dk],  k [B, S, Hk, Dk],  v [B, S, Hk, Dv],  o [B, T, H, Dv],  lse [B, T, H]
#pragma once

#include <cstdint>
#include <tuple>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab::kernel {

// Options with the scale resolved (> 0) and the block validated, as the kernels receive them.
struct AttentionParams {
  bool causal = true;
  double scale = 1;
  int64_t block = 64;
};

struct AttentionGrads {
  Tensor dq, dk, dv;  // undefined where not asked for
};
inline auto tensor_fields(AttentionGrads& g) { return std::tie(g.dq, g.dk, g.dv); }  // see tensor/dispatch.h

// All tensors contiguous, one dtype (lse and dlse: its accumulate_dtype), shapes as above. The forward writes
// every element of o and lse. The backward reads dout [B, T, H, Dv] and dlse [B, T, H] (zeros when unused) and writes
// every element of each defined gradient in `grads`; undefined ones are skipped.
SEQLAB_DECLARE_KERNEL(attention_forward_kernel, void (*)(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionParams& p, const Tensor& o, const Tensor& lse));
SEQLAB_DECLARE_KERNEL(attention_backward_kernel,
                      void (*)(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionParams& p,
                               const AttentionGrads& grads));

}  // namespace seqlab::kernel
