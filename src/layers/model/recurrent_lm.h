// A language model whose blocks mix tokens with a recurrence instead of softmax attention: GLA,
// RetNet, linear attention, DeltaNet or Gated DeltaNet (model.mixer in a recipe).
//
//   x_0 = wte[tokens]                                         no position embedding: the recurrence
//   x   = x + drop(mixer(norm1(x)))                           orders the tokens (RetNet rotates q, k)
//   x   = x + drop(proj(silu(fc x) ⊙ gate x))                 SwiGLU, per block
//   logits = norm_f(x) · wteᵀ                                 tied output embedding
//
// Decoding carries one MixerState per block (the recurrent state, a short convolution's last inputs),
// so a token costs the same at any position and the context is unbounded.
//
// Parameter names: wte.weight, blocks.{i}.norm1.weight, blocks.{i}.mixer.*, blocks.{i}.norm2.weight,
// blocks.{i}.mlp.{fc,gate,proj}.weight, norm_f.weight.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/model/language_model.h"
#include "layers/mixer.h"

namespace seqlab {

enum class MixerKind { gla, retnet, linear_attention, delta_net, gated_delta_net };
// "gla", "retnet", "linear", "deltanet", "gated_deltanet" (the recipe's names); throws for others.
MixerKind parse_mixer_kind(const std::string& name);

struct RecurrentLmConfig {
  int64_t vocab_size = 0;
  int64_t n_layers = 0;
  int64_t d_ff = 0;  // 0: the multiple of 64 nearest 8/3 · d_model
  MixerKind mixer = MixerKind::gla;
  MixerConfig mixer_config;  // d_model, n_heads, chunk, gates, ...
  double dropout = 0;
  uint64_t dropout_seed = 0;
};

struct RecurrentLmState : DecodeState {
  std::vector<MixerState> mixers;  // one per block
};

class RecurrentLm : public LanguageModel {
 public:
  // Throws std::invalid_argument for sizes that do not fit (heads not dividing d_model, ...).
  RecurrentLm(const RecurrentLmConfig& cfg, Generator& gen);

  Tensor forward(const Tensor& tokens) override;
  std::unique_ptr<DecodeState> new_decode_state() const override { return std::make_unique<RecurrentLmState>(); }
  Tensor forward_step(const Tensor& tokens, DecodeState& state) override;
  // Chunkwise form, per layer and token: causal attention within a chunk of C (6·C·d, as GPT's 6·T·d)
  // plus reading and writing the d/H × d/H state of every head (q S and kᵀv: 4·d·(d/H) forward), ×3
  // for forward and backward.
  double mixing_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_context() const override { return 0; }
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  Tensor run(const Tensor& tokens, RecurrentLmState* state);
  Tensor drop(const Tensor& x);

  RecurrentLmConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  struct Block {
    Norm* norm1;
    Mixer* mixer;
    Norm* norm2;
    Linear* fc;
    Linear* gate;
    Linear* proj;
  };
  std::vector<Block> blocks_;
  Norm* norm_f_ = nullptr;
};

}  // namespace seqlab
