// CUDA against CPU for copies, fills, every elementwise op, where and sums, and the caching device
// allocator's accounting. Skipped where no GPU is usable.
//
// Each case draws fresh random inputs, rounds them to the dtype under test, and computes the reference
// on the CPU from the same rounded values (in f32 for bf16, which the CPU kernels do not take). Where
// a test calls a kernel slot directly, the output is first filled with NaN (a sentinel for integers),
// so an element the kernel fails to write shows up. Tolerance: |got − want| ≤ rtol · max(|want|, 1)
// with rtol 1e-5 for f32, 1e-10 for f64 and 1e-2 for bf16 (the rounding of the stored result).
// Inputs come from a fixed seed; --gtest_random_seed=N draws others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

using testing::kFloatTypes;
using testing::kGpu;
const UnaryOp kUnaryOps[] = {UnaryOp::neg,    UnaryOp::exp,  UnaryOp::log,     UnaryOp::sqrt, UnaryOp::rsqrt,
                             UnaryOp::square, UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::silu, UnaryOp::gelu,
                             UnaryOp::relu,   UnaryOp::elu,  UnaryOp::softplus};

double rtol(DType d) { return testing::gpu_rtol(d); }
using testing::reference_type;

using testing::poisoned;

// `x` rounded to `dtype` on the CPU: the input both devices compute from.
Tensor rounded(const Tensor& x, DType dtype) { return kernel::to_dtype(x, dtype); }
using testing::on_gpu;

using testing::expect_close;

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{testing::test_seed(17)};
};

bool positive_domain(UnaryOp op) { return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt; }

TEST_F(CudaVsCpu, UnaryForward) {
  for (DType dtype : kFloatTypes) {
    for (UnaryOp op : kUnaryOps) {
      const Shape shape{37, 129};
      Tensor x =
          positive_domain(op) ? Tensor::rand(shape, gen_, dtype, 0.2, 3.0) : Tensor::randn(shape, gen_, dtype, 2.0);
      Tensor want = kernel::unary(op, rounded(x, reference_type(dtype)), 0.7);
      Tensor got = poisoned(shape, dtype);
      kernel::unary_kernel(kGpu, op, on_gpu(x), 0.7, got);
      expect_close(got, want, rtol(dtype), std::string(kernel::unary_name(op)) + " " + dtype_name(dtype));
    }
  }
}

TEST_F(CudaVsCpu, UnaryBackward) {
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    for (UnaryOp op : kUnaryOps) {
      const Shape shape{5, 211};
      Tensor x =
          positive_domain(op) ? Tensor::rand(shape, gen_, dtype, 0.2, 3.0) : Tensor::randn(shape, gen_, dtype, 2.0);
      Tensor dy = Tensor::randn(shape, gen_, dtype);
      Tensor y = rounded(kernel::unary(op, rounded(x, ref), 0.7), dtype);  // y as the forward stored it
      Tensor want = kernel::unary_backward(op, rounded(dy, ref), rounded(x, ref), rounded(y, ref), 0.7);
      Tensor got = poisoned(shape, dtype);
      kernel::unary_backward_kernel(kGpu, op, on_gpu(dy), on_gpu(x), on_gpu(y), 0.7, got);
      expect_close(got, want, rtol(dtype), std::string(kernel::unary_name(op)) + " backward " + dtype_name(dtype));
    }
  }
}

TEST_F(CudaVsCpu, BinaryWithBroadcastingAndStridedInputs) {
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
      const std::string what = std::string(kernel::binary_name(op)) + " " + dtype_name(dtype);
      // Both operands broadcast: [2, 3, 1, 5] op [3, 4, 1] -> [2, 3, 4, 5].
      Tensor a = Tensor::randn({2, 3, 1, 5}, gen_, dtype);
      Tensor b = Tensor::rand({3, 4, 1}, gen_, dtype, 0.5, 2.0);
      const Shape shape{2, 3, 4, 5};
      Tensor want = kernel::binary(op, rounded(a, ref), rounded(b, ref));
      Tensor got = poisoned(shape, dtype);
      kernel::binary_kernel(kGpu, op, kernel::expand(on_gpu(a), shape), kernel::expand(on_gpu(b), shape), got);
      expect_close(got, want, rtol(dtype), what + " broadcast");
      expect_close(kernel::binary(op, on_gpu(a), on_gpu(b)), want, rtol(dtype), what + " through binary()");
      // A transposed operand against a row vector: [7, 9]ᵀ op [7].
      Tensor c = Tensor::randn({9, 7}, gen_, dtype);
      Tensor r = Tensor::rand({7}, gen_, dtype, 0.5, 2.0);
      Tensor want_t =
          kernel::binary(op, kernel::transpose(rounded(c, ref), 0, 1), kernel::unsqueeze(rounded(r, ref), 1));
      Tensor got_t = kernel::binary(op, kernel::transpose(on_gpu(c), 0, 1), kernel::unsqueeze(on_gpu(r), 1));
      expect_close(got_t, want_t, rtol(dtype), what + " transposed");
    }
  }
}

TEST_F(CudaVsCpu, ScalarOps) {
  for (DType dtype : kFloatTypes) {
    for (ScalarOp op : {ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv}) {
      Tensor x = Tensor::rand({1000}, gen_, dtype, 0.5, 2.0);
      Tensor want = kernel::scalar_op(op, rounded(x, reference_type(dtype)), 1.7);
      Tensor got = poisoned({1000}, dtype);
      kernel::scalar_kernel(kGpu, op, on_gpu(x), 1.7, got);
      expect_close(got, want, rtol(dtype),
                   std::string("scalar op ") + std::to_string(static_cast<int>(op)) + " " + dtype_name(dtype));
    }
  }
}

TEST_F(CudaVsCpu, WhereBroadcastsAllThree) {
  for (DType dtype : kFloatTypes) {
    for (DType cond_type : {DType::f32, DType::i64, DType::bf16}) {
      const DType ref = reference_type(dtype);
      std::vector<double> picks;  // about half zeros; the rest nonzero of either sign
      for (int i = 0; i < 8; ++i) picks.push_back(gen_.uniform() < 0.5 ? 0.0 : gen_.uniform() < 0.5 ? 1.0 : -2.0);
      Tensor cond = Tensor::from_vector(picks, {2, 1, 4}, cond_type);
      Tensor a = Tensor::randn({3, 4}, gen_, dtype), b = Tensor::randn({2, 3, 1}, gen_, dtype);
      const Shape shape{2, 3, 4};
      Tensor want = kernel::where(cond, rounded(a, ref), rounded(b, ref));
      Tensor got = poisoned(shape, dtype);
      Tensor cg = on_gpu(cond);
      kernel::where_kernel(kGpu, kernel::expand(cg, shape), kernel::expand(on_gpu(a), shape),
                           kernel::expand(on_gpu(b), shape), got);
      expect_close(got, want, rtol(dtype),
                   std::string("where ") + dtype_name(dtype) + " cond " + dtype_name(cond_type));
    }
  }
}

TEST_F(CudaVsCpu, CopiesOfStridedViewsAreExact) {
  for (DType dtype : kFloatTypes) {
    Tensor x = Tensor::randn({4, 6, 5}, gen_, dtype);
    Tensor xg = on_gpu(x);
    // A permuted source into a contiguous destination.
    Tensor got = poisoned({5, 4, 6}, dtype);
    kernel::copy_kernel(kGpu, got, kernel::permute(xg, {2, 0, 1}));
    expect_close(got, kernel::contiguous(kernel::permute(x, {2, 0, 1})), 0.0,
                 std::string("permute ") + dtype_name(dtype));
    // A narrowed (offset) source into a transposed destination; the rest of the destination untouched.
    Tensor dst = poisoned({3, 4, 6}, dtype);
    kernel::copy_kernel(kGpu, kernel::permute(dst, {1, 2, 0}), kernel::narrow(xg, 2, 1, 3));
    expect_close(dst, kernel::contiguous(kernel::permute(kernel::narrow(x, 2, 1, 3), {2, 0, 1})), 0.0,
                 std::string("into a transposed view ") + dtype_name(dtype));
    // Ten dimensions (more than the kernel's eight) that merge into one, converting.
    const DType other = dtype == DType::f32 ? DType::f64 : DType::f32;
    Tensor many = Tensor::randn(Shape(10, 2), gen_, dtype);
    Tensor converted = poisoned(Shape(10, 2), other);
    kernel::copy_kernel(kGpu, converted, on_gpu(many));
    expect_close(converted, kernel::to_dtype(many, other), 0.0, std::string("ten dimensions ") + dtype_name(dtype));
  }
}

TEST_F(CudaVsCpu, DtypeConversionsMatchTheCpu) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Halfway cases of f32 -> bf16 (ties to even), signed zero, infinities, NaN (its payload may differ),
  // then random values. Everything else must agree exactly.
  std::vector<double> values{1.0 + 1.0 / 256, 1.0 + 3.0 / 256, -1.0 - 1.0 / 256, -0.0, inf, -inf, nan};
  Tensor r = Tensor::randn({300}, gen_, DType::f64, 50.0);
  for (double v : r.to_doubles()) values.push_back(v);
  const Shape shape{static_cast<int64_t>(values.size())};
  const std::pair<DType, DType> pairs[] = {{DType::f32, DType::bf16}, {DType::f64, DType::bf16},
                                           {DType::bf16, DType::f32}, {DType::f32, DType::f64},
                                           {DType::f64, DType::f32},  {DType::bf16, DType::f64}};
  for (auto [from, to] : pairs) {
    Tensor x = Tensor::from_vector(values, shape, from);
    Tensor got = poisoned(shape, to);
    kernel::copy_kernel(kGpu, got, on_gpu(x));
    expect_close(got, kernel::to_dtype(x, to), 0.0, std::string(dtype_name(from)) + " -> " + dtype_name(to));
  }
  // Integers: finite values only (float -> int of NaN or out-of-range values is undefined).
  std::vector<double> finite(values.begin() + 7, values.end());
  const Shape fshape{static_cast<int64_t>(finite.size())};
  const std::pair<DType, DType> int_pairs[] = {{DType::f32, DType::i32},  {DType::f64, DType::i64},
                                               {DType::bf16, DType::i32}, {DType::i32, DType::f32},
                                               {DType::i64, DType::bf16}, {DType::i64, DType::i32}};
  for (auto [from, to] : int_pairs) {
    Tensor x = kernel::to_dtype(Tensor::from_vector(finite, fshape, DType::f64), from);
    Tensor got = poisoned(fshape, to);
    kernel::copy_kernel(kGpu, got, on_gpu(x));
    expect_close(got, kernel::to_dtype(x, to), 0.0, std::string(dtype_name(from)) + " -> " + dtype_name(to));
  }
}

TEST_F(CudaVsCpu, FillWritesTheCpusBits) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    for (double v : {0.0, 2.75, -3.0}) {
      expect_close(Tensor::full({3, 333}, v, dtype, kGpu), Tensor::full({3, 333}, v, dtype), 0.0,
                   std::string("fill ") + dtype_name(dtype) + " " + std::to_string(v));
    }
  }
}

TEST_F(CudaVsCpu, SumsAndSumTo) {
  for (DType dtype : kFloatTypes) {
    const DType ref = reference_type(dtype);
    const std::string name = dtype_name(dtype);
    // Mean 0.5, so row sums grow with their length instead of cancelling.
    Tensor x = Tensor::rand({7, 300, 5}, gen_, dtype, -1.0, 2.0);
    Tensor xr = rounded(x, ref), xg = on_gpu(x);
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{1}, {0, 2}, {2}, {}}) {
      expect_close(kernel::sum(xg, dims, true), kernel::sum(xr, dims, true), rtol(dtype),
                   "sum " + name + " over " + shape_str(dims));
    }
    // The slot directly, long rows (one block per row) and short rows (one thread per row).
    for (int64_t inner : {int64_t{100003}, int64_t{3}}) {
      Tensor rows = Tensor::rand({4, inner}, gen_, dtype, -1.0, 2.0);
      Tensor got = poisoned({4}, dtype);
      kernel::sum_rows_kernel(kGpu, on_gpu(rows), got);
      expect_close(got, kernel::sum(rounded(rows, ref), {1}, false), rtol(dtype), "sum_rows " + name);
    }
    Tensor empty_rows = poisoned({3}, dtype);
    kernel::sum_rows_kernel(kGpu, Tensor::empty({3, 0}, dtype, kGpu), empty_rows);
    expect_close(empty_rows, Tensor::zeros({3}), 0.0, "sum of empty rows " + name);
    // The backward of broadcasting.
    for (const Shape& to : {Shape{7, 1, 5}, Shape{300, 1}, Shape{5}, Shape{1}}) {
      expect_close(kernel::sum_to(xg, to), kernel::sum_to(xr, to), rtol(dtype), "sum_to " + shape_str(to) + " " + name);
    }
  }
}

TEST_F(CudaVsCpu, AllocatorCachesAndAccounts) {
  Allocator& alloc = allocator_for(kGpu);
  const size_t nbytes = (41 << 20) + 123 * 4;  // a size class no other test uses
  const MemoryStats before = alloc.stats();
  {
    Tensor t = Tensor::empty({static_cast<int64_t>(nbytes / 4)}, DType::f32, kGpu);
    EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes + static_cast<int64_t>(nbytes));
    EXPECT_GE(alloc.stats().peak_bytes, before.live_bytes + static_cast<int64_t>(nbytes));
    EXPECT_GE(alloc.stats().reserved_bytes, alloc.stats().live_bytes);
  }
  const MemoryStats after_first = alloc.stats();
  EXPECT_EQ(after_first.live_bytes, before.live_bytes);
  EXPECT_GE(after_first.reserved_bytes, before.reserved_bytes + static_cast<int64_t>(nbytes));  // kept in the cache
  {
    Tensor t = Tensor::full({static_cast<int64_t>(nbytes / 4)}, 1.0, DType::f32, kGpu);
    EXPECT_EQ(alloc.stats().reserved_bytes, after_first.reserved_bytes) << "the second allocation called cudaMalloc";
    EXPECT_EQ(alloc.stats().allocations, after_first.allocations + 1);
    // Every element written: the count is below 2^24, so the f32 sum is exact.
    EXPECT_EQ(kernel::sum(t, {}, false).item(), static_cast<double>(nbytes / 4));
  }
  {
    // A slightly smaller request falls in the same size class and reuses the block too.
    Tensor t = Tensor::empty({static_cast<int64_t>(nbytes / 4) - 1000}, DType::f32, kGpu);
    EXPECT_EQ(alloc.stats().reserved_bytes, after_first.reserved_bytes) << "a same-class allocation called cudaMalloc";
  }
  EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes);
}

}  // namespace
}  // namespace seqlab
