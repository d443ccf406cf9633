// Kernel slots of retention (the op: src/layers/scan/retention.h; CPU kernels in
// src/layers/scan/retention.cpp, CUDA kernels in src/cuda/scan/retention.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class RetentionForm { parallel, chunkwise, recurrent };

namespace kernel {

// Options as the kernels receive them: scale resolved, one γ per head.
struct RetentionParams {
  RetentionForm form = RetentionForm::chunkwise;
  int64_t chunk = 64;
  double scale = 1;
  std::vector<double> gammas;
};

// q, k [B, T, H, dk], v [B, T, H, dv], s0 [B, H, dk, dv] (zeros when absent), contiguous,
// one dtype. The forward writes every element of o and s (final state); the backward reads do and
// ds (zeros where unused) and writes every element of dq, dk, dv, ds0.
SEQLAB_DECLARE_KERNEL(retention_forward_kernel,
                      void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0,
                               const RetentionParams& p, const Tensor& o, const Tensor& s));
SEQLAB_DECLARE_KERNEL(retention_backward_kernel,
                      void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const Tensor& dout,
                               const Tensor& ds, const RetentionParams& p, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv, const Tensor& ds0));

}  // namespace kernel
}  // namespace seqlab
