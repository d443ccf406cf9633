// The block every model kind is built from: a token mixer and a feed-forward network, each behind a
// norm and a residual add, with a cross-attention layer between them in an encoder-decoder's decoder.
//
// Pre-norm (GPT-2, T5; NormPlacement::pre):
//   x = x + drop(mixer(norm1 x))
//   x = x + drop(cross(cross_norm x, memory))              encoder-decoder's decoder only
//   x = x + drop(ffn(norm2 x))                              unless the FFN is none
// Post-norm (BERT; NormPlacement::post):
//   x = norm1(x + drop(mixer(x)))
//   x = norm2(x + drop(ffn(x)))
// In a pre-norm stack every norm that follows a residual add (norm2, the next block's norm1, the
// final norm) is fused with it (Norm::add_forward): a block returns the stream and its last output not
// yet added (the "branch"), which the next block or the final norm adds. Dropout masks come from the
// model's generator in a fixed order: mixer, cross, FFN.
//
// Parameter names: norm1.*, mixer.*, cross_norm.*, cross.*, norm2.*, mlp.{fc,gate,proj}.* (no norm2
// and mlp where the FFN is none; moe.router.*, moe.experts.{e}.* in its place where the FFN is moe).
#pragma once

#include <cstdint>
#include <utility>

#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/model/model_config.h"
#include "layers/module.h"

namespace seqlab {

class MoeFfn;
struct MoeStats;

// The FFN of a block (model_config.h FfnKind): proj(act(fc x)) or proj(act(fc x) ⊙ gate x); GELU's
// GEMM and activation fused (linear_gelu).
class Ffn : public Module {
 public:
  Ffn(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias, Generator& gen, double init_std);
  Tensor forward(const Tensor& x) const;

 private:
  FfnKind kind_;
  Linear& fc_;
  Linear* gate_ = nullptr;  // the gated FFNs' second input projection
  Linear& proj_;
};

// The number of weights of an FFN of that kind (with biases where `bias`).
double ffn_parameter_count(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias);

// What every block of a stack is given besides the stream: the mixers' input without x (causal or not,
// lengths, the memory and its lengths for cross attention, the self-attention score bias).
struct StackInput {
  bool causal = true;
  Tensor lengths;
  Tensor memory, memory_lengths;
  Tensor bias;  // [1, H, T, S] for the blocks' self mixers (relative positions); undefined: none
  MoeStats* moe = nullptr;  // where the MoE blocks add their aux loss and counts (training); null: nowhere
};

// A block's decoding states: its mixer's and (encoder-decoder) its cross attention's.
struct BlockState {
  std::unique_ptr<MixerState> mixer, cross;
};

class Block : public Module {
 public:
  // Weights are drawn from `init_gen` (mixer, cross attention, FFN); dropout masks from `dropout_gen`,
  // which must outlive the block. `cross`: a cross-attention layer after the mixer (the memory is
  // d_model wide).
  Block(const ModelConfig& cfg, const BlockSpec& spec, const MixerContext& ctx, bool cross, Generator& init_gen,
        Generator& dropout_gen);
  // Pre-norm: the stream arrives as x + branch (branch undefined for the first block) and leaves the
  // same way (see above). Post-norm: branch is undefined in and out. `state` null in training.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& branch, const StackInput& in,
                                    BlockState* state) const;
  BlockState new_state() const;
  const Mixer& mixer() const { return mixer_; }

 private:
  Tensor drop(const Tensor& x) const;  // dropout in training mode, else x
  Tensor mix(const Mixer& m, const Tensor& x, const StackInput& in, bool cross, MixerState* state) const;
  Tensor feed_forward(const Tensor& x, const StackInput& in) const;  // the FFN or the MoE

  double dropout_;
  bool post_norm_;
  Generator& dropout_gen_;
  Norm& norm1_;
  Mixer& mixer_;
  Norm* cross_norm_ = nullptr;
  Mixer* cross_ = nullptr;
  Norm* norm2_ = nullptr;
  Ffn* ffn_ = nullptr;
  MoeFfn* moe_ = nullptr;
};

// The weights of one block of `spec` (norms, mixer, cross attention when `cross`, FFN), counted from
// the configuration alone: equals Block(...).num_parameters().
double block_parameter_count(const ModelConfig& cfg, const BlockSpec& spec, bool cross);

}  // namespace seqlab
