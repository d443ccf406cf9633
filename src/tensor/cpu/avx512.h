// The CPU kernels' AVX-512 loops: f32 loops that take most of a training step's time outside the GEMMs
// (the softmax rows of attention; GELU, SiLU and the sigmoid, and their gradients), written with AVX-512 intrinsics so
// that eˣ costs about 15 instructions per 16 floats (vscalefps multiplies by 2ⁿ) instead of 25 per 8.
//
// Each gives the same bits as the plain loop it stands for, for every input: it is math::exp_vec's
// (or exp_vec_nonpositive's) own steps, the same range reduction, polynomial and fused multiply-adds
// where the compiler fuses them in the plain loop, and vscalefps rounds p·2ⁿ once as the plain loop's
// product by 2ⁿ (or by 2ⁿ⁺⁶⁴ then 2⁻⁶⁴, for subnormal results) does. So a run's results do not depend
// on the CPU it ran on; tests/cpu_avx512_test.cc compares the two paths on floats of every exponent
// (SEQLAB_CPU_AVX512_EVERY_FLOAT=1: on every float, about four minutes). They run where the CPU has
// AVX512F (checked once at run time) unless SEQLAB_CPU_AVX512=off or kernel::set_cpu_avx512(false).
// Each returns whether it ran: false where the path is off, the CPU lacks AVX512F or the build is for
// another CPU; the caller then runs its plain loop.
#pragma once

#include <cstdint>

#include "tensor/kernels.h"

namespace seqlab::cpu {

bool avx512_on();

// x_c ← exp_vec_nonpositive(x_c − shift) for c < n; `sum` = Σ x_c in eight partial sums (entry c in sum
// c mod 8, the tail's in sum 0) added as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)).
bool exp_shifted_sum_avx512(float* x, int64_t n, float shift, float& sum);
// The same without the sum.
bool exp_shifted_avx512(float* x, int64_t n, float shift);
// `max` = max_c x_c in eight lanes (x > acc ? x : acc), the tail into lane 0, the lanes combined in order.
bool row_max_avx512(const float* x, int64_t n, float& max);

// y = op(x), as math::unary_forward, for the ops avx512_unary_forward names.
constexpr bool avx512_unary_forward(kernel::UnaryOp op) {
  return op == kernel::UnaryOp::gelu || op == kernel::UnaryOp::silu || op == kernel::UnaryOp::sigmoid;
}
bool unary_forward_avx512(kernel::UnaryOp op, float* y, int64_t n, const float* x);

// dx = dy · op'(x), as math::unary_backward, for the ops avx512_unary_backward names (those whose
// gradient reads x alone and takes an exponential: the sigmoid's reads y and takes none).
constexpr bool avx512_unary_backward(kernel::UnaryOp op) {
  return op == kernel::UnaryOp::gelu || op == kernel::UnaryOp::silu || op == kernel::UnaryOp::softplus;
}
bool unary_backward_avx512(kernel::UnaryOp op, float* dx, int64_t n, const float* dy, const float* x);

// The same on bf16 tensors, widened and rounded in registers: the bits of the f32 loop on widened values,
// each result rounded once (to nearest even, NaN kept quiet), as map_runs' blocks give (bf16_convert.h).
bool unary_forward_avx512(kernel::UnaryOp op, bf16* y, int64_t n, const bf16* x);
bool unary_backward_avx512(kernel::UnaryOp op, bf16* dx, int64_t n, const bf16* dy, const bf16* x);

// dst_c = bf16(src_c) for c < n: to nearest even, NaN kept quiet, as bf16(float) (tensor/dtype.h) rounds.
bool round_to_bf16_avx512(const float* src, bf16* dst, int64_t n);

}  // namespace seqlab::cpu
