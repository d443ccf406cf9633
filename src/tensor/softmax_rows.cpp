// The softmax row loops (see softmax_rows.h): plain loops, or for f32 their AVX-512 form (cpu/avx512.h).
#include "tensor/softmax_rows.h"

#include <limits>

#include "tensor/cpu/avx512.h"
#include "tensor/elementwise_math.h"
#include "tensor/lane_sum.h"

namespace seqlab::cpu {
namespace {

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
  return dot_tree(acc);
}

template <class A>
void exp_shifted_plain(A* x, int64_t n, A shift) {
  for (int64_t c = 0; c < n; ++c) x[c] = math::exp_vec_nonpositive(x[c] - shift);
}

}  // namespace

float row_max(const float* x, int64_t n) {
  float max;
  return row_max_avx512(x, n, max) ? max : row_max_plain(x, n);
}
double row_max(const double* x, int64_t n) { return row_max_plain(x, n); }

float exp_shifted_sum(float* x, int64_t n, float shift) {
  float sum;
  return exp_shifted_sum_avx512(x, n, shift, sum) ? sum : exp_shifted_sum_plain(x, n, shift);
}
double exp_shifted_sum(double* x, int64_t n, double shift) { return exp_shifted_sum_plain(x, n, shift); }

void exp_shifted(float* x, int64_t n, float shift) {
  if (!exp_shifted_avx512(x, n, shift)) exp_shifted_plain(x, n, shift);
}
void exp_shifted(double* x, int64_t n, double shift) { exp_shifted_plain(x, n, shift); }

}  // namespace seqlab::cpu
