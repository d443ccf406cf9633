// Ring attention: causal softmax attention over a sequence that the P ranks of a SequenceGroup share in
// the zig-zag layout of layers/sequence_parallel.h. Key/value blocks travel around the ring (P − 1
// shifts); each rank attends its queries to the visiting block with the fused op (attention.h): causal
// on its own chunk, full on earlier chunks, skipped on later ones; the partial outputs merge by their
// log-sum-exp in f32. Backward: the gradients of the visiting blocks travel back around the ring.
// Equations in docs/distributed.md "Sequence parallelism".
#pragma once

#include "layers/sequence_parallel.h"
#include "tensor/tensor.h"

namespace seqlab {

// q [B, 2c, H, D], k [B, 2c, Hk, D], v [B, 2c, Hk, Dv], this rank's two chunks; the output [B, 2c, H, Dv]
// is the rows of attention(Q, K, V) over all T tokens at this rank's positions. `scale` ≤ 0: 1/√D.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceGroup& g, double scale = 0);

}  // namespace seqlab
