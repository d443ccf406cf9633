// CPU cross-entropy fused with log-softmax, over rows of contiguous logits [N, V]. Targets were
// range-checked by the entry point, so the kernels index with them directly. The exponentials are the
// softmax rows' (tensor/softmax_rows.h: vectorised, AVX-512 where the CPU has it; std::exp for f64) and
// row sums accumulate in double (tensor/lane_sum.h). bf16 logits are read as f32 and dlogits rounded
// once on store (tensor/bf16_convert.h); lse and the losses are f32 for them (accumulate_dtype).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/lane_sum.h"
#include "tensor/parallel.h"
#include "tensor/softmax_rows.h"

namespace seqlab::cpu {
namespace {

int64_t row_grain(int64_t v) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(v, 1)); }

// lse_n = m + log Σ_v exp(x_nv − m) with m = max_v x_nv (no overflow for any logit scale);
// losses_n = lse_n − x_n,target  (−log softmax at the target), 0 where the target is ignored.
void cross_entropy_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                       const Tensor& lse) {
  if (logits.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&logits}, {&losses, &lse})) {
    return bf16_on_cpu::call_on_standins(&cross_entropy_cpu, logits, targets, ignore_index, losses, lse);
  }
  dispatch_float_or_bf16(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    dispatch_index(targets.dtype(), "cross_entropy", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T* x = logits.data<T>();
      const I* t = targets.data<I>();
      S *loss = losses.data<S>(), *l = lse.data<S>();
      parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
        std::vector<S> e(static_cast<size_t>(v));  // the row's exp(x − m)
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * v;
          S m = from_storage(xr[0]);  // the first maximum, as std::max_element finds it
          for (int64_t i = 1; i < v; ++i) m = std::max(m, from_storage(xr[i]));
          for (int64_t i = 0; i < v; ++i) e[static_cast<size_t>(i)] = from_storage(xr[i]);
          exp_shifted(e.data(), v, m);
          const double s = lane_sum<double>(v, [&](int64_t i) { return double(e[static_cast<size_t>(i)]); });
          const double lse_r = static_cast<double>(m) + std::log(s);
          l[r] = static_cast<S>(lse_r);
          const int64_t target = static_cast<int64_t>(t[r]);
          loss[r] = target == ignore_index ? S(0) : static_cast<S>(lse_r - from_storage(xr[target]));
        }
      });
    });
  });
}

// dlogits_nv = scale · (exp(x_nv − lse_n) − [v = target_n]) with scale = dloss / count;
// a row whose target is ignored contributed nothing to the loss, so its gradient row is 0.
void cross_entropy_backward_cpu(double scale, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                int64_t ignore_index, const Tensor& dlogits) {
  if (logits.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&logits, &dlogits}, {&lse})) {
    return bf16_on_cpu::call_on_standins(&cross_entropy_backward_cpu, scale, logits, targets, lse, ignore_index,
                                         dlogits);
  }
  dispatch_float_or_bf16(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    dispatch_index(targets.dtype(), "cross_entropy backward", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T* x = logits.data<T>();
      const S* l = lse.data<S>();
      const I* t = targets.data<I>();
      T* d = dlogits.data<T>();
      const S k = static_cast<S>(scale);
      parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
        // The row in S before it is rounded: dr itself when T is S. Its target element is k·p − k,
        // the product rounded to S before k is subtracted, exactly as the f32 row computes it.
        std::vector<S> scratch(std::is_same_v<T, S> ? 0 : static_cast<size_t>(v));
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * v;
          T* dr = d + r * v;
          const int64_t target = static_cast<int64_t>(t[r]);
          if (target == ignore_index) {
            std::fill(dr, dr + v, to_storage<T>(S(0)));
            continue;
          }
          S* row = nullptr;
          if constexpr (std::is_same_v<T, S>) {
            row = dr;
          } else {
            row = scratch.data();
          }
          for (int64_t i = 0; i < v; ++i) row[i] = from_storage(xr[i]);
          exp_shifted(row, v, l[r]);  // x − lse ≤ 0
          for (int64_t i = 0; i < v; ++i) row[i] *= k;
          row[target] -= k;
          if constexpr (!std::is_same_v<T, S>) {
            for (int64_t i = 0; i < v; ++i) dr[i] = to_storage<T>(row[i]);
          }
        }
      });
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(cross_entropy_kernel, DeviceType::CPU, &cpu::cross_entropy_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(cross_entropy_backward_kernel, DeviceType::CPU, &cpu::cross_entropy_backward_cpu);
}  // namespace seqlab::kernel
