// The f32 → bf16 rounding loop of bf16_convert.h: AVX-512 where the CPU has it, else the plain loop.
#include "tensor/bf16_convert.h"

#include "tensor/cpu/avx512.h"

namespace seqlab {

void round_to_bf16_run(const float* src, bf16* dst, int64_t n) {
  if (cpu::round_to_bf16_avx512(src, dst, n)) return;
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16(src[i]);
}

}  // namespace seqlab
