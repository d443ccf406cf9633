// CPU copy (strided, converting dtype) and fill.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace seqlab::cpu {

int64_t omp_threads() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

int64_t omp_thread() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

namespace {

// out[i] = convert(in[i]) for i < n; bf16 <-> f32 (the dispatch layer's stand-ins) by the vectorised
// loops of tensor/bf16_convert.h, the same bits as convert_scalar.
template <class D, class S>
void convert_run(const S* in, D* out, int64_t n) {
  if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bf16>) {
    widen_bf16_run(in, out, n);
  } else if constexpr (std::is_same_v<D, bf16> && std::is_same_v<S, float>) {
    round_to_bf16_run(in, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = convert_scalar<D>(in[i]);
  }
}

// dst[i] = convert(src[i]) for every index i of dst's shape.
void copy_cpu(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  if (dst.is_contiguous() && src.is_contiguous()) {
    // One block whatever the rank (a 1-D tensor is one row, which the row loop below would give to
    // one thread): split into one run per thread.
    dispatch_any(dst.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      dispatch_any(src.dtype(), [&](auto src_tag) {
        using S = decltype(src_tag);
        D* out = static_cast<D*>(dst.raw_data());
        const S* in = static_cast<const S*>(src.raw_data());
        parallel_for(n, kParallelGrain,
                     [&](int64_t begin, int64_t end) { convert_run(in + begin, out + begin, end - begin); });
      });
    });
    return;
  }
  dispatch_any(dst.dtype(), [&](auto dst_tag) {
    using D = decltype(dst_tag);
    dispatch_any(src.dtype(), [&](auto src_tag) {
      using S = decltype(src_tag);
      D* out = static_cast<D*>(dst.raw_data());
      const S* in = static_cast<const S*>(src.raw_data());
      const int64_t inner = dst.dim() > 0 ? dst.size(-1) : 1;
      if (dst.dim() > 0 && inner > 1 && dst.strides().back() == 1 && src.strides().back() == 1) {
        // Rows contiguous on both sides (a narrow or a head split of the last dimension): walk
        // the rows and copy each with a tight loop, not element by element through the walker.
        Shape rows(dst.shape().begin(), dst.shape().end() - 1);
        Shape rd(dst.strides().begin(), dst.strides().end() - 1), rs(src.strides().begin(), src.strides().end() - 1);
        parallel_for(shape_numel(rows), std::max<int64_t>(1, kParallelGrain / inner), [&](int64_t begin, int64_t end) {
          StridedWalker<2> walk(rows, {&rd, &rs}, begin);
          for (int64_t r = begin; r < end; ++r, walk.next()) {
            D* o = out + walk.offset(0);
            const S* i = in + walk.offset(1);
            convert_run(i, o, inner);
          }
        });
        return;
      }
      parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
        StridedWalker<2> walk(dst.shape(), {&dst.strides(), &src.strides()}, begin);
        for (int64_t i = begin; i < end; ++i, walk.next()) {
          out[walk.offset(0)] = convert_scalar<D>(in[walk.offset(1)]);
        }
      });
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  dispatch_any(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst.raw_data());
    const T v = convert_scalar<T>(value);
    parallel_for(dst.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = v;
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(copy_kernel, DeviceType::CPU, &cpu::copy_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(fill_kernel, DeviceType::CPU, &cpu::fill_cpu);
}  // namespace seqlab::kernel
