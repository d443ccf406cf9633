// The configuration of every model kind, and what can be counted from it without building anything.
//
// Three kinds, all built from blocks (block.h: a token mixer and an FFN, plus cross attention in an
// encoder-decoder's decoder):
//   decoder          a decoder-only language model (GPT, the recurrent LMs, hybrids): causal blocks,
//                    next-token loss (decoder.h)
//   encoder          a bidirectional encoder with a masked-LM head (BERT): blocks over the whole row,
//                    padding masked by lengths, segment embeddings, optional next-sentence head (encoder.h)
//   encoder_decoder  an encoder and a causal decoder that cross-attends to it (T5): span-corruption or
//                    any sequence-to-sequence loss on the decoder's tokens (encoder_decoder.h)
// make_model builds the kind a configuration names; model_parameter_count, model_mixing_flops_per_token
// and model_state_size count from the configuration alone (a double: sizes may be absurd, and the counts
// are what refuses them before anything is allocated), each equal to what the built model has.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/model/language_model.h"

namespace seqlab {

enum class ModelKind { decoder, encoder, encoder_decoder };
const char* model_kind_name(ModelKind kind);  // "decoder", "encoder", "encoder_decoder"

// The FFN of a block: proj(gelu(fc x)) (GPT-2, BERT), proj(relu(fc x)) (T5), or gated with a third
// matrix: proj(silu(fc x) ⊙ gate x) (SwiGLU) or proj(gelu(fc x) ⊙ gate x) (GEGLU, T5 v1.1); or none;
// or a mixture of experts (moe.h: a router sends each token to top_k of `experts` FFNs of one of the
// kinds above, configured by ModelConfig::moe). gelu is the tanh form throughout (autograd/ops.h).
enum class FfnKind { gelu, swiglu, none, relu, geglu, moe };
const char* ffn_kind_name(FfnKind kind);  // "gelu", "swiglu", "none", "relu", "geglu", "moe"
bool ffn_gated(FfnKind kind);             // swiglu, geglu: three matrices

// The mixture-of-experts FFN of the blocks whose FFN is moe (moe.h has the equations).
struct MoeConfig {
  int64_t experts = 8;           // E expert FFNs per MoE block
  int64_t top_k = 2;             // experts each token is sent to
  double capacity_factor = 1.25; // in training, an expert takes ceil(factor · N · k / E) of N tokens; 0: no limit
  FfnKind expert = FfnKind::swiglu;  // every expert's FFN (not none or moe)
  int64_t d_ff = 0;              // each expert's hidden width; 0: ModelConfig::d_ff, else ffn_d_ff(expert, d)
  double aux_loss_weight = 0.01; // the load-balancing loss's weight in the objective
  bool renormalize = true;       // the k routing weights divided by their sum (else the router's probabilities)
  bool operator==(const MoeConfig& o) const {
    return experts == o.experts && top_k == o.top_k && capacity_factor == o.capacity_factor && expert == o.expert &&
           d_ff == o.d_ff && aux_loss_weight == o.aux_loss_weight && renormalize == o.renormalize;
  }
};

// Where a block's norms sit: before each sub-layer, with a final norm after the stack (GPT-2, T5), or
// after each residual add (the original Transformer, BERT), with a norm of the embeddings instead.
enum class NormPlacement { pre, post };

// One block of a stack: its mixer (a registered name) and its feed-forward network.
struct BlockSpec {
  std::string mixer;
  FfnKind ffn = FfnKind::swiglu;
  bool operator==(const BlockSpec& o) const { return mixer == o.mixer && ffn == o.ffn; }
};

struct ModelConfig {
  ModelKind kind = ModelKind::decoder;
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;   // attention's key/value heads; 0: n_heads
  int64_t d_ff = 0;         // hidden width of the FFNs; 0: ffn_d_ff(kind, d_model) per block
  int64_t max_seq_len = 0;  // positions the model knows: needed by absolute positions and attention
  std::vector<BlockSpec> blocks;          // one per layer, bottom first (encoder_decoder: the encoder's)
  std::vector<BlockSpec> decoder_blocks;  // encoder_decoder: the decoder's stack, each with cross attention
  std::map<std::string, MixerOptions> mixer_options;  // by mixer name; a mixer not listed takes its defaults
  PositionKind positions = PositionKind::none;
  double rope_base = 10000;             // θ_i = rope_base^(−2i/D) (rope only)
  int64_t relative_buckets = 32;        // relative: T5's buckets per table (relative_position_bias.h)
  int64_t relative_max_distance = 128;  // relative: distances at and past this share the last bucket
  NormKind norm = NormKind::rms_norm;
  double norm_eps = 1e-5;
  NormPlacement norm_placement = NormPlacement::pre;
  bool bias = false;  // biases in attention's and the FFNs' linear layers (and BERT's head)
  bool tie_embeddings = true;  // the output projection is the token embedding (else its own lm_head)
  int64_t segments = 0;        // encoder: rows of the segment (token type) embedding; 0: none
  bool next_sentence = false;  // encoder: a pooled [CLS] classifier of two classes (BERT's NSP)
  double init_std = 0.02;
  double dropout = 0;         // in [0, 1); applied in training mode only
  uint64_t dropout_seed = 0;  // seeds the model's dropout generator
  MoeConfig moe;              // the blocks whose FFN is moe
  // Zamba's shared attention block (decoder only; stack.h): after every k-th block one attention block
  // whose weights the whole model shares, each use with its own input projection; 0: none.
  int64_t shared_attention_every = 0;
  FfnKind shared_attention_ffn = FfnKind::swiglu;  // the shared block's FFN
};

// How often a stack of `layers` blocks applies the shared attention block: layers / every (0 when off).
int64_t shared_attention_uses(const ModelConfig& cfg, size_t layers);

// A GPT-2: n_layers blocks of causal attention (n_heads heads) with GELU MLPs of 4·d_model, LayerNorm,
// biases and learned positions for max_seq_len tokens.
ModelConfig gpt2_config(int64_t vocab_size, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t max_seq_len);

// 4·d_model for GELU and ReLU; for the gated FFNs (SwiGLU, GEGLU) the multiple of 64 nearest
// 8/3·d_model (at least 64), which keeps the parameter count of a 4·d_model MLP with three matrices.
int64_t ffn_d_ff(FfnKind kind, int64_t d_model);

// The configuration with its defaults filled in (n_kv_heads; decoder_blocks of an encoder_decoder from
// blocks) and checked: throws std::invalid_argument naming what does not fit (sizes, an unknown mixer,
// a mixer without a trait the kind needs: bidirectional in an encoder, cross attention, ...).
ModelConfig resolved_config(ModelConfig cfg);

// What every mixer of the model shares, from a resolved configuration.
MixerContext mixer_context_of(const ModelConfig& cfg);
// The options of `spec` in the configuration (its defaults where the configuration has none).
MixerOptions options_of(const ModelConfig& cfg, const MixerSpec& spec);

// The model a configuration names, its weights drawn from `gen` in parameter order. Throws
// std::invalid_argument as resolved_config does.
std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Generator& gen);

// The number of weights make_model(cfg) has, counted from the configuration alone. Equals
// make_model(cfg)->num_parameters(); throws as make_model does for sizes it cannot take.
double model_parameter_count(const ModelConfig& cfg);
// The weights one token's forward and backward pass through, each time it does (what 6·N counts in the
// FLOPs per token): all of them but, in every MoE block, the E − top_k experts it is not routed to, and
// the shared attention block's once per use. Equals model_parameter_count for a model with neither.
double model_active_parameter_count(const ModelConfig& cfg);
// Token-mixing FLOPs per token for sequences of seq_len tokens, beyond 6 per weight (each block's
// MixerSpec::mixing_flops_per_token, twice for a bidirectional stack, whose rows see every token; and a
// cross-attention layer's over seq_len memory tokens): equals make_model(cfg)->mixing_flops_per_token.
double model_mixing_flops_per_token(const ModelConfig& cfg, int64_t seq_len);
// The elements of decoding state the model carries per sequence after seq_len tokens: every decoding
// block's MixerSpec::state_size (recurrent states; attention's KV cache; an encoder-decoder's cross
// attention keys and values of seq_len memory tokens). 0 for a model that does not decode (encoder).
double model_state_size(const ModelConfig& cfg, int64_t seq_len);

// The conventions "auto" stands for in a recipe's model.norm, model.mlp, model.bias, model.positions
// and the norms' placement, by kind: a decoder takes GPT-2's when every block is softmax attention
// (LayerNorm, GELU MLP, biases, learned positions), otherwise those of the recurrent language models'
// papers (RMSNorm, SwiGLU, no biases, no position embedding: the recurrence orders the tokens); an
// encoder BERT's (LayerNorm after each residual add, GELU, biases, learned positions); an
// encoder-decoder T5's (RMSNorm before each sub-layer, ReLU, no biases, relative position bias).
struct ModelConventions {
  NormKind norm;
  FfnKind ffn;
  bool bias;
  PositionKind positions;
  NormPlacement placement;
};
ModelConventions model_conventions(ModelKind kind, const std::vector<std::string>& mixers);

}  // namespace seqlab
