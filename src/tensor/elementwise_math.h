// Scalar formulas of the elementwise ops, shared by the CPU kernels and the CUDA kernels so both
// compute exactly the same function. T is float or double.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/kernels.h"

#ifdef __CUDACC__
#define SEQLAB_HD __host__ __device__ __forceinline__
#else
#define SEQLAB_HD inline
#endif

namespace seqlab::math {

#ifndef __CUDACC__
// Host code picks the float overloads from std; nvcc provides them for device code.
using std::exp;
using std::fabs;
using std::log;
using std::log1p;
using std::pow;
using std::sqrt;
using std::tanh;
#endif

#ifndef __CUDACC__
// The part of eˣ both exp_vec and exp_vec_nonpositive compute, for a finite, clamped x: n = round(x/ln2)
// and eʳ (r = x − n·ln2, |r| ≤ ln2/2) by Cephes' degree-6 polynomial, so that eˣ = eʳ · 2ⁿ.
inline float exp_reduced(float xc, float& n) {
  const float round_magic = 12582912.0f;  // 1.5·2²³: adding it rounds to an integer
  n = (xc * 1.44269504f + round_magic) - round_magic;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two for exactness
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// eˣ for float without a call or a branch, so that loops over it vectorise (libm's expf is a
// call per element). x = n·ln2 + r with n = round(x/ln2), |r| ≤ ln2/2; eʳ by Cephes' degree-6
// polynomial (relative error below 2e-7, about 2 ulp), times 2ⁿ built in the exponent bits.
// Results down to the subnormals are kept (2ⁿ is built in two factors below n = −126); below −103.97
// the result is 0, above 88 it is +∞ (giving up e⁸⁸ … e^88.7 ≈ 1.7e38 … 3.4e38, which no caller
// needs), NaN stays NaN. (Loops over it vectorise when built with -fno-trapping-math, as the library is.)
inline float exp_vec(float x) {
  const float lo = -103.972084f, hi = 88.0f;  // below lo, eˣ rounds to 0 in float
  // Two selects (GCC does not if-convert the nested form); the second is written so that NaN, for
  // which every comparison is false, becomes hi: n stays finite, and converting it to an integer is
  // defined (the result is x itself, below).
  float xc = x < lo ? lo : x;
  xc = xc <= hi ? xc : hi;
  float n;
  const float p = exp_reduced(xc, n);
  // 2ⁿ as a normal float needs n ≥ −126; below, build 2^(n+64) and scale by 2^−64 (a subnormal result).
  const int32_t ni = static_cast<int32_t>(n);
  const bool subnormal = ni < -126;
  const int32_t bits = ((subnormal ? ni + 64 : ni) + 127) << 23;
  float y = p * __builtin_bit_cast(float, bits);
  y = subnormal ? y * 5.42101086e-20f : y;  // 2^−64
  y = x < lo ? 0.0f : y;
  y = x > hi ? HUGE_VALF : y;
  return x != x ? x : y;
}
inline double exp_vec(double x) { return std::exp(x); }

// eˣ for x ≤ 0 (a softmax's exponents, x = s − max s or s − lse): exp_vec without the subnormal
// and overflow handling, about 40% faster in a loop (softmax attention computes one per score).
// The same bits as exp_vec wherever eˣ is a normal float (x ≥ −87.33, where 2ⁿ needs no second
// factor); 0 below, where exp_vec gives subnormals (< 1.2e-38, beside the row's largest term, 1).
// −∞ gives 0 and NaN stays NaN; x > 0 is right up to 88 and gives e⁸⁸ above (it is meant for x ≤ 0 plus
// rounding). As in exp_vec, the clamps turn NaN into a finite value before n is converted to an integer.
inline float exp_vec_nonpositive(float x) {
  const float lo = -87.33654f, hi = 88.0f;  // lo: ln of the smallest normal float, 2⁻¹²⁶
  float xc = x > lo ? x : lo;  // NaN → lo (one max instruction, which returns its second operand for NaN)
  xc = xc < hi ? xc : hi;
  float n;
  const float p = exp_reduced(xc, n);
  const float y = p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return x != x ? x : (x < lo ? 0.0f : y);
}
inline double exp_vec_nonpositive(double x) { return std::exp(x); }

// log(1 + u) for u in [0, 1] (softplus' log(1 + e^−|x|)), without a call or a branch, so that loops
// over it vectorise (libm's log1pf is a call per element, 16 ns each here). m = 1 + u ∈ [1, 2] is
// written m = 2ᵏ·f with f ∈ [√½, √2) (k = 0 or 1, f = m or m/2, both exact), log m = k·ln2 + log f, and
// log f = log(1 + t), t = f − 1 (exact) ∈ [−0.293, 0.415], as t − t²/2 + t³·P(t) with Cephes' degree-8
// polynomial P (relative error about 1e-7). 1 + u is rounded; its error is added back as
// (u − (m − 1)) / m, so tiny u give u, not 0. NaN stays NaN; outside [0, 1] the result is not log1p.
inline float log1p_unit_vec(float u) {
  const float m = 1.0f + u;
  const bool halve = m > 1.41421356f;
  const float f = halve ? 0.5f * m : m;
  const float k = halve ? 1.0f : 0.0f;
  const float t = f - 1.0f, t2 = t * t;
  float p = 7.0376836292e-2f;
  p = p * t - 1.1514610310e-1f;
  p = p * t + 1.1676998740e-1f;
  p = p * t - 1.2420140846e-1f;
  p = p * t + 1.4249322787e-1f;
  p = p * t - 1.6668057665e-1f;
  p = p * t + 2.0000714765e-1f;
  p = p * t - 2.4999993993e-1f;
  p = p * t + 3.3333331174e-1f;
  const float log_f = t + (p * t * t2 - 0.5f * t2);
  const float rounding = (u - (m - 1.0f)) / m;
  return (k * 0.693359375f + (log_f + (rounding - k * 2.12194440e-4f)));  // ln2 split in two, as in exp_reduced
}
inline double log1p_unit_vec(double u) { return std::log1p(u); }
#else
template <class T>
SEQLAB_HD T exp_vec(T x) {
  return exp(x);
}
template <class T>
SEQLAB_HD T log1p_unit_vec(T u) {
  return log1p(u);
}
#endif

template <class T>
SEQLAB_HD T sigmoid(T x) {
  // σ(x) = 1 / (1 + e^(−x)) for x ≥ 0, e^x / (1 + e^x) below: the exponent −|x| ≤ 0 never overflows.
  // Selects, not branches, and exp_vec, so loops over it (sigmoid, silu, SwiGLU) vectorise.
  const T e = exp_vec(x >= T(0) ? -x : x);
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}

// GELU, tanh form: ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³). Computed as x·σ(2u), the same
// function (½(1 + tanh u) = σ(2u)) with one exp and no branch: y = x / (1 + e^(−2u)).
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;

// y = f(x)
template <class T>
SEQLAB_HD T unary_forward(kernel::UnaryOp op, T x, T alpha) {
  using kernel::UnaryOp;
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return T(1) / sqrt(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return sigmoid(x);
    case UnaryOp::silu: return x * sigmoid(x);
    case UnaryOp::gelu: return x / (T(1) + exp_vec(T(-2 * kGeluC) * (x + T(kGeluA) * x * x * x)));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::elu: return x > T(0) ? x : alpha * (exp(x) - T(1));
    // log(1 + eˣ) = max(x, 0) + log(1 + e^−|x|): stable, and e^−|x| ∈ [0, 1] is log1p_unit_vec's domain.
    case UnaryOp::softplus: return (x > T(0) ? x : T(0)) + log1p_unit_vec(exp_vec(-fabs(x)));
  }
  return x;
}

// Which of x and y = f(x) unary_backward's formula below reads (a kernel may skip loading the other).
constexpr bool unary_backward_reads_x(kernel::UnaryOp op) {
  using kernel::UnaryOp;
  return op == UnaryOp::log || op == UnaryOp::square || op == UnaryOp::silu || op == UnaryOp::gelu ||
         op == UnaryOp::relu || op == UnaryOp::elu || op == UnaryOp::softplus;
}
constexpr bool unary_backward_reads_y(kernel::UnaryOp op) {
  using kernel::UnaryOp;
  return op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::tanh ||
         op == UnaryOp::sigmoid || op == UnaryOp::elu;
}

// dx = dy · f'(x), given x and y = f(x).
template <class T>
SEQLAB_HD T unary_backward(kernel::UnaryOp op, T dy, T x, T y, T alpha) {
  using kernel::UnaryOp;
  switch (op) {
    case UnaryOp::neg: return -dy;
    case UnaryOp::exp: return dy * y;
    case UnaryOp::log: return dy / x;
    case UnaryOp::sqrt: return dy * T(0.5) / y;
    case UnaryOp::rsqrt: return dy * T(-0.5) * y * y * y;
    case UnaryOp::square: return dy * T(2) * x;
    case UnaryOp::tanh: return dy * (T(1) - y * y);
    case UnaryOp::sigmoid: return dy * y * (T(1) - y);
    case UnaryOp::silu: {
      T s = sigmoid(x);
      return dy * (s + x * s * (T(1) - s));
    }
    case UnaryOp::gelu: {
      // With s = σ(2u): y = x s, dy/dx = s + x · 2s(1 − s) · du/dx  (since 1 − tanh²u = 4s(1 − s)).
      const T s = T(1) / (T(1) + exp_vec(T(-2 * kGeluC) * (x + T(kGeluA) * x * x * x)));
      const T du = T(kGeluC) * (T(1) + T(3 * kGeluA) * x * x);
      return dy * (s + T(2) * x * s * (T(1) - s) * du);
    }
    case UnaryOp::relu: return x > T(0) ? dy : T(0);
    case UnaryOp::elu: return x > T(0) ? dy : dy * (y + alpha);
    case UnaryOp::softplus: return dy * sigmoid(x);
  }
  return dy;
}

template <class T>
SEQLAB_HD T binary(kernel::BinaryOp op, T a, T b) {
  using kernel::BinaryOp;
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
  }
  return a;
}

template <class T>
SEQLAB_HD T scalar(kernel::ScalarOp op, T x, T s) {
  using kernel::ScalarOp;
  switch (op) {
    case ScalarOp::add: return x + s;
    case ScalarOp::mul: return x * s;
    case ScalarOp::pow: return pow(x, s);
    case ScalarOp::rsub: return s - x;
    case ScalarOp::rdiv: return s / x;
  }
  return x;
}

}  // namespace seqlab::math
