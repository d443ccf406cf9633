// The row loops of a softmax over scores, for the CPU kernels that compute one tile by tile (softmax
// attention's forward and backward): a row's maximum, and x ← exp(x − shift) with or without the sum.
//
// f32 rows run on AVX-512 where the CPU has it (tensor/cpu/avx512.h: the same bits as the plain loops
// for every input, so a run's result does not depend on the CPU it ran on; docs/perf.md measures what it
// gains); elsewhere, and for f64, they are plain C++ loops that the compiler vectorises on the build's
// instruction set.
#pragma once

#include <cstdint>

namespace seqlab::cpu {

// max_c x_c over c < n (−∞ when n ≤ 0); NaN entries are skipped (a max of them is never taken).
float row_max(const float* x, int64_t n);
double row_max(const double* x, int64_t n);

// x_c ← exp(x_c − shift) for c < n (math::exp_vec_nonpositive: meant for x_c − shift ≤ 0, 0 below
// −87.33); returns Σ_c x_c in eight partial sums (entry c in sum c mod 8, the tail's in sum 0) added
// as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)), as `dot` adds them.
float exp_shifted_sum(float* x, int64_t n, float shift);
double exp_shifted_sum(double* x, int64_t n, double shift);

// x_c ← exp(x_c − shift) for c < n, as exp_shifted_sum without the sum.
void exp_shifted(float* x, int64_t n, float shift);
void exp_shifted(double* x, int64_t n, double shift);

}  // namespace seqlab::cpu
