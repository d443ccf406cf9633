// CPU layer norm and RMS norm over rows of contiguous x [N, C], one row per loop iteration, plain or
// fused with the residual add before them (s = x + residual written, then normalised).
// Row statistics accumulate in double (an f32 sum over C terms would lose digits to the running
// total); dweight and dbias are column sums over all rows, computed column-parallel so every
// column is summed in row order and the result does not depend on the thread count. The outputs
// themselves (y, dx) are computed in compute_t<T> (float for f32 and bf16, double for f64) from the
// statistics rounded to it: they need no more digits than they are stored with, and float lanes are
// twice as many (the forward 1.3x, the backward 1.2x faster than in double, docs/perf.md).
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
#include <type_traits>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/lane_sum.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

using kernel::NormGrads;
using kernel::NormOutput;

int64_t grain(int64_t work_per_item) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(work_per_item, 1));
}

// Row sums in double through lane_sum (tensor/lane_sum.h: vectorised, fixed order). Terms that are
// products are written to a row first (Scratch) and summed from there: GCC contracts a·b + c into an
// fma, and explicit fmas in a lane sum are not vectorised by GCC 12.
using Scratch = std::vector<double>;

// (1/n) Σ_i v_i in double.
template <class V>
double row_mean(int64_t n, const V* v) {
  return lane_sum<double>(n, [&](int64_t i) { return static_cast<double>(v[i]); }) / static_cast<double>(n);
}

// Rows as the kernels compute with them, compute_t<T> (float for bf16 and f32, double for f64). f32
// and f64 rows are the tensor's own; a bf16 row is widened into a float buffer (RowIn), or written to
// one and rounded into the tensor by store() (RowOut), each in a loop of its own. So the arithmetic
// loops below see float rows for f32 and bf16 alike, and vectorise alike: a bf16 rounding (a select
// on NaN) inside them would keep them scalar.
template <class T>
class RowIn {
 public:
  explicit RowIn(int64_t c) {
    if constexpr (std::is_same_v<T, bf16>) buf_.resize(static_cast<size_t>(c));
  }
  const compute_t<T>* values(const T* src, int64_t c) {
    if constexpr (std::is_same_v<T, bf16>) {
      widen_bf16_run(src, buf_.data(), c);
      return buf_.data();
    } else {
      (void)c;
      return src;
    }
  }

 private:
  std::vector<compute_t<T>> buf_;
};

template <class T>
class RowOut {
 public:
  explicit RowOut(int64_t c) {
    if constexpr (std::is_same_v<T, bf16>) buf_.resize(static_cast<size_t>(c));
  }
  compute_t<T>* values(T* dst) {
    if constexpr (std::is_same_v<T, bf16>) {
      return buf_.data();
    } else {
      return dst;
    }
  }
  void store(T* dst, int64_t c) {
    if constexpr (std::is_same_v<T, bf16>) round_to_bf16_run(buf_.data(), dst, c);
  }

 private:
  std::vector<compute_t<T>> buf_;
};

// Every a·b + c below is an explicit std::fma, or its product is stored before the sum, so the
// compiler's contraction cannot round the f32 and bf16 instantiations differently: the bf16 kernel
// gives the bits of the f32 kernel on stand-ins, which tests/bf16_cpu_test checks.

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
    const T* in = x.data<T>();
    const T* res = fused ? residual.data<T>() : nullptr;
    T* s = fused ? sum.data<T>() : nullptr;
    T* y = out.y.data<T>();
    S *mean = centered ? out.mean.data<S>() : nullptr, *rstd = out.rstd.data<S>();
    RowIn<T> w_row(c), b_row(c);
    const S* w = w_row.values(weight.data<T>(), c);
    const S* b = bias.defined() ? b_row.values(bias.data<T>(), c) : nullptr;
    parallel_for(n, grain(c), [&](int64_t begin, int64_t end) {
      RowIn<T> x_in(c), r_in(c);
      RowOut<T> row(c);
      Scratch sq_row(static_cast<size_t>(c));
      double* sq = sq_row.data();
      for (int64_t r = begin; r < end; ++r) {
        const S* xr = x_in.values(in + r * c, c);
        if (fused) {
          T* sr = s + r * c;
          const S* rr = r_in.values(res + r * c, c);
          S* sv = row.values(sr);
          for (int64_t i = 0; i < c; ++i) sv[i] = xr[i] + rr[i];
          row.store(sr, c);
          xr = x_in.values(sr, c);  // s as stored (rounded for bf16)
        }
        const double mu = centered ? row_mean(c, xr) : 0.0;
        for (int64_t i = 0; i < c; ++i) {
          const double d = xr[i] - mu;
          sq[i] = d * d;
        }
        const double rs = 1.0 / std::sqrt(row_mean(c, sq) + eps);
        if (centered) mean[r] = static_cast<S>(mu);
        rstd[r] = static_cast<S>(rs);
        T* yr = y + r * c;
        S* yv = row.values(yr);
        // y in S (float for f32 and bf16) from the statistics rounded to S: x̂ and y need no more digits
        // than the output has, and float lanes are twice as many as double ones.
        const S mu_s = static_cast<S>(mu), rs_s = static_cast<S>(rs);
        if (b) {
          for (int64_t i = 0; i < c; ++i) yv[i] = std::fma((xr[i] - mu_s) * rs_s, w[i], b[i]);
        } else {
          for (int64_t i = 0; i < c; ++i) yv[i] = (xr[i] - mu_s) * rs_s * w[i];
        }
        row.store(yr, c);
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
    const T *g = dy.data<T>(), *in = x.data<T>();
    const S* rs = rstd.data<S>();
    const S* mu = centered ? mean.data<S>() : nullptr;

    if (grads.dx.defined()) {
      T* dx = grads.dx.data<T>();
      const T* ds = dsum.defined() ? dsum.data<T>() : nullptr;
      RowIn<T> w_row(c);
      const S* w = w_row.values(weight.data<T>(), c);
      parallel_for(n, grain(c), [&](int64_t begin, int64_t end) {
        RowIn<T> g_in(c), x_in(c), ds_in(c);
        RowOut<T> row(c);
        Scratch gw_row(static_cast<size_t>(c)), gwx_row(static_cast<size_t>(c));
        double *gw = gw_row.data(), *gwx = gwx_row.data();
        for (int64_t r = begin; r < end; ++r) {
          const S *gr = g_in.values(g + r * c, c), *xr = x_in.values(in + r * c, c);
          const double mu_r = mu ? double(mu[r]) : 0.0, rs_r = rs[r];
          auto xhat = [&](int64_t i) { return (xr[i] - mu_r) * rs_r; };
          // g_i = dy_i · w_i, exact in double (two products of ≤ 24-bit significands) for f32 and bf16.
          for (int64_t i = 0; i < c; ++i) {
            gw[i] = double(gr[i]) * w[i];
            gwx[i] = gw[i] * xhat(i);
          }
          const double mean_g = centered ? row_mean(c, gw) : 0.0;
          const double mean_gx = row_mean(c, gwx);
          T* dxr = dx + r * c;
          S* d = row.values(dxr);
          // dx in S from the statistics rounded to S (as y in the forward), but g − mean(g) in double from
          // the exact g: it cancels, exactly so over one column (and a contracted g·w − mean(g) in S would not).
          const S mu_s = static_cast<S>(mu_r), rs_s = static_cast<S>(rs_r), mgx = static_cast<S>(mean_gx);
          for (int64_t i = 0; i < c; ++i) {
            d[i] = rs_s * std::fma(-((xr[i] - mu_s) * rs_s), mgx, static_cast<S>(gw[i] - mean_g));
          }
          if (ds) {  // dnorm rounded to T, then + ds (rounded by store)
            const S* dsr = ds_in.values(ds + r * c, c);
            for (int64_t i = 0; i < c; ++i) d[i] = from_storage(to_storage<T>(d[i])) + dsr[i];
          }
          row.store(dxr, c);
        }
      });
    }

    if (grads.dweight.defined() || grads.dbias.defined()) {
      T* dw = grads.dweight.defined() ? grads.dweight.data<T>() : nullptr;
      T* db = grads.dbias.defined() ? grads.dbias.data<T>() : nullptr;
      parallel_for(c, grain(n), [&](int64_t c0, int64_t c1) {
        const int64_t m = c1 - c0;
        Scratch acc_w_row(static_cast<size_t>(m), 0.0), acc_b_row(acc_w_row.size(), 0.0);
        double *acc_w = acc_w_row.data(), *acc_b = acc_b_row.data();
        RowIn<T> g_in(m), x_in(m);
        for (int64_t r = 0; r < n; ++r) {
          const S *gr = g_in.values(g + r * c + c0, m), *xr = x_in.values(in + r * c + c0, m);
          const double mu_r = mu ? double(mu[r]) : 0.0, rs_r = rs[r];
          for (int64_t i = 0; i < m; ++i) {
            acc_w[i] = std::fma(double(gr[i]), (xr[i] - mu_r) * rs_r, acc_w[i]);
            acc_b[i] += gr[i];
          }
        }
        for (int64_t i = 0; i < m; ++i) {
          if (dw) dw[c0 + i] = to_storage<T>(static_cast<S>(acc_w[i]));
          if (db) db[c0 + i] = to_storage<T>(static_cast<S>(acc_b[i]));
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
