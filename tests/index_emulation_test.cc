// The index CUDA kernels of src/cuda/index.cu (the functors of index_kernels.cuh: the embedding gather;
// the embedding backward's sort input, bucket starts and per-row sums; the max backward's scatter; the
// cumulative sums, forward and reverse), run on the CPU against the CPU slots of
// src/tensor/cpu/{embedding,reduce}.cpp. No GPU needed: this is the check these kernels get on every
// build until a GPU runs the GPU tests. (max_rows itself is in rows_emulation_test.)
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA
// thread, an emulated GPU of one multiprocessor, so a grid stops at 32 blocks of 256 threads and the
// cases of more than 8192 items take the grid-stride loop's second stride). Each launch mirrors its
// launcher in index.cu: the same early returns, the same functor arguments and grid. The one step that
// is not emulated is the embedding backward's CUB radix sort (DeviceRadixSort::SortPairs, a library
// kernel whose source is not ours): the test produces its output on the host with std::stable_sort of
// the (key, position) pairs by the key's bits [0, sort_end_bit(V)) — the bits the launcher asks CUB to
// sort, so a bit range too narrow for V fails here as it would on the GPU. Every buffer a kernel writes
// starts as NaN (a sentinel for integers) between guard bands; the scatter's output starts as zeros
// between guard bands, as its caller zeroes it.
//
// Comparison: bit for bit, except the embedding backward in f32 and bf16: the CPU sums a row's tokens
// in f64, the kernel in f32 (same order), so there gpu_rtol (1e-5 f32, 1e-2 bf16); in f64 both sum in
// f64 in token order, bit for bit. The reference for bf16 is the CPU slot, computing in f32 on the same
// bf16 values and rounding its outputs as the kernels do.
// What this cannot check: nvcc, CUB's sort, the hardware's memory system, performance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/index_kernels.cuh"

namespace seqlab {
namespace {

namespace ix = cuda::indexing;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

// fn(I{}, dtype) for each index type.
template <class Fn>
void for_each_index_type(Fn&& fn) {
  fn(int32_t{}, DType::i32);
  fn(int64_t{}, DType::i64);
}

// index.cu launch_elements: f(i) for i in [0, n) in a grid-stride loop, nothing for n = 0.
template <class F>
void launch_elements(int64_t n, const F& f) {
  if (n == 0) return;
  emu::launch(dim3(cuda::grid_stride_blocks(n, kSMs)), dim3(cuda::kThreads), 0, cuda::grid_stride_loop<F>, n, f);
}

// n indices in [0, v) of `dtype`, with the first and last row among them where n allows.
Tensor random_indices(int64_t n, int64_t v, DType dtype, Generator& gen) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t& i : idx) i = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(v));
  if (n > 0) idx[0] = v - 1;
  if (n > 1) idx[static_cast<size_t>(n) - 1] = 0;
  return Tensor::from_indices(idx, {n}, dtype);
}

std::string shape_name(const char* op, DType dtype, DType itype, int64_t v, int64_t c, int64_t n) {
  return std::string(op) + " " + dtype_name(dtype) + " index " + dtype_name(itype) + " V=" + std::to_string(v) +
         " C=" + std::to_string(c) + " N=" + std::to_string(n);
}

class IndexEmulation : public ::testing::Test {
 protected:
  Generator gen_{testing::test_seed(89)};
};

struct EmbeddingCase {
  int64_t v, c, n;
};
// One row; fewer tokens than rows; a width that is no multiple of a warp; more than the emulated grid
// covers (300 · 64 = 19200 outputs); V above 256 (a 9-bit sort); many tokens on few rows; no tokens.
const EmbeddingCase kEmbeddingCases[] = {{1, 3, 5},      {11, 7, 37},  {50, 64, 300},
                                         {300, 16, 500}, {7, 1, 1000}, {5, 4, 0}};

// ---- embedding gather ------------------------------------------------------------------------------

TEST_F(IndexEmulation, EmbeddingGather) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for_each_index_type([&](auto itag, DType itype) {
      using I = decltype(itag);
      for (const EmbeddingCase& k : kEmbeddingCases) {
        const std::string what = shape_name("embedding", dtype, itype, k.v, k.c, k.n);
        const Tensor weight = Tensor::randn({k.v, k.c}, gen_, dtype);
        const Tensor index = random_indices(k.n, k.v, itype, gen_);
        GuardedOutput got({k.n, k.c}, dtype);
        // index.cu embedding_cuda
        launch_elements(k.n * k.c, ix::EmbeddingFn<T, I>{weight.data<T>(), index.data<I>(), got.data<T>(), k.c});
        Tensor want = Tensor::empty({k.n, k.c}, dtype, kCpu);
        kernel::embedding_kernel(kCpu, weight, index, want);
        expect_output(got, want, 0.0, what);
      }
    });
  });
}

// ---- embedding backward ----------------------------------------------------------------------------

TEST_F(IndexEmulation, SortEndBitCoversTheKeys) {
  for (int64_t v : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{256}, int64_t{257},
                    int64_t{50257}, int64_t{1} << 30, (int64_t{1} << 31) - 1}) {
    const int bits = ix::sort_end_bit(v);
    EXPECT_GE(int64_t{1} << bits, v) << "V=" << v << ": key V − 1 has a bit at or above " << bits;
    EXPECT_TRUE(bits == 1 || (int64_t{1} << (bits - 1)) < v)
        << "V=" << v << ": " << bits << " bits sort more than needed";
  }
}

// index.cu embedding_backward_cuda, its CUB sort replaced by std::stable_sort (see the top).
template <class T, class I>
void embedding_backward(const Tensor& dy, const Tensor& index, GuardedOutput& dweight, int64_t v,
                        const std::string& what) {
  const int64_t n = index.numel(), c = dy.size(1);
  if (v * c == 0) return;
  if (n == 0) {  // no tokens: the launcher zeroes dweight with a memset
    std::memset(static_cast<void*>(dweight.data<T>()), 0, static_cast<size_t>(v * c) * sizeof(T));
    return;
  }
  GuardedOutput keys({n}, DType::i32), positions({n}, DType::i32), start({v + 1}, DType::i32);
  launch_elements(n, ix::SortInputFn<I>{index.data<I>(), keys.data<int32_t>(), positions.data<int32_t>()});
  expect_output(keys, kernel::to_dtype(index, DType::i32), 0.0, what + " sort keys");
  expect_output(positions, Tensor::arange(n, DType::i32), 0.0, what + " sort positions");

  // DeviceRadixSort::SortPairs(keys → sorted, positions → order) over bits [0, end_bit): stable.
  const int end_bit = ix::sort_end_bit(v);
  const int32_t mask = static_cast<int32_t>((int64_t{1} << end_bit) - 1);
  std::vector<int32_t> order(static_cast<size_t>(n)), sorted(static_cast<size_t>(n));
  const int32_t* k_in = keys.data<int32_t>();
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return (k_in[a] & mask) < (k_in[b] & mask); });
  for (size_t i = 0; i < order.size(); ++i) sorted[i] = k_in[order[i]];

  launch_elements(v + 1, ix::BucketStartFn{sorted.data(), start.data<int32_t>(), n});
  std::vector<double> want_start(static_cast<size_t>(v + 1));  // start[u] = #{t : index[t] < u}
  const std::vector<int64_t> idx = index.to_indices();
  for (int64_t u = 0; u <= v; ++u) {
    want_start[static_cast<size_t>(u)] =
        static_cast<double>(std::count_if(idx.begin(), idx.end(), [&](int64_t i) { return i < u; }));
  }
  expect_output(start, Tensor::from_vector(want_start, {v + 1}, DType::i32), 0.0, what + " bucket starts");

  launch_elements(v * c,
                  ix::EmbeddingGradFn<T>{dy.data<T>(), order.data(), start.data<int32_t>(), dweight.data<T>(), c});
}

TEST_F(IndexEmulation, EmbeddingBackward) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for_each_index_type([&](auto itag, DType itype) {
      using I = decltype(itag);
      for (const EmbeddingCase& k : kEmbeddingCases) {
        const std::string what = shape_name("embedding backward", dtype, itype, k.v, k.c, k.n);
        const Tensor dy = Tensor::randn({k.n, k.c}, gen_, dtype);
        const Tensor index = random_indices(k.n, k.v, itype, gen_);
        GuardedOutput got({k.v, k.c}, dtype);
        embedding_backward<T, I>(dy, index, got, k.v, what);
        Tensor want = Tensor::empty({k.v, k.c}, dtype, kCpu);
        kernel::embedding_backward_kernel(kCpu, dy, index, want);
        // f32 and bf16 sum in f32 here, in f64 on the CPU; f64 sums alike on both.
        expect_output(got, want, dtype == DType::f64 ? 0.0 : testing::gpu_rtol(dtype), what);
      }
    });
  });
}

// ---- the max backward's scatter --------------------------------------------------------------------

TEST_F(IndexEmulation, MaxBackwardScatter) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (int64_t outer : {int64_t{1}, int64_t{40}, int64_t{9000}}) {
      for (int64_t inner : {int64_t{1}, int64_t{5}, int64_t{33}}) {
        const std::string what = std::string("max backward ") + dtype_name(dtype) + " [" + std::to_string(outer) +
                                 ", " + std::to_string(inner) + "]";
        const Tensor dy = Tensor::randn({outer}, gen_, dtype);
        const Tensor index = random_indices(outer, inner, DType::i64, gen_);
        GuardedOutput got({outer, inner}, dtype);
        std::memset(static_cast<void*>(got.data<T>()), 0,
                    static_cast<size_t>(outer * inner) * sizeof(T));  // the caller zeroes dx
        // index.cu scatter_rows_cuda
        launch_elements(outer, ix::ScatterRowsFn<T>{dy.data<T>(), index.data<int64_t>(), got.data<T>(), inner});
        Tensor want = Tensor::zeros({outer, inner}, dtype, kCpu);
        kernel::scatter_rows_kernel(kCpu, dy, index, want);
        expect_output(got, want, 0.0, what);
      }
    }
  });
}

// ---- cumulative sums -------------------------------------------------------------------------------

TEST_F(IndexEmulation, CumsumForwardAndReverse) {
  // [outer, n, inner]: single element; a few of each; one column (inner 1); a wide row over two
  // blocks; more columns than the emulated grid covers (9000); an empty scan dimension.
  const Shape shapes[] = {{1, 1, 1}, {2, 5, 3}, {3, 17, 1}, {1, 40, 300}, {90, 3, 100}, {2, 0, 4}};
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (const Shape& shape : shapes) {
      for (bool reverse : {false, true}) {
        const std::string what =
            std::string(reverse ? "reverse " : "") + "cumsum " + dtype_name(dtype) + " " + shape_str(shape);
        const Tensor x = Tensor::randn(shape, gen_, dtype);
        const int64_t outer = shape[0], n = shape[1], inner = shape[2];
        GuardedOutput got(shape, dtype);
        // index.cu cumsum_cuda
        launch_elements(n == 0 ? 0 : outer * inner, ix::CumsumFn<T>{x.data<T>(), got.data<T>(), n, inner, reverse});
        Tensor want = Tensor::empty(shape, dtype, kCpu);
        kernel::cumsum_kernel(kCpu, x, reverse, want);
        expect_output(got, want, 0.0, what);
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
