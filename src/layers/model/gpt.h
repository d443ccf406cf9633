// A decoder-only transformer (GPT): token embedding (+ learned positions), pre-norm blocks of
// causal self-attention and an MLP, a final norm, and logits through the tied token embedding.
//
//   x_0 = drop(wte[tokens] (+ wpe[positions]))                 wpe with PositionKind::learned only
//   q, k, v = split(qkv(norm1(x)))                              [B, T, H, D], [B, T, Hk, D] ×2
//   q, k = rope(q, start), rope(k, start)                       PositionKind::rope only (rope.h)
//   x   = x + drop(proj(attention(q, [K_cache; k], [V_cache; v])))          per block
//   x   = x + drop(mlp(norm2(x)))  mlp = proj(gelu(fc x))  or  proj(silu(fc x) ⊙ gate x)  (SwiGLU)
//   logits = norm_f(x) · wteᵀ
// Every norm that follows a residual add (norm2, the next block's norm1, norm_f) is fused with it
// (add_layer_norm / add_rms_norm): the same arithmetic, without a separate pass reading the sum back.
//
// Token t of a call sits at position start + t, where start is 0 for a full forward and the
// cache position when decoding, so rotary positions of new tokens are their true positions.
// drop is GPT-2's dropout (p = dropout), active only in training mode (Module::set_training) and
// drawn from the model's own generator, seeded by dropout_seed, in a fixed order: embedding, then
// per block attention, MLP. Its state (dropout_generator().state()) belongs in a checkpoint.
//
// Parameter names are stable dotted paths: wte.weight, wpe.weight (learned positions only),
// blocks.{i}.ln1.*, blocks.{i}.attn.qkv.*, blocks.{i}.attn.proj.*, blocks.{i}.ln2.*,
// blocks.{i}.mlp.fc.*, blocks.{i}.mlp.gate.* (SwiGLU only), blocks.{i}.mlp.proj.*, ln_f.*.
// Rotary and absent positions add no parameters.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "layers/basic.h"
#include "layers/model/language_model.h"
#include "layers/module.h"

namespace seqlab {

// How the model knows token order: a learned absolute embedding added to the input (wpe),
// rotary embedding of every layer's queries and keys (no parameters), or nothing (causal
// attention alone).
enum class PositionKind { learned, rope, none };

struct GptConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: n_heads
  int64_t d_ff = 0;        // 0: 4 · d_model
  int64_t max_seq_len = 0;
  PositionKind positions = PositionKind::learned;
  double rope_base = 10000;  // θ_i = rope_base^(−2i/D) (rope only)
  NormKind norm = NormKind::layer_norm;
  double norm_eps = 1e-5;
  bool swiglu = false;
  bool bias = true;
  double init_std = 0.02;
  double dropout = 0;         // in [0, 1); applied in training mode only
  uint64_t dropout_seed = 0;  // seeds the model's dropout generator
};

// Keys and values of every layer seen so far, [B, S, Hk, D] each (undefined before the first
// call), and the position of the next token.
struct GptCache : DecodeState {
  std::vector<Tensor> k, v;
};

class GptAttention : public Module {
 public:
  GptAttention(const GptConfig& cfg, Generator& gen);
  // x [B, T, C] holds the tokens at positions start … start+T−1 (rotary positions use them);
  // with `cache_k`/`cache_v` non-null, new keys/values are appended to them first, and a
  // non-empty cache must hold exactly `start` positions. Returns proj(attention), before dropout.
  Tensor forward(const Tensor& x, int64_t start = 0, Tensor* cache_k = nullptr, Tensor* cache_v = nullptr) const;

 private:
  int64_t heads_, kv_heads_, head_dim_;
  bool rope_;
  double rope_base_;
  Linear& qkv_;
  Linear& proj_;
};

class GptMlp : public Module {
 public:
  GptMlp(const GptConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x) const;

 private:
  Linear& fc_;
  Linear* gate_ = nullptr;  // SwiGLU's second input projection
  Linear& proj_;
};

class GptBlock : public Module {
 public:
  // Weights are drawn from `init_gen`; dropout masks from `dropout_gen`, which must outlive the
  // block (Gpt passes its own generator).
  GptBlock(const GptConfig& cfg, Generator& init_gen, Generator& dropout_gen);
  // The residual stream arrives as x + branch, where branch is the previous block's MLP output not
  // yet added (undefined for the first block): the add is fused with ln1, as the attention output's
  // is with ln2 (Norm::add_forward). Returns the stream and this block's MLP output, whose sum is the
  // block's output; the next block or the final norm adds them. As GptAttention::forward: the tokens
  // of x sit at positions start … start+T−1.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& branch, int64_t start = 0, Tensor* cache_k = nullptr,
                                    Tensor* cache_v = nullptr) const;

 private:
  Tensor drop(const Tensor& x) const;  // dropout in training mode, else x

  double dropout_;
  Generator& dropout_gen_;
  Norm& ln1_;
  GptAttention& attn_;
  Norm& ln2_;
  GptMlp& mlp_;
};

class Gpt : public LanguageModel {
 public:
  // Throws std::invalid_argument for sizes that do not fit (heads not dividing d_model, ...).
  Gpt(const GptConfig& cfg, Generator& gen);

  const GptConfig& config() const { return cfg_; }
  Tensor forward(const Tensor& tokens) override;
  // tokens [B, t] at positions cache.position … +t−1 → logits [B, t, V]; appends their keys and
  // values to `cache` and advances cache.position. Meant for decoding under NoGradGuard.
  Tensor forward_incremental(const Tensor& tokens, GptCache& cache);

  std::unique_ptr<DecodeState> new_decode_state() const override { return std::make_unique<GptCache>(); }
  // forward_incremental on a GptCache.
  Tensor forward_step(const Tensor& tokens, DecodeState& state) override;
  // Causal attention: scores and mixing, 2·T·d per token forward over half the keys on average
  // (T·d multiply-adds each), three times for forward and backward: 6·L·T·d.
  double mixing_flops_per_token(int64_t seq_len) const override {
    return 6.0 * static_cast<double>(cfg_.n_layers * seq_len * cfg_.d_model);
  }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_context() const override { return cfg_.max_seq_len; }
  Generator& dropout_generator() override { return dropout_gen_; }

 private:
  Tensor run(const Tensor& tokens, GptCache* cache);

  GptConfig cfg_;
  Generator dropout_gen_;
  Embedding& wte_;
  Embedding* wpe_ = nullptr;
  std::vector<GptBlock*> blocks_;
  Norm* ln_f_ = nullptr;
};

}  // namespace seqlab
