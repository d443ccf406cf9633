// The tensor core: creation, views over shared storage, contiguous copies, dtype conversion
// (bf16 rounding), allocator accounting, printing, and the errors of bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/kernels.h"

namespace seqlab {
namespace {

using Vec = std::vector<double>;

// The message of the exception of type E that fn throws ("" when it throws none).
template <class E, class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// 0, 1, 2, ... as f64 in `shape`.
Tensor ramp(const Shape& shape) { return kernel::reshape(Tensor::arange(shape_numel(shape), DType::f64), shape).detach(); }

// ---- creation ----

TEST(TensorCreation, ZerosOnesFullArangeFromVector) {
  Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_TRUE(z.device().is_cpu());
  EXPECT_EQ(z.to_doubles(), Vec(6, 0.0));
  EXPECT_EQ(Tensor::ones({4}, DType::f64).to_doubles(), Vec(4, 1.0));
  EXPECT_EQ(Tensor::full({2, 2}, -2.5, DType::bf16).to_doubles(), Vec(4, -2.5));
  EXPECT_EQ(Tensor::full({3}, 7, DType::i32).to_indices(), (std::vector<int64_t>{7, 7, 7}));
  Tensor s = Tensor::scalar(4.25, DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 4.25);
  Tensor a = Tensor::arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(3, DType::f32).to_doubles(), (Vec{0, 1, 2}));
  Tensor v = Tensor::from_vector({1.5, -2, 3, 4, 5, 6}, {3, 2}, DType::f64);
  EXPECT_EQ(v.shape(), (Shape{3, 2}));
  EXPECT_EQ(v.strides(), (Shape{2, 1}));
  EXPECT_EQ(v.data<double>()[0], 1.5);
  EXPECT_EQ(v.data<double>()[5], 6.0);
  EXPECT_THROW(v.data<float>(), std::invalid_argument);  // wrong element type
  EXPECT_EQ(Tensor::from_indices({3, -1}, {2}, DType::i32).to_indices(), (std::vector<int64_t>{3, -1}));
  EXPECT_THROW(Tensor::from_vector({1, 2, 3}, {2, 2}), std::invalid_argument);
  EXPECT_THROW(Tensor::empty({2, -1}), std::invalid_argument);
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorCreation, RandomTensorsAreDeterminedByTheSeed) {
  Generator g1(123), g2(123), g3(124);
  Vec a = Tensor::randn({1000}, g1, DType::f64).to_doubles();
  Vec b = Tensor::randn({1000}, g2, DType::f64).to_doubles();
  Vec c = Tensor::randn({1000}, g3, DType::f64).to_doubles();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The stream continues: the next draw differs from the first.
  EXPECT_NE(Tensor::randn({1000}, g1, DType::f64).to_doubles(), a);
  // N(0, σ²) with σ = 2 over 20000 draws: mean within ±0.1 (5σ/√n), std within 5%.
  Generator g(5);
  Vec x = Tensor::randn({20000}, g, DType::f64, 2.0).to_doubles();
  double mean = 0, sq = 0;
  for (double e : x) mean += e / x.size();
  for (double e : x) sq += (e - mean) * (e - mean) / x.size();
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(sq), 2.0, 0.1);
  for (double e : Tensor::rand({1000}, g, DType::f32, -1.0, 3.0).to_doubles()) {
    EXPECT_GE(e, -1.0);
    EXPECT_LE(e, 3.0);  // f32 rounding may reach the bound
  }
}

// A generator restored from state() continues the stream draw for draw, including the spare normal
// that std::normal_distribution caches after an odd number of draws.
TEST(TensorCreation, GeneratorStateRoundTrips) {
  Generator g(77);
  for (int i = 0; i < 5; ++i) g.normal();  // odd: a spare normal is now cached
  g.uniform();
  const std::string saved = g.state();
  auto draws = [](Generator& gen) {
    std::vector<double> v;
    for (int i = 0; i < 7; ++i) v.push_back(gen.normal());
    for (int i = 0; i < 3; ++i) v.push_back(gen.uniform());
    v.push_back(static_cast<double>(gen.next_u64() >> 11));
    for (double x : Tensor::randn({9}, gen, DType::f64).to_doubles()) v.push_back(x);
    return v;
  };
  const Vec expected = draws(g);
  Generator fresh(1);
  fresh.set_state(saved);
  EXPECT_EQ(draws(fresh), expected);
  g.set_state(saved);  // rewinding the same generator
  EXPECT_EQ(draws(g), expected);
  EXPECT_EQ(g.state(), fresh.state());
  // The cached spare matters: the engine alone would give a different first normal.
  Generator engine_only(1);
  engine_only.set_state(saved);
  Generator copy_engine(1);
  copy_engine.engine() = engine_only.engine();
  EXPECT_NE(copy_engine.normal(), engine_only.normal());

  EXPECT_THROW(fresh.set_state(""), std::invalid_argument);
  EXPECT_THROW(fresh.set_state("not a state"), std::invalid_argument);
  EXPECT_THROW(fresh.set_state(saved.substr(0, saved.size() / 2)), std::invalid_argument);
  EXPECT_THROW(fresh.set_state(saved + " 5"), std::invalid_argument);
  EXPECT_EQ(draws(fresh), draws(g));  // a failed set_state leaves the generator as it was
}

// ---- views ----

TEST(TensorViews, ReshapeSharesStorageAndInfersMinusOne) {
  Tensor x = ramp({2, 3, 4});
  Tensor r = kernel::reshape(x, {4, -1});
  EXPECT_EQ(r.shape(), (Shape{4, 6}));
  EXPECT_EQ(r.storage(), x.storage());
  EXPECT_EQ(r.to_doubles(), x.to_doubles());
  EXPECT_EQ(kernel::reshape(x, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(kernel::view(x, {6, 2, 2}).strides(), (Shape{4, 2, 1}));
  // A write through the view is seen by the original.
  r.data<double>()[7] = -1;
  EXPECT_EQ(x.to_doubles()[7], -1.0);
}

TEST(TensorViews, PermuteAndTransposeReadTheRightElements) {
  Tensor x = ramp({2, 3, 4});  // x[i, j, k] = 12i + 4j + k
  Tensor p = kernel::permute(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.storage(), x.storage());
  Vec pv = p.to_doubles();
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) EXPECT_EQ(pv[static_cast<size_t>((k * 2 + i) * 3 + j)], 12 * i + 4 * j + k);
    }
  }
  Tensor t = kernel::transpose(x, 0, -1);  // t[k, j, i] = x[i, j, k]
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  Vec tv = t.to_doubles();
  EXPECT_EQ(tv[static_cast<size_t>((3 * 3 + 1) * 2 + 1)], 12 * 1 + 4 * 1 + 3);
  EXPECT_THROW(kernel::permute(x, {0, 0, 1}), std::invalid_argument);
  EXPECT_THROW(kernel::permute(x, {0, 1}), std::invalid_argument);
}

TEST(TensorViews, NarrowExpandUnsqueezeSqueeze) {
  Tensor x = ramp({3, 5});  // x[i, j] = 5i + j
  Tensor n = kernel::narrow(x, 1, 1, 3);
  EXPECT_EQ(n.shape(), (Shape{3, 3}));
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(n.storage(), x.storage());
  EXPECT_EQ(n.to_doubles(), (Vec{1, 2, 3, 6, 7, 8, 11, 12, 13}));
  EXPECT_EQ(kernel::narrow(x, 0, -1, 1).to_doubles(), (Vec{10, 11, 12, 13, 14}));  // negative start
  Tensor col = kernel::narrow(x, 1, 4, 1);  // [3, 1]: 4, 9, 14
  Tensor e = kernel::expand(col, {2, 3, 2});
  EXPECT_EQ(e.strides(), (Shape{0, 5, 0}));
  EXPECT_EQ(e.storage(), x.storage());
  EXPECT_EQ(e.to_doubles(), (Vec{4, 4, 9, 9, 14, 14, 4, 4, 9, 9, 14, 14}));
  Tensor u = kernel::unsqueeze(x, 1);
  EXPECT_EQ(u.shape(), (Shape{3, 1, 5}));
  EXPECT_EQ(kernel::unsqueeze(x, -1).shape(), (Shape{3, 5, 1}));
  EXPECT_EQ(u.to_doubles(), x.to_doubles());
  Tensor s = kernel::squeeze(u, 1);
  EXPECT_EQ(s.shape(), (Shape{3, 5}));
  EXPECT_EQ(s.strides(), x.strides());
  EXPECT_THROW(kernel::squeeze(x, 0), std::invalid_argument);  // size 3, not 1
}

TEST(TensorViews, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = ramp({2, 3});
  EXPECT_EQ(kernel::contiguous(x).storage(), x.storage());
  Tensor t = kernel::transpose(x, 0, 1);
  Tensor c = kernel::contiguous(t);
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_doubles(), (Vec{0, 3, 1, 4, 2, 5}));
  Tensor k = kernel::clone(x);
  EXPECT_NE(k.storage(), x.storage());
  k.data<double>()[0] = 42;
  EXPECT_EQ(x.to_doubles()[0], 0.0);
  // reshape of a non-contiguous view must copy, and keep the view's element order.
  Tensor r = kernel::reshape(t, {6});
  EXPECT_EQ(r.to_doubles(), (Vec{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(kernel::view(t, {6}), std::invalid_argument);
}

TEST(TensorViews, IsContiguous) {
  Tensor x = ramp({3, 4});
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_FALSE(kernel::transpose(x, 0, 1).is_contiguous());
  EXPECT_TRUE(kernel::narrow(x, 0, 1, 2).is_contiguous());   // whole rows
  EXPECT_FALSE(kernel::narrow(x, 1, 1, 2).is_contiguous());  // part of each row
  EXPECT_FALSE(kernel::expand(kernel::unsqueeze(x, 0), {2, 3, 4}).is_contiguous());
  EXPECT_TRUE(kernel::unsqueeze(x, 1).is_contiguous());       // size-1 dims do not matter
  EXPECT_FALSE(kernel::narrow(x, 1, 2, 1).is_contiguous());                 // a column: stride 4
  EXPECT_TRUE(kernel::transpose(kernel::narrow(x, 0, 0, 1), 0, 1).is_contiguous());  // one row, [4, 1]
  EXPECT_TRUE(Tensor::zeros({}).is_contiguous());
}

// ---- dtypes ----

TEST(TensorDtypes, ConversionsRoundTrip) {
  Vec v = {0.0, -1.5, 3.25, 1e-3, 123456.0};
  Tensor f64 = Tensor::from_vector(v, {5}, DType::f64);
  Tensor f32 = kernel::to_dtype(f64, DType::f32);
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_EQ(kernel::to_dtype(f32, DType::f64).to_doubles(), f32.to_doubles());
  EXPECT_EQ(f32.to_doubles()[3], static_cast<double>(1e-3f));
  EXPECT_EQ(kernel::to_dtype(f64, DType::f64).storage(), f64.storage());  // no copy
  Tensor i = Tensor::from_indices({-3, 0, 7, 1 << 20}, {4}, DType::i64);
  Tensor back = kernel::to_dtype(kernel::to_dtype(kernel::to_dtype(i, DType::f32), DType::i32), DType::i64);
  EXPECT_EQ(back.to_indices(), i.to_indices());
  // Floating to integer truncates toward zero.
  EXPECT_EQ(kernel::to_dtype(Tensor::from_vector({2.7, -2.7}, {2}, DType::f64), DType::i64).to_indices(),
            (std::vector<int64_t>{2, -2}));
}

TEST(TensorDtypes, Bf16RoundsToNearestEvenAndKeepsNaN) {
  // bf16 keeps 8 significant bits: between 1 and 2 the step is 2⁻⁷ = 0.0078125.
  const double step = 1.0 / 128;
  Vec in = {1.0,
            1.0 + step / 2,                 // a tie: 1.0 is even
            1.0 + 3 * step / 2,             // a tie: 1 + 2·step is even
            1.0 + step / 2 + step / 64,     // just above a tie: rounds up
            3.14159265,                     // → 3.140625
            -0.1,                           // → -0.10009765625
            65504.0,                        // → 65536 (8 bits of mantissa)
            std::numeric_limits<double>::infinity(),
            std::nan("")};
  Vec want = {1.0, 1.0, 1.0 + 2 * step, 1.0 + step, 3.140625, -0.10009765625, 65536.0,
              std::numeric_limits<double>::infinity(), 0.0};
  Tensor b = kernel::to_dtype(Tensor::from_vector(in, {9}, DType::f32), DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.nbytes(), 18u);
  Vec got = b.to_doubles();
  for (size_t i = 0; i + 1 < in.size(); ++i) EXPECT_EQ(got[i], want[i]) << "value " << in[i];
  EXPECT_TRUE(std::isnan(got[8]));
  // bf16 → f32 is exact, and f32 → bf16 → f32 is idempotent.
  Tensor again = kernel::to_dtype(kernel::to_dtype(b, DType::f32), DType::bf16);
  Vec twice = again.to_doubles();
  for (size_t i = 0; i + 1 < in.size(); ++i) EXPECT_EQ(twice[i], got[i]);
  EXPECT_TRUE(std::isnan(twice[8]));
}

// ---- memory accounting ----

TEST(TensorMemory, AllocatorLiveAndPeakBytesFollowTensors) {
  Allocator& a = cpu_allocator();
  const int64_t live0 = a.stats().live_bytes;
  a.reset_peak();
  {
    Tensor x = Tensor::zeros({1000}, DType::f32);
    EXPECT_EQ(a.stats().live_bytes, live0 + 4000);
    {
      Tensor y = Tensor::zeros({100, 100}, DType::f64);
      EXPECT_EQ(a.stats().live_bytes, live0 + 4000 + 80000);
      Tensor view = kernel::transpose(y, 0, 1);  // a view allocates nothing
      EXPECT_EQ(a.stats().live_bytes, live0 + 84000);
    }
    EXPECT_EQ(a.stats().live_bytes, live0 + 4000);
    // A large block (cached by the allocator when freed) is still counted while live and not after.
    Tensor big = Tensor::empty({1 << 20}, DType::f32);
    EXPECT_EQ(a.stats().live_bytes, live0 + 4000 + (4 << 20));
  }
  MemoryStats s = a.stats();
  EXPECT_EQ(s.live_bytes, live0);
  EXPECT_EQ(s.peak_bytes, live0 + 4000 + (4 << 20));
  EXPECT_GE(s.reserved_bytes, s.live_bytes);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_bytes, live0);
}

// ---- printing ----

TEST(TensorPrinting, ShowsValuesShapeDtypeAndElidesLargeDims) {
  std::string s = Tensor::from_vector({1, 2.5, -3, 4, 5, 6}, {2, 3}).str();
  for (const char* part : {"1", "2.5", "-3", "6", "shape=[2, 3]", "dtype=f32", "cpu"}) {
    EXPECT_TRUE(contains(s, part)) << part << " missing from " << s;
  }
  EXPECT_FALSE(contains(s, "..."));
  std::string big = Tensor::arange(100).str();
  EXPECT_TRUE(contains(big, "...")) << big;
  EXPECT_TRUE(contains(big, "0, 1, 2")) << big;
  EXPECT_TRUE(contains(big, "97, 98, 99")) << big;
  EXPECT_FALSE(contains(big, "50")) << big;
  EXPECT_TRUE(contains(big, "dtype=i64")) << big;
  EXPECT_TRUE(contains(Tensor().str(), "undefined"));
}

// ---- errors ----

TEST(TensorErrors, BadShapesThrowNamingTheShapes) {
  Tensor x = ramp({2, 3});
  std::string m = message_of<std::invalid_argument>([&] { kernel::reshape(x, {4, 2}); });
  EXPECT_TRUE(contains(m, "[2, 3]") && contains(m, "[4, 2]")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::reshape(x, {-1, -1}); });
  EXPECT_TRUE(contains(m, "-1")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::reshape(x, {4, -1}); });
  EXPECT_TRUE(contains(m, "[2, 3]")) << m;
  m = message_of<std::out_of_range>([&] { kernel::narrow(x, 1, 2, 2); });
  EXPECT_TRUE(contains(m, "[2, 3]")) << m;
  m = message_of<std::out_of_range>([&] { kernel::narrow(x, 2, 0, 1); });
  EXPECT_TRUE(contains(m, "dimension 2")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::expand(x, {2, 4}); });
  EXPECT_TRUE(contains(m, "[2, 3]") && contains(m, "[2, 4]")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::expand(x, {3}); });
  EXPECT_TRUE(contains(m, "[2, 3]")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::binary(kernel::BinaryOp::add, x, ramp({4})); });
  EXPECT_TRUE(contains(m, "[2, 3]") && contains(m, "[4]")) << m;
  m = message_of<std::invalid_argument>([&] { kernel::broadcast_shapes({3, 1, 5}, {4, 4}); });
  EXPECT_TRUE(contains(m, "[3, 1, 5]") && contains(m, "[4, 4]")) << m;
  EXPECT_EQ(kernel::broadcast_shapes({3, 1, 5}, {4, 5}), (Shape{3, 4, 5}));
  EXPECT_THROW(x.item(), std::invalid_argument);
  EXPECT_THROW(x.size(2), std::out_of_range);
  EXPECT_EQ(x.size(-1), 3);
}

}  // namespace
}  // namespace seqlab
