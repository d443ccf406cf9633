// CPU row reductions and the cumulative sum. Sums accumulate in double for f32 inputs so results
// do not depend on the thread count. sum_rows takes bf16 itself: bf16 rows are read as f32 and each
// sum rounded once to the output's dtype (tensor/bf16_convert.h), as from f32 stand-ins.
#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

// out[o] = Σ_i x[o, i]
void sum_rows_cpu(const Tensor& x, const Tensor& out) {
  if (x.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&x, &out})) {
    return bf16_on_cpu::call_on_standins(&sum_rows_cpu, x, out);
  }
  dispatch_float_or_bf16(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    const int64_t outer = x.size(0), inner = x.size(1);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(inner, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) {
                     double acc = 0;
                     const T* row = in + r * inner;
                     for (int64_t i = 0; i < inner; ++i) acc += from_storage(row[i]);
                     o[r] = to_storage<T>(static_cast<S>(acc));
                   }
                 });
  });
}

// out[o] = max_i x[o, i]; index[o] = the first i attaining it
void max_rows_cpu(const Tensor& x, const Tensor& out, const Tensor& index) {
  dispatch_float(x.dtype(), "max", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = x.size(0), inner = x.size(1);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    int64_t* idx = index.data<int64_t>();
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(inner, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) {
                     const T* row = in + r * inner;
                     int64_t best = 0;
                     for (int64_t i = 1; i < inner; ++i) {
                       if (row[i] > row[best]) best = i;
                     }
                     o[r] = row[best];
                     idx[r] = best;
                   }
                 });
  });
}

// dx[o, index[o]] = dy[o]; the rest of dx was zeroed by the caller
void scatter_rows_cpu(const Tensor& dy, const Tensor& index, const Tensor& dx) {
  dispatch_float(dx.dtype(), "max backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = dx.size(0), inner = dx.size(1);
    const T* g = dy.data<T>();
    const int64_t* idx = index.data<int64_t>();
    T* d = dx.data<T>();
    for (int64_t r = 0; r < outer; ++r) d[r * inner + idx[r]] = g[r];
  });
}

// out[o, j, i] = Σ_{j' ≤ j} x[o, j', i]  (j' ≥ j when reverse)
void cumsum_cpu(const Tensor& x, bool reverse, const Tensor& out) {
  dispatch_float(x.dtype(), "cumsum", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = x.size(0), n = x.size(1), inner = x.size(2);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    parallel_for(outer * inner, kParallelGrain / std::max<int64_t>(n, 1), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t base = (p / inner) * n * inner + p % inner;
        T acc = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t j = reverse ? n - 1 - s : s;
          acc += in[base + j * inner];
          o[base + j * inner] = acc;
        }
      }
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sum_rows_kernel, DeviceType::CPU, &cpu::sum_rows_cpu);
SEQLAB_REGISTER_KERNEL(max_rows_kernel, DeviceType::CPU, &cpu::max_rows_cpu);
SEQLAB_REGISTER_KERNEL(scatter_rows_kernel, DeviceType::CPU, &cpu::scatter_rows_cpu);
SEQLAB_REGISTER_KERNEL(cumsum_kernel, DeviceType::CPU, &cpu::cumsum_cpu);
}  // namespace seqlab::kernel
