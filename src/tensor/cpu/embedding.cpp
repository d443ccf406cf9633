// CPU embedding gather and its scatter-add backward. Indices were range-checked by the entry
// point (src/tensor/embedding.cpp), so the kernels index with them directly.
//
// The backward must add the rows of every token that picked the same embedding. Threads over
// tokens would race on those rows (and atomics would make f32 sums depend on thread timing), so
// the tokens are first bucketed by row with a stable counting sort, and threads then own disjoint
// ranges of vocabulary rows, each summing its tokens in token order: the result is the same bits
// for any thread count.
//
// bf16 weights and gradients are read as f32 and written rounded once (tensor/bf16_convert.h), the
// f32 kernels' bits on their stand-ins: a gathered row is the weight row itself, except that a
// signalling NaN comes out quiet, as it does from the stand-ins.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab::cpu {
namespace {

// out[n, :] = weight[index[n], :]   weight [V, C], index [N], out [N, C]; reads N·C, writes N·C.
void embedding_cpu(const Tensor& weight, const Tensor& index, const Tensor& out) {
  if (weight.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&weight, &out})) {
    return bf16_on_cpu::call_on_standins(&embedding_cpu, weight, index, out);
  }
  dispatch_float_or_bf16(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(index.dtype(), "embedding", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = index.numel(), c = weight.size(1);
      const T* w = weight.data<T>();
      const I* idx = index.data<I>();
      T* o = out.data<T>();
      parallel_for(n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(c, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* src = w + static_cast<int64_t>(idx[r]) * c;
          T* dst = o + r * c;
          if constexpr (std::is_same_v<T, compute_t<T>>) {
            std::copy(src, src + c, dst);
          } else {
            for (int64_t j = 0; j < c; ++j) dst[j] = to_storage<T>(from_storage(src[j]));
          }
        }
      });
    });
  });
}

// dweight[v, :] = Σ_{n : index[n] = v} dy[n, :]   dy [N, C], index [N], dweight [V, C] (every row
// written, zero where no token points). Sums accumulate in double, in increasing n.
void embedding_backward_cpu(const Tensor& dy, const Tensor& index, const Tensor& dweight) {
  if (dy.dtype() == DType::bf16 && !bf16_on_cpu::native_bf16({&dy, &dweight})) {
    return bf16_on_cpu::call_on_standins(&embedding_backward_cpu, dy, index, dweight);
  }
  dispatch_float_or_bf16(dy.dtype(), "embedding backward", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    dispatch_index(index.dtype(), "embedding backward", [&](auto itag) {
      using I = decltype(itag);
      const int64_t n = index.numel(), c = dy.size(1), v = dweight.size(0);
      const T* g = dy.data<T>();
      const I* idx = index.data<I>();
      T* dw = dweight.data<T>();

      // Stable counting sort: tokens of row r are order[start[r] .. start[r + 1]) in increasing n.
      std::vector<int64_t> start(static_cast<size_t>(v + 1), 0), order(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) ++start[static_cast<size_t>(idx[t]) + 1];
      for (int64_t r = 0; r < v; ++r) start[static_cast<size_t>(r + 1)] += start[static_cast<size_t>(r)];
      std::vector<int64_t> next(start.begin(), start.end() - 1);
      for (int64_t t = 0; t < n; ++t) order[static_cast<size_t>(next[static_cast<size_t>(idx[t])]++)] = t;

      // One thread per range of rows when there is enough work to share.
      const int64_t grain = n * c < kParallelGrain ? v : 1;
      parallel_for(v, grain, [&](int64_t begin, int64_t end) {
        std::vector<double> acc(static_cast<size_t>(c));
        for (int64_t r = begin; r < end; ++r) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t k = start[static_cast<size_t>(r)]; k < start[static_cast<size_t>(r + 1)]; ++k) {
            const T* src = g + order[static_cast<size_t>(k)] * c;
            for (int64_t j = 0; j < c; ++j) acc[static_cast<size_t>(j)] += from_storage(src[j]);
          }
          T* dst = dw + r * c;
          for (int64_t j = 0; j < c; ++j) dst[j] = to_storage<T>(static_cast<S>(acc[static_cast<size_t>(j)]));
        }
      });
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(embedding_kernel, DeviceType::CPU, &cpu::embedding_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(embedding_backward_kernel, DeviceType::CPU, &cpu::embedding_backward_cpu);
}  // namespace seqlab::kernel
