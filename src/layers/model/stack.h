// A stack of blocks (block.h) and what surrounds them in every model kind: the dropout of its input,
// the norm of its input (post-norm: BERT's embedding norm) or its output (pre-norm: the final norm),
// and, with relative positions, its own table of T5's relative position bias, shared by its layers.
//
//   x = drop(norm_in(x))     (norm_in with post-norm only)
//   x = block_L(… block_1(x))
//   y = norm_f(x)            (pre-norm only; fused with the last residual add)
// With positions = relative, every block's self mixer gets the bias b = relative_position_bias(table,
// T, S) [1, H, T, S], computed once per call (S = start + T: the keys of the cache and the new ones),
// bidirectional in a stack that is not causal, causal otherwise. Cross attention takes no bias.
//
// Zamba's shared attention block (ModelConfig::shared_attention_every = k > 0; a pre-norm decoder's
// stack): after every k-th block, one attention block (attention and the shared FFN, each behind its
// norm) whose weights every use shares is applied to a per-use projection of the stream and the stack's
// input (the embeddings x_0):
//   x = x_{i}                                   the stream after block i, (i + 1) mod k = 0; use u = (i+1)/k − 1
//   z = W_u [x ; x_0]                           W_u [C, 2C], use u's own input projection (no bias)
//   s = z + attn(norm1 z);  s = s + ffn(norm2 s) the shared block, a pre-norm block on z
//   x = x + s                                   its output added to the stream directly
// Zamba (Glorioso et al., 2024) feeds the shared block the concatenation of the residual stream and
// the original embeddings and gives each use its own linear map; here the per-use map comes first (2C →
// C) so that the shared block has the model's width, and no per-use map follows it (its output, z and
// its two branches, is added as it is). Decoding: each use keeps its own attention cache (the shared
// weights see different inputs at each use), the states after the blocks' (new_states).
//
// Parameter names: relative_bias.weight [buckets, H] (relative only), norm_in.*, blocks.{i}.*, norm_f.*,
// and with the shared block shared.{norm1,mixer,norm2,mlp}.* and shared_in.{u}.weight [C, 2C].
#pragma once

#include <cstdint>
#include <vector>

#include "layers/model/block.h"
#include "layers/model/model_config.h"
#include "layers/module.h"

namespace seqlab {

class Stack : public Module {
 public:
  // `specs` bottom first; `cross`: every block has cross attention (an encoder-decoder's decoder).
  // Weights from `init_gen`, in parameter order; dropout masks from `dropout_gen` (outlives the stack).
  Stack(const ModelConfig& cfg, const std::vector<BlockSpec>& specs, bool cross, Generator& init_gen,
        Generator& dropout_gen);
  // x [B, T, C], the embedded tokens at positions start … start+T−1 → [B, T, C]. `states` null in
  // training; when decoding, one BlockState per block and then one per use of the shared block (made by
  // new_states() on first use).
  Tensor forward(const Tensor& x, const StackInput& in, int64_t start, std::vector<BlockState>* states) const;
  std::vector<BlockState> new_states() const;
  size_t size() const { return blocks_.size(); }
  const Block& block(size_t i) const { return *blocks_[i]; }

 private:
  Tensor drop(const Tensor& x) const;

  double dropout_;
  Generator& dropout_gen_;
  bool post_norm_;
  Module* relative_ = nullptr;  // holds the relative bias table
  Tensor* relative_table_ = nullptr;
  int64_t relative_buckets_ = 0, relative_max_distance_ = 0;
  Norm* norm_in_ = nullptr;
  std::vector<Block*> blocks_;
  Norm* norm_f_ = nullptr;
  int64_t shared_every_ = 0;
  Block* shared_ = nullptr;            // the shared attention block
  std::vector<Linear*> shared_in_;     // its per-use input projections
};

// The weights of a stack: its blocks, its norm and its relative bias table.
double stack_parameter_count(const ModelConfig& cfg, const std::vector<BlockSpec>& specs, bool cross);

// The sinusoidal position embedding of the Transformer paper for the given positions, [T, d]:
// PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); computed in f64 and converted.
Tensor sinusoidal_positions(const std::vector<int64_t>& positions, int64_t d, DType dtype, Device device);

}  // namespace seqlab
