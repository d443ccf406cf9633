// The decoder-only language model, built from blocks: each block one token mixer (any registered
// mixer: softmax attention, GLA, retention, ...; mixer.h) and one feed-forward network. A GPT is every
// block attention with a GELU MLP; GLA's language model every block GLA with SwiGLU; a hybrid any list
// of them (model.pattern in a recipe).
//
//   x_0 = drop(wte[tokens] (+ wpe[positions]))                 wpe with PositionKind::learned only
//   x   = x + drop(mixer_i(norm1_i(x)))                        per block i (pre-norm residual)
//   x   = x + drop(ffn_i(norm2_i(x)))   ffn = proj(gelu(fc x)) or proj(silu(fc x) ⊙ gate x), or none
//   logits = norm_f(x) · wteᵀ                                  tied output embedding
// Every norm that follows a residual add (norm2, the next block's norm1, norm_f) is fused with it
// (add_layer_norm / add_rms_norm): the same arithmetic, without a separate pass reading the sum back.
//
// Token t of a call sits at position start + t, where start is 0 in training and the number of
// tokens decoded so far when decoding: each block keeps a MixerState (attention its keys and values,
// a recurrence its state), so a prompt and then one token at a time give the logits of a full forward.
// drop is dropout (p = dropout), active only in training mode (Module::set_training) and drawn from
// the model's own generator, seeded by dropout_seed, in a fixed order: embedding, then per block
// mixer, FFN. Its state (dropout_generator().state()) belongs in a checkpoint. Initial weights are
// drawn from the constructor's generator in parameter order.
//
// Parameter names are stable dotted paths: wte.weight, wpe.weight (learned positions only),
// blocks.{i}.norm1.*, blocks.{i}.mixer.* (the mixer's own: attention qkv.*, proj.*; gla q.*, ...),
// blocks.{i}.norm2.*, blocks.{i}.mlp.{fc,gate,proj}.* (no norm2 and mlp where the FFN is none),
// norm_f.*.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/model/language_model.h"
#include "layers/module.h"

namespace seqlab {

enum class FfnKind { gelu, swiglu, none };
const char* ffn_kind_name(FfnKind kind);  // "gelu", "swiglu", "none"

// One block of the stack: its mixer (a registered name) and its feed-forward network.
struct BlockSpec {
  std::string mixer;
  FfnKind ffn = FfnKind::swiglu;
  bool operator==(const BlockSpec& o) const { return mixer == o.mixer && ffn == o.ffn; }
};

struct DecoderConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;   // attention's key/value heads; 0: n_heads
  int64_t d_ff = 0;         // hidden width of the FFNs; 0: decoder_d_ff(kind, d_model) per block
  int64_t max_seq_len = 0;  // positions the model knows: needed by learned positions and attention
  std::vector<BlockSpec> blocks;                      // one per layer, bottom first
  std::map<std::string, MixerOptions> mixer_options;  // by mixer name; a mixer not listed takes its defaults
  PositionKind positions = PositionKind::none;
  double rope_base = 10000;  // θ_i = rope_base^(−2i/D) (rope only)
  NormKind norm = NormKind::rms_norm;
  double norm_eps = 1e-5;
  bool bias = false;  // biases in attention's and the FFNs' linear layers
  double init_std = 0.02;
  double dropout = 0;         // in [0, 1); applied in training mode only
  uint64_t dropout_seed = 0;  // seeds the model's dropout generator
};

// A GPT-2: n_layers blocks of causal attention (n_heads heads) with GELU MLPs of 4·d_model, LayerNorm,
// biases and learned positions for max_seq_len tokens.
DecoderConfig gpt2_config(int64_t vocab_size, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t max_seq_len);

// 4·d_model for GELU; for SwiGLU the multiple of 64 nearest 8/3·d_model (at least 64), which keeps
// the parameter count of a 4·d_model GELU MLP with three matrices instead of two.
int64_t decoder_d_ff(FfnKind kind, int64_t d_model);

// The number of weights the Decoder of `cfg` has, counted from the configuration alone (nothing is
// allocated; a double, since a configuration may ask for more than any memory holds): the embeddings,
// every block's norms, mixer (MixerSpec::parameter_count) and FFN, the final norm. Equals
// Decoder(cfg).num_parameters(); throws std::invalid_argument as the Decoder's constructor does for
// sizes it cannot take.
double decoder_parameter_count(const DecoderConfig& cfg);
// Token-mixing FLOPs per token of the Decoder of `cfg` for sequences of seq_len tokens, beyond 6 per
// weight (each block's MixerSpec::mixing_flops_per_token), from the configuration alone: equals
// Decoder(cfg).mixing_flops_per_token(seq_len).
double decoder_mixing_flops_per_token(const DecoderConfig& cfg, int64_t seq_len);
// The elements of decoding state the Decoder of `cfg` carries per sequence after seq_len tokens: every
// block's MixerSpec::state_size (recurrent states; attention's KV cache).
double decoder_state_size(const DecoderConfig& cfg, int64_t seq_len);

// The conventions "auto" stands for in a recipe's model.norm, model.mlp, model.bias and
// model.positions: GPT-2's when every block is softmax attention (LayerNorm, GELU MLP, biases,
// learned positions); otherwise those of the recurrent language models' papers (RMSNorm, SwiGLU, no
// biases, no position embedding: the recurrence orders the tokens).
struct DecoderConventions {
  NormKind norm;
  FfnKind ffn;
  bool bias;
  PositionKind positions;
};
DecoderConventions decoder_conventions(const std::vector<std::string>& mixers);

// The FFN of a block: y = proj(gelu(fc x)) (fc and gelu fused: linear_gelu) or proj(silu(fc x) ⊙ gate x).
class Ffn : public Module {
 public:
  Ffn(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias, Generator& gen, double init_std);
  Tensor forward(const Tensor& x) const;

 private:
  Linear& fc_;
  Linear* gate_ = nullptr;  // SwiGLU's second input projection
  Linear& proj_;
};

class DecoderBlock : public Module {
 public:
  // Weights are drawn from `init_gen` (mixer, then FFN); dropout masks from `dropout_gen`, which must
  // outlive the block.
  DecoderBlock(const DecoderConfig& cfg, const BlockSpec& spec, const MixerContext& ctx, Generator& init_gen,
               Generator& dropout_gen);
  // The residual stream arrives as x + branch, where branch is the previous block's last output not
  // yet added (undefined for the first block): the add is fused with norm1, as the mixer output's is
  // with norm2 (Norm::add_forward). Returns the stream and this block's last output (the FFN's, or the
  // mixer's without an FFN), whose sum is the block's output; the next block or the final norm adds
  // them. `state` as Mixer::forward.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& branch, MixerState* state) const;
  const Mixer& mixer() const { return mixer_; }

 private:
  Tensor drop(const Tensor& x) const;  // dropout in training mode, else x

  double dropout_;
  Generator& dropout_gen_;
  Norm& norm1_;
  Mixer& mixer_;
  Norm* norm2_ = nullptr;
  Ffn* ffn_ = nullptr;
};

// Decoding state: each block's mixer's own (Mixer::new_state()).
struct DecoderState : DecodeState {
  std::vector<std::unique_ptr<MixerState>> blocks;
};

class Decoder : public LanguageModel {
 public:
  // Throws std::invalid_argument for a configuration that does not fit (an unknown mixer, heads not
  // dividing d_model, ...), naming what.
  Decoder(const DecoderConfig& cfg, Generator& gen);

  const DecoderConfig& config() const { return cfg_; }
  // Reads batch.inputs (and lengths, through the loss); refuses decoder_inputs and segment_ids.
  Tensor logits(const Batch& batch) override;
  std::unique_ptr<DecodeState> new_decode_state() const override { return std::make_unique<DecoderState>(); }
  Tensor forward_step(const Tensor& tokens, DecodeState& state) override;
  double mixing_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  // max_seq_len with learned positions or any attention block (whose cache grows); 0 (unbounded) for
  // a stack of recurrences.
  int64_t max_context() const override;
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  Tensor run(const Tensor& tokens, DecoderState* state);
  MixerContext mixer_context() const;
  bool bounded_context() const;

  DecoderConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  Embedding* wpe_ = nullptr;
  std::vector<DecoderBlock*> blocks_;
  Norm* norm_f_ = nullptr;
};

}  // namespace seqlab
