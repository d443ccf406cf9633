// Rotary position embedding (RoPE), a fused op on query or key heads.
//
//   x [B, T, H, D], D even;  token t sits at position p = start + t
//   θ_i = base^(−2i/D),  φ = p·θ_i                        for i < D/2
//   y_{2i}   = x_{2i} cos φ − x_{2i+1} sin φ
//   y_{2i+1} = x_{2i} sin φ + x_{2i+1} cos φ              y = R(φ) x, pair by pair
//
// Convention: adjacent pairs (x_{2i}, x_{2i+1}) are rotated (RoFormer's form), not the half-split
// pairs (x_i, x_{i+D/2}) of GPT-NeoX; weights trained with one convention do not transfer to the
// other without permuting the q/k projection rows. Rotating q at position m and k at position n
// gives ⟨R(mθ) q, R(nθ) k⟩ = ⟨q, R((n−m)θ) k⟩: scores depend only on the distance n − m.
//
// R is orthogonal, so the backward is the inverse rotation: dx = R(−φ) dy, i.e.
//   dx_{2i} = dy_{2i} cos φ + dy_{2i+1} sin φ,  dx_{2i+1} = −dy_{2i} sin φ + dy_{2i+1} cos φ.
// `start` is the position of the first token, so that decoding against a KV cache rotates new
// tokens at their true positions. The op has no parameters and saves nothing for the backward.
#pragma once

#include <cstdint>

#include "tensor/slots/attention/rope.h"
#include "tensor/tensor.h"

namespace seqlab {

// The fused op, differentiable in x. Throws std::invalid_argument naming the shape when x is not
// [B, T, H, D] with D even, when base ≤ 0 or start < 0.
Tensor rope(const Tensor& x, const RopeOptions& opts = {});

// The naive form: materialises cos φ and sin φ per (position, pair) as [T, 1, D/2] tensors and
// rotates the even and odd lanes with primitive autograd ops (whose backward passes give its
// gradients). For tests and comparisons.
Tensor rope_reference(const Tensor& x, const RopeOptions& opts = {});

class SequenceGroup;
// Rotary embedding of x [B, 2c, H, D], a rank's two chunks under sequence parallelism
// (layers/sequence_parallel.h), each rotated at its global positions.
Tensor sequence_rope(const Tensor& x, double base, const SequenceGroup& g);

namespace kernel {

// Raw entry point: checks x, makes it contiguous, allocates y and calls the slot. `inverse`
// rotates by −φ (the backward: dx = rope_rotate(dy, opts, true)).
Tensor rope_rotate(const Tensor& x, const RopeOptions& opts, bool inverse);

}  // namespace kernel
}  // namespace seqlab
