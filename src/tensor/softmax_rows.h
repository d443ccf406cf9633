// The row loops of a softmax over scores, for the CPU kernels that compute one tile by tile (softmax
// attention's forward and backward): a row's maximum, and x ← exp(x − shift) with or without the sum.
//
// f32 rows run on AVX-512 where the CPU has it (AVX512F and AVX512DQ, checked once at run time): the
// exponential is math::exp_vec_nonpositive's own steps (the same range reduction and polynomial, its
// products fused where the compiler fuses them) with vscalefps multiplying by 2ⁿ, and the sum keeps
// the eight partial sums and the tree of the loops below. So both paths give the same bits for every
// input (softmax_rows_test checks every float's exponential and rows of every length), and a run's
// result does not depend on the CPU it ran on. Elsewhere, and for f64, the loops are plain C++ that
// the compiler vectorises on the build's instruction set. The AVX-512 path measured 1.9× faster on
// 64-element rows (the exponential is about 15 instructions per 16 floats instead of 25 per 8).
// SEQLAB_CPU_AVX512=off (or set_softmax_rows_avx512(false)) forces the plain loops.
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

// Whether the f32 loops above run on AVX-512 (the CPU has it and it is not turned off).
bool softmax_rows_avx512();
// Turns the AVX-512 path off (false) or back on where the CPU has it (true); for tests and benchmarks.
void set_softmax_rows_avx512(bool on);

}  // namespace seqlab::cpu
