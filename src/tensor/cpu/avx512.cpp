// The CPU kernels' AVX-512 loops (see avx512.h) and the switch that turns them on.
#include "tensor/cpu/avx512.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"
#include "tensor/lane_sum.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SEQLAB_BUILD_AVX512 1
#endif

namespace seqlab::cpu {
namespace {

bool cpu_has_avx512() {
#ifdef SEQLAB_BUILD_AVX512
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

// 1: on; 0: off; −1: not decided yet (the CPU and SEQLAB_CPU_AVX512 decide on first use).
std::atomic<int> state{-1};

}  // namespace

bool avx512_on() {
  int s = state.load(std::memory_order_relaxed);
  if (s < 0) {
    const char* env = std::getenv("SEQLAB_CPU_AVX512");
    const bool off = env != nullptr && std::strcmp(env, "off") == 0;
    s = cpu_has_avx512() && !off ? 1 : 0;
    state.store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

#ifdef SEQLAB_BUILD_AVX512
namespace {

#define SEQLAB_AVX512 __attribute__((target("avx512f")))

// The steps both exponentials share, for a clamped, finite x (math::exp_reduced): n = round(x/ln2) by
// the magic-number add, r = x − n·ln2 in two parts, Cephes' polynomial, p·r·r + r + 1; returns eʳ and n.
SEQLAB_AVX512 inline __m512 exp_reduced16(__m512 xc, __m512& n) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504f), magic), magic);
  const __m512 r =
      _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  return _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
}

// math::exp_vec: 0 below −103.97, +∞ above 88, NaN kept, subnormal results rounded once.
SEQLAB_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-103.972084f), hi = _mm512_set1_ps(88.0f);
  __m512 n;
  const __m512 p = exp_reduced16(_mm512_min_ps(_mm512_max_ps(x, lo), hi), n);
  __m512 y = _mm512_scalef_ps(p, n);
  y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y);                           // x < lo: 0
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(HUGE_VALF));  // x > hi: +∞
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);                      // NaN: x
}

// math::exp_vec_nonpositive: 0 below −87.34 (where exp16 gives subnormals), NaN kept.
SEQLAB_AVX512 inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  __m512 n;
  const __m512 p = exp_reduced16(_mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f)), n);
  const __m512 y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), _mm512_scalef_ps(p, n));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// The mask of the first k ≤ 16 lanes.
SEQLAB_AVX512 inline __mmask16 first(int64_t k) { return static_cast<__mmask16>((1u << k) - 1u); }

// The first k < 16 entries at x ← exp(x − shift), the rest untouched.
SEQLAB_AVX512 inline __m512 exp_shifted_partial(float* x, int64_t k, __m512 shift) {
  const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(first(k), x), shift));
  _mm512_mask_storeu_ps(x, first(k), e);
  return e;
}

SEQLAB_AVX512 float exp_shifted_sum16(float* x, int64_t n, float shift) {
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
  if (c < n) {
    const __m512 e = exp_shifted_partial(x + c, n - c, s);
    if (n - c >= 8) {
      acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
      c += 8;
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; c < n; ++c) lanes[0] += x[c];  // the tail's exponentials, written above, into sum 0
  return dot_tree(lanes);
}

SEQLAB_AVX512 void exp_shifted16(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(x + c, exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s)));
  if (c < n) exp_shifted_partial(x + c, n - c, s);
}

// vmaxps(x, acc) is x > acc ? x : acc exactly (it returns its second operand for NaN and for two
// zeros), so even the sign of a zero maximum is the plain loop's.
SEQLAB_AVX512 float row_max8(const float* x, int64_t n) {
  __m256 acc = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + c), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; c < n; ++c) lanes[0] = x[c] > lanes[0] ? x[c] : lanes[0];
  for (int u = 1; u < 8; ++u) lanes[0] = lanes[u] > lanes[0] ? lanes[u] : lanes[0];
  return lanes[0];
}

// GELU's exponent −2·√(2/π)·(x + a·x³), with the plain loop's fusion: x + ((a·x)·x)·x as one fma.
SEQLAB_AVX512 inline __m512 gelu_exponent16(__m512 x) {
  const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(float(math::kGeluA)), x), x), x, x);
  return _mm512_mul_ps(_mm512_set1_ps(float(-2 * math::kGeluC)), inner);
}

// σ(x) = 1 / (1 + e^(−x)) for x ≥ 0, e^x / (1 + e^x) below (math::sigmoid: the exponent −|x|, by a
// sign flip, never overflows).
SEQLAB_AVX512 inline __m512 sigmoid16(__m512 x) {
  const __mmask16 ge = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 minus_x = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  const __m512 e = exp16(_mm512_mask_mov_ps(x, ge, minus_x));
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  return _mm512_mask_mov_ps(_mm512_mul_ps(e, r), ge, r);
}

// op(x) for the ops of avx512_unary_forward.
SEQLAB_AVX512 inline __m512 forward16(kernel::UnaryOp op, __m512 x) {
  switch (op) {
    case kernel::UnaryOp::gelu:  // x / (1 + e^(−2u))
      return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(gelu_exponent16(x))));
    case kernel::UnaryOp::silu:
      return _mm512_mul_ps(x, sigmoid16(x));
    default:
      return sigmoid16(x);
  }
}

// dy · op'(x) for the ops of avx512_unary_backward, with the plain loop's fusions:
//   gelu: s = σ(2u), du = √(2/π)(1 + 3a·x²), dy · (s + 2x·s·(1 − s)·du);
//   silu: s = σ(x), dy · (s + x·s·(1 − s));  softplus: dy · σ(x).
SEQLAB_AVX512 inline __m512 backward16(kernel::UnaryOp op, __m512 dy, __m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  switch (op) {
    case kernel::UnaryOp::gelu: {
      const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp16(gelu_exponent16(x))));
      const __m512 du =
          _mm512_mul_ps(_mm512_set1_ps(float(math::kGeluC)),
                        _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(float(3 * math::kGeluA)), x), x, one));
      const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), x), s), _mm512_sub_ps(one, s));
      return _mm512_mul_ps(dy, _mm512_fmadd_ps(t, du, s));
    }
    case kernel::UnaryOp::silu: {
      const __m512 s = sigmoid16(x);
      return _mm512_mul_ps(dy, _mm512_fmadd_ps(_mm512_mul_ps(x, s), _mm512_sub_ps(one, s), s));
    }
    default:
      return _mm512_mul_ps(dy, sigmoid16(x));
  }
}

// 16 bf16 values widened to f32 (exact: the bits shifted up), as widen_bf16_run.
SEQLAB_AVX512 inline __m512 widen16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 floats rounded to bf16 as bf16(float) (tensor/dtype.h): (u + 0x7fff + bit 16 of u) >> 16, to nearest
// even; a NaN keeps its top bits with the quiet bit set.
SEQLAB_AVX512 inline void round16(bf16* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// The first k ≤ 16 values of a run as f32 lanes (the rest 0), and back: f32 through masked loads and
// stores; bf16 widened and rounded in registers, a last partial vector through a copy padded with zeros.
SEQLAB_AVX512 inline __m512 load16(const float* p, int64_t k) {
  return k == 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(first(k), p);
}
SEQLAB_AVX512 inline void store16(float* p, __m512 v, int64_t k) {
  if (k == 16) return _mm512_storeu_ps(p, v);
  _mm512_mask_storeu_ps(p, first(k), v);
}
SEQLAB_AVX512 inline __m512 load16(const bf16* p, int64_t k) {
  if (k == 16) return widen16(p);
  bf16 t[16] = {};
  std::copy(p, p + k, t);
  return widen16(t);
}
SEQLAB_AVX512 inline void store16(bf16* p, __m512 v, int64_t k) {
  if (k == 16) return round16(p, v);
  bf16 t[16];
  round16(t, v);
  std::copy(t, t + k, p);
}

// The loops over a run of n values, 16 at a time, on f32 or bf16 storage (T), computing in f32.
template <class T>
SEQLAB_AVX512 void forward_loop(kernel::UnaryOp op, T* y, int64_t n, const T* x) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t k = std::min<int64_t>(16, n - i);
    store16(y + i, forward16(op, load16(x + i, k)), k);
  }
}

template <class T>
SEQLAB_AVX512 void backward_loop(kernel::UnaryOp op, T* dx, int64_t n, const T* dy, const T* x) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t k = std::min<int64_t>(16, n - i);
    store16(dx + i, backward16(op, load16(dy + i, k), load16(x + i, k)), k);
  }
}

SEQLAB_AVX512 void round_loop(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t k = std::min<int64_t>(16, n - i);
    store16(dst + i, load16(src + i, k), k);
  }
}

#undef SEQLAB_AVX512

}  // namespace

bool exp_shifted_sum_avx512(float* x, int64_t n, float shift, float& sum) {
  if (!avx512_on()) return false;
  sum = exp_shifted_sum16(x, n, shift);
  return true;
}
bool exp_shifted_avx512(float* x, int64_t n, float shift) {
  if (!avx512_on()) return false;
  exp_shifted16(x, n, shift);
  return true;
}
bool row_max_avx512(const float* x, int64_t n, float& max) {
  if (!avx512_on()) return false;
  max = row_max8(x, n);
  return true;
}
bool unary_forward_avx512(kernel::UnaryOp op, float* y, int64_t n, const float* x) {
  if (!avx512_unary_forward(op) || !avx512_on()) return false;
  forward_loop(op, y, n, x);
  return true;
}
bool unary_backward_avx512(kernel::UnaryOp op, float* dx, int64_t n, const float* dy, const float* x) {
  if (!avx512_unary_backward(op) || !avx512_on()) return false;
  backward_loop(op, dx, n, dy, x);
  return true;
}
bool round_to_bf16_avx512(const float* src, bf16* dst, int64_t n) {
  if (!avx512_on()) return false;
  round_loop(src, dst, n);
  return true;
}
bool unary_forward_avx512(kernel::UnaryOp op, bf16* y, int64_t n, const bf16* x) {
  if (!avx512_unary_forward(op) || !avx512_on()) return false;
  forward_loop(op, y, n, x);
  return true;
}
bool unary_backward_avx512(kernel::UnaryOp op, bf16* dx, int64_t n, const bf16* dy, const bf16* x) {
  if (!avx512_unary_backward(op) || !avx512_on()) return false;
  backward_loop(op, dx, n, dy, x);
  return true;
}

#else  // a build for another CPU: the plain loops run

bool exp_shifted_sum_avx512(float*, int64_t, float, float&) { return false; }
bool exp_shifted_avx512(float*, int64_t, float) { return false; }
bool row_max_avx512(const float*, int64_t, float&) { return false; }
bool unary_forward_avx512(kernel::UnaryOp, float*, int64_t, const float*) { return false; }
bool unary_backward_avx512(kernel::UnaryOp, float*, int64_t, const float*, const float*) { return false; }
bool round_to_bf16_avx512(const float*, bf16*, int64_t) { return false; }
bool unary_forward_avx512(kernel::UnaryOp, bf16*, int64_t, const bf16*) { return false; }
bool unary_backward_avx512(kernel::UnaryOp, bf16*, int64_t, const bf16*, const bf16*) { return false; }

#endif  // SEQLAB_BUILD_AVX512

}  // namespace seqlab::cpu

namespace seqlab::kernel {

void set_cpu_avx512(bool on) { cpu::state.store(on && cpu::cpu_has_avx512() ? 1 : 0, std::memory_order_relaxed); }
bool cpu_avx512() { return cpu::avx512_on(); }

}  // namespace seqlab::kernel
