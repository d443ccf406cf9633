// Small bf16 GEMMs on AVX512-BF16 registers, for the tile products of the fused variant kernels.
//
// Attention's CPU kernels multiply tiles of 64 or 128 rows by 64 or 128 columns, thousands of times a step,
// each inside a parallel region on one thread. oneDNN spends more time per call on such shapes getting
// ready (its primitive's arguments, packing both operands into its blocked layouts) than multiplying:
// 80–140 GFLOP/s a thread where a large product reaches 220. This is the GEMM with nothing around it:
// op(B) is packed once per call into pairs of k (the layout vdpbf16ps reads: two bf16 products per f32
// lane, added to the lane's sum), op(A) is read in place where its rows hold k, and each 8 × 32 tile of C
// keeps its sums in 16 registers over the whole k.
//
//   C = α op(A) op(B) + β C,   A, B bf16, C f32, each sum over k in order of k, two terms per step
//
// The products and their pairwise sums are those of vdpbf16ps (round to nearest even, subnormal inputs
// and results flushed to zero), as in oneDNN's kernels; only the order of the f32 additions differs from
// oneDNN's (and from the widened f32 path), as it does between any two GEMMs. β = 0 leaves C unread.
// tests/gemm_bf16_tiles_test.cc checks every layout and edge size against a double-precision product.
#pragma once

#include "tensor/kernels.h"

namespace seqlab::cpu {

// Whether tile_gemm_bf16 can run: the CPU has AVX512-BF16 (and AVX512BW) and SEQLAB_CPU_AVX512 is not off.
bool tile_gemm_bf16_available();

// One product (g.batch = 1) with bf16 A and B and an f32 C, on the calling thread. Returns false, having
// done nothing, where it cannot run (tile_gemm_bf16_available, or g is not such a product).
bool tile_gemm_bf16(const kernel::GemmArgs& g);

}  // namespace seqlab::cpu
