// Causal softmax self-attention as a token mixer around the fused `attention` op (attention.h),
// registered as `model.mixer = "attention"`: a block of every layer of a GPT, or some layers of a hybrid.
//
//   q, k, v = split(x W_qkv + b)                      [B, T, H, D], [B, T, Hk, D] ×2   (Hk = n_kv_heads)
//   q, k    = rope(q, p), rope(k, p)                  model.positions = "rope" only (rope.h)
//   o       = attention(q, [K_cache; k], [V_cache; v])   causal, query head h reads kv head h / (H/Hk)
//   y       = o W_proj + b
//
// Token t of a call sits at position p = start + t, start the number of tokens decoded before (0 in
// training), so rotary positions of new tokens are their true positions, and cached keys, rotated
// when they were new, never need rotating again. Biases with model.bias (GPT-2).
//
// Parameters: qkv, proj.
#include <memory>
#include <stdexcept>
#include <string>

#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "layers/attention/rope.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"

namespace seqlab {
namespace {

// Checks what the attention mixer needs of the model's settings; returns the head size.
int64_t checked_head_dim(const MixerContext& ctx) {
  const int64_t head = head_dim(ctx, "attention");
  if (ctx.n_kv_heads <= 0 || ctx.n_heads % ctx.n_kv_heads != 0) {
    throw std::invalid_argument("attention: n_heads " + std::to_string(ctx.n_heads) + " not divisible by n_kv_heads " +
                                std::to_string(ctx.n_kv_heads));
  }
  if (ctx.positions == PositionKind::rope) {
    if (head % 2 != 0) {
      throw std::invalid_argument("attention: rotary positions need an even head size, but d_model / n_heads = " +
                                  std::to_string(ctx.d_model) + " / " + std::to_string(ctx.n_heads) + " = " +
                                  std::to_string(head));
    }
    if (!(ctx.rope_base > 0)) {
      throw std::invalid_argument("attention: rope_base must be positive, got " + std::to_string(ctx.rope_base));
    }
  }
  return head;
}

class AttentionMixer : public Mixer {
 public:
  AttentionMixer(const MixerContext& ctx, Generator& gen)
      : head_dim_(checked_head_dim(ctx)),
        heads_(ctx.n_heads),
        kv_heads_(ctx.n_kv_heads),
        rope_(ctx.positions == PositionKind::rope),
        rope_base_(ctx.rope_base),
        qkv_(add_module("qkv", std::make_unique<Linear>(ctx.d_model, (heads_ + 2 * kv_heads_) * head_dim_, ctx.bias,
                                                        gen, ctx.init_std))),
        proj_(add_module("proj",
                         std::make_unique<Linear>(heads_ * head_dim_, ctx.d_model, ctx.bias, gen, ctx.init_std))) {}

  Tensor forward(const Tensor& x, MixerState* state) const override {
    const int64_t B = x.shape()[0], T = x.shape()[1];
    const int64_t start = state != nullptr ? state->position : 0;
    // [q | k | v] = x W_qkvᵀ + b, split along the feature dimension into H, Hk, Hk heads of D.
    Tensor qkv = qkv_.forward(x);
    Tensor q = reshape(narrow(qkv, 2, 0, heads_ * head_dim_), {B, T, heads_, head_dim_});
    Tensor k = reshape(narrow(qkv, 2, heads_ * head_dim_, kv_heads_ * head_dim_), {B, T, kv_heads_, head_dim_});
    Tensor v = reshape(narrow(qkv, 2, (heads_ + kv_heads_) * head_dim_, kv_heads_ * head_dim_),
                       {B, T, kv_heads_, head_dim_});
    if (const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr) {
      // Sequence-parallel: this rank's two chunks, rotated at their global positions, attend to the whole
      // sequence's keys and values as they travel around the ring.
      if (rope_) {
        q = sequence_rope(q, rope_base_, *sp);
        k = sequence_rope(k, rope_base_, *sp);
      }
      return proj_.forward(reshape(ring_attention(q, k, v, *sp), {B, T, heads_ * head_dim_}));
    }
    if (rope_) {
      // Rotated at their own positions before caching: cached keys never need rotating again.
      q = rope(q, {rope_base_, start});
      k = rope(k, {rope_base_, start});
    }
    if (state != nullptr) {
      // K = [K_cache; k] along the sequence; the T new queries sit at the last T key positions.
      if (state->keys.defined()) {
        if (state->keys.size(1) != start) {
          throw std::logic_error("attention: the cache holds " + std::to_string(state->keys.size(1)) +
                                 " positions but the new tokens start at " + std::to_string(start));
        }
        k = concat({state->keys, k}, 1);
        v = concat({state->values, v}, 1);
      }
      state->keys = k;
      state->values = v;
    }
    AttentionOptions opts;
    opts.causal = true;
    Tensor o = attention(q, k, v, opts);  // [B, T, H, D]
    return proj_.forward(reshape(o, {B, T, heads_ * head_dim_}));
  }

 private:
  int64_t head_dim_, heads_, kv_heads_;
  bool rope_;
  double rope_base_;
  Linear& qkv_;
  Linear& proj_;
};

const MixerRegistration kAttention{MixerSpec{
    "attention",
    {},
    "causal softmax attention (fused, online softmax), multi-, grouped- or multi-query heads (model.n_kv_heads)",
    "docs/variants/attention.md",
    /*recurrent=*/false,
    {},
    [](const MixerContext& ctx, const MixerOptions&, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<AttentionMixer>(ctx, gen);
    },
    // Scores and mixing, 2·T·d per token forward over half the keys on average (T·d multiply-adds each),
    // three times for forward and backward: 6·T·d per layer.
    [](const MixerContext& ctx, const MixerOptions&, int64_t seq_len) {
      return 6.0 * static_cast<double>(seq_len * ctx.d_model);
    },
    // qkv: d → (H + 2·Hk)·D, proj: H·D → d (D = d / H), each with a bias when ctx.bias.
    [](const MixerContext& ctx, const MixerOptions&) {
      const double d = static_cast<double>(ctx.d_model), D = static_cast<double>(ctx.d_model / ctx.n_heads);
      const double qkv = static_cast<double>(ctx.n_heads + 2 * ctx.n_kv_heads) * D, heads = static_cast<double>(ctx.n_heads) * D;
      return d * qkv + heads * d + (ctx.bias ? qkv + d : 0.0);
    },
    // The KV cache: keys and values of Hk heads of D for each of seq_len tokens.
    [](const MixerContext& ctx, const MixerOptions&, int64_t seq_len) {
      const int64_t hk = ctx.n_kv_heads > 0 ? ctx.n_kv_heads : ctx.n_heads;
      return 2.0 * static_cast<double>(seq_len) * static_cast<double>(hk) * static_cast<double>(ctx.d_model / ctx.n_heads);
    }}};

}  // namespace
}  // namespace seqlab
