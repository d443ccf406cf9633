// Kernel slot of the rotary position embedding (the op: src/layers/attention/rope.h; CPU kernel in
// src/layers/attention/rope.cpp, CUDA kernel in src/cuda/attention/rope.cu).
#pragma once

#include <cstdint>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

struct RopeOptions {
  double base = 10000;
  int64_t start = 0;  // position of token t = 0
};

namespace kernel {

// x and y contiguous [B, T, H, D], one dtype; writes every element of y = R(±φ) x, φ = (start + t)·base^(−2i/D)
// (inverse: −φ).
SEQLAB_DECLARE_KERNEL(rope_kernel, void (*)(const Tensor& x, const RopeOptions& opts, bool inverse, const Tensor& y));

}  // namespace kernel
}  // namespace seqlab
