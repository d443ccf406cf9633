// Small bf16 GEMMs on AVX512-BF16 registers (see gemm_bf16_tiles.h).
//
// vdpbf16ps takes, in each of its 16 f32 lanes, one pair of bf16 values from each operand and adds their
// two products to the lane's sum. So both operands are read as pairs along k: a 32-bit word of op(A) row
// i holds op(A)[i][2p] and op(A)[i][2p + 1] (broadcast to all lanes), and a vector of op(B) holds, in lane
// j, op(B)[2p][j] and op(B)[2p + 1][j]. op(B) is packed into such vectors, 32 columns (two vectors) per
// panel and all k; op(A) is read in place when its rows hold k (A not transposed) and k is even, and is
// otherwise packed into pairs first. An odd k is padded with a zero term.
//
// Each micro-tile is up to 8 rows × 32 columns of C: 16 vectors of sums that stay in registers over the
// whole k, two vdpbf16ps per row per pair, then C = α·sum + β·C (masked at the edges).
#include "tensor/cpu/gemm_bf16_tiles.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensor/cpu/avx512.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SEQLAB_BUILD_BF16_TILES 1
#endif

namespace seqlab::cpu {

#ifdef SEQLAB_BUILD_BF16_TILES
namespace {

#define SEQLAB_BF16_TILES __attribute__((target("avx512f,avx512bw,avx512bf16")))

constexpr int64_t kPanel = 32;  // columns of C per panel of op(B): two vectors of 16 sums
constexpr int kTileRows = 8;    // rows of C per micro-tile: 16 vectors of sums

bool cpu_has_bf16_tiles() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has;
}

// Masks of the lanes [0, n) of a vector of 32 bf16 (or of two vectors of 16, lo and hi).
SEQLAB_BF16_TILES inline __mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1; }
SEQLAB_BF16_TILES inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Pairs of rows of a row-major bf16 matrix X (rows 0..k), columns [c0, c0 + nc), nc ≤ 32, interleaved:
// dst[p·stride + j] = (X[2p][c0 + j], X[2p + 1][c0 + j]) as one 32-bit word, the second 0 past row k − 1.
// That is op(B) for B stored [k][n] (columns of C), and op(A) for A stored transposed (rows of C).
SEQLAB_BF16_TILES void pack_row_pairs(const bf16* x, int64_t ld, int64_t k, int64_t c0, int64_t nc, uint32_t* dst,
                                      int64_t stride) {
  // vpermt2w: lane 2t ← the first row's element t, lane 2t + 1 ← the second row's element t.
  alignas(64) uint16_t lo_idx[32], hi_idx[32];
  for (int t = 0; t < 32; ++t) {
    lo_idx[t] = static_cast<uint16_t>((t % 2 ? 32 : 0) + t / 2);
    hi_idx[t] = static_cast<uint16_t>((t % 2 ? 32 : 0) + 16 + t / 2);
  }
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  const __mmask32 cols = mask32(nc);
  for (int64_t p = 0; 2 * p < k; ++p) {
    const __m512i r0 = _mm512_maskz_loadu_epi16(cols, x + 2 * p * ld + c0);
    const __m512i r1 = 2 * p + 1 < k ? _mm512_maskz_loadu_epi16(cols, x + (2 * p + 1) * ld + c0) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + p * stride, _mm512_permutex2var_epi16(r0, lo, r1));
    _mm512_storeu_si512(dst + p * stride + 16, _mm512_permutex2var_epi16(r0, hi, r1));
  }
}

// r[i] ← the column i of the 16 × 16 matrix of 32-bit words whose row i is r[i]. Within each 128-bit lane L,
// two rounds of unpacks leave b[4i + c] = column 4L + c of rows 4i..4i + 3; two rounds of lane shuffles then
// gather lane L of b[c], b[4 + c], b[8 + c], b[12 + c] into column 4L + c.
SEQLAB_BF16_TILES inline void transpose16(__m512i* r) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), v = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
    const __m512i w = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44), z = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(u, w, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(u, w, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(v, z, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v, z, 0xdd);
  }
}

// Rows [r0, r0 + nr) of a row-major bf16 matrix X whose rows hold k, nr ≤ 32, as pairs along the row:
// dst[p·32 + j] = (X[r0 + j][2p], X[r0 + j][2p + 1]), the second 0 for an odd k's last pair, and 0 for
// j ≥ nr. That is op(B) for B stored transposed ([n][k]): 16 rows × 16 pairs at a time, transposed.
SEQLAB_BF16_TILES void pack_column_pairs(const bf16* x, int64_t ld, int64_t k, int64_t r0, int64_t nr,
                                         uint32_t* dst) {
  const int64_t full = k / 2;
  for (int half = 0; half < 2; ++half) {
    const int64_t lanes = std::min<int64_t>(16, nr - 16 * half);
    uint32_t* d = dst + 16 * half;
    if (lanes <= 0) {
      for (int64_t p = 0; p < (k + 1) / 2; ++p) _mm512_storeu_si512(d + p * kPanel, _mm512_setzero_si512());
      continue;
    }
    const bf16* rows = x + (r0 + 16 * half) * ld;
    for (int64_t p0 = 0; p0 < full; p0 += 16) {
      const int64_t np = std::min<int64_t>(16, full - p0);
      const __mmask16 words = mask16(np);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = i < lanes ? _mm512_maskz_loadu_epi32(words, rows + i * ld + 2 * p0) : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int64_t t = 0; t < np; ++t) _mm512_storeu_si512(d + (p0 + t) * kPanel, r[t]);
    }
    if (k % 2) {  // the last pair: X[r][k − 1] and a zero
      for (int64_t j = 0; j < 16; ++j) d[full * kPanel + j] = j < lanes ? rows[j * ld + k - 1].bits : 0u;
    }
  }
}

// C rows [0, R) × columns [0, 32) (masked by m0, m1) = α Σ_p a_p b_p + β C. Row r's pair p is the word at
// a + r·a_row + p·a_pair (bytes); b holds kp pairs of 32 columns, 32 words each.
template <int R>
SEQLAB_BF16_TILES void micro_tile(int64_t kp, const char* a, int64_t a_row, int64_t a_pair, const uint32_t* b,
                                  float* c, int64_t ldc, __mmask16 m0, __mmask16 m1, float alpha, float beta) {
  __m512 s0[R], s1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kPanel);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kPanel + 16);
    const char* ap = a + p * a_pair;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t w;
      std::memcpy(&w, ap + r * a_row, sizeof w);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(w);
      s0[r] = _mm512_dpbf16_ps(s0[r], av, b0);
      s1[r] = _mm512_dpbf16_ps(s1[r], av, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    __m512 y0 = _mm512_mul_ps(s0[r], va), y1 = _mm512_mul_ps(s1[r], va);
    if (beta != 0.0f) {
      y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), y0);
      y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), y1);
    }
    _mm512_mask_storeu_ps(cr, m0, y0);
    _mm512_mask_storeu_ps(cr + 16, m1, y1);
  }
}

using MicroTile = void (*)(int64_t, const char*, int64_t, int64_t, const uint32_t*, float*, int64_t, __mmask16,
                           __mmask16, float, float);
constexpr MicroTile kMicroTiles[kTileRows + 1] = {nullptr,          &micro_tile<1>, &micro_tile<2>,
                                                  &micro_tile<3>,   &micro_tile<4>, &micro_tile<5>,
                                                  &micro_tile<6>,   &micro_tile<7>, &micro_tile<8>};

SEQLAB_BF16_TILES void tile_gemm(const kernel::GemmArgs& g) {
  const int64_t m = g.m, n = g.n, k = g.k, kp = (k + 1) / 2;
  const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
  const bf16 *a = static_cast<const bf16*>(g.a), *b = static_cast<const bf16*>(g.b);
  float* c = static_cast<float*>(g.c);
  thread_local std::vector<uint32_t> a_pack, b_pack;

  // op(A)'s pairs: in place (A's rows hold k, and k is even), else packed.
  const char* a_words;
  int64_t a_row, a_pair;  // bytes
  if (!g.trans_a && k % 2 == 0) {
    a_words = reinterpret_cast<const char*>(a);
    a_row = 2 * g.lda;
    a_pair = 4;
  } else if (!g.trans_a) {  // rows of k values, each padded with a zero to kp pairs
    a_pack.assign(static_cast<size_t>(m * kp), 0u);
    for (int64_t i = 0; i < m; ++i) std::memcpy(a_pack.data() + i * kp, a + i * g.lda, sizeof(bf16) * k);
    a_words = reinterpret_cast<const char*>(a_pack.data());
    a_row = 4 * kp;
    a_pair = 4;
  } else {  // A stored [k][m]: pairs of its rows, m rounded up to whole panels
    const int64_t width = (m + kPanel - 1) / kPanel * kPanel;
    a_pack.resize(static_cast<size_t>(kp * width));
    for (int64_t c0 = 0; c0 < m; c0 += kPanel) {
      pack_row_pairs(a, g.lda, k, c0, std::min(kPanel, m - c0), a_pack.data() + c0, width);
    }
    a_words = reinterpret_cast<const char*>(a_pack.data());
    a_row = 4;
    a_pair = 4 * width;
  }

  b_pack.resize(static_cast<size_t>(kp * kPanel));
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t cols = std::min(kPanel, n - j0);
    if (g.trans_b) {
      pack_column_pairs(b, g.ldb, k, j0, cols, b_pack.data());
    } else {
      pack_row_pairs(b, g.ldb, k, j0, cols, b_pack.data(), kPanel);
    }
    const __mmask16 m0 = mask16(cols), m1 = mask16(cols - 16);
    for (int64_t i0 = 0; i0 < m; i0 += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - i0));
      kMicroTiles[rows](kp, a_words + i0 * a_row, a_row, a_pair, b_pack.data(), c + i0 * g.ldc + j0, g.ldc, m0, m1,
                        alpha, beta);
    }
  }
}

}  // namespace
#endif  // SEQLAB_BUILD_BF16_TILES

namespace {
// 1: on; 0: off; −1: not decided yet (SEQLAB_CPU_BF16_GEMM decides on first use).
std::atomic<int> tiles_state{-1};
}  // namespace

bool tile_gemm_bf16_available() {
#ifdef SEQLAB_BUILD_BF16_TILES
  int s = tiles_state.load(std::memory_order_relaxed);
  if (s < 0) {
    const char* env = std::getenv("SEQLAB_CPU_BF16_GEMM");
    s = env != nullptr && std::strcmp(env, "onednn") == 0 ? 0 : 1;
    tiles_state.store(s, std::memory_order_relaxed);
  }
  return s == 1 && avx512_on() && cpu_has_bf16_tiles();
#else
  return false;
#endif
}

bool tile_gemm_bf16(const kernel::GemmArgs& g) {
  if (g.dtype != DType::bf16 || !g.c_is_f32 || g.batch != 1 || g.k <= 0 || !tile_gemm_bf16_available()) {
    return false;
  }
#ifdef SEQLAB_BUILD_BF16_TILES
  if (g.m > 0 && g.n > 0) tile_gemm(g);
  return true;
#else
  return false;
#endif
}

}  // namespace seqlab::cpu

namespace seqlab::kernel {

bool cpu_bf16_gemm_tiles() { return cpu_bf16_gemm_native() && cpu::tile_gemm_bf16_available(); }
void set_cpu_bf16_gemm_tiles(bool on) { cpu::tiles_state.store(on ? 1 : 0, std::memory_order_relaxed); }

}  // namespace seqlab::kernel
