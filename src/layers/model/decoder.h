// The decoder-only language model (model.arch = "decoder"), built from blocks (block.h): each block
// one token mixer (any registered mixer: softmax attention, GLA, retention, ...; mixer.h) and one
// feed-forward network. A GPT is every block attention with a GELU MLP; GLA's language model every
// block GLA with SwiGLU; a hybrid any list of them (model.pattern in a recipe).
//
//   x_0 = wte[tokens] (+ wpe[positions])        wpe learned or sinusoidal (PositionKind) only
//   x   = stack(x_0)                            causal blocks with their norms and dropout (stack.h)
//   logits = x · wteᵀ                           tied output embedding (or x · lm_headᵀ, untied)
//
// Token t of a call sits at position start + t, where start is 0 in training and the number of
// tokens decoded so far when decoding: each block keeps its mixer's own decoding state (attention its
// keys and values, a recurrence its state), so a prompt and then one token at a time give the logits
// of a full forward. Dropout (p = dropout) is active only in training mode (Module::set_training) and
// drawn from the model's own generator, seeded by dropout_seed, in a fixed order: embedding, then per
// block mixer, FFN. Its state (dropout_generator().state()) belongs in a checkpoint. Initial weights
// are drawn from the constructor's generator in parameter order.
//
// Parameter names are stable dotted paths: wte.weight, wpe.weight (learned positions only),
// relative_bias.weight (relative positions), blocks.{i}.norm1.*, blocks.{i}.mixer.* (the mixer's own:
// attention qkv.*, proj.*; gla q.*, ...), blocks.{i}.norm2.*, blocks.{i}.mlp.{fc,gate,proj}.* (no
// norm2 and mlp where the FFN is none; blocks.{i}.moe.* for a mixture of experts), norm_f.*,
// lm_head.weight (untied only); with Zamba's shared attention block (stack.h) shared.* and shared_in.{u}.*.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/basic.h"
#include "layers/model/language_model.h"
#include "layers/model/model_config.h"
#include "layers/model/stack.h"
#include "layers/module.h"

namespace seqlab {

// Decoding state: each block's states.
struct DecoderState : DecodeState {
  std::vector<BlockState> blocks;
};

class Decoder : public LanguageModel {
 public:
  // Throws std::invalid_argument for a configuration that does not fit (an unknown mixer, heads not
  // dividing d_model, ...), naming what.
  Decoder(const ModelConfig& cfg, Generator& gen);

  const ModelConfig& config() const { return cfg_; }
  // Reads batch.inputs (and lengths, through the loss); refuses decoder_inputs and segment_ids.
  Tensor logits(const Batch& batch) override;
  // The logits and, in training, the MoE blocks' aux loss (moe.h).
  ModelOutputs outputs(const Batch& batch) override;
  // The MoE blocks' figures of the last training forward: aux_loss (the term the objective added),
  // moe_balance (E · Σ f_e P_e per block, averaged over the blocks: 1 when balanced) and moe_dropped
  // (the fraction of token-expert assignments past capacity). Empty without MoE blocks.
  std::vector<std::pair<std::string, double>> training_metrics() const override;
  bool can_decode() const override { return true; }
  std::unique_ptr<DecodeState> new_decode_state() const override { return std::make_unique<DecoderState>(); }
  Tensor forward_step(const Tensor& tokens, DecodeState& state) override;
  double mixing_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  // max_seq_len with absolute positions or any attention block (whose cache grows); 0 (unbounded) for
  // a stack of recurrences.
  int64_t max_context() const override;
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  Tensor run(const Tensor& tokens, DecoderState* state);

  ModelConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  Embedding* wpe_ = nullptr;
  Stack* stack_ = nullptr;
  bool has_moe_ = false;
  Tensor last_aux_;  // the last training forward's aux loss, until outputs() takes it
  double last_aux_value_ = 0, last_balance_ = 0, last_dropped_ = 0;
  Linear* lm_head_ = nullptr;
};

// The pieces of a decoder-only model counted from its configuration (model_config.h dispatches here).
double decoder_parameter_count(const ModelConfig& cfg);
double decoder_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len);
double decoder_state_size(const ModelConfig& cfg, int64_t seq_len);

// One stack of `cfg` (its settings, these blocks) as a decoder-only configuration, for counting a stack's
// mixing FLOPs and decoding state with the decoder's counts (an encoder's, an encoder-decoder's two).
ModelConfig causal_stack_config(const ModelConfig& cfg, const std::vector<BlockSpec>& blocks);

// Whether a model of these settings has a bounded context: absolute positions, or an attention block
// (whose cache grows); then max_seq_len bounds it.
bool bounded_context(const ModelConfig& cfg, const std::vector<BlockSpec>& blocks);

// The absolute position embedding of tokens at `positions` ([T] i64), [T, C]: the learned table's rows
// or the sinusoids; undefined for the other position kinds.
Tensor absolute_positions(const ModelConfig& cfg, const Embedding* wpe, const std::vector<int64_t>& positions,
                          DType dtype, Device device);

}  // namespace seqlab
