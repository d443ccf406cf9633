#include "layers/model/gpt.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "layers/attention/rope.h"

namespace seqlab {
namespace {

GptConfig resolved(GptConfig cfg) {
  if (cfg.n_kv_heads == 0) cfg.n_kv_heads = cfg.n_heads;
  if (cfg.d_ff == 0) cfg.d_ff = 4 * cfg.d_model;
  if (cfg.vocab_size <= 0 || cfg.d_model <= 0 || cfg.n_layers < 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 ||
      cfg.d_ff <= 0 || cfg.max_seq_len <= 0) {
    throw std::invalid_argument("GptConfig: sizes must be positive");
  }
  if (cfg.d_model % cfg.n_heads != 0) {
    throw std::invalid_argument("GptConfig: d_model " + std::to_string(cfg.d_model) + " not divisible by n_heads " +
                                std::to_string(cfg.n_heads));
  }
  if (cfg.n_heads % cfg.n_kv_heads != 0) {
    throw std::invalid_argument("GptConfig: n_heads " + std::to_string(cfg.n_heads) + " not divisible by n_kv_heads " +
                                std::to_string(cfg.n_kv_heads));
  }
  if (cfg.positions == PositionKind::rope) {
    const int64_t head_dim = cfg.d_model / cfg.n_heads;
    if (head_dim % 2 != 0) {
      throw std::invalid_argument(
          "GptConfig: rotary positions need an even head size, but d_model / n_heads = " + std::to_string(cfg.d_model) +
          " / " + std::to_string(cfg.n_heads) + " = " + std::to_string(head_dim));
    }
    if (!(cfg.rope_base > 0)) {
      throw std::invalid_argument("GptConfig: rope_base must be positive, got " + std::to_string(cfg.rope_base));
    }
  }
  if (!(cfg.dropout >= 0 && cfg.dropout < 1)) {
    throw std::invalid_argument("GptConfig: dropout must be in [0, 1), got " + std::to_string(cfg.dropout));
  }
  return cfg;
}

}  // namespace

GptAttention::GptAttention(const GptConfig& cfg, Generator& gen)
    : heads_(cfg.n_heads),
      kv_heads_(cfg.n_kv_heads),
      head_dim_(cfg.d_model / cfg.n_heads),
      rope_(cfg.positions == PositionKind::rope),
      rope_base_(cfg.rope_base),
      qkv_(add_module("qkv", std::make_unique<Linear>(cfg.d_model, (heads_ + 2 * kv_heads_) * head_dim_, cfg.bias, gen,
                                                      cfg.init_std))),
      proj_(
          add_module("proj", std::make_unique<Linear>(heads_ * head_dim_, cfg.d_model, cfg.bias, gen, cfg.init_std))) {}

Tensor GptAttention::forward(const Tensor& x, int64_t start, Tensor* cache_k, Tensor* cache_v) const {
  const int64_t B = x.shape()[0], T = x.shape()[1];
  // [q | k | v] = x W_qkvᵀ + b, split along the feature dimension into H, Hk, Hk heads of D.
  Tensor qkv = qkv_.forward(x);
  Tensor q = reshape(narrow(qkv, 2, 0, heads_ * head_dim_), {B, T, heads_, head_dim_});
  Tensor k = reshape(narrow(qkv, 2, heads_ * head_dim_, kv_heads_ * head_dim_), {B, T, kv_heads_, head_dim_});
  Tensor v =
      reshape(narrow(qkv, 2, (heads_ + kv_heads_) * head_dim_, kv_heads_ * head_dim_), {B, T, kv_heads_, head_dim_});
  if (rope_) {
    // Rotated at their own positions before caching: cached keys never need rotating again.
    q = rope(q, {rope_base_, start});
    k = rope(k, {rope_base_, start});
  }
  if (cache_k != nullptr) {
    // K = [K_cache; k] along the sequence; the T new queries sit at the last T key positions.
    if (cache_k->defined()) {
      if (cache_k->size(1) != start) {
        throw std::logic_error("GptAttention: the cache holds " + std::to_string(cache_k->size(1)) +
                               " positions but the new tokens start at " + std::to_string(start));
      }
      k = concat({*cache_k, k}, 1);
      v = concat({*cache_v, v}, 1);
    }
    *cache_k = k;
    *cache_v = v;
  }
  AttentionOptions opts;
  opts.causal = true;
  Tensor o = attention(q, k, v, opts);  // [B, T, H, D]
  return proj_.forward(reshape(o, {B, T, heads_ * head_dim_}));
}

GptMlp::GptMlp(const GptConfig& cfg, Generator& gen)
    : fc_(add_module("fc", std::make_unique<Linear>(cfg.d_model, cfg.d_ff, cfg.bias, gen, cfg.init_std))),
      gate_(cfg.swiglu
                ? &add_module("gate", std::make_unique<Linear>(cfg.d_model, cfg.d_ff, cfg.bias, gen, cfg.init_std))
                : nullptr),
      proj_(add_module("proj", std::make_unique<Linear>(cfg.d_ff, cfg.d_model, cfg.bias, gen, cfg.init_std))) {}

Tensor GptMlp::forward(const Tensor& x) const {
  // GELU: proj(gelu(fc x)), fc and gelu fused (linear_gelu);  SwiGLU: proj(silu(fc x) ⊙ gate x).
  Tensor h = gate_ != nullptr ? mul(silu(fc_.forward(x)), gate_->forward(x)) : fc_.forward_gelu(x);
  return proj_.forward(h);
}

GptBlock::GptBlock(const GptConfig& cfg, Generator& init_gen, Generator& dropout_gen)
    : dropout_(cfg.dropout),
      dropout_gen_(dropout_gen),
      ln1_(add_module("ln1", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps))),
      attn_(add_module("attn", std::make_unique<GptAttention>(cfg, init_gen))),
      ln2_(add_module("ln2", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps))),
      mlp_(add_module("mlp", std::make_unique<GptMlp>(cfg, init_gen))) {}

Tensor GptBlock::drop(const Tensor& x) const {
  return dropout_ > 0 && training() ? dropout(x, dropout_, dropout_gen_) : x;
}

std::pair<Tensor, Tensor> GptBlock::forward(const Tensor& x, const Tensor& branch, int64_t start, Tensor* cache_k,
                                            Tensor* cache_v) const {
  // Pre-norm residual: x + drop(attn(ln1 x)), then + drop(mlp(ln2 ·)), each add fused with the norm
  // that reads its result.
  AddNormResult in = ln1_.add_forward(x, branch);
  AddNormResult mid = ln2_.add_forward(in.sum, drop(attn_.forward(in.y, start, cache_k, cache_v)));
  return {mid.sum, drop(mlp_.forward(mid.y))};
}

Gpt::Gpt(const GptConfig& cfg, Generator& gen)
    : cfg_(resolved(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.d_model, gen, cfg_.init_std))),
      wpe_(cfg_.positions == PositionKind::learned
               ? &add_module("wpe", std::make_unique<Embedding>(cfg_.max_seq_len, cfg_.d_model, gen, cfg_.init_std))
               : nullptr),
      blocks_() {
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    blocks_.push_back(&add_module("blocks." + std::to_string(i), std::make_unique<GptBlock>(cfg_, gen, dropout_gen_)));
  }
  ln_f_ = &add_module("ln_f", std::make_unique<Norm>(cfg_.norm, cfg_.d_model, cfg_.norm_eps));
}

Tensor Gpt::run(const Tensor& tokens, GptCache* cache) {
  if (tokens.dim() != 2) throw std::invalid_argument("Gpt: tokens must be [B, T], got " + shape_str(tokens.shape()));
  const int64_t T = tokens.shape()[1];
  const int64_t start = cache != nullptr ? cache->position : 0;
  if (start + T > cfg_.max_seq_len) {
    throw std::invalid_argument("Gpt: positions up to " + std::to_string(start + T) + " exceed max_seq_len " +
                                std::to_string(cfg_.max_seq_len));
  }
  Tensor x = wte_.forward(tokens);  // [B, T, C]
  if (wpe_ != nullptr) {
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = start + t;
    Tensor positions = Tensor::from_indices(pos, {T}, DType::i64, tokens.device());
    x = add(x, wpe_->forward(positions));  // [T, C] broadcast over B
  }
  if (cfg_.dropout > 0 && training()) x = dropout(x, cfg_.dropout, dropout_gen_);
  if (cache != nullptr) {
    cache->k.resize(blocks_.size());
    cache->v.resize(blocks_.size());
  }
  Tensor branch;  // the last block's MLP output, not yet added to x
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::tie(x, branch) = cache != nullptr ? blocks_[i]->forward(x, branch, start, &cache->k[i], &cache->v[i])
                                           : blocks_[i]->forward(x, branch, start);
  }
  if (cache != nullptr) cache->position = start + T;
  // Tied output: logits = ln_f(x + branch) · wteᵀ.
  return linear(ln_f_->add_forward(x, branch).y, wte_.weight());
}

Tensor Gpt::forward(const Tensor& tokens) { return run(tokens, nullptr); }

Tensor Gpt::forward_incremental(const Tensor& tokens, GptCache& cache) { return run(tokens, &cache); }

Tensor Gpt::forward_step(const Tensor& tokens, DecodeState& state) {
  auto* cache = dynamic_cast<GptCache*>(&state);
  if (cache == nullptr) throw std::invalid_argument("Gpt::forward_step: the state is not a GptCache");
  return run(tokens, cache);
}

}  // namespace seqlab
