// CPU softmax and log-softmax over the rows of a contiguous [rows, cols] view (cols = last dim).
// One row per loop iteration; rows are split across threads. Row sums accumulate in double so an
// f32 row of many columns loses no precision to the running total.
#include <algorithm>
#include <cmath>

#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab::cpu {
namespace {

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)); }

// m = max_j x_j,  s = Σ_j exp(x_j − m);  y_i = exp(x_i − m) / s,  or  log y_i = x_i − m − log s.
// Subtracting the row max keeps every exponent ≤ 0, so no exp overflows whatever the logits' scale.
void softmax_cpu(const Tensor& x, bool log, const Tensor& y) {
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = in + r * cols;
        T* yr = out + r * cols;
        const T m = *std::max_element(xr, xr + cols);
        double s = 0;
        for (int64_t i = 0; i < cols; ++i) {
          const T e = std::exp(xr[i] - m);
          s += e;
          if (!log) yr[i] = e;
        }
        if (log) {
          // (x_i − m) − log s, not x_i − (m + log s): m + log s would round to m's ulp.
          const T log_s = static_cast<T>(std::log(s));
          for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - m) - log_s;
        } else {
          const T inv = static_cast<T>(1.0 / s);
          for (int64_t i = 0; i < cols; ++i) yr[i] *= inv;
        }
      }
    });
  });
}

// softmax:      dx_i = y_i (dy_i − Σ_j dy_j y_j)   (the Jacobian diag(y) − y yᵀ applied to dy)
// log-softmax:  dx_i = dy_i − exp(y_i) Σ_j dy_j    (the Jacobian I − 1 softmaxᵀ, transposed)
void softmax_backward_cpu(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  dispatch_float(y.dtype(), "softmax backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
    const T *g = dy.data<T>(), *out = y.data<T>();
    T* d = dx.data<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T *gr = g + r * cols, *yr = out + r * cols;
        T* dr = d + r * cols;
        double dot = 0;
        for (int64_t i = 0; i < cols; ++i) dot += log ? static_cast<double>(gr[i]) : static_cast<double>(gr[i]) * yr[i];
        const T s = static_cast<T>(dot);
        if (log) {
          for (int64_t i = 0; i < cols; ++i) dr[i] = gr[i] - std::exp(yr[i]) * s;
        } else {
          for (int64_t i = 0; i < cols; ++i) dr[i] = yr[i] * (gr[i] - s);
        }
      }
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(softmax_kernel, DeviceType::CPU, &cpu::softmax_cpu);
SEQLAB_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CPU, &cpu::softmax_backward_cpu);
}  // namespace seqlab::kernel
