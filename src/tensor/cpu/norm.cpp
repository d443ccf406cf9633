// CPU layer norm and RMS norm over rows of contiguous x [N, C], one row per loop iteration, plain or
// fused with the residual add before them (s = x + residual written, then normalised).
// Row statistics accumulate in double (an f32 sum over C terms would lose digits to the running
// total); dweight and dbias are column sums over all rows, computed column-parallel so every
// column is summed in row order and the result does not depend on the thread count.
//
// With x̂ = (x − μ)·rstd (layer) or x̂ = x·rstd (rms) and g = dy ⊙ w, the backward is
//   layer:  dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))
//   rms:    dx = rstd · (g − x̂ · mean(g ⊙ x̂))
//   dw = Σ_rows dy ⊙ x̂,  db = Σ_rows dy
// (differentiate x̂ through μ and rstd: ∂rstd/∂x_c = −rstd³ (x_c − μ) / C, ∂μ/∂x_c = 1 / C).
// The fused forms: s = x + residual, y = norm(s); the backward at s is ds_total = ds + dnorm, the
// dx above with dsum = ds added in the same loop (dnorm rounded to T first, as a separate add sees it).
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

using kernel::NormGrads;
using kernel::NormOutput;

int64_t grain(int64_t work_per_item) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(work_per_item, 1));
}

// layer (centered): μ = mean_c x_c,  rstd = 1 / √(mean_c (x_c − μ)² + eps),  y = x̂ ⊙ w + b
// rms:              μ = 0,           rstd = 1 / √(mean_c x_c² + eps),         y = x̂ ⊙ w
// The variance is taken around μ in a second pass: mean(x²) − μ² cancels badly when |μ| ≫ σ.
// With `residual` defined, the row normalised is s = x + residual (in T, as binary add computes it),
// written to `sum` first: x and residual are read once, and the passes over s hit the cache.
void norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                  bool centered, const Tensor& sum, const NormOutput& out) {
  const bool fused = residual.defined();
  const char* op = fused ? (centered ? "add_layer_norm" : "add_rms_norm") : (centered ? "layer_norm" : "rms_norm");
  dispatch_float_or_bf16(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;  // the statistics' type
    const int64_t n = x.size(0), c = x.size(1);
    const T *in = x.data<T>(), *w = weight.data<T>(), *b = bias.defined() ? bias.data<T>() : nullptr;
    const T* res = fused ? residual.data<T>() : nullptr;
    T* s = fused ? sum.data<T>() : nullptr;
    T* y = out.y.data<T>();
    S *mean = centered ? out.mean.data<S>() : nullptr, *rstd = out.rstd.data<S>();
    parallel_for(n, grain(c), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = in + r * c;
        if (fused) {
          T* sr = s + r * c;
          const T* rr = res + r * c;
          for (int64_t i = 0; i < c; ++i) {
            sr[i] = to_storage<T>(static_cast<S>(from_storage(xr[i]) + from_storage(rr[i])));
          }
          xr = sr;
        }
        double mu = 0, var = 0;
        if (centered) {
          for (int64_t i = 0; i < c; ++i) mu += from_storage(xr[i]);
          mu /= static_cast<double>(c);
        }
        for (int64_t i = 0; i < c; ++i) var += (from_storage(xr[i]) - mu) * (from_storage(xr[i]) - mu);
        const double rs = 1.0 / std::sqrt(var / static_cast<double>(c) + eps);
        if (centered) mean[r] = static_cast<S>(mu);
        rstd[r] = static_cast<S>(rs);
        for (int64_t i = 0; i < c; ++i) {
          y[r * c + i] = to_storage<T>(static_cast<S>((from_storage(xr[i]) - mu) * rs * from_storage(w[i]) +
                                                      (b ? static_cast<double>(from_storage(b[i])) : 0.0)));
        }
      }
    });
  });
}

void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dsum, bool centered, const NormGrads& grads) {
  dispatch_float_or_bf16(x.dtype(), centered ? "layer_norm backward" : "rms_norm backward", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;  // the statistics' type
    const int64_t n = x.size(0), c = x.size(1);
    const T *g = dy.data<T>(), *in = x.data<T>(), *w = weight.data<T>();
    const S* rs = rstd.data<S>();
    const S* mu = centered ? mean.data<S>() : nullptr;
    auto xhat = [&](int64_t r, int64_t i) {
      return (from_storage(in[r * c + i]) - (mu ? double(mu[r]) : 0.0)) * double(rs[r]);
    };

    if (grads.dx.defined()) {
      T* dx = grads.dx.data<T>();
      const T* ds = dsum.defined() ? dsum.data<T>() : nullptr;
      parallel_for(n, grain(c), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          double mean_g = 0, mean_gx = 0;  // mean(g), mean(g ⊙ x̂)
          for (int64_t i = 0; i < c; ++i) {
            const double gi = double(from_storage(g[r * c + i])) * from_storage(w[i]);
            mean_g += gi;
            mean_gx += gi * xhat(r, i);
          }
          mean_g = centered ? mean_g / static_cast<double>(c) : 0.0;
          mean_gx /= static_cast<double>(c);
          for (int64_t i = 0; i < c; ++i) {
            const double gi = double(from_storage(g[r * c + i])) * from_storage(w[i]);
            const T d = to_storage<T>(static_cast<S>(rs[r] * (gi - mean_g - xhat(r, i) * mean_gx)));
            dx[r * c + i] = ds ? to_storage<T>(static_cast<S>(from_storage(d) + from_storage(ds[r * c + i]))) : d;
          }
        }
      });
    }

    if (grads.dweight.defined() || grads.dbias.defined()) {
      T* dw = grads.dweight.defined() ? grads.dweight.data<T>() : nullptr;
      T* db = grads.dbias.defined() ? grads.dbias.data<T>() : nullptr;
      parallel_for(c, grain(n), [&](int64_t c0, int64_t c1) {
        std::vector<double> acc_w(static_cast<size_t>(c1 - c0), 0.0), acc_b(acc_w.size(), 0.0);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t i = c0; i < c1; ++i) {
            acc_w[static_cast<size_t>(i - c0)] += from_storage(g[r * c + i]) * xhat(r, i);
            acc_b[static_cast<size_t>(i - c0)] += from_storage(g[r * c + i]);
          }
        }
        for (int64_t i = c0; i < c1; ++i) {
          if (dw) dw[i] = to_storage<T>(static_cast<S>(acc_w[static_cast<size_t>(i - c0)]));
          if (db) db[i] = to_storage<T>(static_cast<S>(acc_b[static_cast<size_t>(i - c0)]));
        }
      });
    }
  });
}

// bf16: the kernels above take bf16 x, residual, sum, y, weight, bias, dy, dsum and grads with f32
// statistics (tensor/bf16_convert.h), rounding where CUDA rounds and where the unfused steps round:
// s before it is normalised (the backward reads the stored s), dnorm before dsum is added. So the
// fused slots give the bits of add then norm, and of norm backward then add. Any other mix of dtypes
// runs on f32 stand-ins, the fused slots as those separate steps.
using bf16_on_cpu::native_bf16;

void layer_norm_cpu(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const NormOutput& out) {
  if (x.dtype() == DType::bf16 && !native_bf16({&x, &w, &b, &out.y}, {&out.mean, &out.rstd})) {
    return bf16_on_cpu::call_on_standins(&layer_norm_cpu, x, w, b, eps, out);
  }
  norm_forward(x, Tensor(), w, b, eps, true, Tensor(), out);
}
void rms_norm_cpu(const Tensor& x, const Tensor& w, double eps, const NormOutput& out) {
  if (x.dtype() == DType::bf16 && !native_bf16({&x, &w, &out.y}, {&out.rstd})) {
    return bf16_on_cpu::call_on_standins(&rms_norm_cpu, x, w, eps, out);
  }
  norm_forward(x, Tensor(), w, Tensor(), eps, false, Tensor(), out);
}
void add_layer_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                        const Tensor& sum, const NormOutput& out) {
  if (x.dtype() == DType::bf16 && !native_bf16({&x, &residual, &w, &b, &sum, &out.y}, {&out.mean, &out.rstd})) {
    kernel::binary_kernel(x.device(), kernel::BinaryOp::add, x, residual, sum);
    kernel::layer_norm_kernel(x.device(), sum, w, b, eps, out);
    return;
  }
  norm_forward(x, residual, w, b, eps, true, sum, out);
}
void add_rms_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Tensor& sum,
                      const NormOutput& out) {
  if (x.dtype() == DType::bf16 && !native_bf16({&x, &residual, &w, &sum, &out.y}, {&out.rstd})) {
    kernel::binary_kernel(x.device(), kernel::BinaryOp::add, x, residual, sum);
    kernel::rms_norm_kernel(x.device(), sum, w, eps, out);
    return;
  }
  norm_forward(x, residual, w, Tensor(), eps, false, sum, out);
}
void layer_norm_backward_cpu(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dsum, const NormGrads& grads) {
  if (x.dtype() == DType::bf16 &&
      !native_bf16({&dy, &x, &w, &dsum, &grads.dx, &grads.dweight, &grads.dbias}, {&mean, &rstd})) {
    bf16_on_cpu::call_on_standins(&layer_norm_backward_cpu, dy, x, w, mean, rstd, Tensor(), grads);
    if (dsum.defined() && grads.dx.defined()) {
      kernel::binary_kernel(x.device(), kernel::BinaryOp::add, grads.dx, dsum, grads.dx);
    }
    return;
  }
  norm_backward(dy, x, w, mean, rstd, dsum, true, grads);
}
void rms_norm_backward_cpu(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dsum,
                           const NormGrads& grads) {
  if (x.dtype() == DType::bf16 && !native_bf16({&dy, &x, &w, &dsum, &grads.dx, &grads.dweight}, {&rstd})) {
    bf16_on_cpu::call_on_standins(&rms_norm_backward_cpu, dy, x, w, rstd, Tensor(), grads);
    if (dsum.defined() && grads.dx.defined()) {
      kernel::binary_kernel(x.device(), kernel::BinaryOp::add, grads.dx, dsum, grads.dx);
    }
    return;
  }
  norm_backward(dy, x, w, Tensor(), rstd, dsum, false, grads);
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(layer_norm_kernel, DeviceType::CPU, &cpu::layer_norm_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(rms_norm_kernel, DeviceType::CPU, &cpu::rms_norm_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(layer_norm_backward_kernel, DeviceType::CPU, &cpu::layer_norm_backward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(rms_norm_backward_kernel, DeviceType::CPU, &cpu::rms_norm_backward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(add_layer_norm_kernel, DeviceType::CPU, &cpu::add_layer_norm_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(add_rms_norm_kernel, DeviceType::CPU, &cpu::add_rms_norm_cpu);
}  // namespace seqlab::kernel
