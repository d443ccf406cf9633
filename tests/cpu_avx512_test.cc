// The CPU kernels' AVX-512 loops (tensor/cpu/avx512.h) give the plain loops' bits: the softmax rows
// (tensor/softmax_rows.h), GELU forward and backward through the unary kernels, and the bf16 rounding,
// for floats spread over every exponent and sign (and NaN and ±∞), on f32 and bf16 tensors, and rows of
// every length around the vector widths with the sum's order, ±0 maxima and masked values; then the
// plain loops against std::exp in double. Where the CPU has no AVX-512 the comparisons are skipped, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/softmax_rows.h"

namespace seqlab {
namespace {

using cpu::exp_shifted;
using cpu::exp_shifted_sum;
using cpu::row_max;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Runs fn with the AVX-512 paths on or off, leaving them as it found them.
template <class Fn>
auto with_avx512(bool on, Fn&& fn) {
  const bool before = kernel::cpu_avx512();
  kernel::set_cpu_avx512(on);
  auto result = fn();
  kernel::set_cpu_avx512(before);
  return result;
}

bool cpu_has_avx512() {
  return with_avx512(true, [] { return kernel::cpu_avx512(); });
}

#define SKIP_WITHOUT_AVX512() \
  if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the plain loops run here"

// One float in every `stride` of the 2³² bit patterns (the stride is odd, so every exponent and both
// signs are visited, each with varied mantissas), then the edges of exp_vec_nonpositive's range; given
// to fn in chunks. SEQLAB_CPU_AVX512_EVERY_FLOAT=1 takes every bit pattern (about four minutes).
template <class Fn>
void for_each_sweep_chunk(Fn&& fn) {
  const char* every = std::getenv("SEQLAB_CPU_AVX512_EVERY_FLOAT");
  const uint64_t stride = every != nullptr && std::strcmp(every, "1") == 0 ? 1 : 251;
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<float> xs;
  xs.reserve(kChunk);
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += stride) {
    float x;
    const uint32_t b = static_cast<uint32_t>(u);
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
    if (xs.size() == kChunk) {
      fn(xs);
      xs.clear();
    }
  }
  for (float x : {0.0f, -0.0f, -87.33654f, std::nextafter(-87.33654f, 0.0f), std::nextafter(-87.33654f, -kInf), -87.34f,
                  -103.98f, 88.0f, 88.5f, -kInf, kInf, kNaN, -kNaN, 1e-30f, -1e-30f, -0.34657359f}) {
    xs.push_back(x);
  }
  fn(xs);
}

TEST(CpuAvx512, SoftmaxExponentialGivesThePlainBitsForEveryExponent) {
  SKIP_WITHOUT_AVX512();
  int64_t differ = 0, total = 0;
  for_each_sweep_chunk([&](const std::vector<float>& xs) {
    const auto run = [&](bool on) {
      return with_avx512(on, [&] {
        std::vector<float> y = xs;
        exp_shifted(y.data(), static_cast<int64_t>(y.size()), 0.0f);
        return y;
      });
    };
    const std::vector<float> fast = run(true), plain = run(false);
    for (size_t i = 0; i < xs.size(); ++i) {
      if (bits(fast[i]) != bits(plain[i]) && differ++ < 5) {
        ADD_FAILURE() << "exp(" << xs[i] << "): AVX-512 " << fast[i] << ", plain " << plain[i];
      }
    }
    total += static_cast<int64_t>(xs.size());
  });
  EXPECT_EQ(differ, 0) << "of " << total << " floats";
}

// GELU, SiLU, the sigmoid and softplus (whose gradient is the sigmoid's) and their gradients through the
// unary kernels (f32, and bf16 on the same values rounded): the AVX-512 loops against the plain ones.
// The gradient's dy varies too, so that its last product is checked.
TEST(CpuAvx512, UnaryOpsGiveThePlainBitsForEveryExponent) {
  SKIP_WITHOUT_AVX512();
  int64_t differ = 0, total = 0;
  for_each_sweep_chunk([&](const std::vector<float>& xs) {
    const int64_t n = static_cast<int64_t>(xs.size());
    std::vector<double> xd(xs.begin(), xs.end()), dyd(xs.size());
    for (size_t i = 0; i < dyd.size(); ++i) dyd[i] = 0.25 + 0.001 * static_cast<double>(i % 997);
    for (kernel::UnaryOp op :
         {kernel::UnaryOp::gelu, kernel::UnaryOp::silu, kernel::UnaryOp::sigmoid, kernel::UnaryOp::softplus}) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        const Tensor x = Tensor::from_vector(xd, {n}, dtype), dy = Tensor::from_vector(dyd, {n}, dtype);
        const auto run = [&](bool on) {
          return with_avx512(on, [&] {
            const Tensor y = kernel::unary(op, x);
            return std::pair{y, kernel::unary_backward(op, dy, x, y)};
          });
        };
        const auto fast = run(true), plain = run(false);
        const std::string name = kernel::unary_name(op);
        for (const auto& [f, p, what] :
             {std::tuple{fast.first, plain.first, name}, std::tuple{fast.second, plain.second, name + " backward"}}) {
          const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
          if (std::memcmp(f.raw_data(), p.raw_data(), bytes) == 0) continue;
          const Tensor f32 = kernel::to_dtype(f, DType::f32), p32 = kernel::to_dtype(p, DType::f32);
          for (int64_t i = 0; i < n; ++i) {
            const float a = f32.data<float>()[i], b = p32.data<float>()[i];
            if (bits(a) != bits(b) && differ++ < 5) {
              ADD_FAILURE() << what << " (" << dtype_name(dtype) << ") at x = " << xs[static_cast<size_t>(i)]
                            << ": AVX-512 " << a << ", plain " << b;
            }
          }
        }
      }
    }
    total += n;
  });
  EXPECT_EQ(differ, 0) << "of " << total << " floats";
}

TEST(SoftmaxRows, PlainExponentialMatchesStdExp) {
  // exp_vec_nonpositive: about 2 ulp where eˣ is a normal float, 0 below, NaN kept.
  with_avx512(false, [] {
    std::vector<float> xs;
    for (float x = -87.0f; x <= 0.0f; x += 0.0137f) xs.push_back(x);
    std::vector<float> y = xs;
    exp_shifted(y.data(), static_cast<int64_t>(y.size()), 0.0f);
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = std::exp(static_cast<double>(xs[i]));
      EXPECT_NEAR(y[i], want, 4e-7 * want) << xs[i];
    }
    float edge[3] = {-kInf, -90.0f, kNaN};
    exp_shifted(edge, 3, 0.0f);
    EXPECT_EQ(edge[0], 0.0f);
    EXPECT_EQ(edge[1], 0.0f);
    EXPECT_TRUE(std::isnan(edge[2]));
    return 0;
  });
}

// A row of n scores: normal values around a shift, with some −∞ (masked keys), very negative values,
// zeros of both signs and, when asked, a NaN.
std::vector<float> make_row(int64_t n, std::mt19937& gen, bool with_nan) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> pick(0, 19);
  std::vector<float> row(static_cast<size_t>(n));
  for (float& x : row) {
    switch (pick(gen)) {
      case 0:
        x = -kInf;
        break;
      case 1:
        x = -95.0f;
        break;
      case 2:
        x = 0.0f;
        break;
      case 3:
        x = -0.0f;
        break;
      default:
        x = normal(gen);
    }
  }
  if (with_nan && n > 0) row[static_cast<size_t>(n / 2)] = kNaN;
  return row;
}

// Every length from `first` to 40, then lengths around 48, 64 and 128 (the vector widths' multiples), then
// `longest`.
std::vector<int64_t> lengths_around_vectors(int64_t first, int64_t longest) {
  std::vector<int64_t> lengths;
  for (int64_t n = first; n <= 40; ++n) lengths.push_back(n);
  for (int64_t n : {47, 48, 63, 64, 65, 100, 127, 128, 129}) lengths.push_back(n);
  lengths.push_back(longest);
  return lengths;
}

TEST(CpuAvx512, SoftmaxRowsOfEveryLengthGiveThePlainBits) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 gen(7);
  for (int64_t n : lengths_around_vectors(0, 256)) {
    for (bool with_nan : {false, true}) {
      const std::vector<float> row = make_row(n, gen, with_nan);
      struct Out {
        float max, sum;
        std::vector<float> exps, exps_nosum;
      };
      const auto run = [&](bool on) {
        return with_avx512(on, [&] {
          Out o;
          o.max = row_max(row.data(), n);
          const float shift = std::isfinite(o.max) ? o.max : 0.0f;
          o.exps = row;
          o.sum = exp_shifted_sum(o.exps.data(), n, shift);
          o.exps_nosum = row;
          exp_shifted(o.exps_nosum.data(), n, shift);
          return o;
        });
      };
      const Out fast = run(true), plain = run(false);
      SCOPED_TRACE("n = " + std::to_string(n) + (with_nan ? ", with a NaN" : ""));
      EXPECT_EQ(bits(fast.max), bits(plain.max)) << fast.max << " against " << plain.max;
      EXPECT_EQ(bits(fast.sum), bits(plain.sum)) << fast.sum << " against " << plain.sum;
      for (int64_t c = 0; c < n; ++c) {
        EXPECT_EQ(bits(fast.exps[c]), bits(plain.exps[c])) << "entry " << c;
        EXPECT_EQ(bits(fast.exps_nosum[c]), bits(plain.exps[c])) << "entry " << c << " (no sum)";
      }
    }
  }
}

// The f32 → bf16 rounding (round_to_bf16_run, which every bf16 kernel's stores go through): the AVX-512
// loop against bf16(float) for floats of every exponent and sign, NaN payloads and ±∞ included, then on
// runs of every length 0–40 and around the vector width.
TEST(CpuAvx512, Bf16RoundingGivesThePlainBits) {
  SKIP_WITHOUT_AVX512();
  int64_t differ = 0, total = 0;
  const auto round_run = [](const std::vector<float>& xs, size_t n, bool on) {
    std::vector<bf16> out(n);
    with_avx512(on, [&] {
      round_to_bf16_run(xs.data(), out.data(), static_cast<int64_t>(n));
      return 0;
    });
    return out;
  };
  for_each_sweep_chunk([&](const std::vector<float>& xs) {
    const std::vector<bf16> fast = round_run(xs, xs.size(), true);
    for (size_t i = 0; i < xs.size(); ++i) {
      if (fast[i].bits != bf16(xs[i]).bits && differ++ < 5) {
        ADD_FAILURE() << "x = " << xs[i] << " (bits " << bits(xs[i]) << "): AVX-512 " << fast[i].bits << ", plain "
                      << bf16(xs[i]).bits;
      }
    }
    total += static_cast<int64_t>(xs.size());
  });
  EXPECT_EQ(differ, 0) << "of " << total << " floats";
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (size_t n : {0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 40, 47, 48, 63, 64, 65, 100}) {
    std::vector<float> xs(n + 3, kNaN);  // the run, then guards that must stay unwritten
    for (size_t i = 0; i < n; ++i) xs[i] = u(gen);
    std::vector<bf16> fast(n + 3, bf16(7.0f));
    with_avx512(true, [&] {
      round_to_bf16_run(xs.data(), fast.data(), static_cast<int64_t>(n));
      return 0;
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(fast[i].bits, bf16(xs[i]).bits) << "n = " << n << ", entry " << i;
    for (size_t i = n; i < n + 3; ++i) {
      EXPECT_EQ(fast[i].bits, bf16(7.0f).bits) << "n = " << n << ": wrote past the run";
    }
  }
}

// The unary kernels on bf16 tensors of every length 1–40 and around the vector width (one thread takes
// them all): the AVX-512 loops' last partial vector, and their rounding in registers, against the plain
// loops' blocks.
TEST(CpuAvx512, Bf16UnaryOpsOfEveryLengthGiveThePlainBits) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 gen(11);
  for (int64_t n : lengths_around_vectors(1, 513)) {
    const std::vector<float> row = make_row(n, gen, n % 3 == 0);
    const std::vector<double> xd(row.begin(), row.end());
    std::vector<double> dyd(xd.size());
    for (size_t i = 0; i < dyd.size(); ++i) dyd[i] = 0.5 - 0.37 * static_cast<double>(i % 7);
    const Tensor x = Tensor::from_vector(xd, {n}, DType::bf16), dy = Tensor::from_vector(dyd, {n}, DType::bf16);
    for (kernel::UnaryOp op :
         {kernel::UnaryOp::gelu, kernel::UnaryOp::silu, kernel::UnaryOp::sigmoid, kernel::UnaryOp::softplus}) {
      const auto run = [&](bool on) {
        return with_avx512(on, [&] {
          const Tensor y = kernel::unary(op, x);
          return std::pair{y, kernel::unary_backward(op, dy, x, y)};
        });
      };
      const auto fast = run(true), plain = run(false);
      SCOPED_TRACE(std::string(kernel::unary_name(op)) + ", n = " + std::to_string(n));
      EXPECT_EQ(std::memcmp(fast.first.raw_data(), plain.first.raw_data(), static_cast<size_t>(n) * 2), 0);
      EXPECT_EQ(std::memcmp(fast.second.raw_data(), plain.second.raw_data(), static_cast<size_t>(n) * 2), 0)
          << "backward";
    }
  }
}

TEST(SoftmaxRows, MaxAndSumFollowTheirDefinitions) {
  for (bool on : {false, true}) {
    with_avx512(on, [] {
      // The max skips NaN; −∞ for an empty or all −∞ row; which zero it returns is the first seen in its lane.
      const float a[5] = {-3.0f, kNaN, 2.5f, -kInf, 1.0f};
      EXPECT_EQ(row_max(a, 5), 2.5f);
      EXPECT_EQ(row_max(a, 0), -kInf);
      const float all_masked[9] = {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
      EXPECT_EQ(row_max(all_masked, 9), -kInf);
      // The sum of the exponentials it wrote, to float rounding.
      std::vector<float> x(37);
      double want = 0;
      for (size_t c = 0; c < x.size(); ++c) {
        x[c] = -static_cast<float>(c % 5) * 0.69314718056f;  // e^x = 2^−(c mod 5), to 2 ulp
        want += std::exp(static_cast<double>(x[c]));
      }
      const float sum = exp_shifted_sum(x.data(), static_cast<int64_t>(x.size()), 0.0f);
      EXPECT_NEAR(sum, want, 1e-5);
      EXPECT_EQ(exp_shifted_sum(x.data(), 0, 0.0f), 0.0f);
      return 0;
    });
  }
}

TEST(SoftmaxRows, DoubleRowsUseStdExp) {
  double x[3] = {-1.0, -2.0, -kInf};
  EXPECT_EQ(row_max(x, 3), -1.0);
  const double sum = exp_shifted_sum(x, 3, -1.0);
  EXPECT_EQ(x[0], 1.0);
  EXPECT_EQ(x[1], std::exp(-1.0));
  EXPECT_EQ(x[2], 0.0);
  EXPECT_EQ(sum, 1.0 + std::exp(-1.0));
}

}  // namespace
}  // namespace seqlab
