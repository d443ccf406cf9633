// Small BLAS-like helpers on raw rows of T (float or double) for the CPU kernels of the fused variant
// ops (attention, GLA, retention, linear attention, DeltaNet), which work on the rows of one
// (batch, head) at a time inside an OpenMP loop over (batch, head).
#pragma once

#include <cstdint>
#include <type_traits>

#include "tensor/kernels.h"
#include "tensor/lane_sum.h"

namespace seqlab::cpu {

// Σ a_i b_i with eight independent partial sums, so the compiler vectorises the reduction without
// reassociating it (no -ffast-math needed) and the adds do not wait on each other.
template <class T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[d + u] * b[d + u];
  }
  for (; d < n; ++d) acc[0] += a[d] * b[d];
  return dot_tree(acc);
}

// y += a · x
template <class T>
inline void axpy(T a, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// y *= a
template <class T>
inline void scal(T a, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

// C = α op(A) op(B) + β C on row-major matrices with leading dimensions (row strides) lda, ldb, ldc,
// through the GEMM slot; inside a parallel region it runs on the calling thread. T is float or double
// (C the same), or bf16 with an f32 C: bf16 products summed in f32, on the CPU's bf16 instructions where
// it has them (kernel::cpu_bf16_gemm_native) — the GEMM-shaped parts of a variant kernel in bf16.
template <class T, class C>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, double beta, C* c, int64_t ldc) {
  constexpr bool wide = std::is_same_v<T, float> || std::is_same_v<T, double>;
  static_assert((wide && std::is_same_v<C, T>) || (std::is_same_v<T, bf16> && std::is_same_v<C, float>),
                "gemm: float or double rows, or bf16 rows into float");
  if (m == 0 || n == 0) return;
  kernel::GemmArgs g;
  g.dtype = std::is_same_v<T, float> ? DType::f32 : std::is_same_v<T, double> ? DType::f64 : DType::bf16;
  g.c_is_f32 = std::is_same_v<T, bf16>;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alpha;
  g.beta = beta;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  kernel::gemm_kernel(cpu_device(), g, cpu_device());
}

}  // namespace seqlab::cpu
