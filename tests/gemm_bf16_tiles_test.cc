// The bf16 tile GEMM (tensor/cpu/gemm_bf16_tiles.h): C = α op(A) op(B) + β C with bf16 A, B and f32 C.
// On small integers every product and sum is exact in f32, so the kernel must give the double-precision
// result exactly, in every layout (A and B each as stored or transposed), at every edge of its tiles
// (m around 8, n around 16 and 32, odd and even k, k = 1), with leading dimensions wider than the rows,
// β = 0 leaving C unread (NaN there stays out) and the columns past n untouched. On random values it
// agrees with the double product within f32's rounding over k terms, and with oneDNN's kernel, on the
// shapes of attention's tiles. Where the CPU has no AVX512-BF16 the tests are skipped, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tensor/blas_rows.h"
#include "tensor/cpu/gemm_bf16_tiles.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

#define SKIP_WITHOUT_TILES() \
  if (!cpu::tile_gemm_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16: the tile kernel does not run"

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One product's operands: op(A) [m, k] and op(B) [k, n] stored as asked, with `pad` extra columns per row.
struct Operands {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  std::vector<bf16> a, b;
  std::vector<float> c;

  Operands(bool ta_, bool tb_, int64_t m_, int64_t n_, int64_t k_, int64_t pad)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), lda((ta ? m : k) + pad), ldb((tb ? k : n) + pad), ldc(n + pad) {
    a.resize(static_cast<size_t>((ta ? k : m) * lda));
    b.resize(static_cast<size_t>((tb ? n : k) * ldb));
    c.resize(static_cast<size_t>(m * ldc));
  }
  float op_a(int64_t i, int64_t p) const { return float(a[static_cast<size_t>(ta ? p * lda + i : i * lda + p)]); }
  float op_b(int64_t p, int64_t j) const { return float(b[static_cast<size_t>(tb ? j * ldb + p : p * ldb + j)]); }
  // α Σ_p op(A)[i][p] op(B)[p][j] + β c0 in double, and Σ |terms| (for a tolerance).
  double reference(int64_t i, int64_t j, double alpha, double beta, double c0, double* magnitude) const {
    double s = 0, mag = 0;
    for (int64_t p = 0; p < k; ++p) {
      const double t = double(op_a(i, p)) * op_b(p, j);
      s += t;
      mag += std::fabs(t);
    }
    if (magnitude) *magnitude = std::fabs(alpha) * mag + std::fabs(beta * c0);
    return alpha * s + (beta == 0 ? 0.0 : beta * c0);
  }
  kernel::GemmArgs args(double alpha, double beta) {
    kernel::GemmArgs g;
    g.dtype = DType::bf16;
    g.c_is_f32 = true;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a.data();
    g.lda = lda;
    g.b = b.data();
    g.ldb = ldb;
    g.c = c.data();
    g.ldc = ldc;
    return g;
  }
};

TEST(TileGemmBf16, ExactOnSmallIntegersInEveryLayoutAndEdge) {
  SKIP_WITHOUT_TILES();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-4, 4);
  const int64_t ms[] = {1, 7, 8, 9, 17, 40}, ns[] = {1, 15, 16, 17, 31, 32, 33, 65}, ks[] = {1, 2, 3, 31, 32, 33, 64};
  const double alphas[] = {1.0, 0.125, -2.0}, betas[] = {0.0, 1.0, -0.5};
  int cases = 0;
  for (int layout = 0; layout < 4; ++layout) {
    for (int64_t m : ms) {
      for (int64_t n : ns) {
        for (int64_t k : ks) {
          Operands o(layout & 1, layout & 2, m, n, k, 1 + cases % 4);
          for (auto& x : o.a) x = bf16(float(small(rng)));
          for (auto& x : o.b) x = bf16(float(small(rng)));
          const double alpha = alphas[cases % 3], beta = betas[(cases / 3) % 3];
          for (size_t e = 0; e < o.c.size(); ++e) o.c[e] = beta == 0 ? kNaN : float(small(rng));
          const std::vector<float> c0 = o.c;
          ASSERT_TRUE(cpu::tile_gemm_bf16(o.args(alpha, beta)));
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < o.ldc; ++j) {
              const size_t e = static_cast<size_t>(i * o.ldc + j);
              if (j >= n) {  // past the last column: untouched
                ASSERT_TRUE(std::isnan(c0[e]) ? std::isnan(o.c[e]) : o.c[e] == c0[e]);
                continue;
              }
              ASSERT_EQ(o.c[e], o.reference(i, j, alpha, beta, c0[e], nullptr))
                  << "ta " << o.ta << " tb " << o.tb << " m " << m << " n " << n << " k " << k << " at (" << i
                  << ", " << j << "), alpha " << alpha << " beta " << beta;
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 6 * 8 * 7);
}

// Random normal operands on attention's tile shapes (and odd ones): within f32's rounding of the k terms'
// magnitudes of the double product, and close to oneDNN's result for the same call.
TEST(TileGemmBf16, AgreesWithDoubleAndOneDnnOnRandomValues) {
  SKIP_WITHOUT_TILES();
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{false, true, 128, 128, 64}, {false, true, 64, 64, 64},  {false, false, 128, 64, 128},
                          {true, false, 128, 64, 128}, {false, false, 64, 64, 64}, {true, false, 64, 64, 64},
                          {false, true, 37, 130, 65},  {true, true, 33, 47, 129},  {true, false, 1, 1, 1000}};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& s : shapes) {
    Operands o(s.ta, s.tb, s.m, s.n, s.k, 3);
    for (auto& x : o.a) x = bf16(normal(rng));
    for (auto& x : o.b) x = bf16(normal(rng));
    for (auto& x : o.c) x = normal(rng);
    const std::vector<float> c0 = o.c;
    ASSERT_TRUE(cpu::tile_gemm_bf16(o.args(0.125, 1.0)));
    const std::vector<float> tiles = o.c;
    o.c = c0;
    kernel::set_cpu_bf16_gemm_tiles(false);
    cpu::gemm<bf16, float>(s.ta, s.tb, s.m, s.n, s.k, 0.125, o.a.data(), o.lda, o.b.data(), o.ldb, 1.0, o.c.data(),
                           o.ldc);
    kernel::set_cpu_bf16_gemm_tiles(true);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        const size_t e = static_cast<size_t>(i * o.ldc + j);
        double magnitude;
        const double want = o.reference(i, j, 0.125, 1.0, c0[e], &magnitude);
        const double tol = 4e-7 * double(s.k + 2) * magnitude + 1e-30;
        ASSERT_NEAR(tiles[e], want, tol) << "tiles, m " << s.m << " n " << s.n << " k " << s.k << " at " << i << ", " << j;
        ASSERT_NEAR(tiles[e], o.c[e], 2 * tol) << "against oneDNN (or the widened path) at " << i << ", " << j;
      }
    }
  }
}

// The GEMM slot sends tile-sized bf16 products with f32 sums to the tile kernel and the rest elsewhere,
// with the same results on exact operands either way; turned off, every one goes elsewhere. The slot runs
// bf16 products on the CPU's bf16 instructions only in a build with oneDNN (kernel::cpu_bf16_gemm_native;
// the sanitizer builds have none): elsewhere it widens them all, and the tile kernel is left out.
TEST(TileGemmBf16, TheSlotTakesTileSizedProductsAndCanBeTurnedOff) {
  SKIP_WITHOUT_TILES();
  if (!kernel::cpu_bf16_gemm_native()) GTEST_SKIP() << "no oneDNN in this build: every bf16 GEMM is widened";
  ASSERT_TRUE(kernel::cpu_bf16_gemm_tiles());
  kernel::set_cpu_bf16_gemm_tiles(false);
  EXPECT_FALSE(kernel::cpu_bf16_gemm_tiles());
  EXPECT_FALSE(cpu::tile_gemm_bf16(Operands(false, false, 2, 2, 2, 0).args(1.0, 0.0)));
  kernel::set_cpu_bf16_gemm_tiles(true);
  for (int64_t size : {16, 300}) {  // under and over the tile kernel's size
    Operands o(false, true, size, size, size, 0);
    for (size_t e = 0; e < o.a.size(); ++e) o.a[e] = bf16(float(int(e % 5) - 2));
    for (size_t e = 0; e < o.b.size(); ++e) o.b[e] = bf16(float(int(e % 3) - 1));
    cpu::gemm<bf16, float>(false, true, size, size, size, 1.0, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0, o.c.data(),
                           o.ldc);
    for (int64_t i = 0; i < size; i += 7) {
      for (int64_t j = 0; j < size; j += 5) {
        ASSERT_EQ(o.c[static_cast<size_t>(i * o.ldc + j)], o.reference(i, j, 1.0, 0.0, 0.0, nullptr));
      }
    }
  }
}

}  // namespace
}  // namespace seqlab
