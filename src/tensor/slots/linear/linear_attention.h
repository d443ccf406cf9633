// Kernel slots of linear attention and of Performer's random features (the ops:
// src/layers/linear/linear_attention.h; CPU kernels in src/layers/linear/linear_attention.cpp, CUDA
// kernels in src/cuda/linear/linear_attention.cu).
#pragma once

#include <cstdint>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class LinearAttentionForm { chunkwise, recurrent, noncausal };

namespace kernel {

// Options as the kernels receive them (validated).
struct LinearAttentionParams {
  LinearAttentionForm form = LinearAttentionForm::chunkwise;
  bool normalize = true;
  double eps = 1e-6;
  int64_t chunk = 64;
};

// fq = φ(q), fk = φ(k) [B, T, H, dk], v [B, T, H, dv], s0 [B, H, dk, dv], z0 [B, H, dk]
// (zeros when absent), all contiguous, one dtype. The forward writes every element of o, s, z.
// The backward reads the output gradients do, ds, dz (zeros where unused) and writes every element
// of dfq, dfk (gradients with respect to φ(q), φ(k)), dv, ds0, dz0.
SEQLAB_DECLARE_KERNEL(linear_attention_forward_kernel,
                      void (*)(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                               const LinearAttentionParams& p, const Tensor& o, const Tensor& s, const Tensor& z));
SEQLAB_DECLARE_KERNEL(linear_attention_backward_kernel,
                      void (*)(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                               const Tensor& dout, const Tensor& ds, const Tensor& dz, const LinearAttentionParams& p,
                               const Tensor& dfq, const Tensor& dfk, const Tensor& dv, const Tensor& ds0,
                               const Tensor& dz0));
// Performer features: y = φ(x) for x [B, T, H, d], ω [m, d]; the backward writes dx and domega (both
// every element).
SEQLAB_DECLARE_KERNEL(performer_forward_kernel,
                      void (*)(const Tensor& x, const Tensor& omega, bool stabilize, const Tensor& y));
SEQLAB_DECLARE_KERNEL(performer_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& x, const Tensor& omega, const Tensor& y, bool stabilize,
                               const Tensor& dx, const Tensor& domega));

}  // namespace kernel
}  // namespace seqlab
