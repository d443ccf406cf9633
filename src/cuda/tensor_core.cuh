// The warp-level tensor-core and asynchronous-copy instructions that hand-written tile kernels use, as
// inline PTX (sm_80 and later: mma.sync, ldmatrix, cp.async). Kernel headers written against these names
// (src/cuda/attention/attention_tc_kernels.cuh) are compiled with this file by nvcc, and with
// tests/tensor_core_emulation.h, which gives the same functions their documented meaning on the CPU, by the
// emulation tests.
//
// The fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with lane = 4g + t (g = lane / 4 the
// group, t = lane % 4 the thread in the group); a .b32 register holds two bf16, the lower-numbered column
// (or row, for B) in the low half:
//   A, 16 × 16, row-major: a[0] = (row g, cols 2t, 2t+1), a[1] = (row g+8, cols 2t, 2t+1),
//                          a[2] = (row g, cols 2t+8, 2t+9), a[3] = (row g+8, cols 2t+8, 2t+9);
//   B, 16 × 8:             b0 = (rows 2t, 2t+1, col g), b1 = (rows 2t+8, 2t+9, col g);
//   C and D, 16 × 8, f32:  d[0], d[1] = (row g, cols 2t, 2t+1), d[2], d[3] = (row g+8, cols 2t, 2t+1).
// So a 16 × 16 block of C (two n-blocks side by side) holds, register for register, the A fragment of the
// same 16 × 16 matrix once packed to bf16: a product's output feeds the next product without leaving the
// registers (tc::to_a in the kernels).
//
// ldmatrix .x4 loads four 8 × 8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned); register r[i] of lane 4g + t receives matrix i's elements
// (row g, cols 2t, 2t+1), or with .trans (rows 2t, 2t+1, col g).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace seqlab::cuda::tc {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define SEQLAB_TC_PTX 0  // none of these instructions exist before sm_80; kernels that need them trap there
#else
#define SEQLAB_TC_PTX 1
#endif

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// d += a · b: A 16 × 16 and B 16 × 8 in bf16, D 16 × 8 in f32 (the layouts above).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SEQLAB_TC_PTX
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8 × 8 matrices from shared memory; `row` is this lane's row address (see above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if SEQLAB_TC_PTX
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if SEQLAB_TC_PTX
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}

// Asynchronous copies global → shared of 16 bytes (both addresses 16-byte aligned; bypasses L1) or 4 bytes.
// They land in the order of nothing: a thread's copies committed as a group are complete once
// cp_async_wait<N>() returns with that group older than the N newest; other threads see them after a
// barrier that follows the wait.
__device__ __forceinline__ void cp_async_16(void* dst_shared, const void* src_global) {
#if SEQLAB_TC_PTX
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst_shared)), "l"(src_global)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_4(void* dst_shared, const void* src_global) {
#if SEQLAB_TC_PTX
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst_shared)), "l"(src_global)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if SEQLAB_TC_PTX
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if SEQLAB_TC_PTX
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Two floats rounded to bf16 (nearest even) in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace seqlab::cuda::tc
