// CUDA embedding gather and its backward, row max with argmax, the max backward's scatter, and
// cumulative sums: the CUDA side of the slots that src/tensor/cpu/embedding.cpp and
// src/tensor/cpu/reduce.cpp fill, with the same equations and the same answers on ties and NaN.
//
// The embedding backward is deterministic (no atomics): the tokens are sorted by embedding row with a
// stable radix sort (CUB), so the tokens of row u are order[start[u] .. start[u+1]) in increasing
// token position, exactly the CPU's counting-sort buckets; then thread (u, j) sums dy[order[k], j]
// over its bucket in that order. The same inputs give the same bits on every run, and every row of
// dweight is written (0 where no token points). Indices were range-checked by the entry point
// (src/tensor/embedding.cpp), so the kernels index with them directly. The functors are in
// index_kernels.cuh (host-includable: tests/index_emulation_test.cc runs them on the CPU); this
// file holds the launchers.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/index_kernels.cuh"
#include "cuda/reduce_rows_kernels.cuh"
#include "cuda/row_kernels.cuh"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

using namespace rows;
// The functors and the sort's bit range are in index_kernels.cuh.
using namespace indexing;

// ---- embedding -----------------------------------------------------------------------------------

void embedding_cuda(const Tensor& weight, const Tensor& index, const Tensor& out) {
  const int device = weight.device().index;
  require_contiguous("embedding", device, {&weight, &index, &out});
  if (weight.dim() != 2 || out.dim() != 2 || out.size(0) != index.numel() || out.size(1) != weight.size(1)) {
    throw std::logic_error("embedding on CUDA: expected weight [V, C], index [N] and out [N, C], got " +
                           shape_str(weight.shape()) + ", " + shape_str(index.shape()) + " and " +
                           shape_str(out.shape()));
  }
  DeviceGuard guard(device);
  dispatch_floating(weight.dtype(), "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index_type(index.dtype(), "embedding", [&](auto itag) {
      using I = typename decltype(itag)::type;
      launch_elements("embedding", device, out.numel(),
                      EmbeddingFn<T, I>{cptr<T>(weight), cptr<I>(index), mptr<T>(out), weight.size(1)});
    });
  });
}

void embedding_backward_cuda(const Tensor& dy, const Tensor& index, const Tensor& dweight) {
  const int device = dy.device().index;
  require_contiguous("embedding backward", device, {&dy, &index, &dweight});
  if (dy.dim() != 2 || dweight.dim() != 2 || dy.size(0) != index.numel() || dy.size(1) != dweight.size(1)) {
    throw std::logic_error("embedding backward on CUDA: expected dy [N, C], index [N] and dweight [V, C], got " +
                           shape_str(dy.shape()) + ", " + shape_str(index.shape()) + " and " +
                           shape_str(dweight.shape()));
  }
  const int64_t n = index.numel(), c = dy.size(1), v = dweight.size(0);
  if (dweight.numel() == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  if (n == 0) {  // no tokens: every sum is empty (zero bits are 0 in every floating dtype)
    SEQLAB_CUDA_CHECK(cudaMemsetAsync(dweight.raw_data(), 0, dweight.nbytes(), s));
    return;
  }
  if (n > std::numeric_limits<int32_t>::max() || v > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("embedding backward on CUDA: " + std::to_string(n) + " tokens over " +
                                std::to_string(v) + " rows exceed the 32-bit sort keys");
  }
  // Scratch, freed into the allocator's cache on return: safe, as every kernel that reads it is queued
  // earlier on the same stream as whatever uses the blocks next (runtime.h).
  Tensor keys = Tensor::empty({2, n}, DType::i32, dy.device());       // in, sorted
  Tensor positions = Tensor::empty({2, n}, DType::i32, dy.device());  // in, sorted (= order)
  Tensor start = Tensor::empty({v + 1}, DType::i32, dy.device());
  int32_t* keys_in = mptr<int32_t>(keys);
  int32_t* keys_out = keys_in + n;
  int32_t* pos_in = mptr<int32_t>(positions);
  int32_t* order = pos_in + n;

  dispatch_index_type(index.dtype(), "embedding backward", [&](auto itag) {
    using I = typename decltype(itag)::type;
    launch_elements("embedding backward sort input", device, n, SortInputFn<I>{cptr<I>(index), keys_in, pos_in});
  });
  const int end_bit = sort_end_bit(v);  // keys lie in [0, V): sort only the bits that can be set
  size_t temp_bytes = 0;
  SEQLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, order,
                                                    static_cast<int>(n), 0, end_bit, s));
  Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes / 8 + 1)}, DType::i64, dy.device());
  SEQLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_out, pos_in, order,
                                                    static_cast<int>(n), 0, end_bit, s));
  launch_elements("embedding backward buckets", device, v + 1, BucketStartFn{keys_out, mptr<int32_t>(start), n});
  dispatch_floating(dy.dtype(), "embedding backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elements("embedding backward sums", device, dweight.numel(),
                    EmbeddingGradFn<T>{cptr<T>(dy), order, mptr<int32_t>(start), mptr<T>(dweight), c});
  });
}

// ---- max over rows, and its backward -------------------------------------------------------------

// max_rows, the CPU's first argmax per row, is in reduce_rows_kernels.cuh.

void max_rows_cuda(const Tensor& x, const Tensor& out, const Tensor& index) {
  const int device = x.device().index;
  require_contiguous("max", device, {&x, &out, &index});
  if (x.dim() != 2 || out.numel() != x.size(0) || index.numel() != x.size(0) || index.dtype() != DType::i64) {
    throw std::logic_error("max on CUDA: expected x [outer, inner], out [outer] and an i64 index [outer], got " +
                           shape_str(x.shape()) + ", " + shape_str(out.shape()) + " and " + shape_str(index.shape()));
  }
  const int64_t outer = x.size(0), inner = x.size(1);
  if (outer == 0) return;
  if (inner == 0) throw std::logic_error("max on CUDA: the rows of " + shape_str(x.shape()) + " are empty");
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_rows<T><<<row_blocks(outer, device), row_threads(inner), 0, stream(device)>>>(
        cptr<T>(x), mptr<T>(out), mptr<int64_t>(index), outer, inner);
    SEQLAB_CUDA_CHECK_LAUNCH("max over rows");
  });
}

void scatter_rows_cuda(const Tensor& dy, const Tensor& index, const Tensor& dx) {
  const int device = dx.device().index;
  require_contiguous("max backward", device, {&dy, &index, &dx});
  if (dx.dim() != 2 || dy.numel() != dx.size(0) || index.numel() != dx.size(0) || index.dtype() != DType::i64 ||
      dy.dtype() != dx.dtype()) {
    throw std::logic_error("max backward on CUDA: expected dy [outer], an i64 index [outer] and dx [outer, inner], got " +
                           shape_str(dy.shape()) + ", " + shape_str(index.shape()) + " and " + shape_str(dx.shape()));
  }
  DeviceGuard guard(device);
  dispatch_floating(dx.dtype(), "max backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elements("max backward scatter", device, dx.size(0),
                    ScatterRowsFn<T>{cptr<T>(dy), cptr<int64_t>(index), mptr<T>(dx), dx.size(1)});
  });
}

// ---- cumulative sums -----------------------------------------------------------------------------

void cumsum_cuda(const Tensor& x, bool reverse, const Tensor& out) {
  const int device = x.device().index;
  require_contiguous("cumsum", device, {&x, &out});
  if (x.dim() != 3 || out.shape() != x.shape()) {
    throw std::logic_error("cumsum on CUDA: expected x and out [outer, n, inner], got " + shape_str(x.shape()) +
                           " and " + shape_str(out.shape()));
  }
  const int64_t outer = x.size(0), n = x.size(1), inner = x.size(2);
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), "cumsum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elements("cumsum", device, n == 0 ? 0 : outer * inner,
                    CumsumFn<T>{cptr<T>(x), mptr<T>(out), n, inner, reverse});
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(embedding_kernel, DeviceType::CUDA, &cuda::embedding_cuda);
SEQLAB_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::CUDA, &cuda::embedding_backward_cuda);
SEQLAB_REGISTER_KERNEL(max_rows_kernel, DeviceType::CUDA, &cuda::max_rows_cuda);
SEQLAB_REGISTER_KERNEL(scatter_rows_kernel, DeviceType::CUDA, &cuda::scatter_rows_cuda);
SEQLAB_REGISTER_KERNEL(cumsum_kernel, DeviceType::CUDA, &cuda::cumsum_cuda);
}  // namespace seqlab::kernel
