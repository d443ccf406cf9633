// Sizes, steps and input builders shared by the two checks of the optimizer CUDA kernels — the GPU
// test (tests/optim_gpu_test.cc, the slots of src/cuda/optim.cu) and the emulation test
// (tests/optim_emulation_test.cc, src/cuda/optim_kernels.cuh run on the CPU) — so that both
// update the same kind of tensors drawn the same way. Each program keeps its launches and its checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "tensor/kernels.h"
#include "tensor/tensor.h"
#include "tensor/slots/optim.h"

namespace seqlab::testing {

// Empty, one element, around the 256-thread block, and more than the blocks of one grid stride
// (the emulated GPU's 32, many blocks on a real one).
inline const int64_t kOptimSizes[] = {0, 1, 255, 257, 4099, 100003};

// The optimizer state's dtype beside parameters of `param`: f64 for f64, else f32.
inline DType state_type(DType param) { return param == DType::f64 ? DType::f64 : DType::f32; }
inline std::string size_name(int64_t n, DType d) { return std::string(dtype_name(d)) + " n=" + std::to_string(n); }

// ---- AdamW ---------------------------------------------------------------------------------------

// Step t of AdamW (lr 1e-2, betas 0.9 and 0.95, eps 1e-8), with weight decay 0.1 after the first step.
inline kernel::AdamWStep adamw_step(int t) {
  kernel::AdamWStep s;
  s.lr = 1e-2;
  s.weight_decay = t == 1 ? 0.0 : 0.1;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.eps = 1e-8;
  s.bias_correction1 = 1.0 - std::pow(s.beta1, t);
  s.bias_correction2 = 1.0 - std::pow(s.beta2, t);
  return s;
}
inline const int kAdamWSteps[] = {1, 7};
inline std::string adamw_name(int64_t n, DType dtype, int t) {
  return "adamw " + size_name(n, dtype) + " t=" + std::to_string(t);
}

// An AdamW step's tensors of n elements, drawn in this order: p (dtype), g (dtype, σ 0.5), m (σ 0.1)
// and v (uniform in [0.01, 1)) in state_type; for bf16 an f32 master w with p = bf16(w) (mixed
// precision), and at t = 7 beside the master an f32 g instead (a sum of micro-batch gradients).
struct AdamWInputs {
  Tensor p, g, m, v, w;  // w undefined without a master
};
inline AdamWInputs adamw_inputs(int64_t n, DType dtype, int t, Generator& gen) {
  const DType sdt = state_type(dtype);
  AdamWInputs in;
  in.p = Tensor::randn({n}, gen, dtype);
  in.g = Tensor::randn({n}, gen, dtype, 0.5);
  in.m = Tensor::randn({n}, gen, sdt, 0.1);
  in.v = Tensor::rand({n}, gen, sdt, 0.01, 1.0);
  if (dtype == DType::bf16) {
    in.w = Tensor::randn({n}, gen, DType::f32);
    in.p = kernel::to_dtype(in.w, DType::bf16);
    if (t == 7) in.g = Tensor::randn({n}, gen, DType::f32, 0.5);
  }
  return in;
}

// ---- SGD -----------------------------------------------------------------------------------------

// Plain SGD, momentum, and Nesterov momentum.
struct SgdCase {
  double momentum;
  bool nesterov;
};
inline const SgdCase kSgdCases[] = {{0.0, false}, {0.9, false}, {0.9, true}};

// An SGD step (lr 5e-2, weight decay 0.01) for the case, and its name in messages.
inline kernel::SgdStep sgd_step(const SgdCase& c) {
  kernel::SgdStep s;
  s.lr = 5e-2;
  s.weight_decay = 0.01;
  s.momentum = c.momentum;
  s.nesterov = c.nesterov;
  return s;
}
inline std::string sgd_name(int64_t n, DType dtype, const SgdCase& c) {
  return "sgd " + size_name(n, dtype) + " momentum=" + std::to_string(c.momentum) + (c.nesterov ? " nesterov" : "");
}

// An SGD step's tensors of n elements, drawn in this order: p and g (dtype), the momentum buffer b in
// state_type (with momentum only), and for bf16 an f32 master w with p = bf16(w).
struct SgdInputs {
  Tensor p, g, b, w;  // b, w undefined where absent
};
inline SgdInputs sgd_inputs(int64_t n, DType dtype, const SgdCase& c, Generator& gen) {
  SgdInputs in;
  in.p = Tensor::randn({n}, gen, dtype);
  in.g = Tensor::randn({n}, gen, dtype);
  if (c.momentum > 0) in.b = Tensor::randn({n}, gen, state_type(dtype));
  if (dtype == DType::bf16) {
    in.w = Tensor::randn({n}, gen, DType::f32);
    in.p = kernel::to_dtype(in.w, DType::bf16);
  }
  return in;
}

// ---- scale ---------------------------------------------------------------------------------------

inline const double kScaleFactors[] = {0.37, -2.5};
inline std::string scale_name(int64_t n, DType dtype, double k) {
  return "scale " + size_name(n, dtype) + " by " + std::to_string(k);
}

}  // namespace seqlab::testing
