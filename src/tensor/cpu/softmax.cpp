// CPU softmax and log-softmax over the rows of a contiguous [rows, cols] view (cols = last dim).
// One row per loop iteration; rows are split across threads. Row sums accumulate in double so an
// f32 row of many columns loses no precision to the running total. bf16 rows are computed in f32 and
// rounded once on store (tensor/bf16_convert.h); the softmax's unnormalised exponentials, which the
// f32 kernel keeps in y, are kept in an f32 row of the thread's own for it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)); }

// m = max_j x_j,  s = Σ_j exp(x_j − m);  y_i = exp(x_i − m) / s,  or  log y_i = x_i − m − log s.
// Subtracting the row max keeps every exponent ≤ 0, so no exp overflows whatever the logits' scale.
void softmax_cpu(const Tensor& x, bool log, const Tensor& y) {
  if (x.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&x, &y})) {
    return bf16_on_cpu::call_on_standins(&softmax_cpu, x, log, y);
  }
  dispatch_float_or_bf16(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    constexpr bool rounds = !std::is_same_v<T, S>;
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      // e: where exp(x_i − m) waits for 1/s in S; y's own row when T is S.
      std::vector<S> scratch(rounds && !log ? static_cast<size_t>(cols) : 0);
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = in + r * cols;
        T* yr = out + r * cols;
        S* e_row = nullptr;
        if constexpr (rounds) {
          e_row = scratch.data();
        } else {
          e_row = yr;
        }
        S m = from_storage(xr[0]);
        for (int64_t i = 1; i < cols; ++i) m = std::max(m, from_storage(xr[i]));
        double s = 0;
        for (int64_t i = 0; i < cols; ++i) {
          const S e = std::exp(from_storage(xr[i]) - m);
          s += e;
          if (!log) e_row[i] = e;
        }
        if (log) {
          // (x_i − m) − log s, not x_i − (m + log s): m + log s would round to m's ulp.
          const S log_s = static_cast<S>(std::log(s));
          for (int64_t i = 0; i < cols; ++i) yr[i] = to_storage<T>((from_storage(xr[i]) - m) - log_s);
        } else {
          const S inv = static_cast<S>(1.0 / s);
          for (int64_t i = 0; i < cols; ++i) yr[i] = to_storage<T>(e_row[i] * inv);
        }
      }
    });
  });
}

// softmax:      dx_i = y_i (dy_i − Σ_j dy_j y_j)   (the Jacobian diag(y) − y yᵀ applied to dy)
// log-softmax:  dx_i = dy_i − exp(y_i) Σ_j dy_j    (the Jacobian I − 1 softmaxᵀ, transposed)
void softmax_backward_cpu(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  if (y.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&dy, &y, &dx})) {
    return bf16_on_cpu::call_on_standins(&softmax_backward_cpu, dy, y, log, dx);
  }
  dispatch_float_or_bf16(y.dtype(), "softmax backward", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
    const T *g = dy.data<T>(), *out = y.data<T>();
    T* d = dx.data<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T *gr = g + r * cols, *yr = out + r * cols;
        T* dr = d + r * cols;
        double dot = 0;
        for (int64_t i = 0; i < cols; ++i) {
          dot += log ? static_cast<double>(from_storage(gr[i]))
                     : static_cast<double>(from_storage(gr[i])) * from_storage(yr[i]);
        }
        const S s = static_cast<S>(dot);
        if (log) {
          for (int64_t i = 0; i < cols; ++i) {
            dr[i] = to_storage<T>(from_storage(gr[i]) - std::exp(from_storage(yr[i])) * s);
          }
        } else {
          for (int64_t i = 0; i < cols; ++i) dr[i] = to_storage<T>(from_storage(yr[i]) * (from_storage(gr[i]) - s));
        }
      }
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(softmax_kernel, DeviceType::CPU, &cpu::softmax_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(softmax_backward_kernel, DeviceType::CPU, &cpu::softmax_backward_cpu);
}  // namespace seqlab::kernel
