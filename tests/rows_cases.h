// Input builders and CPU references shared by the two checks of the row-wise CUDA kernels — the GPU
// test (tests/rows_gpu_test.cc, the slots end to end) and the emulation test
// (tests/rows_emulation_test.cc, the kernel source run on the CPU) — so that both draw their
// inputs the same way and compare with the same reference. Each program keeps its own shapes (the
// emulation runs smaller ones: it is slow), its launches and everything it checks.
//
// The references run the CPU slots in reference_type (f32 for bf16, which the CPU kernels do not
// take) on the values as the dtype under test holds them; what a forward saves for its backward is
// the reference rounded to the dtype (or to accumulate_dtype for statistics), as a GPU run stores it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// "op dtype [rows, cols]", the prefix of every message.
inline std::string rows_case_name(const char* op, DType dtype, int64_t rows, int64_t cols) {
  return std::string(op) + " " + dtype_name(dtype) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

inline Tensor cpu_empty(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, kCpu); }

// Uniform integers in [0, n), with about `ignored_share` of them replaced by `ignored`: two draws per
// element (the integer, then the uniform deciding whether it is ignored).
inline Tensor random_indices(Generator& gen, int64_t count, int64_t n, DType dtype, double ignored_share = 0.0,
                             int64_t ignored = -100) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  for (int64_t& i : v) {
    i = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(n));
    if (gen.uniform() < ignored_share) i = ignored;
  }
  return Tensor::from_indices(v, {count}, dtype);
}

// ---- layer norm and RMS norm ---------------------------------------------------------------------

// Rows [n, c] of N(offset, 2²), drawn in reference_type(dtype) and rounded to dtype: an offset mean
// makes the centring matter.
inline Tensor offset_rows(int64_t n, int64_t c, double offset, DType dtype, Generator& gen) {
  const Tensor drawn = Tensor::randn({n, c}, gen, reference_type(dtype), 2.0);
  return kernel::to_dtype(kernel::scalar_op(kernel::ScalarOp::add, drawn, offset), dtype);
}

// The forward's eps: 1e-5 for layer norm (centered), 1e-6 for RMS norm.
inline double norm_eps(bool centered) { return centered ? 1e-5 : 1e-6; }

// The fused forward's inputs s = x + residual, drawn in this order: x [n, c] (mean 3), residual,
// weight and bias [c].
struct AddNormInputs {
  Tensor x, residual, weight, bias;
};
inline AddNormInputs add_norm_inputs(int64_t n, int64_t c, DType dtype, Generator& gen) {
  AddNormInputs in;
  in.x = offset_rows(n, c, 3.0, dtype, gen);
  in.residual = Tensor::randn({n, c}, gen, dtype);
  in.weight = Tensor::randn({c}, gen, dtype);
  in.bias = Tensor::randn({c}, gen, dtype);
  return in;
}

// The CPU's norm of x with norm_eps: layer norm when centered (bias may be undefined), else RMS norm
// (no mean).
inline kernel::NormOutput norm_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, bool centered) {
  const int64_t n = x.size(0), c = x.size(1);
  const DType rt = reference_type(x.dtype());
  kernel::NormOutput want{cpu_empty({n, c}, rt), centered ? cpu_empty({n}, rt) : Tensor(), cpu_empty({n}, rt)};
  if (centered) {
    kernel::layer_norm_kernel(kCpu, as_reference(x), as_reference(weight), as_reference(bias), norm_eps(true), want);
  } else {
    kernel::rms_norm_kernel(kCpu, as_reference(x), as_reference(weight), norm_eps(false), want);
  }
  return want;
}

// The fused forward's reference: s from the CPU's fused slot, then y and the statistics from the CPU's
// plain norm of s as stored in the dtype under test (a kernel normalises the rounded s it writes,
// which the backward reads back). Without bias when !with_bias; RMS norm when !centered.
struct AddNormReference {
  Tensor sum;
  kernel::NormOutput norm;
};
inline AddNormReference add_norm_reference(const AddNormInputs& in, bool centered, bool with_bias) {
  const int64_t n = in.x.size(0), c = in.x.size(1);
  const DType dtype = in.x.dtype(), rt = reference_type(dtype);
  const Tensor bias = with_bias ? in.bias : Tensor();
  Tensor sum = cpu_empty({n, c}, rt);
  kernel::NormOutput fused{cpu_empty({n, c}, rt), centered ? cpu_empty({n}, rt) : Tensor(), cpu_empty({n}, rt)};
  if (centered) {
    kernel::add_layer_norm_kernel(kCpu, as_reference(in.x), as_reference(in.residual), as_reference(in.weight),
                                  as_reference(bias), norm_eps(true), sum, fused);
  } else {
    kernel::add_rms_norm_kernel(kCpu, as_reference(in.x), as_reference(in.residual), as_reference(in.weight),
                                norm_eps(false), sum, fused);
  }
  return {sum, norm_reference(kernel::to_dtype(sum, dtype), in.weight, bias, centered)};
}

// The backward's inputs, drawn in this order: x [n, c] (mean −1.5), weight [c], dy and dsum [n, c]
// (dsum: the gradient of a fused residual sum, added onto dx).
struct NormBackwardInputs {
  Tensor x, weight, dy, dsum;
};
inline NormBackwardInputs norm_backward_inputs(int64_t n, int64_t c, DType dtype, Generator& gen) {
  NormBackwardInputs in;
  in.x = offset_rows(n, c, -1.5, dtype, gen);
  in.weight = Tensor::randn({c}, gen, dtype);
  in.dy = Tensor::randn({n, c}, gen, dtype);
  in.dsum = Tensor::randn({n, c}, gen, dtype);
  return in;
}

// The statistics as a forward saved them: the CPU's (eps 1e-5 for both norms), stored in
// accumulate_dtype (f32 for bf16); mean undefined for RMS norm.
struct NormStatistics {
  Tensor mean, rstd;
};
inline NormStatistics saved_norm_statistics(const NormBackwardInputs& in, bool centered) {
  const int64_t n = in.x.size(0), c = in.x.size(1);
  const DType rt = reference_type(in.x.dtype()), at = accumulate_dtype(in.x.dtype());
  kernel::NormOutput fwd{cpu_empty({n, c}, rt), centered ? cpu_empty({n}, rt) : Tensor(), cpu_empty({n}, rt)};
  if (centered) {
    kernel::layer_norm_kernel(kCpu, as_reference(in.x), as_reference(in.weight), Tensor(), 1e-5, fwd);
  } else {
    kernel::rms_norm_kernel(kCpu, as_reference(in.x), as_reference(in.weight), 1e-5, fwd);
  }
  return {centered ? kernel::to_dtype(fwd.mean, at) : Tensor(), kernel::to_dtype(fwd.rstd, at)};
}

// The CPU's gradients without dsum: dx where need_dx; dweight, and dbias when centered, where
// need_params; the others undefined.
inline kernel::NormGrads norm_backward_reference(const NormBackwardInputs& in, const NormStatistics& saved,
                                                 bool centered, bool need_dx, bool need_params) {
  const int64_t n = in.x.size(0), c = in.x.size(1);
  const DType rt = reference_type(in.x.dtype());
  kernel::NormGrads want{need_dx ? cpu_empty({n, c}, rt) : Tensor(), need_params ? cpu_empty({c}, rt) : Tensor(),
                         need_params && centered ? cpu_empty({c}, rt) : Tensor()};
  if (centered) {
    kernel::layer_norm_backward_kernel(kCpu, as_reference(in.dy), as_reference(in.x), as_reference(in.weight),
                                       as_reference(saved.mean), as_reference(saved.rstd), Tensor(), want);
  } else {
    kernel::rms_norm_backward_kernel(kCpu, as_reference(in.dy), as_reference(in.x), as_reference(in.weight),
                                     as_reference(saved.rstd), Tensor(), want);
  }
  return want;
}

// dx with dsum: dnorm as stored in the dtype under test, plus dsum, as a separate add would compute it.
// Compare with dnorm as the scale (its rounding bounds the error).
inline Tensor dx_plus_dsum(const Tensor& dnorm, const Tensor& dsum) {
  return kernel::binary(kernel::BinaryOp::add, as_reference(kernel::to_dtype(dnorm, dsum.dtype())), as_reference(dsum));
}

// ---- softmax -------------------------------------------------------------------------------------

// Logits [n, c] of N(0, 3²), then the output gradient, both in the dtype under test.
struct SoftmaxInputs {
  Tensor x, dy;
};
inline SoftmaxInputs softmax_inputs(int64_t n, int64_t c, DType dtype, Generator& gen) {
  SoftmaxInputs in;
  in.x = Tensor::randn({n, c}, gen, dtype, 3.0);
  in.dy = Tensor::randn({n, c}, gen, dtype);
  return in;
}

// The CPU's (log-)softmax of x's rows, in reference_type.
inline Tensor softmax_reference(const Tensor& x, bool log) {
  Tensor want = cpu_empty(x.shape(), reference_type(x.dtype()));
  kernel::softmax_kernel(kCpu, as_reference(x), log, want);
  return want;
}
// The CPU's backward from y as the forward stored it.
inline Tensor softmax_backward_reference(const Tensor& dy, const Tensor& y, bool log) {
  Tensor want = cpu_empty(y.shape(), reference_type(y.dtype()));
  kernel::softmax_backward_kernel(kCpu, as_reference(dy), as_reference(y), log, want);
  return want;
}

// [4, 100] logits of N(400, 30²) (drawn in f64, rounded to dtype), which overflow exp without the max
// subtraction, with one NaN at row 2, column 17, which must poison its row only.
inline Tensor large_logits_with_nan(DType dtype, Generator& gen) {
  std::vector<double> values =
      kernel::scalar_op(kernel::ScalarOp::add, Tensor::randn({4, 100}, gen, DType::f64, 30.0), 400.0).to_doubles();
  values[2 * 100 + 17] = std::numeric_limits<double>::quiet_NaN();
  return Tensor::from_vector(values, {4, 100}, dtype);
}

// ---- cross-entropy -------------------------------------------------------------------------------

inline constexpr int64_t kIgnoreIndex = -100;
inline constexpr double kLossScale = 0.37;  // dloss / count, the backward's scale

// Logits [n, v] of N(20, 3²) (drawn in f64, rounded to dtype), so that lse − x_target is a difference
// of large numbers; then targets [n] of target_type, about a fifth of them kIgnoreIndex.
struct CrossEntropyInputs {
  Tensor logits, targets;
};
inline CrossEntropyInputs cross_entropy_inputs(int64_t n, int64_t v, DType dtype, DType target_type, Generator& gen) {
  CrossEntropyInputs in;
  in.logits = kernel::to_dtype(
      kernel::scalar_op(kernel::ScalarOp::add, Tensor::randn({n, v}, gen, DType::f64, 3.0), 20.0), dtype);
  in.targets = random_indices(gen, n, v, target_type, 0.2, kIgnoreIndex);
  return in;
}

// The CPU's losses and lse (reference_type), lse as the forward stored it (accumulate_dtype), and the
// CPU's dlogits (kLossScale, from the stored lse).
struct CrossEntropyReference {
  Tensor losses, lse, saved_lse, dlogits;
};
inline CrossEntropyReference cross_entropy_reference(const CrossEntropyInputs& in) {
  const int64_t n = in.logits.size(0), v = in.logits.size(1);
  const DType dtype = in.logits.dtype(), rt = reference_type(dtype);
  CrossEntropyReference want{cpu_empty({n}, rt), cpu_empty({n}, rt), Tensor(), cpu_empty({n, v}, rt)};
  kernel::cross_entropy_kernel(kCpu, as_reference(in.logits), in.targets, kIgnoreIndex, want.losses, want.lse);
  want.saved_lse = kernel::to_dtype(want.lse, accumulate_dtype(dtype));
  kernel::cross_entropy_backward_kernel(kCpu, kLossScale, as_reference(in.logits), in.targets,
                                        as_reference(want.saved_lse), kIgnoreIndex, want.dlogits);
  return want;
}

// ---- max over rows -------------------------------------------------------------------------------

// Values [n, c] for max over rows: N(0, 2²) rounded to small integers, so most rows hold their max
// several times and the first must win, plus row_step · row (row_step 0 adds nothing, not even to
// the sign of a zero). Where n ≥ 5 and c ≥ 7: row 1 starts with NaN (the CPU never leaves column 0),
// row 2 has a NaN later (skipped), row 3 is NaN but its last column.
inline std::vector<double> max_rows_values(int64_t n, int64_t c, Generator& gen, double row_step = 0.0) {
  std::vector<double> values = Tensor::randn({n, c}, gen, DType::f64, 2.0).to_doubles();
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::round(values[i]);
    if (row_step != 0.0) values[i] += row_step * static_cast<double>(i / static_cast<size_t>(c));
  }
  if (n >= 5 && c >= 7) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    values[static_cast<size_t>(1 * c + 0)] = nan;
    values[static_cast<size_t>(2 * c + 3)] = nan;
    for (int64_t i = 0; i < c; ++i) values[static_cast<size_t>(3 * c + i)] = nan;
    values[static_cast<size_t>(3 * c + c - 1)] = -1.0;
  }
  return values;
}

}  // namespace seqlab::testing
