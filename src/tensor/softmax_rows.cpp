// The softmax row loops (see softmax_rows.h): plain loops, and their f32 AVX-512 form.
#include "tensor/softmax_rows.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "tensor/elementwise_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SEQLAB_SOFTMAX_ROWS_AVX512 1
#endif

namespace seqlab::cpu {
namespace {

// ---- plain loops (any CPU, f32 and f64) ----

template <class A>
A row_max_plain(const A* x, int64_t n) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  A acc[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int u = 0; u < 8; ++u) acc[u] = x[c + u] > acc[u] ? x[c + u] : acc[u];
  }
  for (; c < n; ++c) acc[0] = x[c] > acc[0] ? x[c] : acc[0];
  for (int u = 1; u < 8; ++u) acc[0] = acc[u] > acc[0] ? acc[u] : acc[0];
  return acc[0];
}

// The tree both paths add the eight partial sums in.
template <class A>
A sum_tree(const A* acc) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

template <class A>
A exp_shifted_sum_plain(A* x, int64_t n, A shift) {
  A acc[8] = {};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int u = 0; u < 8; ++u) {
      x[c + u] = math::exp_vec_nonpositive(x[c + u] - shift);
      acc[u] += x[c + u];
    }
  }
  for (; c < n; ++c) {
    x[c] = math::exp_vec_nonpositive(x[c] - shift);
    acc[0] += x[c];
  }
  return sum_tree(acc);
}

template <class A>
void exp_shifted_plain(A* x, int64_t n, A shift) {
  for (int64_t c = 0; c < n; ++c) x[c] = math::exp_vec_nonpositive(x[c] - shift);
}

#ifdef SEQLAB_SOFTMAX_ROWS_AVX512

// ---- AVX-512 (f32) ----
#define SEQLAB_AVX512 __attribute__((target("avx512f")))

// math::exp_vec_nonpositive on 16 floats, step for step: clamp to [lo, 88] (NaN → lo, as its max
// does), n = round(x/ln2) by the same magic-number add, r = x − n·ln2 in two parts, Cephes' polynomial
// with the same fused multiply-adds, then eʳ·2ⁿ by vscalefps, exact like building 2ⁿ in the exponent
// bits wherever the result is normal (x ≥ lo); below lo the result is 0 and NaN stays itself.
SEQLAB_AVX512 inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504f), magic), magic);
  const __m512 r =
      _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));  // p·r·r + r + 1
  __m512 y = _mm512_scalef_ps(p, n);
  y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y);       // x < lo: 0
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // NaN: x
}

// The first k < 16 entries at x ← exp(x − shift), the rest untouched.
SEQLAB_AVX512 inline __m512 exp_shifted_partial(float* x, int64_t k, __m512 shift) {
  const __mmask16 m = static_cast<__mmask16>((1u << k) - 1u);
  const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x), shift));
  _mm512_mask_storeu_ps(x, m, e);
  return e;
}

// row_max_plain in 8 lanes of ymm: lane u takes entries c + u in order, the tail goes into lane 0, and
// the lanes are combined in the same order. vmaxps(x, acc) is x > acc ? x : acc exactly (it returns
// its second operand for NaN and for two zeros), so even the sign of a zero maximum is the same.
SEQLAB_AVX512 float row_max_avx512(const float* x, int64_t n) {
  __m256 acc = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + c), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; c < n; ++c) lanes[0] = x[c] > lanes[0] ? x[c] : lanes[0];
  for (int u = 1; u < 8; ++u) lanes[0] = lanes[u] > lanes[0] ? lanes[u] : lanes[0];
  return lanes[0];
}

SEQLAB_AVX512 float exp_shifted_sum_avx512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  // Lane u of the 8-wide sum takes entry c + u, then c + 8 + u: the plain loop's order.
  __m256 acc = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s));
    _mm512_storeu_ps(x + c, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  alignas(32) float lanes[8];
  if (c < n) {
    const int64_t rest = n - c;  // 1 … 15
    const __m512 e = exp_shifted_partial(x + c, rest, s);
    if (rest >= 8) {
      acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
      c += 8;
    }
  }
  _mm256_store_ps(lanes, acc);
  for (; c < n; ++c) lanes[0] += x[c];  // the tail's exponentials, written above, into sum 0
  return sum_tree(lanes);
}

SEQLAB_AVX512 void exp_shifted_avx512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(x + c, exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s)));
  if (c < n) exp_shifted_partial(x + c, n - c, s);
}

#undef SEQLAB_AVX512

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

#else

bool cpu_has_avx512() { return false; }

#endif  // SEQLAB_SOFTMAX_ROWS_AVX512

// 1: the AVX-512 path; 0: the plain loops; −1: not decided yet (the CPU and SEQLAB_CPU_AVX512 decide).
std::atomic<int> avx512_state{-1};

bool use_avx512() {
  int s = avx512_state.load(std::memory_order_relaxed);
  if (s < 0) {
    const char* env = std::getenv("SEQLAB_CPU_AVX512");
    const bool off = env != nullptr && std::strcmp(env, "off") == 0;
    s = cpu_has_avx512() && !off ? 1 : 0;
    avx512_state.store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

}  // namespace

float row_max(const float* x, int64_t n) {
#ifdef SEQLAB_SOFTMAX_ROWS_AVX512
  if (use_avx512()) return row_max_avx512(x, n);
#endif
  return row_max_plain(x, n);
}
double row_max(const double* x, int64_t n) { return row_max_plain(x, n); }

float exp_shifted_sum(float* x, int64_t n, float shift) {
#ifdef SEQLAB_SOFTMAX_ROWS_AVX512
  if (use_avx512()) return exp_shifted_sum_avx512(x, n, shift);
#endif
  return exp_shifted_sum_plain(x, n, shift);
}
double exp_shifted_sum(double* x, int64_t n, double shift) { return exp_shifted_sum_plain(x, n, shift); }

void exp_shifted(float* x, int64_t n, float shift) {
#ifdef SEQLAB_SOFTMAX_ROWS_AVX512
  if (use_avx512()) return exp_shifted_avx512(x, n, shift);
#endif
  exp_shifted_plain(x, n, shift);
}
void exp_shifted(double* x, int64_t n, double shift) { exp_shifted_plain(x, n, shift); }

bool softmax_rows_avx512() { return use_avx512(); }

void set_softmax_rows_avx512(bool on) { avx512_state.store(on && cpu_has_avx512() ? 1 : 0, std::memory_order_relaxed); }

}  // namespace seqlab::cpu
