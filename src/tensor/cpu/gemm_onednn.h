// bf16 GEMMs through oneDNN's matmul, whose JIT kernels use the CPU's bf16 dot-product instructions
// (AVX512-BF16's vdpbf16ps, or AMX tiles) at about twice the f32 rate of the same cores
// (docs/perf.md, "bf16 GEMM on the CPU"). Internal to src/tensor/cpu/gemm.cpp.
#pragma once

#include "tensor/kernels.h"

namespace seqlab::cpu {

// True when this build has oneDNN, the CPU has bf16 instructions that oneDNN uses, and the
// widened path is not forced (kernel::set_cpu_bf16_gemm_widened, SEQLAB_CPU_BF16_GEMM=widened).
bool bf16_gemm_native();

// C = α op(A) op(B) + β C for bf16 A, B and a bf16 (or, with g.c_is_f32, f32) C, on the OpenMP team,
// or on the calling thread inside a parallel region. Returns false, having written nothing, when
// oneDNN has no optimised kernel for this layout; the caller then computes it by widening.
bool onednn_bf16_gemm(const kernel::GemmArgs& g);

// oneDNN's version and the instruction set its kernels use, or why the bf16 GEMM is widened.
std::string onednn_config();

}  // namespace seqlab::cpu
