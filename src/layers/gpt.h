// A decoder-only transformer (GPT): token embedding (+ learned positions), pre-norm blocks of
// causal self-attention and an MLP, a final norm, and logits through the tied token embedding.
//
//   x_0 = wte[tokens] (+ wpe[positions])
//   x   = x + proj(attention(split(qkv(norm1(x)))))          per block
//   x   = x + mlp(norm2(x))        mlp = proj(gelu(fc x))  or  proj(silu(fc x) ⊙ gate x)  (SwiGLU)
//   logits = norm_f(x) · wteᵀ
//
// Parameter names are stable dotted paths: wte.weight, wpe.weight, blocks.{i}.ln1.*,
// blocks.{i}.attn.qkv.*, blocks.{i}.attn.proj.*, blocks.{i}.ln2.*, blocks.{i}.mlp.fc.*,
// blocks.{i}.mlp.gate.* (SwiGLU only), blocks.{i}.mlp.proj.*, ln_f.*.
#pragma once

#include <cstdint>
#include <vector>

#include "layers/basic.h"
#include "layers/module.h"

namespace seqlab {

struct GptConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: n_heads
  int64_t d_ff = 0;        // 0: 4 · d_model
  int64_t max_seq_len = 0;
  bool learned_positions = true;
  NormKind norm = NormKind::layer_norm;
  double norm_eps = 1e-5;
  bool swiglu = false;
  bool bias = true;
  double init_std = 0.02;
};

// Keys and values of every layer seen so far, [B, S, Hk, D] each (undefined before the first
// call), and the position of the next token.
struct GptCache {
  std::vector<Tensor> k, v;
  int64_t position = 0;
};

class GptAttention : public Module {
 public:
  GptAttention(const GptConfig& cfg, Generator& gen);
  // x [B, T, C]; with `cache_k`/`cache_v` non-null, new keys/values are appended to them first.
  Tensor forward(const Tensor& x, Tensor* cache_k = nullptr, Tensor* cache_v = nullptr) const;

 private:
  int64_t heads_, kv_heads_, head_dim_;
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
  GptBlock(const GptConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x, Tensor* cache_k = nullptr, Tensor* cache_v = nullptr) const;

 private:
  Norm& ln1_;
  GptAttention& attn_;
  Norm& ln2_;
  GptMlp& mlp_;
};

class Gpt : public Module {
 public:
  // Throws std::invalid_argument for sizes that do not fit (heads not dividing d_model, ...).
  Gpt(const GptConfig& cfg, Generator& gen);

  const GptConfig& config() const { return cfg_; }
  // tokens [B, T] (i32 or i64) → logits [B, T, V].
  Tensor forward(const Tensor& tokens);
  // Mean cross-entropy of forward(tokens) against targets [B, T] (entries −100 ignored).
  Tensor loss(const Tensor& tokens, const Tensor& targets);
  // tokens [B, t] at positions cache.position … +t−1 → logits [B, t, V]; appends their keys and
  // values to `cache` and advances cache.position. Meant for decoding under NoGradGuard.
  Tensor forward_incremental(const Tensor& tokens, GptCache& cache);

 private:
  Tensor run(const Tensor& tokens, GptCache* cache);

  GptConfig cfg_;
  Embedding& wte_;
  Embedding* wpe_ = nullptr;
  std::vector<GptBlock*> blocks_;
  Norm* ln_f_ = nullptr;
};

}  // namespace seqlab
