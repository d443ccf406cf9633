// CPU linear layer: the GEMM, then one pass over the rows of its result (the epilogue) that adds the bias
// and applies the activation, as cuBLASLt's epilogue does on the GPU:
//   pre = x Wᵀ + b,   y = act(pre)          (act: none, or GELU in tanh form)
// f32, f64: the GEMM writes pre (or y, without an activation); the epilogue adds b onto each row and runs
// GELU from pre into y by the unary kernel's own loop (elementwise_runs.h), so y is bit for bit the
// unary kernel's gelu(pre).
// bf16: without a bias or an activation the GEMM writes y itself (its f32 sums rounded once). Otherwise it
// writes its f32 sums into an f32 scratch; the epilogue adds b there in f32, rounds pre from it, applies
// GELU in f32 and rounds y: pre and y rounded once each from the f32 values, which are
// those of the f32 layer on the same bf16 values (tests/mixed_precision_test.cc).
// The bias is added after the products (not by starting the GEMM from it), in every dtype.
#include <algorithm>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/cpu/elementwise_runs.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

using kernel::Activation;

// Rows of work per parallel chunk of an epilogue: about kParallelGrain elements.
int64_t epilogue_grain(int64_t out) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(out, 1)); }

template <class T>
void linear_same_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                       const Tensor& y) {
  const int64_t n = x.size(0), out = weight.size(0);
  const Tensor& sum = act == Activation::gelu ? pre : y;  // where x Wᵀ + b goes
  kernel::matmul_into(x, weight, false, true, sum, 0.0);  // (zeros when in = 0)
  T* s = sum.data<T>();
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  if (!b && act == Activation::none) return;
  parallel_for(n, epilogue_grain(out), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* row = s + r * out;
      if (b) {
        for (int64_t j = 0; j < out; ++j) row[j] += b[j];
      }
      if (act == Activation::gelu) unary_forward_run<T>(kernel::UnaryOp::gelu, yp + r * out, out, row, T(1));
    }
  });
}

// bf16: the f32 sums of all rows from one GEMM call (which keeps oneDNN's blocking whole), then one
// epilogue pass over them.
void linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                 const Tensor& y) {
  if (!bias.defined() && act == Activation::none) {  // nothing to add or apply: the GEMM rounds its sums once
    kernel::matmul_into(x, weight, false, true, y, 0.0);
    return;
  }
  const int64_t n = x.size(0), out = weight.size(0);
  std::vector<float> b;
  if (bias.defined()) {
    b.resize(static_cast<size_t>(out));
    widen_bf16_run(bias.data<bf16>(), b.data(), out);
  }
  bf16* yp = y.data<bf16>();
  bf16* pp = act == Activation::gelu ? pre.data<bf16>() : nullptr;
  const Tensor sum = Tensor::empty({n, out}, DType::f32, x.device());
  float* s = sum.data<float>();
  kernel::matmul_into(x, weight, false, true, sum, 0.0);  // f32 sums of bf16 products
  parallel_for(n, epilogue_grain(out), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = s + r * out;
      if (!b.empty()) {
        for (int64_t j = 0; j < out; ++j) row[j] += b[static_cast<size_t>(j)];
      }
      if (pp) {
        round_to_bf16_run(row, pp + r * out, out);
        unary_forward_run<float>(kernel::UnaryOp::gelu, row, out, row, 1.0f);
      }
      round_to_bf16_run(row, yp + r * out, out);
    }
  });
}

void linear_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                const Tensor& y) {
  if (y.dtype() == DType::bf16) return linear_bf16(x, weight, bias, act, pre, y);
  dispatch_float(y.dtype(), "linear",
                 [&](auto tag) { linear_same_dtype<decltype(tag)>(x, weight, bias, act, pre, y); });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(linear_kernel, DeviceType::CPU, &cpu::linear_cpu);
}  // namespace seqlab::kernel
