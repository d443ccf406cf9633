// The per-thread work of the S4D CUDA kernels (src/cuda/ssm/s4.cu), as __host__ __device__ functions over
// plain pointers with the thread's index as an argument, so that tests/s4_emulation_test.cc runs exactly
// this schedule on the CPU against the CPU kernels (src/layers/ssm/s4.cpp). No CUDA intrinsic appears here.
//
// Per channel h and mode n (equations in src/layers/ssm/s4.h, derivations in docs/variants/s4.md):
//   Ā, B̄ = φ·B from Λ and Δ = exp(log_dt) (zoh or bilinear),  x_t = Ā x_{t−1} + B̄ u_t,
//   y_t = 2·Re(Σ_n C_n x_{t,n}) + D u_t,  K_j = 2·Re(Σ_n C_n Ā_n^j B̄_n).
// Everything is computed in double whatever the element type (f32, f64, bf16 stored), as the CPU kernels
// do, so the two agree to f64 round-off before the outputs' rounding. Threads and what they write, each
// element by one thread in a fixed order (deterministic, no atomics):
// recurrent form
//   forward      one thread per (b, h): modes one after another, y_t accumulated in a double scratch row
//                [T], then rounded once; final_state[b, h, n].
//   backward     one thread per (b, h): per mode the states x_t into a scratch row [T] (complex), then the
//                reverse walk (g += conj(C)·2dy_t, g_C, g_Ā, g_B̄, du_t += Re(conj(g) B̄), g ← conj(Ā) g),
//                du in a double scratch row, the mode's (g_Ā, g_B̄, g_C) into partials [B, H, N2, 6] and
//                Σ_t u dy into [B, H]; d initial_state = g. Then one thread per (h, n) sums the partials
//                over b and applies the chain rule to Λ, B, C and ∂L/∂Δ (partial per mode), and one thread
//                per h sums ∂L/∂Δ over the modes (dlog_dt) and dD over b.
// convolution form
//   kernel       one thread per (h, j): K_j, with Ā^j by binary powering.
//   forward      one thread per (b, h, t): y_t = Σ_{j≤t} K_j u_{t−j} + D u_t + 2·Re(Σ_n C_n Ā_n^{t+1} x_{−1,n});
//                one thread per (b, h, n): x_T by Horner's rule over s (= Ā^T x_{−1} + Σ_s Ā^{T−1−s} B̄ u_s).
//   backward     one thread per (h, j): dK_j = Σ_b Σ_{t≥j} dy_t u_{t−j}; one per (b, h, s): du_s; one per
//                (h, n): the kernel's, the initial state's and the final state's terms of g_Ā, g_B̄, g_C
//                (powers by repeated multiplication), d initial_state for every b, and the chain rule;
//                then the per-h sums as in the recurrent form.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/elementwise_math.h"  // SEQLAB_HD: __host__ __device__ under nvcc, inline elsewhere

namespace seqlab::s4_cuda {

#ifndef __CUDACC__
using std::cos;
using std::exp;
using std::expm1;
using std::sin;
using std::sqrt;
#endif

// A complex double with the few operations the op needs (std::complex is not device code).
struct Cx {
  double re = 0, im = 0;
};
SEQLAB_HD Cx cx(double re, double im = 0) { return Cx{re, im}; }
SEQLAB_HD Cx operator+(Cx a, Cx b) { return {a.re + b.re, a.im + b.im}; }
SEQLAB_HD Cx operator-(Cx a, Cx b) { return {a.re - b.re, a.im - b.im}; }
SEQLAB_HD Cx operator*(Cx a, Cx b) { return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
SEQLAB_HD Cx operator*(double s, Cx a) { return {s * a.re, s * a.im}; }
SEQLAB_HD Cx conj(Cx a) { return {a.re, -a.im}; }
SEQLAB_HD Cx operator/(Cx a, Cx b) {
  const double d = b.re * b.re + b.im * b.im;
  return {(a.re * b.re + a.im * b.im) / d, (a.im * b.re - a.re * b.im) / d};
}
SEQLAB_HD double cabs(Cx a) { return sqrt(a.re * a.re + a.im * a.im); }
SEQLAB_HD Cx cexp(Cx a) {
  const double m = exp(a.re);
  return {m * cos(a.im), m * sin(a.im)};
}
// e^z − 1 without cancellation: Re = expm1(a) cos b − 2 sin²(b/2), Im = e^a sin b.
SEQLAB_HD Cx cexpm1(Cx z) {
  const double s = sin(0.5 * z.im);
  return {expm1(z.re) * cos(z.im) - 2 * s * s, exp(z.re) * sin(z.im)};
}
// a^k for k ≥ 0 by binary powering.
SEQLAB_HD Cx cpow(Cx a, int64_t k) {
  Cx r = cx(1), p = a;
  while (k > 0) {
    if (k & 1) r = r * p;
    p = p * p;
    k >>= 1;
  }
  return r;
}

// Elements in and out: double for f64, through float for f32 and bf16.
template <class T>
SEQLAB_HD double ld(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, double>) {
    return p[i];
  } else {
    return static_cast<double>(static_cast<float>(p[i]));
  }
}
template <class T>
SEQLAB_HD void st(T* p, int64_t i, double v) {
  if constexpr (std::is_same_v<T, double>) {
    p[i] = v;
  } else {
    p[i] = static_cast<T>(static_cast<float>(v));
  }
}
template <class T>
SEQLAB_HD Cx ldc(const T* p, int64_t i) {
  return cx(ld(p, 2 * i), ld(p, 2 * i + 1));
}
template <class T>
SEQLAB_HD void stc(T* p, int64_t i, Cx v) {
  st(p, 2 * i, v.re);
  st(p, 2 * i + 1, v.im);
}

struct Dims {
  int64_t B, T, H, N2;
  bool zoh;
  SEQLAB_HD int64_t row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
  SEQLAB_HD int64_t mode(int64_t h, int64_t n) const { return h * N2 + n; }                // into A, B, C
  SEQLAB_HD int64_t state(int64_t b, int64_t h, int64_t n) const { return (b * H + h) * N2 + n; }
};

// Inputs, contiguous, element type T: u [B, T, H], log_dt [H], A, B, C [H, N2, 2], D [H] or null,
// x0 [B, H, N2, 2] or null.
template <class T>
struct Inputs {
  const T *u, *log_dt, *A, *B, *C, *D, *x0;
};

// One mode's discretisation and derivatives, as the CPU's discretise (s4.cpp): z = ΔΛ, B̄ = φ B.
struct Mode {
  Cx Abar, phi, Bbar, C, B, lambda, dA_dL, dA_dDt, dphi_dL, dphi_dDt;
  double dt;
};

template <class T>
SEQLAB_HD Mode mode_of(const Dims& d, const Inputs<T>& in, int64_t h, int64_t n) {
  Mode m;
  const int64_t i = d.mode(h, n);
  m.dt = exp(ld(in.log_dt, h));
  m.lambda = ldc(in.A, i);
  m.B = ldc(in.B, i);
  m.C = ldc(in.C, i);
  const Cx z = m.dt * m.lambda;
  if (d.zoh) {
    const Cx ez = cexp(z);
    Cx psi, chi;
    if (cabs(z) < 1e-3) {  // Taylor series where the quotients cancel
      psi = cx(1) + z * (cx(1.0 / 2) + z * (cx(1.0 / 6) + z * (cx(1.0 / 24) + z * (cx(1.0 / 120) + z * cx(1.0 / 720)))));
      chi = cx(1.0 / 2) + z * (cx(1.0 / 3) + z * (cx(1.0 / 8) + z * (cx(1.0 / 30) + z * (cx(1.0 / 144) + z * cx(1.0 / 840)))));
    } else {
      psi = cexpm1(z) / z;
      chi = (ez - psi) / z;
    }
    m.Abar = ez;
    m.phi = m.dt * psi;
    m.dA_dL = m.dt * ez;
    m.dA_dDt = m.lambda * ez;
    m.dphi_dL = (m.dt * m.dt) * chi;
    m.dphi_dDt = ez;
  } else {
    const Cx w = cx(1) / (cx(1) - 0.5 * z), w2 = w * w;
    m.Abar = (cx(1) + 0.5 * z) * w;
    m.phi = m.dt * w;
    m.dA_dL = m.dt * w2;
    m.dA_dDt = m.lambda * w2;
    m.dphi_dL = (0.5 * m.dt * m.dt) * w2;
    m.dphi_dDt = w2;
  }
  m.Bbar = m.phi * m.B;
  return m;
}

// The chain rule from (g_Ā, g_B̄, g_C) of mode (h, n) to dA, dB, dC there; returns ∂L/∂Δ's part.
template <class T>
SEQLAB_HD double write_mode_grads(const Dims& d, const Mode& m, Cx gA, Cx gB, Cx gC, int64_t h, int64_t n, T* dA,
                                  T* dB, T* dC) {
  const int64_t i = d.mode(h, n);
  const Cx gphi = conj(m.B) * gB;
  stc(dB, i, conj(m.phi) * gB);
  stc(dA, i, conj(m.dA_dL) * gA + conj(m.dphi_dL) * gphi);
  stc(dC, i, gC);
  return (conj(m.dA_dDt) * gA + conj(m.dphi_dDt) * gphi).re;
}

// ---- recurrent form -----------------------------------------------------------------------------

// Thread (b, h): ybuf [T] double scratch of this thread.
template <class T>
SEQLAB_HD void recurrent_forward(int64_t bh, const Dims& d, const Inputs<T>& in, double* ybuf, T* y, T* xT) {
  const int64_t b = bh / d.H, h = bh % d.H;
  const double D = in.D ? ld(in.D, h) : 0.0;
  for (int64_t t = 0; t < d.T; ++t) ybuf[t] = 0;
  for (int64_t n = 0; n < d.N2; ++n) {
    const Mode m = mode_of(d, in, h, n);
    Cx x = in.x0 ? ldc(in.x0, d.state(b, h, n)) : cx(0);
    for (int64_t t = 0; t < d.T; ++t) {
      x = m.Abar * x + ld(in.u, d.row(b, t, h)) * m.Bbar;
      ybuf[t] += (m.C * x).re;
    }
    stc(xT, d.state(b, h, n), x);
  }
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    st(y, r, 2 * ybuf[t] + D * ld(in.u, r));
  }
}

// Thread (b, h): xs [T] complex and dubuf [T] double scratch of this thread; partial [B, H, N2, 6]
// (g_Ā, g_B̄, g_C of this batch entry) and dd [B, H] (Σ_t u dy) shared, one slot per thread.
template <class T>
SEQLAB_HD void recurrent_backward(int64_t bh, const Dims& d, const Inputs<T>& in, const T* dy, const T* dfinal, Cx* xs,
                                  double* dubuf, double* partial, double* dd, T* du, T* dx0) {
  const int64_t b = bh / d.H, h = bh % d.H;
  const double D = in.D ? ld(in.D, h) : 0.0;
  double dD = 0;
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t r = d.row(b, t, h);
    dubuf[t] = D * ld(dy, r);
    dD += ld(in.u, r) * ld(dy, r);
  }
  dd[bh] = dD;
  for (int64_t n = 0; n < d.N2; ++n) {
    const Mode m = mode_of(d, in, h, n);
    const int64_t s = d.state(b, h, n);
    const Cx x0 = in.x0 ? ldc(in.x0, s) : cx(0);
    for (int64_t t = 0; t < d.T; ++t) xs[t] = m.Abar * (t ? xs[t - 1] : x0) + ld(in.u, d.row(b, t, h)) * m.Bbar;
    Cx g = ldc(dfinal, s), gA = cx(0), gB = cx(0), gC = cx(0);
    for (int64_t t = d.T - 1; t >= 0; --t) {
      const int64_t r = d.row(b, t, h);
      const double rt = 2 * ld(dy, r);
      g = g + rt * conj(m.C);
      gC = gC + rt * conj(xs[t]);
      gA = gA + conj(t ? xs[t - 1] : x0) * g;
      gB = gB + ld(in.u, r) * g;
      dubuf[t] += (conj(g) * m.Bbar).re;
      g = conj(m.Abar) * g;
    }
    double* p = partial + 6 * s;
    p[0] = gA.re, p[1] = gA.im, p[2] = gB.re, p[3] = gB.im, p[4] = gC.re, p[5] = gC.im;
    if (dx0) stc(dx0, s, g);
  }
  for (int64_t t = 0; t < d.T; ++t) st(du, d.row(b, t, h), dubuf[t]);
}

// Thread (h, n): the partials summed over b in order, then the chain rule; ddt [H, N2] gets ∂L/∂Δ's part.
template <class T>
SEQLAB_HD void recurrent_mode_grads(int64_t hn, const Dims& d, const Inputs<T>& in, const double* partial, double* ddt,
                                    T* dA, T* dB, T* dC) {
  const int64_t h = hn / d.N2, n = hn % d.N2;
  Cx gA = cx(0), gB = cx(0), gC = cx(0);
  for (int64_t b = 0; b < d.B; ++b) {
    const double* p = partial + 6 * d.state(b, h, n);
    gA = gA + cx(p[0], p[1]);
    gB = gB + cx(p[2], p[3]);
    gC = gC + cx(p[4], p[5]);
  }
  ddt[hn] = write_mode_grads(d, mode_of(d, in, h, n), gA, gB, gC, h, n, dA, dB, dC);
}

// Thread h: dlog_dt = Δ Σ_n ∂L/∂Δ parts; dD = Σ_b dd (dd null: the convolution form's, summed here from
// u and dy).
template <class T>
SEQLAB_HD void channel_grads(int64_t h, const Dims& d, const Inputs<T>& in, const T* dy, const double* ddt,
                             const double* dd, T* dlog_dt, T* dD) {
  double s = 0;
  for (int64_t n = 0; n < d.N2; ++n) s += ddt[d.mode(h, n)];
  st(dlog_dt, h, exp(ld(in.log_dt, h)) * s);
  if (!dD) return;
  double acc = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    if (dd) {
      acc += dd[b * d.H + h];
    } else {
      for (int64_t t = 0; t < d.T; ++t) acc += ld(in.u, d.row(b, t, h)) * ld(dy, d.row(b, t, h));
    }
  }
  st(dD, h, acc);
}

// ---- convolution form ---------------------------------------------------------------------------

// Thread (h, j): K [H, T] double.
template <class T>
SEQLAB_HD void conv_kernel(int64_t hj, const Dims& d, const Inputs<T>& in, double* K) {
  const int64_t h = hj / d.T, j = hj % d.T;
  double acc = 0;
  for (int64_t n = 0; n < d.N2; ++n) {
    const Mode m = mode_of(d, in, h, n);
    acc += (m.C * cpow(m.Abar, j) * m.Bbar).re;
  }
  K[hj] = 2 * acc;
}

// Thread (b, h, t).
template <class T>
SEQLAB_HD void conv_forward(int64_t bht, const Dims& d, const Inputs<T>& in, const double* K, T* y) {
  const int64_t t = bht % d.T, h = (bht / d.T) % d.H, b = bht / (d.T * d.H);
  const int64_t r = d.row(b, t, h);
  double acc = (in.D ? ld(in.D, h) : 0.0) * ld(in.u, r);
  const double* Kh = K + h * d.T;
  for (int64_t j = 0; j <= t; ++j) acc += Kh[j] * ld(in.u, d.row(b, t - j, h));
  if (in.x0) {
    double init = 0;
    for (int64_t n = 0; n < d.N2; ++n) {
      const Mode m = mode_of(d, in, h, n);
      init += (m.C * cpow(m.Abar, t + 1) * ldc(in.x0, d.state(b, h, n))).re;
    }
    acc += 2 * init;
  }
  st(y, r, acc);
}

// Thread (b, h, n): x_T = Ā^T x_{−1} + Σ_s Ā^{T−1−s} B̄ u_s by Horner's rule.
template <class T>
SEQLAB_HD void conv_final_state(int64_t bhn, const Dims& d, const Inputs<T>& in, T* xT) {
  const int64_t n = bhn % d.N2, h = (bhn / d.N2) % d.H, b = bhn / (d.N2 * d.H);
  const Mode m = mode_of(d, in, h, n);
  Cx x = in.x0 ? ldc(in.x0, bhn) : cx(0);
  for (int64_t s = 0; s < d.T; ++s) x = m.Abar * x + ld(in.u, d.row(b, s, h)) * m.Bbar;
  stc(xT, bhn, x);
}

// Thread (h, j): dK [H, T] double.
template <class T>
SEQLAB_HD void conv_dkernel(int64_t hj, const Dims& d, const Inputs<T>& in, const T* dy, double* dK) {
  const int64_t h = hj / d.T, j = hj % d.T;
  double acc = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = j; t < d.T; ++t) acc += ld(dy, d.row(b, t, h)) * ld(in.u, d.row(b, t - j, h));
  }
  dK[hj] = acc;
}

// Thread (b, h, s): du_s = Σ_{t≥s} K_{t−s} dy_t + D dy_s + Re(Σ_n conj(G_n) Ā_n^{T−1−s} B̄_n).
template <class T>
SEQLAB_HD void conv_du(int64_t bhs, const Dims& d, const Inputs<T>& in, const T* dy, const T* dfinal, const double* K,
                       T* du) {
  const int64_t s = bhs % d.T, h = (bhs / d.T) % d.H, b = bhs / (d.T * d.H);
  double acc = (in.D ? ld(in.D, h) : 0.0) * ld(dy, d.row(b, s, h));
  const double* Kh = K + h * d.T;
  for (int64_t t = s; t < d.T; ++t) acc += Kh[t - s] * ld(dy, d.row(b, t, h));
  for (int64_t n = 0; n < d.N2; ++n) {
    const Mode m = mode_of(d, in, h, n);
    acc += (conj(ldc(dfinal, d.state(b, h, n))) * cpow(m.Abar, d.T - 1 - s) * m.Bbar).re;
  }
  st(du, d.row(b, s, h), acc);
}

// Thread (h, n): g_Ā, g_B̄, g_C of the mode from the kernel (dK), the initial state's and the final state's
// terms (the CPU's convolution_backward, s4.cpp, term by term), d initial_state, then the chain rule.
template <class T>
SEQLAB_HD void conv_mode_grads(int64_t hn, const Dims& d, const Inputs<T>& in, const T* dy, const T* dfinal,
                               const double* dK, double* ddt, T* dA, T* dB, T* dC, T* dx0) {
  const int64_t h = hn / d.N2, n = hn % d.N2;
  const Mode m = mode_of(d, in, h, n);
  Cx gA = cx(0), gB = cx(0), gC = cx(0);
  {
    Cx P = cx(1), Pprev = cx(0), sK = cx(0), sKA = cx(0);  // Σ_j 2dK_j Ā^j, Σ_{j≥1} 2dK_j j Ā^{j−1}
    for (int64_t j = 0; j < d.T; ++j) {
      const double k2 = 2 * dK[h * d.T + j];
      sK = sK + k2 * P;
      if (j >= 1) sKA = sKA + (k2 * static_cast<double>(j)) * Pprev;
      Pprev = P;
      P = P * m.Abar;
    }
    gC = gC + conj(sK * m.Bbar);
    gB = gB + conj(m.C * sK);
    gA = gA + conj(m.C * sKA * m.Bbar);
  }
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t s = d.state(b, h, n);
    const Cx G = ldc(dfinal, s);
    // Σ_s u_s Ā^{T−1−s} and Σ_s (T−1−s) Ā^{T−2−s} u_s, walking s from T−1 down (power e = T−1−s up).
    Cx Ub = cx(0), Ua = cx(0), P = cx(1), Pprev = cx(0);
    for (int64_t e = 0; e < d.T; ++e) {
      const double us = ld(in.u, d.row(b, d.T - 1 - e, h));
      Ub = Ub + us * P;
      if (e >= 1) Ua = Ua + (static_cast<double>(e) * us) * Pprev;
      Pprev = P;
      P = P * m.Abar;
    }
    gB = gB + conj(Ub) * G;
    gA = gA + conj(Ua * m.Bbar) * G;
    if (!in.x0) continue;
    const Cx x0 = ldc(in.x0, s);
    Cx sC = cx(0), sA = cx(0), Q = m.Abar, Qprev = cx(1);  // Σ_t r_t Ā^{t+1}, Σ_t r_t (t+1) Ā^t
    for (int64_t t = 0; t < d.T; ++t) {
      const double r = 2 * ld(dy, d.row(b, t, h));
      sC = sC + r * Q;
      sA = sA + (r * static_cast<double>(t + 1)) * Qprev;
      Qprev = Q;
      Q = Q * m.Abar;
    }
    // Qprev = Ā^T, and Ā^{T−1} = cpow(Ā, T−1)
    gC = gC + conj(sC * x0);
    gA = gA + conj(m.C * sA * x0);
    if (d.T >= 1) gA = gA + conj(static_cast<double>(d.T) * cpow(m.Abar, d.T - 1) * x0) * G;
    if (dx0) stc(dx0, s, conj(m.C * sC) + conj(Qprev) * G);
  }
  ddt[hn] = write_mode_grads(d, m, gA, gB, gC, h, n, dA, dB, dC);
}

// ---- diagonal-plus-low-rank form -----------------------------------------------------------------
// A = diag(Λ) − P Q*, M = I − ΔA/2, R = M⁻¹, Ā = 2R − I, B̄ = Δ R B (bilinear only; src/layers/ssm/s4.h).
// One thread per channel h for the forward and one for the backward, each the CPU's dplr_forward /
// dplr_backward (s4.cpp) for that h, step for step and in the same order (the batch walked inside), with
// the CPU's std::vector and Mat locals carved from a per-channel scratch slice (DplrWork). I − ΔA/2 is
// never singular when Re Λ ≤ 0 (the CPU throws otherwise; here such a channel's outputs are not finite).

// Inputs, contiguous, element type T: as Inputs, with P, Q [H, N2, 2].
template <class T>
struct DplrInputs {
  const T *u, *log_dt, *A, *P, *Q, *B, *C, *D, *x0;
};

// The per-channel scratch: 8 n × n complex matrices, 14 complex vectors [n], the sequence rows [(T + 1) n]
// complex, and K, dK, du [T] double.
SEQLAB_HD int64_t dplr_work_cx(const Dims& d) { return 8 * d.N2 * d.N2 + (14 + d.T + 1) * d.N2; }
SEQLAB_HD int64_t dplr_work_f64(const Dims& d) { return 3 * d.T; }

struct DplrWork {
  Cx *A, *R, *Abar, *M, *gA, *gR, *tmpM, *gM;
  Cx *B, *C, *P, *Q, *Bbar, *x, *tmp, *v, *gB, *gC, *g, *xi, *RB, *gBin, *seq;
  double *K, *dK, *du;
  double dt;
};

SEQLAB_HD DplrWork dplr_work(const Dims& d, Cx* cbase, double* fbase, int64_t h) {
  const int64_t n = d.N2, nn = n * n;
  Cx* c = cbase + h * dplr_work_cx(d);
  double* f = fbase + h * dplr_work_f64(d);
  DplrWork w;
  Cx** mats[] = {&w.A, &w.R, &w.Abar, &w.M, &w.gA, &w.gR, &w.tmpM, &w.gM};
  for (Cx** m : mats) *m = c, c += nn;
  Cx** vecs[] = {&w.B, &w.C, &w.P, &w.Q, &w.Bbar, &w.x, &w.tmp, &w.v, &w.gB, &w.gC, &w.g, &w.xi, &w.RB, &w.gBin};
  for (Cx** v : vecs) *v = c, c += n;
  w.seq = c;
  w.K = f, w.dK = f + d.T, w.du = f + 2 * d.T;
  w.dt = 0;
  return w;
}

// y = M x, or M* x with `adjoint` (the CPU's matvec).
SEQLAB_HD void dplr_matvec(const Cx* M, const Cx* x, Cx* y, int64_t n, bool adjoint = false) {
  for (int64_t i = 0; i < n; ++i) {
    Cx acc = cx(0);
    for (int64_t j = 0; j < n; ++j) acc = acc + (adjoint ? conj(M[j * n + i]) * x[j] : M[i * n + j] * x[j]);
    y[i] = acc;
  }
}
// G += a b*.
SEQLAB_HD void dplr_add_outer(Cx* G, const Cx* a, const Cx* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) G[i * n + j] = G[i * n + j] + a[i] * conj(b[j]);
  }
}
SEQLAB_HD Cx dplr_dot(const Cx* C, const Cx* x, int64_t n) {  // Σ_n C_n x_n (no conjugate)
  Cx acc = cx(0);
  for (int64_t i = 0; i < n; ++i) acc = acc + C[i] * x[i];
  return acc;
}
SEQLAB_HD void dplr_swap(Cx*& a, Cx*& b) {
  Cx* t = a;
  a = b;
  b = t;
}

// R = M⁻¹ by Gauss–Jordan elimination with partial pivoting (the CPU's inverse; M is overwritten).
SEQLAB_HD void dplr_inverse(Cx* M, Cx* R, int64_t n) {
  for (int64_t i = 0; i < n * n; ++i) R[i] = cx(0);
  for (int64_t i = 0; i < n; ++i) R[i * n + i] = cx(1);
  for (int64_t c = 0; c < n; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r) {
      if (cabs(M[r * n + c]) > cabs(M[piv * n + c])) piv = r;
    }
    for (int64_t k = 0; k < n; ++k) {
      const Cx a = M[c * n + k], b = R[c * n + k];
      M[c * n + k] = M[piv * n + k], R[c * n + k] = R[piv * n + k];
      M[piv * n + k] = a, R[piv * n + k] = b;
    }
    const Cx inv = cx(1) / M[c * n + c];
    for (int64_t k = 0; k < n; ++k) {
      M[c * n + k] = M[c * n + k] * inv;
      R[c * n + k] = R[c * n + k] * inv;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c || (M[r * n + c].re == 0 && M[r * n + c].im == 0)) continue;
      const Cx f = M[r * n + c];
      for (int64_t k = 0; k < n; ++k) {
        M[r * n + k] = M[r * n + k] - f * M[c * n + k];
        R[r * n + k] = R[r * n + k] - f * R[c * n + k];
      }
    }
  }
}

// Channel h's A, R, Ā, B̄ and its B, C, P, Q into w (the CPU's dplr_of).
template <class T>
SEQLAB_HD void dplr_setup(const Dims& d, const DplrInputs<T>& in, int64_t h, DplrWork& w) {
  const int64_t n = d.N2;
  w.dt = exp(ld(in.log_dt, h));
  for (int64_t i = 0; i < n; ++i) {
    w.B[i] = ldc(in.B, d.mode(h, i));
    w.C[i] = ldc(in.C, d.mode(h, i));
    w.P[i] = ldc(in.P, d.mode(h, i));
    w.Q[i] = ldc(in.Q, d.mode(h, i));
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      w.A[i * n + j] = (i == j ? ldc(in.A, d.mode(h, i)) : cx(0)) - w.P[i] * conj(w.Q[j]);
      w.M[i * n + j] = cx(i == j ? 1.0 : 0.0) - (0.5 * w.dt) * w.A[i * n + j];
    }
  }
  dplr_inverse(w.M, w.R, n);
  for (int64_t i = 0; i < n * n; ++i) w.Abar[i] = 2.0 * w.R[i] - cx(i % (n + 1) == 0 ? 1.0 : 0.0);
  dplr_matvec(w.R, w.B, w.Bbar, n);
  for (int64_t i = 0; i < n; ++i) w.Bbar[i] = w.dt * w.Bbar[i];
}

// Thread h: y [B, T, H] at h and final_state [B, H, n] at h (the CPU's dplr_forward for channel h).
template <class T>
SEQLAB_HD void dplr_forward(int64_t h, const Dims& d, const DplrInputs<T>& in, bool recurrent, Cx* cwork,
                            double* fwork, T* y, T* xT) {
  DplrWork w = dplr_work(d, cwork, fwork, h);
  dplr_setup(d, in, h, w);
  const int64_t n = d.N2, Tn = d.T;
  const double dskip = in.D ? ld(in.D, h) : 0.0;
  Cx *x = w.x, *tmp = w.tmp, *v = w.v;
  if (!recurrent) {
    for (int64_t i = 0; i < n; ++i) v[i] = w.Bbar[i];
    for (int64_t j = 0; j < Tn; ++j) {
      w.K[j] = 2 * dplr_dot(w.C, v, n).re;
      dplr_matvec(w.Abar, v, tmp, n);
      dplr_swap(v, tmp);
    }
  }
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t i = 0; i < n; ++i) x[i] = in.x0 ? ldc(in.x0, d.state(b, h, i)) : cx(0);
    if (recurrent) {
      for (int64_t t = 0; t < Tn; ++t) {
        const double ut = ld(in.u, d.row(b, t, h));
        dplr_matvec(w.Abar, x, tmp, n);
        for (int64_t i = 0; i < n; ++i) x[i] = tmp[i] + ut * w.Bbar[i];
        st(y, d.row(b, t, h), 2 * dplr_dot(w.C, x, n).re + dskip * ut);
      }
    } else {
      Cx* wv = w.v;  // w ← Ā w: Ā^{t+1} x_{−1} (v is free once K is built)
      tmp = w.tmp;
      for (int64_t i = 0; i < n; ++i) wv[i] = x[i];
      for (int64_t t = 0; t < Tn; ++t) {
        double acc = dskip * ld(in.u, d.row(b, t, h));
        for (int64_t j = 0; j <= t; ++j) acc += w.K[j] * ld(in.u, d.row(b, t - j, h));
        if (in.x0) {
          dplr_matvec(w.Abar, wv, tmp, n);
          dplr_swap(wv, tmp);
          acc += 2 * dplr_dot(w.C, wv, n).re;
        }
        st(y, d.row(b, t, h), acc);
      }
      for (int64_t t = 0; t < Tn; ++t) {  // Horner: x ← Ā x + B̄ u_s from x_{−1}
        const double ut = ld(in.u, d.row(b, t, h));
        dplr_matvec(w.Abar, x, tmp, n);
        for (int64_t i = 0; i < n; ++i) x[i] = tmp[i] + ut * w.Bbar[i];
      }
    }
    for (int64_t i = 0; i < n; ++i) stc(xT, d.state(b, h, i), x[i]);
  }
}

// Thread h: every gradient at channel h (the CPU's dplr_backward for channel h, which states the sums):
// du [B, T, H] and d initial_state [B, H, n] at h, dlog_dt_h, dA, dP, dQ, dB, dC at h, dD_h.
template <class T>
SEQLAB_HD void dplr_backward(int64_t h, const Dims& d, const DplrInputs<T>& in, bool recurrent, const T* dy,
                             const T* dfinal, Cx* cwork, double* fwork, T* du, T* dlog_dt, T* dA, T* dP, T* dQ, T* dB,
                             T* dC, T* dD, T* dx0) {
  DplrWork w = dplr_work(d, cwork, fwork, h);
  dplr_setup(d, in, h, w);
  const int64_t n = d.N2, Tn = d.T;
  const double dskip = in.D ? ld(in.D, h) : 0.0;
  Cx *g = w.g, *tmp = w.tmp;
  for (int64_t i = 0; i < n * n; ++i) w.gA[i] = cx(0);
  for (int64_t i = 0; i < n; ++i) w.gB[i] = cx(0), w.gC[i] = cx(0);
  double dD_acc = 0;
  auto row = [&](int64_t t) { return w.seq + (t + 1) * n; };  // row(−1) is the starting vector
  if (!recurrent) {
    if (Tn > 0) {  // v_j = row(j); with T = 0 there is no row 0
      for (int64_t i = 0; i < n; ++i) row(0)[i] = w.Bbar[i];
    }
    for (int64_t j = 0; j < Tn; ++j) {
      w.K[j] = 2 * dplr_dot(w.C, row(j), n).re;
      if (j + 1 < Tn) dplr_matvec(w.Abar, row(j), row(j + 1), n);
    }
    for (int64_t j = 0; j < Tn; ++j) w.dK[j] = 0;
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t j = 0; j < Tn; ++j) {
        double acc = 0;
        for (int64_t t = j; t < Tn; ++t) acc += ld(dy, d.row(b, t, h)) * ld(in.u, d.row(b, t - j, h));
        w.dK[j] += acc;
      }
    }
    for (int64_t i = 0; i < n; ++i) g[i] = cx(0);  // λ
    for (int64_t j = Tn - 1; j >= 0; --j) {
      for (int64_t i = 0; i < n; ++i) {
        g[i] = g[i] + (2 * w.dK[j]) * conj(w.C[i]);
        w.gC[i] = w.gC[i] + (2 * w.dK[j]) * conj(row(j)[i]);
      }
      if (j >= 1) {
        dplr_add_outer(w.gA, g, row(j - 1), n);
        dplr_matvec(w.Abar, g, tmp, n, true);
        dplr_swap(g, tmp);
      } else {
        for (int64_t i = 0; i < n; ++i) w.gB[i] = w.gB[i] + g[i];
      }
    }
  }
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t i = 0; i < n; ++i) w.xi[i] = in.x0 ? ldc(in.x0, d.state(b, h, i)) : cx(0);
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t r = d.row(b, t, h);
      w.du[t] = dskip * ld(dy, r);
      dD_acc += ld(in.u, r) * ld(dy, r);
    }
    auto step = [&](const Cx* prev, Cx* next, double ut) {  // next = Ā prev + B̄ u_t
      dplr_matvec(w.Abar, prev, next, n);
      for (int64_t i = 0; i < n; ++i) next[i] = next[i] + ut * w.Bbar[i];
    };
    if (recurrent) {
      for (int64_t i = 0; i < n; ++i) row(-1)[i] = w.xi[i];
      for (int64_t t = 0; t < Tn; ++t) step(row(t - 1), row(t), ld(in.u, d.row(b, t, h)));
      for (int64_t i = 0; i < n; ++i) g[i] = ldc(dfinal, d.state(b, h, i));
      for (int64_t t = Tn - 1; t >= 0; --t) {
        const double r = 2 * ld(dy, d.row(b, t, h)), ut = ld(in.u, d.row(b, t, h));
        for (int64_t i = 0; i < n; ++i) {
          g[i] = g[i] + r * conj(w.C[i]);
          w.gC[i] = w.gC[i] + r * conj(row(t)[i]);
          w.gB[i] = w.gB[i] + ut * g[i];
          w.du[t] += (conj(g[i]) * w.Bbar[i]).re;
        }
        dplr_add_outer(w.gA, g, row(t - 1), n);
        dplr_matvec(w.Abar, g, tmp, n, true);
        dplr_swap(g, tmp);
      }
    } else {
      for (int64_t s = 0; s < Tn; ++s) {
        for (int64_t t = s; t < Tn; ++t) w.du[s] += w.K[t - s] * ld(dy, d.row(b, t, h));
      }
      // x_T's sum: z_s into seq (z_{−1} = 0), then ν walking back.
      for (int64_t i = 0; i < n; ++i) row(-1)[i] = cx(0);
      for (int64_t t = 0; t < Tn; ++t) step(row(t - 1), row(t), ld(in.u, d.row(b, t, h)));
      for (int64_t i = 0; i < n; ++i) g[i] = ldc(dfinal, d.state(b, h, i));  // ν
      for (int64_t t = Tn - 1; t >= 0; --t) {
        const double ut = ld(in.u, d.row(b, t, h));
        for (int64_t i = 0; i < n; ++i) {
          w.gB[i] = w.gB[i] + ut * g[i];
          w.du[t] += (conj(g[i]) * w.Bbar[i]).re;
        }
        if (t >= 1) dplr_add_outer(w.gA, g, row(t - 1), n);
        dplr_matvec(w.Abar, g, tmp, n, true);
        dplr_swap(g, tmp);
      }
      if (in.x0) {  // w_t = Ā^{t+1} x_{−1} into seq, then μ walking back
        for (int64_t i = 0; i < n; ++i) row(-1)[i] = w.xi[i];
        for (int64_t t = 0; t < Tn; ++t) dplr_matvec(w.Abar, row(t - 1), row(t), n);
        for (int64_t i = 0; i < n; ++i) g[i] = ldc(dfinal, d.state(b, h, i));  // μ
        for (int64_t t = Tn - 1; t >= 0; --t) {
          const double r = 2 * ld(dy, d.row(b, t, h));
          for (int64_t i = 0; i < n; ++i) {
            g[i] = g[i] + r * conj(w.C[i]);
            w.gC[i] = w.gC[i] + r * conj(row(t)[i]);
          }
          dplr_add_outer(w.gA, g, row(t - 1), n);
          dplr_matvec(w.Abar, g, tmp, n, true);
          dplr_swap(g, tmp);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) g[i] = cx(0);
      }
    }
    for (int64_t t = 0; t < Tn; ++t) st(du, d.row(b, t, h), w.du[t]);
    if (dx0) {
      for (int64_t i = 0; i < n; ++i) stc(dx0, d.state(b, h, i), g[i]);
    }
  }
  if (dD) st(dD, h, dD_acc);
  // The chain through R = M⁻¹: g_R = 2 g_Ā + Δ g_B̄ B*, g_M = −R* g_R R*.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) w.gR[i * n + j] = 2.0 * w.gA[i * n + j] + (w.dt * w.gB[i]) * conj(w.B[j]);
  }
  for (int64_t i = 0; i < n * n; ++i) w.tmpM[i] = cx(0), w.gM[i] = cx(0);
  for (int64_t i = 0; i < n; ++i) {  // tmpM = R* g_R
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < n; ++k) w.tmpM[i * n + j] = w.tmpM[i * n + j] + conj(w.R[k * n + i]) * w.gR[k * n + j];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < n; ++k) w.gM[i * n + j] = w.gM[i * n + j] - w.tmpM[i * n + k] * conj(w.R[j * n + k]);
    }
  }
  dplr_matvec(w.R, w.B, w.RB, n);
  double d_dt = 0;
  for (int64_t i = 0; i < n; ++i) {
    d_dt += (conj(w.RB[i]) * w.gB[i]).re;
    for (int64_t j = 0; j < n; ++j) d_dt -= 0.5 * (conj(w.gM[i * n + j]) * w.A[i * n + j]).re;
  }
  st(dlog_dt, h, w.dt * d_dt);
  dplr_matvec(w.R, w.gB, w.gBin, n, true);
  for (int64_t i = 0; i < n; ++i) {
    Cx gp = cx(0), gq = cx(0);
    for (int64_t j = 0; j < n; ++j) {
      gp = gp + w.gM[i * n + j] * w.Q[j];
      gq = gq + conj(w.gM[j * n + i]) * w.P[j];
    }
    const int64_t m = d.mode(h, i);
    stc(dA, m, (-0.5 * w.dt) * w.gM[i * n + i]);
    stc(dP, m, (0.5 * w.dt) * gp);
    stc(dQ, m, (0.5 * w.dt) * gq);
    stc(dB, m, w.dt * w.gBin[i]);
    stc(dC, m, w.gC[i]);
  }
}

}  // namespace seqlab::s4_cuda
