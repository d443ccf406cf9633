// CPU linear layer: the GEMM, then one pass over the rows of its result (the epilogue) that adds the bias
// and applies the activation, as cuBLASLt's epilogue does on the GPU:
//   pre = x Wᵀ + b,   y = act(pre)          (act: none, or GELU in tanh form)
// f32, f64: the GEMM writes pre (or y, without an activation); the epilogue adds b onto each row and runs
// GELU from pre into y by the unary kernel's own loop (elementwise_runs.h), so y is bit for bit the
// unary kernel's gelu(pre).
// bf16: without a bias or an activation the GEMM writes y itself (its f32 sums rounded once). Otherwise it
// writes its f32 sums into an f32 scratch, a block of rows at a time; the epilogue adds b there in f32,
// rounds pre from it, applies GELU in f32 and rounds y: pre and y rounded once each from the f32 values,
// which are those of the f32 layer on the same bf16 values (tests/mixed_precision_test.cc).
// The bias is added after the products (not by starting the GEMM from it), in every dtype.
#include <algorithm>
#include <memory>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/blas_rows.h"
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

// bf16 weights up to this size are multiplied by row blocks (below); larger ones in one GEMM call.
constexpr int64_t kRowBlockWeightBytes = int64_t{4} << 20;
// Rows per block: 256 rows of f32 sums at gpt_small's widest output (1024) are 1 MiB, which stays in a
// core's L2 for the epilogue that reads them back.
constexpr int64_t kRowBlock = 256;

// bf16: the f32 sums of a block of rows, then the epilogue over those rows while they are in cache.
// Each thread takes a contiguous range of rows and runs the GEMM of each of its blocks on itself
// (oneDNN inside a parallel region runs on the calling thread), so the f32 sums never make a round trip
// through memory. oneDNN repacks the weight for every block, which costs little while it fits in cache;
// a larger weight goes through one GEMM call over all rows (which keeps oneDNN's blocking whole) into
// an f32 scratch, then one epilogue pass.
void linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                 const Tensor& y) {
  if (!bias.defined() && act == Activation::none) {  // nothing to add or apply: the GEMM rounds its sums once
    kernel::matmul_into(x, weight, false, true, y, 0.0);
    return;
  }
  const int64_t n = x.size(0), in = x.size(1), out = weight.size(0);
  std::vector<float> b;
  if (bias.defined()) {
    b.resize(static_cast<size_t>(out));
    widen_bf16_run(bias.data<bf16>(), b.data(), out);
  }
  bf16* yp = y.data<bf16>();
  bf16* pp = act == Activation::gelu ? pre.data<bf16>() : nullptr;
  // Rows [r0, r0 + rows) from their f32 sums s: + b, pre rounded (with GELU), GELU, y rounded.
  auto epilogue = [&](float* s, int64_t r0, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * out;
      if (!b.empty()) {
        for (int64_t j = 0; j < out; ++j) row[j] += b[static_cast<size_t>(j)];
      }
      if (pp) {
        round_to_bf16_run(row, pp + (r0 + r) * out, out);
        unary_forward_run<float>(kernel::UnaryOp::gelu, row, out, row, 1.0f);
      }
      round_to_bf16_run(row, yp + (r0 + r) * out, out);
    }
  };
  if (in > 0 && 2 * in * out <= kRowBlockWeightBytes) {  // (in = 0: matmul_into writes the zero sums)
    const bf16 *xp = x.data<bf16>(), *wp = weight.data<bf16>();
    parallel_for(n, epilogue_grain(out), [&](int64_t begin, int64_t end) {
      const int64_t block = std::min(kRowBlock, end - begin);
      const std::unique_ptr<float[]> sums(new float[static_cast<size_t>(block * out)]);
      for (int64_t r0 = begin; r0 < end; r0 += block) {
        const int64_t rows = std::min(block, end - r0);
        gemm<bf16, float>(false, true, rows, out, in, 1.0, xp + r0 * in, in, wp, in, 0.0, sums.get(), out);
        epilogue(sums.get(), r0, rows);
      }
    });
    return;
  }
  const Tensor sum = Tensor::empty({n, out}, DType::f32, x.device());
  float* s = sum.data<float>();
  kernel::matmul_into(x, weight, false, true, sum, 0.0);  // f32 sums of bf16 products
  parallel_for(n, epilogue_grain(out),
               [&](int64_t begin, int64_t end) { epilogue(s + begin * out, begin, end - begin); });
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
