// CPU cross-entropy fused with log-softmax, over rows of contiguous logits [N, V]. Targets were
// range-checked by the entry point, so the kernels index with them directly. Row sums accumulate
// in double.
#include <algorithm>
#include <cmath>

#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab::cpu {
namespace {

int64_t row_grain(int64_t v) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(v, 1)); }

// lse_n = m + log Σ_v exp(x_nv − m) with m = max_v x_nv (no overflow for any logit scale);
// losses_n = lse_n − x_n,target  (−log softmax at the target), 0 where the target is ignored.
void cross_entropy_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                       const Tensor& lse) {
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets.dtype(), "cross_entropy", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T* x = logits.data<T>();
      const I* t = targets.data<I>();
      T *loss = losses.data<T>(), *l = lse.data<T>();
      parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * v;
          const T m = *std::max_element(xr, xr + v);
          double s = 0;
          for (int64_t i = 0; i < v; ++i) s += std::exp(xr[i] - m);
          const double lse_r = static_cast<double>(m) + std::log(s);
          l[r] = static_cast<T>(lse_r);
          const int64_t target = static_cast<int64_t>(t[r]);
          loss[r] = target == ignore_index ? T(0) : static_cast<T>(lse_r - xr[target]);
        }
      });
    });
  });
}

// dlogits_nv = scale · (exp(x_nv − lse_n) − [v = target_n]) with scale = dloss / count;
// a row whose target is ignored contributed nothing to the loss, so its gradient row is 0.
void cross_entropy_backward_cpu(double scale, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                int64_t ignore_index, const Tensor& dlogits) {
  dispatch_float(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets.dtype(), "cross_entropy backward", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T *x = logits.data<T>(), *l = lse.data<T>();
      const I* t = targets.data<I>();
      T* d = dlogits.data<T>();
      const T k = static_cast<T>(scale);
      parallel_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * v;
          T* dr = d + r * v;
          const int64_t target = static_cast<int64_t>(t[r]);
          if (target == ignore_index) {
            std::fill(dr, dr + v, T(0));
            continue;
          }
          for (int64_t i = 0; i < v; ++i) dr[i] = k * std::exp(xr[i] - l[r]);
          dr[target] -= k;
        }
      });
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(cross_entropy_kernel, DeviceType::CPU, &cpu::cross_entropy_cpu);
SEQLAB_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CPU, &cpu::cross_entropy_backward_cpu);
}  // namespace seqlab::kernel
