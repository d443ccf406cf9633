// Kernel slots of the optimizer steps and of the global gradient norm (the optimizer itself, which
// owns parameter groups and state: src/train/optim/optim.h). CPU kernels in src/tensor/cpu/optim.cpp,
// CUDA kernels in src/cuda/optim.cu.
//
// Contiguous tensors of one device; g has p's dtype (or f32 for a bf16 p with a master: a sum of
// micro-batch gradients kept in f32); m, v are f64 for f64 parameters and f32 otherwise (bf16
// parameters are computed in f32). `w` is the f32 master of a bf16 p, or undefined: when defined the
// update reads and writes w instead of p, and then p ← bf16(w). Below, p stands for w when w is
// defined. The updates are elementwise, so their result does not depend on the number of threads.
#pragma once

#include <vector>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab::kernel {

struct AdamWStep {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  double bias_correction1 = 1, bias_correction2 = 1;  // 1 − β1^t, 1 − β2^t for this update's t
};
// p ← p − lr·wd·p;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
// p ← p − lr · (m / bc1) / (√(v / bc2) + ε).
SEQLAB_DECLARE_KERNEL(adamw_step_kernel, void (*)(const AdamWStep& s, const Tensor& p, const Tensor& g, const Tensor& m,
                                                  const Tensor& v, const Tensor& w));

// The AdamW step of many parameters in one call: each entry is what adamw_step_kernel takes, updated
// exactly as adamw_step_kernel updates it (the same bits), but all entries in one pass with one parallel
// region over their elements together, instead of one region per tensor (a model's biases and norm
// gains are too small to split among threads on their own). The kernel handles bf16 parameters itself
// (it takes the bf16 p, its f32 master w and a bf16 or f32 g and stores p = bf16(w), rounded to nearest
// even as the per-tensor path's stand-ins are). CPU only: where a device has no kernel for it, the
// optimizer calls adamw_step_kernel per parameter.
struct AdamWTensors {
  AdamWStep step;
  Tensor p, g, m, v, w;
};
SEQLAB_DECLARE_KERNEL(adamw_multi_step_kernel, void (*)(const std::vector<AdamWTensors>& params));

struct SgdStep {
  double lr = 0, weight_decay = 0, momentum = 0;
  bool nesterov = false;
};
// p ← p − lr·wd·p;  b ← μ·b + g;  d = nesterov ? g + μ·b : b  (d = g when b is undefined);
// p ← p − lr·d.
SEQLAB_DECLARE_KERNEL(sgd_step_kernel,
                      void (*)(const SgdStep& s, const Tensor& p, const Tensor& g, const Tensor& b, const Tensor& w));

// out = Σ x² over a contiguous floating tensor, accumulated in double in an order independent of threads;
// out is a one-element f64 tensor on x's device. On CUDA it is queued like any kernel: no wait.
SEQLAB_DECLARE_KERNEL(sum_squares_kernel, void (*)(const Tensor& x, const Tensor& out));
// Σ x² read back to the host (waits for x's device).
double squared_norm(const Tensor& x);
// Σ_i Σ x_i² over tensors on one device: each tensor's sum as squared_norm gives it, added on the host in
// the order given, with one wait for the device in all (not one per tensor).
double squared_norm(const std::vector<Tensor>& xs);
// x ← s·x over a contiguous floating tensor.
SEQLAB_DECLARE_KERNEL(scale_inplace_kernel, void (*)(const Tensor& x, double s));

// The gradient norm and clip of many tensors in one call each (contiguous floating tensors of one device,
// bf16 taken as it is): out[i] = Σ x_i² (out f64 [xs.size()]), each sum exactly as sum_squares_kernel gives
// it (the same blocks, added in the same order), and x_i ← s·x_i exactly as scale_inplace_kernel does it
// (bf16: in f32, rounded to nearest even), each with one parallel region over all the tensors' elements
// instead of one per tensor. CPU only: squared_norm and the optimizer's scale_grads call the per-tensor
// slots where a device has no kernel for these.
SEQLAB_DECLARE_KERNEL(sum_squares_multi_kernel, void (*)(const std::vector<Tensor>& xs, const Tensor& out));
SEQLAB_DECLARE_KERNEL(scale_inplace_multi_kernel, void (*)(const std::vector<Tensor>& xs, double s));

}  // namespace seqlab::kernel
