// The tensor-core (bf16) kernels of the fused attention op, as src/cuda/attention.cu calls them.
// Layouts, equations and the reasoning behind the kernels are in src/cuda/attention_tc.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "cuda/common.cuh"

namespace seqlab::cuda::attention_tc {

// One call: q [B, T, H, D], k and v [B, S, Hk, D] (Dk = Dv = D), contiguous bf16; query head h reads
// kv head h / (H/Hk); query i sees keys j < i + S − T + 1 when causal, all S otherwise. scale > 0.
struct Problem {
  int64_t B, T, S, H, Hk, D;
  bool causal;
  float scale;
};

// Whether these kernels take the call on `device`: D is 64 or 128, the device has compute capability
// ≥ 8.0 (bf16 tensor cores) and enough opt-in shared memory for all three kernels, and every pointer
// is 16-byte aligned (tiles are read 16 bytes at a time). Otherwise the caller uses its FMA kernels.
bool supports(const Problem& p, int device, std::initializer_list<const void*> pointers);

// Writes o [B, T, H, D] and lse [B, T, H] (bf16, like the inputs), every element once.
void forward(const Problem& p, cudaStream_t stream, const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* o,
             bf16_t* lse);

// Reads dout [B, T, H, D], lse [B, T, H] and delta [B, T, H] (f32, δ_i = dO_i·O_i − dlse_i, computed by
// the caller); writes every element of each non-null gradient (dq like q, dk and dv like k and v).
void backward(const Problem& p, cudaStream_t stream, const bf16_t* q, const bf16_t* k, const bf16_t* v,
              const bf16_t* dout, const bf16_t* lse, const float* delta, bf16_t* dq, bf16_t* dk, bf16_t* dv);

}  // namespace seqlab::cuda::attention_tc
