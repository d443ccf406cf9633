// The tensor-core (bf16) kernels of the fused attention op, as src/cuda/attention/attention.cu calls them. Plain
// C++ (no CUDA types), so tests/attention_tc_emulation_test.cc can share Problem. Layouts, equations
// and the reasoning behind the kernels: src/cuda/attention/attention_tc.cu.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "tensor/dtype.h"

namespace seqlab::cuda::attention_tc {

// One call: q [B, T, H, D], k and v [B, S, Hk, D] (Dk = Dv = D), contiguous bf16; query head h reads
// kv head h / (H/Hk); query i sees keys j < i + S − T + 1 when causal, all S otherwise. scale > 0.
// The masks (attention.h's AttentionMasks), each null when absent, on the device: q_lengths and k_lengths
// [B] (queries i ≥ q_lengths[b] are padding and see nothing, keys j ≥ k_lengths[b] are seen by no query),
// and bias [B or 1, H, T, S] (bias_batched: B rows), added to the scaled scores.
struct Problem {
  int64_t B, T, S, H, Hk, D;
  bool causal;
  float scale;
  const int64_t* q_lengths = nullptr;
  const int64_t* k_lengths = nullptr;
  const bf16* bias = nullptr;
  bool bias_batched = false;
};

// Whether these kernels take the call on `device`: D is 64 or 128, the device has compute capability
// ≥ 8.0 (bf16 tensor cores), the kernels were compiled for it, it has enough opt-in shared memory for
// all three kernels, and every pointer is 16-byte aligned (tiles are read 16 bytes at a time).
// Otherwise the caller uses its FMA kernels. Call with `device` current.
bool supports(const Problem& p, int device, std::initializer_list<const void*> pointers);

// Writes o [B, T, H, D] (bf16, like the inputs) and lse [B, T, H] (f32), every element once, on the
// device's stream (0 and −∞ for a row that sees no key).
void forward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse);

// Reads dout [B, T, H, D], lse [B, T, H] (f32) and delta [B, T, H] (f32, δ_i = dO_i·O_i − dlse_i, computed by
// the caller); writes every element of each non-null gradient (dq like q, dk and dv like k and v, dbias
// [B, H, T, S], the gradient of the scores).
void backward(const Problem& p, int device, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
              const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv, bf16* dbias);

}  // namespace seqlab::cuda::attention_tc
