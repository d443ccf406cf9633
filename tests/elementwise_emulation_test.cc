// The elementwise CUDA kernels of src/cuda/elementwise.cu (the functors of elementwise_kernels.cuh: the
// strided, converting copy; fill; every unary op and its backward; the binary ops with broadcasting;
// the scalar ops; where), run on the CPU against the CPU slots of src/tensor/cpu/{copy,elementwise}.cpp.
// No GPU needed: this is the check these kernels get on every build until a GPU runs
// tests/elementwise_gpu_test.cc. (The row sums of the same file are in rows_emulation_test.)
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA
// thread, an emulated GPU of one multiprocessor, so a grid stops at 32 blocks of 256 threads and the
// cases of more than 8192 elements take the grid-stride loop's second stride). Each launch mirrors its
// launcher in elementwise.cu: the same early returns (the copy's memcpy when nothing is strided or
// converted, the fill's memset for zero bits, nothing for n = 0), the same StridedOffsets built by
// the same strided_offsets, the same functor arguments and grid. Outputs start as NaN (a sentinel for
// integers) between guard bands; a strided destination is a view into a poisoned buffer, so an
// element outside the view that the copy writes shows up too.
//
// Views: contiguous, transposed, sliced (rows with gaps, an offset), broadcast (stride 0, whole
// dimensions and a column), 0-d, size-1 dimensions with arbitrary strides, the 8 unmergeable
// dimensions StridedOffsets holds (and the error for 9), empty. Copies: every pair of the five dtypes.
//
// Comparison: bit for bit (tolerance 0) for what moves or converts values without arithmetic (copy,
// fill, where), the binary and scalar ops and most unary ops: the functors evaluate the same formulas
// of elementwise_math.h in the same precision, with the same roundings. The exceptions use gpu_rtol
// (1e-5 f32, 1e-10 f64, 1e-2 bf16): sigmoid, silu, gelu and softplus forward, tanh, silu, gelu and softplus
// backward, because the CPU library is built with -march=x86-64-v3, where GCC contracts a·b + c into
// FMAs (exp_vec's polynomial, 1 − y², ...), while this test is built for the baseline without FMAs (as
// measured: those ops differ in the last bits of a few elements, the others in none). A GPU contracts
// too, in its own places, and nvcc's device code calls expf where the host calls exp_vec (see
// elementwise_math.h), so on a GPU more ops differ in their last bits: the GPU test uses gpu_rtol. The reference for
// bf16 is the CPU slot, which computes in f32 on the same bf16 values and rounds its outputs as the kernels do. What
// this cannot check: nvcc itself, the GPU's libm, the hardware's memory system, performance.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/elementwise_kernels.cuh"

namespace seqlab {
namespace {

namespace ew = cuda::elementwise;
using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;
using testing::expect_output;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

const DType kAllTypes[] = {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64};
const UnaryOp kUnaryOps[] = {UnaryOp::neg,    UnaryOp::exp,  UnaryOp::log,     UnaryOp::sqrt, UnaryOp::rsqrt,
                             UnaryOp::square, UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::silu, UnaryOp::gelu,
                             UnaryOp::relu,   UnaryOp::elu,  UnaryOp::softplus};
const char* const kScalarNames[] = {"add", "mul", "pow", "rsub", "rdiv"};  // by ScalarOp's value
const BinaryOp kBinaryOps[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div};

// fn(T{}) with T the kernels' element type of d (bf16_t for bf16).
template <class Fn>
void with_type(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::bf16:
      return fn(cuda::bf16_t{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
  }
}

// elementwise.cu launch: f(i) for i in [0, n) in a grid-stride loop, nothing for n = 0.
template <class F>
void launch_elements(int64_t n, const F& f) {
  if (n == 0) return;
  emu::launch(dim3(cuda::grid_stride_blocks(n, kSMs)), dim3(cuda::kThreads), 0, cuda::grid_stride_loop<F>, n, f);
}

// A view: shape and strides (elements) at `offset` into a base buffer of `base` elements.
struct Layout {
  const char* name;
  int64_t base;
  Shape shape, strides;
  int64_t offset = 0;
};
Tensor view_of(const Tensor& buffer, const Layout& l) {
  return Tensor::make_view(buffer.storage(), l.shape, l.strides, buffer.offset() + l.offset, buffer.dtype());
}

// Source views of the copy: each a view over a buffer of `base` elements.
const Layout kViews[] = {
    {"contiguous [2, 3, 4]", 24, {2, 3, 4}, {12, 4, 1}},
    {"transposed [3, 5, 4] of [4, 5, 3]", 60, {3, 5, 4}, {1, 3, 15}},
    {"sliced [3, 4] of [6, 7] at (1, 2)", 42, {3, 4}, {7, 1}, 9},
    {"rows with gaps [2, 3, 5] of [2, 4, 5] at row 1", 40, {2, 3, 5}, {20, 5, 1}, 5},
    {"[5] broadcast over [3, 4, 5]", 5, {3, 4, 5}, {0, 0, 1}},
    {"column [3, 1] broadcast over [3, 4]", 3, {3, 4}, {1, 0}},
    {"one element broadcast over [2, 3]", 1, {2, 3}, {0, 0}},
    {"0-d", 1, {}, {}},
    {"size-1 dims [1, 4, 1, 3] with odd strides", 12, {1, 4, 1, 3}, {99, 3, 77, 1}},
    {"8 unmergeable dims (reversed [2]^8)", 256, {2, 2, 2, 2, 2, 2, 2, 2}, {1, 2, 4, 8, 16, 32, 64, 128}},
    {"empty [0, 3]", 1, {0, 3}, {3, 1}},
    {"transposed [129, 97] of [97, 129] (> 8192 elements)", 97 * 129, {129, 97}, {1, 129}},
};

// Random values in [-100, 100) as `dtype` (integers truncated), `n` of them.
Tensor random_values(int64_t n, DType dtype, Generator& gen) {
  return kernel::to_dtype(Tensor::rand({n}, gen, DType::f64, -100.0, 100.0), dtype);
}

class ElementwiseEmulation : public ::testing::Test {
 protected:
  Generator gen_{testing::test_seed(71)};
};

// ---- strided addressing ------------------------------------------------------------------------------

// The merged dimensions (innermost first) and strides strided_offsets builds.
TEST_F(ElementwiseEmulation, StridedOffsetsMergeDimensions) {
  struct Case {
    const char* name;
    Shape shape, a, b;
    std::vector<int64_t> size, stride_a, stride_b;
  };
  const Case cases[] = {
      {"both contiguous: one dim", {2, 3, 4}, {12, 4, 1}, {12, 4, 1}, {24}, {1}, {1}},
      {"bias over [B, T, C]: two", {2, 3, 4}, {12, 4, 1}, {0, 0, 1}, {4, 6}, {1, 4}, {1, 0}},
      {"column broadcast", {3, 4}, {4, 1}, {1, 0}, {4, 3}, {1, 4}, {0, 1}},
      {"size-1 dims dropped", {1, 4, 1, 3}, {99, 3, 77, 1}, {12, 3, 3, 1}, {12}, {1}, {1}},
      {"0-d", {}, {}, {}, {}, {}, {}},
      {"transposed", {3, 5}, {1, 3}, {5, 1}, {5, 3}, {3, 1}, {1, 5}},
      {"rows with gaps", {2, 3, 5}, {20, 5, 1}, {15, 5, 1}, {15, 2}, {1, 20}, {1, 15}},
  };
  for (const Case& c : cases) {
    Tensor ta = Tensor::make_view(Tensor::zeros({64}).storage(), c.shape, c.a, 0, DType::f32);
    Tensor tb = Tensor::make_view(Tensor::zeros({64}).storage(), c.shape, c.b, 0, DType::f32);
    const ew::StridedOffsets<2> s = ew::strided_offsets<2>(c.shape, {&ta, &tb}, "test");
    ASSERT_EQ(s.ndim, static_cast<int>(c.size.size())) << c.name;
    for (int d = 0; d < s.ndim; ++d) {
      EXPECT_EQ(s.size[d], c.size[d]) << c.name << " dim " << d;
      EXPECT_EQ(s.stride[0][d], c.stride_a[d]) << c.name << " dim " << d;
      EXPECT_EQ(s.stride[1][d], c.stride_b[d]) << c.name << " dim " << d;
    }
    // Every linear index maps to the offsets the strides give.
    for (int64_t i = 0; i < shape_numel(c.shape); ++i) {
      int64_t off[2], want_a = 0, want_b = 0, rest = i;
      for (size_t d = c.shape.size(); d-- > 0;) {
        const int64_t digit = rest % c.shape[d];
        rest /= c.shape[d];
        want_a += digit * c.a[d];
        want_b += digit * c.b[d];
      }
      s(i, off);
      EXPECT_EQ(off[0], want_a) << c.name << " index " << i;
      EXPECT_EQ(off[1], want_b) << c.name << " index " << i;
    }
  }
}

TEST_F(ElementwiseEmulation, StridedOffsetsRejectNineDimensions) {
  const Shape shape(9, 2), reversed{1, 2, 4, 8, 16, 32, 64, 128, 256};
  Tensor src = Tensor::make_view(Tensor::zeros({512}).storage(), shape, reversed, 0, DType::f32);
  Tensor dst = Tensor::zeros(shape);
  try {
    ew::strided_offsets<2>(shape, {&dst, &src}, "copy");
    FAIL() << "expected an error for 9 unmergeable dimensions";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "copy on CUDA: the strided layout of shape [2, 2, 2, 2, 2, 2, 2, 2, 2] needs more than 8 dimensions");
  }
}

// ---- copy ------------------------------------------------------------------------------------------

// elementwise.cu copy_cuda into dst (a view of some buffer) from src.
void copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.nbytes() > 0) std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  const ew::StridedOffsets<2> at = ew::strided_offsets<2>(dst.shape(), {&dst, &src}, "copy");
  with_type(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    with_type(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      launch_elements(dst.numel(),
                      ew::CopyFn<D, S>{static_cast<D*>(dst.raw_data()), static_cast<const S*>(src.raw_data()), at});
    });
  });
}

// Copies src into a contiguous, poisoned destination of `dst_dtype` and compares with the CPU's copy.
void check_copy(const Tensor& src, DType dst_dtype, const std::string& what) {
  GuardedOutput got(src.shape(), dst_dtype);
  copy(got.value(), src);
  Tensor want = Tensor::empty(src.shape(), dst_dtype, kCpu);
  kernel::copy_kernel(kCpu, want, src);
  expect_output(got, want, 0.0, what);
}

TEST_F(ElementwiseEmulation, CopyEveryViewAndDtypePair) {
  for (const Layout& l : kViews) {
    for (DType from : kAllTypes) {
      const Tensor src = view_of(random_values(l.base, from, gen_), l);
      for (DType to : kAllTypes) {
        check_copy(src, to, std::string("copy ") + dtype_name(from) + " → " + dtype_name(to) + ", " + l.name);
      }
    }
  }
}

// Integers beyond f32's 24-bit mantissa (i64 up to ±2^40, i32 up to ±(2^31 − 1)), transposed, into
// every floating dtype: rounded once to f32 or f64, and to bf16 through f32, as convert_scalar does.
TEST_F(ElementwiseEmulation, CopyLargeIntegersToFloating) {
  const Layout l{"transposed [7, 9] of [9, 7]", 63, {7, 9}, {1, 7}};
  for (DType from : {DType::i32, DType::i64}) {
    const double range = from == DType::i32 ? 2147483647.0 : 1099511627776.0;
    std::vector<double> v(63);
    for (double& e : v) e = std::trunc((2.0 * gen_.uniform() - 1.0) * range);
    v[0] = range;
    v[1] = -range;
    v[2] = 16777217.0;  // 2^24 + 1: the first integer f32 rounds
    const Tensor src = view_of(Tensor::from_vector(v, {63}, from), l);
    for (DType to : {DType::f32, DType::f64, DType::bf16}) {
      check_copy(src, to, std::string("copy large ") + dtype_name(from) + " → " + dtype_name(to));
    }
  }
}

// Destinations that are views: a transpose (the source contiguous, or itself transposed back) and a
// slice, each inside a poisoned buffer whose other elements must stay poisoned.
TEST_F(ElementwiseEmulation, CopyIntoStridedDestinations) {
  const Layout dsts[] = {
      {"transposed [3, 5, 4] of [4, 5, 3]", 60, {3, 5, 4}, {1, 3, 15}},
      {"sliced [3, 5, 4] of [4, 6, 4] at (1, 1)", 96, {3, 5, 4}, {24, 4, 1}, 28},
      {"[3, 5, 4] every other element of [3, 5, 8]", 120, {3, 5, 4}, {40, 8, 2}, 1},
  };
  const Layout srcs[] = {
      {"contiguous", 60, {3, 5, 4}, {20, 4, 1}},
      {"transposed", 60, {3, 5, 4}, {1, 3, 15}},
      {"[4] broadcast", 4, {3, 5, 4}, {0, 0, 1}},
  };
  for (const Layout& d : dsts) {
    for (const Layout& s : srcs) {
      for (DType from : kAllTypes) {
        for (DType to : kAllTypes) {
          const std::string what =
              std::string("copy ") + dtype_name(from) + " " + s.name + " → " + dtype_name(to) + " " + d.name;
          const Tensor src = view_of(random_values(s.base, from, gen_), s);
          GuardedOutput got({d.base}, to);
          copy(view_of(got.value(), d), src);
          Tensor want = testing::poisoned({d.base}, to, kCpu);
          kernel::copy_kernel(kCpu, view_of(want, d), src);
          expect_output(got, want, 0.0, what);
        }
      }
    }
  }
}

// ---- fill ------------------------------------------------------------------------------------------

// elementwise.cu fill_cuda: zero bits by a memset, anything else by the kernel.
template <class T>
void fill(const Tensor& dst, double value) {
  using U = ew::fill_bits_t<T>;
  const U bits = ew::fill_bits<T>(value);
  if (bits == 0 && dst.nbytes() > 0) {
    std::memset(dst.raw_data(), 0, dst.nbytes());
    return;
  }
  launch_elements(dst.numel(), ew::FillFn<U>{static_cast<U*>(dst.raw_data()), bits});
}

TEST_F(ElementwiseEmulation, Fill) {
  for (DType dtype : kAllTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{300}, int64_t{9000}}) {
      for (double value : {0.0, -0.0, 2.5, -7.0, 1.0 / 3.0, 1e30}) {
        if (!is_floating(dtype) && std::fabs(value) > 1e9) continue;  // no integer holds it
        const std::string what =
            std::string("fill ") + dtype_name(dtype) + " n=" + std::to_string(n) + " value=" + std::to_string(value);
        GuardedOutput got({n}, dtype);
        with_type(dtype, [&](auto tag) {
          using T = decltype(tag);
          fill<T>(got.value(), value);
        });
        Tensor want = Tensor::empty({n}, dtype, kCpu);
        kernel::fill_kernel(kCpu, want, value);
        expect_output(got, want, 0.0, what);
        if (value == -0.0 && n > 0 && is_floating(dtype)) {  // the sign bit too, not just the value
          EXPECT_TRUE(std::signbit(got.value().to_doubles()[0]) == std::signbit(value)) << what;
        }
      }
    }
  }
}

// ---- unary ops and their backward ------------------------------------------------------------------

bool positive_domain(UnaryOp op) { return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt; }
// Where the CPU library (built for x86-64-v3) contracts a·b + c into an FMA and this test (built for
// the baseline) cannot: exp_vec's and log1p_unit_vec's polynomials (sigmoid, silu, gelu, softplus;
// softplus' backward through sigmoid), and 1 − y² (tanh's backward). Everything else is bit for bit.
bool fma_in_forward(UnaryOp op) {
  return op == UnaryOp::sigmoid || op == UnaryOp::silu || op == UnaryOp::gelu || op == UnaryOp::softplus;
}
bool fma_in_backward(UnaryOp op) {
  return op == UnaryOp::tanh || op == UnaryOp::silu || op == UnaryOp::gelu || op == UnaryOp::softplus;
}

const int64_t kSizes[] = {1, 37, 9000};  // one element, part of a block, more than the 32-block grid covers
const double kAlpha = 0.7;               // elu's

// Inputs of op in its domain (its closure: 0, ±∞ and NaN too), `n` of them in `dtype`; the first few
// are edge values where n allows.
Tensor unary_input(UnaryOp op, int64_t n, DType dtype, Generator& gen) {
  std::vector<double> v =
      (positive_domain(op) ? Tensor::rand({n}, gen, DType::f64, 0.05, 4.0) : Tensor::randn({n}, gen, DType::f64, 2.5))
          .to_doubles();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> edges =
      positive_domain(op) ? std::vector<double>{1.0, 1e-3, 100.0, 0.0, inf, nan}
                          : std::vector<double>{0.0, 30.0, -30.0, -0.5, 12.0, -0.0, 100.0, -100.0, inf, -inf, nan};
  for (size_t i = 0; i < edges.size() && i < v.size(); ++i) v[i] = edges[i];
  return Tensor::from_vector(v, {n}, dtype);
}

TEST_F(ElementwiseEmulation, UnaryForwardAndBackward) {
  testing::for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    using C = cuda::compute_t<T>;
    for (UnaryOp op_value : kUnaryOps) {
      ew::with_unary(op_value, [&](auto op) {
        constexpr UnaryOp kOp = decltype(op)::value;
        for (int64_t n : kSizes) {
          const std::string what =
              std::string(kernel::unary_name(kOp)) + " " + dtype_name(dtype) + " n=" + std::to_string(n);
          const Tensor x = unary_input(kOp, n, dtype, gen_);
          GuardedOutput y({n}, dtype);
          launch_elements(n, ew::UnaryFn<T, kOp>{x.data<T>(), y.data<T>(), static_cast<C>(kAlpha)});
          Tensor y_cpu = Tensor::empty({n}, dtype, kCpu);
          kernel::unary_kernel(kCpu, kOp, x, kAlpha, y_cpu);
          expect_output(y, y_cpu, fma_in_forward(kOp) ? testing::gpu_rtol(dtype) : 0.0, what);

          // The backward from the CPU's y, so both sides see the same inputs.
          const Tensor dy = Tensor::randn({n}, gen_, dtype);
          GuardedOutput dx({n}, dtype);
          launch_elements(n, ew::UnaryBackwardFn<T, kOp>{dy.data<T>(), x.data<T>(), y_cpu.data<T>(), dx.data<T>(),
                                                         static_cast<C>(kAlpha)});
          Tensor dx_cpu = Tensor::empty({n}, dtype, kCpu);
          kernel::unary_backward_kernel(kCpu, kOp, dy, x, y_cpu, kAlpha, dx_cpu);
          expect_output(dx, dx_cpu, fma_in_backward(kOp) ? testing::gpu_rtol(dtype) : 0.0, what + " backward");
        }
      });
    }
  });
}

// ---- binary ops with broadcasting ------------------------------------------------------------------

struct BroadcastCase {
  const char* name;
  Shape out;
  Layout a, b;
};
const BroadcastCase kBroadcasts[] = {
    {"same shape", {3, 4, 5}, {"", 60, {3, 4, 5}, {20, 5, 1}}, {"", 60, {3, 4, 5}, {20, 5, 1}}},
    {"bias [8] over [2, 3, 8]", {2, 3, 8}, {"", 48, {2, 3, 8}, {24, 8, 1}}, {"", 8, {2, 3, 8}, {0, 0, 1}}},
    {"column [4, 1] · [4, 6]", {4, 6}, {"", 4, {4, 6}, {1, 0}}, {"", 24, {4, 6}, {6, 1}}},
    {"[3, 1, 5] · [1, 4, 1]", {3, 4, 5}, {"", 15, {3, 4, 5}, {5, 0, 1}}, {"", 4, {3, 4, 5}, {0, 1, 0}}},
    {"one element · [2, 3]", {2, 3}, {"", 6, {2, 3}, {3, 1}}, {"", 1, {2, 3}, {0, 0}}},
    {"0-d", {}, {"", 1, {}, {}}, {"", 1, {}, {}}},
    {"transposed · sliced", {5, 3}, {"", 15, {5, 3}, {1, 5}}, {"", 42, {5, 3}, {7, 1}, 8}},
    {"empty [0, 4]", {0, 4}, {"", 1, {0, 4}, {4, 1}}, {"", 1, {0, 4}, {0, 1}}},
    {"[129] over transposed [97, 129] (> 8192)",
     {97, 129},
     {"", 97 * 129, {97, 129}, {1, 97}},
     {"", 129, {97, 129}, {0, 1}}},
};

TEST_F(ElementwiseEmulation, BinaryWithBroadcasting) {
  testing::for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (const BroadcastCase& c : kBroadcasts) {
      const Tensor a = view_of(Tensor::randn({c.a.base}, gen_, dtype, 2.0), c.a);
      const Tensor b = view_of(Tensor::rand({c.b.base}, gen_, dtype, 0.5, 2.0), c.b);  // away from 0 for div
      for (BinaryOp op_value : kBinaryOps) {
        const std::string what = std::string(kernel::binary_name(op_value)) + " " + dtype_name(dtype) + " " + c.name;
        // elementwise.cu binary_cuda
        const ew::StridedOffsets<2> at = ew::strided_offsets<2>(c.out, {&a, &b}, kernel::binary_name(op_value));
        GuardedOutput got(c.out, dtype);
        ew::with_binary(op_value, [&](auto op) {
          launch_elements(shape_numel(c.out),
                          ew::BinaryFn<T, decltype(op)::value>{a.data<T>(), b.data<T>(), got.data<T>(), at});
        });
        Tensor want = Tensor::empty(c.out, dtype, kCpu);
        kernel::binary_kernel(kCpu, op_value, a, b, want);
        expect_output(got, want, 0.0, what);
      }
    }
  });
}

// ---- scalar ops ------------------------------------------------------------------------------------

TEST_F(ElementwiseEmulation, ScalarOps) {
  struct Case {
    ScalarOp op;
    double s;
  };
  // Scalars exact in f32 and not (0.1, 1/3: the launcher rounds s to the compute type, as the CPU).
  const Case cases[] = {{ScalarOp::add, 0.75},      {ScalarOp::add, 0.1},       {ScalarOp::mul, -1.25},
                        {ScalarOp::mul, 1.0 / 3.0}, {ScalarOp::pow, 2.5},       {ScalarOp::pow, -1.5},
                        {ScalarOp::pow, 3.0},       {ScalarOp::rsub, 0.5},      {ScalarOp::rsub, 0.1},
                        {ScalarOp::rdiv, 1.5},      {ScalarOp::rdiv, 1.0 / 3.0}};
  testing::for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (const Case& c : cases) {
      ew::with_scalar(c.op, [&](auto op) {
        for (int64_t n : kSizes) {
          const std::string what = std::string("scalar ") + kScalarNames[static_cast<int>(c.op)] +
                                   " s=" + std::to_string(c.s) + " " + dtype_name(dtype) + " n=" + std::to_string(n);
          const Tensor x = Tensor::rand({n}, gen_, dtype, 0.5, 3.0);  // positive, away from 0 (pow, rdiv)
          GuardedOutput got({n}, dtype);
          launch_elements(n, ew::ScalarFn<T, decltype(op)::value>{x.data<T>(), got.data<T>(),
                                                                  static_cast<cuda::compute_t<T>>(c.s)});
          Tensor want = Tensor::empty({n}, dtype, kCpu);
          kernel::scalar_kernel(kCpu, c.op, x, c.s, want);
          expect_output(got, want, 0.0, what);
        }
      });
    }
  });
}

// ---- where -----------------------------------------------------------------------------------------

TEST_F(ElementwiseEmulation, WhereWithBroadcasting) {
  struct Case {
    const char* name;
    Shape out;
    Layout cond, a, b;
  };
  const Case cases[] = {
      {"same shape", {3, 7}, {"", 21, {3, 7}, {7, 1}}, {"", 21, {3, 7}, {7, 1}}, {"", 21, {3, 7}, {7, 1}}},
      {"cond [4, 1], b one element",
       {4, 6},
       {"", 4, {4, 6}, {1, 0}},
       {"", 24, {4, 6}, {6, 1}},
       {"", 1, {4, 6}, {0, 0}}},
      {"three broadcasts, a transposed",
       {3, 4, 5},
       {"", 5, {3, 4, 5}, {0, 0, 1}},
       {"", 60, {3, 4, 5}, {1, 3, 12}},
       {"", 12, {3, 4, 5}, {4, 1, 0}}},
      {"0-d", {}, {"", 1, {}, {}}, {"", 1, {}, {}}, {"", 1, {}, {}}},
      {"[97, 129] (> 8192)",
       {97, 129},
       {"", 97 * 129, {97, 129}, {129, 1}},
       {"", 129, {97, 129}, {0, 1}},
       {"", 97 * 129, {97, 129}, {1, 97}}},
  };
  // Zero and non-zero conditions; 0.25 is 0 as an integer, -0 is 0 as a float.
  const double choices[] = {0.0, 1.0, -3.0, 0.25, -0.0};
  testing::for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (DType cond_dtype : kAllTypes) {
      with_type(cond_dtype, [&](auto ctag) {
        using Cond = decltype(ctag);
        for (const Case& c : cases) {
          const std::string what =
              std::string("where ") + dtype_name(dtype) + " cond " + dtype_name(cond_dtype) + " " + c.name;
          std::vector<double> cv(static_cast<size_t>(c.cond.base));
          for (double& e : cv) e = choices[gen_.next_u64() % 5];
          const Tensor cond = view_of(Tensor::from_vector(cv, {c.cond.base}, cond_dtype), c.cond);
          const Tensor a = view_of(Tensor::randn({c.a.base}, gen_, dtype), c.a);
          const Tensor b = view_of(Tensor::randn({c.b.base}, gen_, dtype), c.b);
          // elementwise.cu where_cuda
          const ew::StridedOffsets<3> at = ew::strided_offsets<3>(c.out, {&cond, &a, &b}, "where");
          GuardedOutput got(c.out, dtype);
          launch_elements(shape_numel(c.out),
                          ew::WhereFn<Cond, T>{cond.data<Cond>(), a.data<T>(), b.data<T>(), got.data<T>(), at});
          Tensor want = Tensor::empty(c.out, dtype, kCpu);
          kernel::where_kernel(kCpu, cond, a, b, want);
          expect_output(got, want, 0.0, what);
        }
      });
    }
  });
}

}  // namespace
}  // namespace seqlab
