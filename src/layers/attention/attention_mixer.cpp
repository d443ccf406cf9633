// Softmax attention as a token mixer around the fused `attention` op (attention.h), registered as
// `model.mixer = "attention"`: every block of a GPT or a BERT, some blocks of a hybrid, and (made with
// MixerContext::cross) the cross-attention layer of an encoder-decoder.
//
// Self-attention:
//   q, k, v = split(x W_qkv + b)                      [B, T, H, D], [B, T, Hk, D] ×2   (Hk = n_kv_heads)
//   q, k    = rope(q, p), rope(k, p)                  model.positions = "rope" only (rope.h)
//   o       = attention(q, [K_cache; k], [V_cache; v], causal or not, key lengths, score bias)
//   y       = o W_proj + b
// Cross-attention (keys and values from the memory m [B, S, C'], computed once when decoding):
//   q = x W_q + b,  k, v = split(m W_kv + b),  o = attention(q, k, v, not causal, memory lengths, bias)
//
// Query head h reads kv head h / (H/Hk). Token t of a call sits at position p = start + t, start the
// number of tokens decoded before (0 in training), so rotary positions of new tokens are their true
// positions, and cached keys, rotated when they were new, never need rotating again. Biases with
// model.bias (GPT-2, BERT). Scores are scaled by [model.attention] scale, 1/√D by default (T5: 1).
// Padding: with lengths, keys past a row's length are never seen and padded query rows give 0 (a
// causal decoder needs no lengths: right padding never reaches a valid token).
//
// Parameters: qkv, proj (self); q, kv, proj (cross).
#include <memory>
#include <stdexcept>
#include <string>

#include "autograd/ops.h"
#include "layers/attention/attention.h"
#include "layers/attention/ring_attention.h"
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

// Softmax attention: bidirectional, with a score bias and (made so) cross attention; sequence-parallel
// by ring attention (causal self-attention).
constexpr MixerTraits kTraits{/*recurrent=*/false, /*bidirectional=*/true, /*sequence_parallel=*/true,
                              /*cross_attention=*/true, /*score_bias=*/true};

// Decoding state: the keys and values seen so far, [B, S, Hk, D] each (cross attention: the memory's,
// computed at the first call).
struct AttentionCache : MixerState {
  Tensor keys, values;
  double size() const override { return elements_per_sequence({&keys, &values}); }
};

// The fused op with the input's masks and bias.
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, const Tensor& q_lengths,
              const Tensor& k_lengths, const Tensor& bias) {
  AttentionOptions opts;
  opts.causal = causal;
  opts.scale = scale;
  opts.q_lengths = q_lengths;
  opts.k_lengths = k_lengths;
  return attention(q, k, v, opts, bias);
}

class AttentionMixer : public Mixer {
 public:
  AttentionMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : head_dim_(checked_head_dim(ctx)),
        heads_(ctx.n_heads),
        kv_heads_(ctx.n_kv_heads),
        cross_(ctx.cross),
        rope_(ctx.positions == PositionKind::rope && !ctx.cross),
        rope_base_(ctx.rope_base),
        scale_(opts.number("scale")) {
    const int64_t memory_dim = ctx.memory_dim > 0 ? ctx.memory_dim : ctx.d_model;
    if (cross_) {
      q_ = &add_module("q", std::make_unique<Linear>(ctx.d_model, heads_ * head_dim_, ctx.bias, gen, ctx.init_std));
      kv_ = &add_module("kv",
                        std::make_unique<Linear>(memory_dim, 2 * kv_heads_ * head_dim_, ctx.bias, gen, ctx.init_std));
    } else {
      qkv_ = &add_module("qkv", std::make_unique<Linear>(ctx.d_model, (heads_ + 2 * kv_heads_) * head_dim_, ctx.bias,
                                                          gen, ctx.init_std));
    }
    proj_ = &add_module("proj", std::make_unique<Linear>(heads_ * head_dim_, ctx.d_model, ctx.bias, gen, ctx.init_std));
  }

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "attention", kTraits);
    if (cross_ != in.memory.defined()) {
      throw std::invalid_argument(cross_ ? "attention: a cross-attention layer needs a memory to attend to"
                                         : "attention: a self-attention layer was given a memory");
    }
    AttentionCache* state = state_of<AttentionCache>(decoding, "attention");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1];
    Tensor o = cross_ ? cross_attend(in, state) : self_attend(in, state);  // [B, T, H, D]
    return proj_->forward(reshape(o, {B, T, heads_ * head_dim_}));
  }

  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<AttentionCache>(); }

 private:
  Tensor self_attend(const MixerInput& in, AttentionCache* state) const {
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1];
    const int64_t start = state != nullptr ? state->position : 0;
    // [q | k | v] = x W_qkvᵀ + b as [B, T, H + 2Hk, D], split along the heads into H, Hk, Hk: views of the
    // projection, which the CPU kernels read in place. One split, not three narrows (each a zero-filled
    // gradient of the whole of qkv, then summed); the CPU backward writes dq, dk, dv side by side, so the
    // split's backward takes them without a copy.
    const Tensor qkv = reshape(qkv_->forward(x), {B, T, heads_ + 2 * kv_heads_, head_dim_});
    const std::vector<Tensor> parts = split(qkv, {heads_, kv_heads_, kv_heads_}, 2);
    Tensor q = parts[0], k = parts[1], v = parts[2];
    if (const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr) {
      // Sequence-parallel: this rank's two chunks, rotated at their global positions, attend to the whole
      // sequence's keys and values as they travel around the ring.
      if (!in.causal || in.bias.defined()) {
        throw std::invalid_argument("attention: sequence parallelism runs causal attention without a score bias");
      }
      if (rope_) {
        q = sequence_rope(q, rope_base_, *sp);
        k = sequence_rope(k, rope_base_, *sp);
      }
      return ring_attention(q, k, v, *sp, scale_);
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
      // Contiguous, so that the cache does not keep the whole projection (q's heads too) alive.
      state->keys = contiguous(k);
      state->values = contiguous(v);
    }
    // A causal row never sees a padded key (padding is at the end); bidirectional rows must be masked.
    const Tensor lengths = in.causal ? Tensor() : in.lengths;
    return attend(q, k, v, in.causal, scale_, lengths, lengths, in.bias);
  }

  Tensor cross_attend(const MixerInput& in, AttentionCache* state) const {
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1];
    if (sequence_group() != nullptr && state == nullptr) {
      throw std::invalid_argument("attention: cross attention does not run under sequence parallelism");
    }
    Tensor q = reshape(q_->forward(x), {B, T, heads_, head_dim_});
    Tensor k, v;
    if (state != nullptr && state->keys.defined()) {
      k = state->keys;  // the memory's keys and values, computed at the first call
      v = state->values;
    } else {
      const int64_t S = in.memory.size(1);
      const std::vector<Tensor> kv = split(kv_->forward(in.memory), {kv_heads_ * head_dim_, kv_heads_ * head_dim_}, 2);
      k = reshape(kv[0], {B, S, kv_heads_, head_dim_});
      v = reshape(kv[1], {B, S, kv_heads_, head_dim_});
      if (state != nullptr) {
        state->keys = k;
        state->values = v;
      }
    }
    return attend(q, k, v, /*causal=*/false, scale_, Tensor(), in.memory_lengths, in.bias);
  }

  int64_t head_dim_, heads_, kv_heads_;
  bool cross_, rope_;
  double rope_base_, scale_;
  Linear* qkv_ = nullptr;  // self-attention
  Linear* q_ = nullptr;    // cross attention
  Linear* kv_ = nullptr;
  Linear* proj_ = nullptr;
};

const MixerRegistration kAttention{MixerSpec{
    "attention",
    {},
    "softmax attention (fused, online softmax), causal or bidirectional, multi-, grouped- or multi-query heads "
    "(model.n_kv_heads)",
    "docs/variants/attention.md",
    kTraits,
    {OptionSpec::number("scale", 0.0, 0, false,
                        "scores are q·k times this; 0: 1/√(head size) (T5 uses 1, its weights absorb the scale)")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<AttentionMixer>(ctx, opts, gen);
    },
    // Scores and mixing, 2·T·d per token forward over half the keys on average (T·d multiply-adds each),
    // three times for forward and backward: 6·T·d per layer.
    [](const MixerContext& ctx, const MixerOptions&, int64_t seq_len) {
      return 6.0 * static_cast<double>(seq_len * ctx.d_model);
    },
    // qkv: d → (H + 2·Hk)·D, proj: H·D → d (D = d / H), each with a bias when ctx.bias. Cross
    // attention: q d → H·D and kv memory_dim → 2·Hk·D instead of qkv.
    [](const MixerContext& ctx, const MixerOptions&) {
      const double d = static_cast<double>(ctx.d_model), D = static_cast<double>(ctx.d_model / ctx.n_heads);
      const double m = ctx.memory_dim > 0 ? static_cast<double>(ctx.memory_dim) : d;
      const double q = static_cast<double>(ctx.n_heads) * D, kv = 2 * static_cast<double>(ctx.n_kv_heads) * D;
      const double in = ctx.cross ? d * q + m * kv : d * (q + kv);
      return in + q * d + (ctx.bias ? q + kv + d : 0.0);
    },
    // The KV cache: keys and values of Hk heads of D for each of seq_len tokens.
    [](const MixerContext& ctx, const MixerOptions&, int64_t seq_len) {
      const int64_t hk = ctx.n_kv_heads > 0 ? ctx.n_kv_heads : ctx.n_heads;
      return 2.0 * static_cast<double>(seq_len) * static_cast<double>(hk) * static_cast<double>(ctx.d_model / ctx.n_heads);
    }}};

}  // namespace
}  // namespace seqlab
