// CUDA layer norm and RMS norm over the rows of a contiguous x [N, C], plain or fused with the residual
// add before them: the CUDA side of the slots that src/tensor/cpu/norm.cpp fills, with the same
// equations and the same saved statistics.
//
//   layer:  μ = mean_c x_c,  rstd = 1 / √(mean_c (x_c − μ)² + eps),  x̂ = (x − μ)·rstd,  y = x̂ ⊙ w + b
//   rms:    μ = 0,           rstd = 1 / √(mean_c x_c² + eps),         x̂ = x·rstd,        y = x̂ ⊙ w
// With g = dy ⊙ w, the backward is
//   layer:  dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))
//   rms:    dx = rstd · (g − x̂ · mean(g ⊙ x̂))
//   dw = Σ_rows dy ⊙ x̂,  db = Σ_rows dy
// where the backward rebuilds x̂ from the saved μ and rstd, as the CPU does. The statistics are kept in
// the compute type (accumulate_dtype: f32 for bf16 x, x's dtype otherwise).
// Fused with the residual add: s = x + residual (rounded to T) is written and normalised, and the
// backward at s is ds_total = ds + dnorm: the dx kernel adds dsum = ds (onto dnorm rounded to T, as a
// separate add kernel would) in the same pass, so dx = dresidual = ds_total costs no extra launch.
//
// Forward and dx: one block per row (block_reduce.cuh). The variance is taken around μ in a second pass
// over the row, as on the CPU (mean(x²) − μ² cancels when |μ| ≫ σ). dw and db: column sums over all
// rows, in two deterministic passes: the rows are cut into `chunks` slices and thread (slice, column)
// sums its slice's rows in order into partial[slice, column]; then thread (column) sums the partials in
// slice order. No atomics, so the result is the same bits on every run.
// The kernels are in norm_kernels.cuh (a header of their own so that tests/rows_emulation_test.cc
// runs the same source on the CPU); this file holds the checks and launches.
#include <algorithm>
#include <type_traits>

#include "cuda/norm_kernels.cuh"
#include "cuda/row_kernels.cuh"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

using kernel::NormGrads;
using kernel::NormOutput;
using namespace rows;

void check_rows(const char* op, const Tensor& x, const Tensor& other, int64_t expected_numel) {
  if (x.dim() != 2 || other.numel() != expected_numel) {
    throw std::logic_error(std::string(op) + " on CUDA: expected rows [N, C] and matching operands, got " +
                           shape_str(x.shape()) + " with " + shape_str(other.shape()));
  }
}

// Saved statistics are [N] in x's accumulate_dtype.
void check_stats(const char* op, const Tensor& x, const Tensor& stat) {
  check_rows(op, x, stat, x.size(0));
  if (stat.dtype() != accumulate_dtype(x.dtype())) {
    throw std::logic_error(std::string(op) + " on CUDA: statistics must be " + dtype_name(accumulate_dtype(x.dtype())) +
                           " for " + dtype_name(x.dtype()) + " rows, got " + dtype_name(stat.dtype()));
  }
}

// residual and sum are both defined (fused: sum = x + residual is normalised) or both undefined.
void norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                  bool centered, const Tensor& sum, const NormOutput& out) {
  const bool fused = residual.defined();
  const char* op = fused ? (centered ? "add_layer_norm" : "add_rms_norm") : (centered ? "layer_norm" : "rms_norm");
  const int device = x.device().index;
  require_contiguous(op, device, {&x, &weight, &out.y, &out.rstd});
  if (bias.defined()) require_contiguous(op, device, {&bias});
  if (centered) require_contiguous(op, device, {&out.mean});
  if (fused) {
    require_contiguous(op, device, {&residual, &sum});
    check_rows(op, x, residual, x.numel());
    check_rows(op, x, sum, x.numel());
  }
  check_rows(op, x, weight, x.size(1));
  check_stats(op, x, out.rstd);
  if (centered) check_stats(op, x, out.mean);
  const int64_t n = x.size(0), c = x.size(1);
  if (n == 0 || c == 0) return;
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* b = bias.defined() ? cptr<T>(bias) : nullptr;
    const T* res = fused ? cptr<T>(residual) : nullptr;
    T* s = fused ? mptr<T>(sum) : nullptr;
    const dim3 grid(row_blocks(n, device)), block(row_threads(c));
    if (centered) {
      norm_forward_rows<T, true><<<grid, block, 0, stream(device)>>>(cptr<T>(x), res, s, cptr<T>(weight), b,
                                                                     mptr<T>(out.y), mptr<compute_t<T>>(out.mean),
                                                                     mptr<compute_t<T>>(out.rstd), n, c, eps);
    } else {
      norm_forward_rows<T, false><<<grid, block, 0, stream(device)>>>(
          cptr<T>(x), res, s, cptr<T>(weight), b, mptr<T>(out.y), nullptr, mptr<compute_t<T>>(out.rstd), n, c, eps);
    }
    SEQLAB_CUDA_CHECK_LAUNCH(op);
  });
}

void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dsum, bool centered, const NormGrads& grads) {
  const char* op = centered ? "layer_norm backward" : "rms_norm backward";
  const int device = x.device().index;
  require_contiguous(op, device, {&dy, &x, &weight, &rstd});
  if (centered) require_contiguous(op, device, {&mean});
  check_rows(op, x, dy, x.numel());
  check_rows(op, x, weight, x.size(1));
  check_stats(op, x, rstd);
  if (centered) check_stats(op, x, mean);
  const int64_t n = x.size(0), c = x.size(1);
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const compute_t<T>* mu = centered ? cptr<compute_t<T>>(mean) : nullptr;

    if (grads.dx.defined() && n > 0 && c > 0) {
      require_contiguous(op, device, {&grads.dx});
      if (dsum.defined()) {
        require_contiguous(op, device, {&dsum});
        check_rows(op, x, dsum, x.numel());
      }
      const T* ds = dsum.defined() ? cptr<T>(dsum) : nullptr;
      const dim3 grid(row_blocks(n, device)), block(row_threads(c));
      if (centered) {
        norm_backward_dx_rows<T, true><<<grid, block, 0, stream(device)>>>(
            cptr<T>(dy), cptr<T>(x), cptr<T>(weight), mu, cptr<compute_t<T>>(rstd), ds, mptr<T>(grads.dx), n, c);
      } else {
        norm_backward_dx_rows<T, false><<<grid, block, 0, stream(device)>>>(
            cptr<T>(dy), cptr<T>(x), cptr<T>(weight), nullptr, cptr<compute_t<T>>(rstd), ds, mptr<T>(grads.dx), n, c);
      }
      SEQLAB_CUDA_CHECK_LAUNCH(centered ? "layer_norm backward dx" : "rms_norm backward dx");
    }

    const bool need_w = grads.dweight.defined(), need_b = grads.dbias.defined();
    if ((!need_w && !need_b) || c == 0) return;
    if (need_w) require_contiguous(op, device, {&grads.dweight});
    if (need_b) require_contiguous(op, device, {&grads.dbias});
    // No rows: the sums are empty, so both gradients are 0 (a single zero slice says so).
    const int64_t chunks = n == 0 ? 1 : param_chunks(n, c, multiprocessor_count(device)),
                  per = n == 0 ? 0 : (n + chunks - 1) / chunks;
    const DType acc_type = std::is_same_v<A, double> ? DType::f64 : DType::f32;
    Tensor part_w = need_w ? Tensor::empty({chunks, c}, acc_type, x.device()) : Tensor();
    Tensor part_b = need_b ? Tensor::empty({chunks, c}, acc_type, x.device()) : Tensor();
    A* pw = need_w ? mptr<A>(part_w) : nullptr;
    A* pb = need_b ? mptr<A>(part_b) : nullptr;
    const dim3 grid(static_cast<unsigned>((c + kMaxThreads - 1) / kMaxThreads), static_cast<unsigned>(chunks));
    if (centered) {
      norm_param_partials<T, true><<<grid, kMaxThreads, 0, stream(device)>>>(
          cptr<T>(dy), cptr<T>(x), mu, cptr<compute_t<T>>(rstd), pw, pb, n, c, per);
    } else {
      norm_param_partials<T, false><<<grid, kMaxThreads, 0, stream(device)>>>(
          cptr<T>(dy), cptr<T>(x), nullptr, cptr<compute_t<T>>(rstd), pw, pb, n, c, per);
    }
    SEQLAB_CUDA_CHECK_LAUNCH(centered ? "layer_norm weight/bias partial sums" : "rms_norm weight partial sums");
    if (need_w)
      launch_elements("norm weight gradient", device, c, SumPartialsFn<T>{pw, mptr<T>(grads.dweight), chunks, c});
    if (need_b) launch_elements("norm bias gradient", device, c, SumPartialsFn<T>{pb, mptr<T>(grads.dbias), chunks, c});
  });
}

void layer_norm_cuda(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const NormOutput& out) {
  norm_forward(x, Tensor(), w, b, eps, true, Tensor(), out);
}
void rms_norm_cuda(const Tensor& x, const Tensor& w, double eps, const NormOutput& out) {
  norm_forward(x, Tensor(), w, Tensor(), eps, false, Tensor(), out);
}
void add_layer_norm_cuda(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                         const Tensor& sum, const NormOutput& out) {
  norm_forward(x, residual, w, b, eps, true, sum, out);
}
void add_rms_norm_cuda(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Tensor& sum,
                       const NormOutput& out) {
  norm_forward(x, residual, w, Tensor(), eps, false, sum, out);
}
void layer_norm_backward_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dsum, const NormGrads& grads) {
  norm_backward(dy, x, w, mean, rstd, dsum, true, grads);
}
void rms_norm_backward_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dsum,
                            const NormGrads& grads) {
  norm_backward(dy, x, w, Tensor(), rstd, dsum, false, grads);
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(layer_norm_kernel, DeviceType::CUDA, &cuda::layer_norm_cuda);
SEQLAB_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CUDA, &cuda::layer_norm_backward_cuda);
SEQLAB_REGISTER_KERNEL(rms_norm_kernel, DeviceType::CUDA, &cuda::rms_norm_cuda);
SEQLAB_REGISTER_KERNEL(rms_norm_backward_kernel, DeviceType::CUDA, &cuda::rms_norm_backward_cuda);
SEQLAB_REGISTER_KERNEL(add_layer_norm_kernel, DeviceType::CUDA, &cuda::add_layer_norm_cuda);
SEQLAB_REGISTER_KERNEL(add_rms_norm_kernel, DeviceType::CUDA, &cuda::add_rms_norm_cuda);
}  // namespace seqlab::kernel
