// Layer norm and RMS norm entry points, plain and fused with the residual add before them. x [..., C]
// is viewed as contiguous rows [N, C]; the per-row statistics (mean, rstd) are [N] in x's
// accumulate_dtype (f32 for bf16, x's dtype otherwise) and are what the backward reads.
#include <cmath>
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

void check_param(const Tensor& p, const Tensor& x, const char* name, const char* op) {
  if (p.dim() != 1 || p.size(0) != x.size(-1) || p.dtype() != x.dtype() || p.device() != x.device()) {
    throw std::invalid_argument(std::string(op) + ": " + name + " " + shape_str(p.shape()) + " " +
                                dtype_name(p.dtype()) + " does not match input " + shape_str(x.shape()) + " " +
                                dtype_name(x.dtype()) + " (expected [C] of the same dtype and device)");
  }
}

// x as contiguous rows [N, C], after checking x, weight and (if defined) bias.
Tensor as_rows(const Tensor& x, const Tensor& weight, const Tensor& bias, const char* op) {
  if (!x.defined() || !is_floating(x.dtype()) || x.dim() < 1 || x.size(-1) == 0) {
    throw std::invalid_argument(std::string(op) + ": expected a floating input [..., C] with C ≥ 1");
  }
  if (!weight.defined()) throw std::invalid_argument(std::string(op) + ": weight is required");
  check_param(weight, x, "weight", op);
  if (bias.defined()) check_param(bias, x, "bias", op);
  const int64_t c = x.size(-1);
  return reshape(x, {x.numel() / c, c});
}

void check_eps(double eps, const char* op) {
  if (!(eps >= 0) || !std::isfinite(eps))
    throw std::invalid_argument(std::string(op) + ": eps must be ≥ 0, got " + std::to_string(eps));
}

void check_grad(const Tensor& dy, const Tensor& x, const Tensor& stat, const char* op) {
  if (!dy.defined() || dy.shape() != x.shape() || dy.dtype() != x.dtype() || dy.device() != x.device()) {
    throw std::invalid_argument(std::string(op) + ": gradient " + (dy.defined() ? shape_str(dy.shape()) : "undefined") +
                                " does not match input " + shape_str(x.shape()));
  }
  if (!stat.defined() || stat.numel() != x.numel() / x.size(-1) || stat.dtype() != accumulate_dtype(x.dtype())) {
    throw std::invalid_argument(std::string(op) + ": saved statistics do not match input " + shape_str(x.shape()) +
                                " " + dtype_name(x.dtype()) + " (expected [N] " +
                                dtype_name(accumulate_dtype(x.dtype())) + ")");
  }
}

// The residual added before a fused norm: x's shape, dtype and device, as contiguous rows like `rows`.
Tensor residual_rows(const Tensor& residual, const Tensor& x, const Tensor& rows, const char* op) {
  if (!residual.defined() || residual.shape() != x.shape() || residual.dtype() != x.dtype() ||
      residual.device() != x.device()) {
    throw std::invalid_argument(std::string(op) + ": residual " +
                                (residual.defined() ? shape_str(residual.shape()) + " " + dtype_name(residual.dtype()) +
                                                          " on " + residual.device().str()
                                                    : std::string("undefined")) +
                                " does not match input " + shape_str(x.shape()) + " " + dtype_name(x.dtype()) + " on " +
                                x.device().str() + " (expected the same shape, dtype and device)");
  }
  return reshape(residual, rows.shape());
}

// dsum as contiguous rows, or undefined when not given.
Tensor dsum_rows(const Tensor& dsum, const Tensor& x, const Tensor& rows, const char* op) {
  if (!dsum.defined()) return dsum;
  if (dsum.shape() != x.shape() || dsum.dtype() != x.dtype() || dsum.device() != x.device()) {
    throw std::invalid_argument(std::string(op) + ": gradient of the sum " + shape_str(dsum.shape()) + " " +
                                dtype_name(dsum.dtype()) + " does not match input " + shape_str(x.shape()) + " " +
                                dtype_name(x.dtype()));
  }
  return reshape(dsum, rows.shape());
}

// Allocates the gradients asked for; the rest stay undefined so the kernel skips them.
NormGrads alloc_grads(const Tensor& rows, bool need_dx, bool need_dweight, bool need_dbias) {
  NormGrads g;
  if (need_dx) g.dx = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
  if (need_dweight) g.dweight = Tensor::empty({rows.size(1)}, rows.dtype(), rows.device());
  if (need_dbias) g.dbias = Tensor::empty({rows.size(1)}, rows.dtype(), rows.device());
  return g;
}

}  // namespace

NormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_eps(eps, "layer_norm");
  Tensor rows = as_rows(x, weight, bias, "layer_norm");
  const int64_t n = rows.size(0);
  const DType stats = accumulate_dtype(x.dtype());
  NormOutput out{Tensor::empty(rows.shape(), x.dtype(), x.device()), Tensor::empty({n}, stats, x.device()),
                 Tensor::empty({n}, stats, x.device())};
  layer_norm_kernel(x.device(), rows, contiguous(weight), bias.defined() ? contiguous(bias) : bias, eps, out);
  out.y = view(out.y, x.shape());
  return out;
}

NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool need_dx, bool need_dweight, bool need_dbias,
                              const Tensor& dsum) {
  Tensor rows = as_rows(x, weight, Tensor(), "layer_norm backward");
  check_grad(dy, x, mean, "layer_norm backward");
  check_grad(dy, x, rstd, "layer_norm backward");
  Tensor ds = need_dx ? dsum_rows(dsum, x, rows, "layer_norm backward") : Tensor();
  NormGrads g = alloc_grads(rows, need_dx, need_dweight, need_dbias);
  if (!need_dx && !need_dweight && !need_dbias) return g;
  layer_norm_backward_kernel(x.device(), reshape(dy, rows.shape()), rows, contiguous(weight), contiguous(mean),
                             contiguous(rstd), ds, g);
  if (g.dx.defined()) g.dx = view(g.dx, x.shape());
  return g;
}

NormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_eps(eps, "rms_norm");
  Tensor rows = as_rows(x, weight, Tensor(), "rms_norm");
  NormOutput out{Tensor::empty(rows.shape(), x.dtype(), x.device()), Tensor(),
                 Tensor::empty({rows.size(0)}, accumulate_dtype(x.dtype()), x.device())};
  rms_norm_kernel(x.device(), rows, contiguous(weight), eps, out);
  out.y = view(out.y, x.shape());
  return out;
}

NormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, bool need_dx,
                            bool need_dweight, const Tensor& dsum) {
  Tensor rows = as_rows(x, weight, Tensor(), "rms_norm backward");
  check_grad(dy, x, rstd, "rms_norm backward");
  Tensor ds = need_dx ? dsum_rows(dsum, x, rows, "rms_norm backward") : Tensor();
  NormGrads g = alloc_grads(rows, need_dx, need_dweight, false);
  if (!need_dx && !need_dweight) return g;
  rms_norm_backward_kernel(x.device(), reshape(dy, rows.shape()), rows, contiguous(weight), contiguous(rstd), ds, g);
  if (g.dx.defined()) g.dx = view(g.dx, x.shape());
  return g;
}

AddNormOutput add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                             double eps) {
  check_eps(eps, "add_layer_norm");
  Tensor rows = as_rows(x, weight, bias, "add_layer_norm");
  Tensor res = residual_rows(residual, x, rows, "add_layer_norm");
  const int64_t n = rows.size(0);
  AddNormOutput out{Tensor::empty(rows.shape(), x.dtype(), x.device()),
                    {Tensor::empty(rows.shape(), x.dtype(), x.device()),
                     Tensor::empty({n}, accumulate_dtype(x.dtype()), x.device()),
                     Tensor::empty({n}, accumulate_dtype(x.dtype()), x.device())}};
  add_layer_norm_kernel(x.device(), rows, res, contiguous(weight), bias.defined() ? contiguous(bias) : bias, eps,
                        out.sum, out.norm);
  out.sum = view(out.sum, x.shape());
  out.norm.y = view(out.norm.y, x.shape());
  return out;
}

AddNormOutput add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  check_eps(eps, "add_rms_norm");
  Tensor rows = as_rows(x, weight, Tensor(), "add_rms_norm");
  Tensor res = residual_rows(residual, x, rows, "add_rms_norm");
  AddNormOutput out{Tensor::empty(rows.shape(), x.dtype(), x.device()),
                    {Tensor::empty(rows.shape(), x.dtype(), x.device()), Tensor(),
                     Tensor::empty({rows.size(0)}, accumulate_dtype(x.dtype()), x.device())}};
  add_rms_norm_kernel(x.device(), rows, res, contiguous(weight), eps, out.sum, out.norm);
  out.sum = view(out.sum, x.shape());
  out.norm.y = view(out.norm.y, x.shape());
  return out;
}

}  // namespace seqlab::kernel
