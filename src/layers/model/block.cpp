#include "layers/model/block.h"

#include <memory>
#include <stdexcept>
#include <string>

#include "autograd/ops.h"
#include "layers/model/moe.h"

namespace seqlab {

// ---- the FFN ----

Ffn::Ffn(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias, Generator& gen, double init_std)
    : kind_(kind),
      fc_(add_module("fc", std::make_unique<Linear>(d_model, d_ff, bias, gen, init_std))),
      gate_(ffn_gated(kind) ? &add_module("gate", std::make_unique<Linear>(d_model, d_ff, bias, gen, init_std))
                            : nullptr),
      proj_(add_module("proj", std::make_unique<Linear>(d_ff, d_model, bias, gen, init_std))) {
  if (kind == FfnKind::none || kind == FfnKind::moe) {
    throw std::logic_error("Ffn: a block without an FFN, or with a mixture of experts, has no Ffn module");
  }
}

Tensor Ffn::forward(const Tensor& x) const {
  Tensor h;
  switch (kind_) {
    case FfnKind::gelu: h = fc_.forward_gelu(x); break;                          // gelu(fc x), fused
    case FfnKind::relu: h = relu(fc_.forward(x)); break;                         // relu(fc x)
    case FfnKind::swiglu: h = mul(silu(fc_.forward(x)), gate_->forward(x)); break;  // silu(fc x) ⊙ gate x
    case FfnKind::geglu: h = mul(fc_.forward_gelu(x), gate_->forward(x)); break;    // gelu(fc x) ⊙ gate x
    case FfnKind::none:
    case FfnKind::moe: break;
  }
  return proj_.forward(h);
}

double ffn_parameter_count(FfnKind kind, int64_t d_model, int64_t d_ff, bool bias) {
  if (kind == FfnKind::none || kind == FfnKind::moe) return 0;
  const double d = static_cast<double>(d_model), ff = static_cast<double>(d_ff);
  const double inputs = ffn_gated(kind) ? 2 : 1;  // fc (and gate): d → d_ff each
  return inputs * d * ff + ff * d + (bias ? inputs * ff + d : 0.0);
}

// ---- the block ----

Block::Block(const ModelConfig& cfg, const BlockSpec& spec, const MixerContext& ctx, bool cross, Generator& init_gen,
             Generator& dropout_gen)
    : dropout_(cfg.dropout),
      post_norm_(cfg.norm_placement == NormPlacement::post),
      dropout_gen_(dropout_gen),
      norm1_(add_module("norm1", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps))),
      mixer_(add_module("mixer", [&] {
        const MixerSpec& mixer = mixer_spec(spec.mixer);
        return mixer.make(ctx, options_of(cfg, mixer), init_gen);
      }())) {
  if (cross) {
    cross_norm_ = &add_module("cross_norm", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps));
    const MixerSpec& attention = mixer_spec("attention");
    MixerContext cross_ctx = ctx;
    cross_ctx.cross = true;
    cross_ctx.memory_dim = cfg.d_model;
    cross_ = &add_module("cross", attention.make(cross_ctx, options_of(cfg, attention), init_gen));
  }
  if (spec.ffn == FfnKind::none) return;
  norm2_ = &add_module("norm2", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps));
  if (spec.ffn == FfnKind::moe) {
    moe_ = &add_module("moe", std::make_unique<MoeFfn>(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias, init_gen, cfg.init_std));
    return;
  }
  const int64_t d_ff = cfg.d_ff > 0 ? cfg.d_ff : ffn_d_ff(spec.ffn, cfg.d_model);
  ffn_ = &add_module("mlp", std::make_unique<Ffn>(spec.ffn, cfg.d_model, d_ff, cfg.bias, init_gen, cfg.init_std));
}

double block_parameter_count(const ModelConfig& cfg, const BlockSpec& spec, bool cross) {
  const MixerContext ctx = mixer_context_of(cfg);
  const double d = static_cast<double>(cfg.d_model);
  const double norm = cfg.norm == NormKind::layer_norm ? 2 * d : d;  // gain (and bias)
  const MixerSpec& mixer = mixer_spec(spec.mixer);
  double n = norm + mixer.parameter_count(ctx, options_of(cfg, mixer));
  if (cross) {
    const MixerSpec& attention = mixer_spec("attention");
    MixerContext cross_ctx = ctx;
    cross_ctx.cross = true;
    cross_ctx.memory_dim = cfg.d_model;
    n += norm + attention.parameter_count(cross_ctx, options_of(cfg, attention));
  }
  if (spec.ffn == FfnKind::moe) {
    n += norm + moe_parameter_count(cfg.moe, cfg.d_model, cfg.d_ff, cfg.bias);
  } else if (spec.ffn != FfnKind::none) {
    const int64_t d_ff = cfg.d_ff > 0 ? cfg.d_ff : ffn_d_ff(spec.ffn, cfg.d_model);
    n += norm + ffn_parameter_count(spec.ffn, cfg.d_model, d_ff, cfg.bias);
  }
  return n;
}

Tensor Block::drop(const Tensor& x) const {
  return dropout_ > 0 && training() ? dropout(x, dropout_, dropout_gen_) : x;
}

Tensor Block::mix(const Mixer& m, const Tensor& x, const StackInput& in, bool cross, MixerState* state) const {
  MixerInput input;
  input.x = x;
  input.causal = cross ? false : in.causal;
  input.lengths = in.lengths;
  if (cross) {
    input.memory = in.memory;
    input.memory_lengths = in.memory_lengths;
  } else {
    input.bias = in.bias;
  }
  return m.forward(input, state);
}

Tensor Block::feed_forward(const Tensor& x, const StackInput& in) const {
  return moe_ != nullptr ? moe_->forward(x, in.moe) : ffn_->forward(x);
}

BlockState Block::new_state() const {
  BlockState s;
  s.mixer = mixer_.new_state();
  if (cross_ != nullptr) s.cross = cross_->new_state();
  return s;
}

std::pair<Tensor, Tensor> Block::forward(const Tensor& x, const Tensor& branch, const StackInput& in,
                                         BlockState* state) const {
  MixerState* self_state = state != nullptr ? state->mixer.get() : nullptr;
  MixerState* cross_state = state != nullptr ? state->cross.get() : nullptr;
  if (post_norm_) {
    if (branch.defined()) throw std::logic_error("block: a post-norm stack carries no branch");
    // x = norm1(x + drop(mixer x)), then norm2(x + drop(ffn x)); cross attention likewise.
    Tensor h = norm1_.add_forward(x, drop(mix(mixer_, x, in, false, self_state))).y;
    if (cross_ != nullptr) h = cross_norm_->add_forward(h, drop(mix(*cross_, h, in, true, cross_state))).y;
    if (norm2_ == nullptr) return {h, Tensor()};
    return {norm2_->add_forward(h, drop(feed_forward(h, in))).y, Tensor()};
  }
  // Pre-norm residual: x + drop(mixer(norm1 x)), + drop(cross(cross_norm ·)), + drop(ffn(norm2 ·)),
  // each add fused with the norm that reads its result.
  const AddNormResult first = norm1_.add_forward(x, branch);
  Tensor stream = first.sum;
  Tensor last = drop(mix(mixer_, first.y, in, false, self_state));
  if (cross_ != nullptr) {
    const AddNormResult c = cross_norm_->add_forward(stream, last);
    stream = c.sum;
    last = drop(mix(*cross_, c.y, in, true, cross_state));
  }
  if (norm2_ == nullptr) return {stream, last};
  const AddNormResult mid = norm2_->add_forward(stream, last);
  return {mid.sum, drop(feed_forward(mid.y, in))};
}

}  // namespace seqlab
