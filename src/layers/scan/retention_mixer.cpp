// The RetNet token mixer (multi-scale retention, seed 000 §5.3) around the `retention` op
// (retention.h), registered as `model.mixer = "retention"` (older name "retnet") with the options of
// [model.retention]:
//
//   q, k = RoPE(x W_q), RoPE(x W_k)      v = x W_v            per head: [B, T, H, D], D = C / H
//   o    = retention(q, k, v)                                 S_n = γ_h S_{n−1} + k_nᵀ v_n, o_n = q_n S_n
//   y    = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o                per-head (group) norm, swish gate
//
// γ_h = 1 − 2^(−5−h): each head forgets at its own rate ("multi-scale"). The rotation makes the
// score of positions n, m depend on n − m (RetNet's xPos-style relative position); tokens are
// rotated at their true positions when decoding (state->position).
//
// Parameters: q, k, v, out_gate, head_norm, out.
#include <cmath>
#include <memory>

#include "autograd/ops.h"
#include "layers/attention/rope.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/scan/retention.h"
#include "layers/sequence_parallel.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing, not bidirectional.
constexpr MixerTraits kTraits{};

class RetentionMixer : public Mixer {
 public:
  RetentionMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : heads_(ctx.n_heads),
        head_dim_(head_dim(ctx, "retention")),
        chunk_(opts.integer("chunk_size")),
        q_(add_module("q", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        k_(add_module("k", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        v_(add_module("v", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        out_gate_(add_module("out_gate", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, ctx.norm_eps))),
        out_(add_module("out", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))) {}

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "retention", kTraits);
    MatrixState* state = state_of<MatrixState>(decoding, "retention");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
    RopeOptions rotation;
    rotation.start = state != nullptr ? state->position : 0;
    RetentionOptions opts;
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? RetentionForm::recurrent : RetentionForm::chunkwise;
    Tensor o;
    if (const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr) {
      // Sequence-parallel: q, k rotated at their global positions; S_out = γ_h^n S_in + F over n tokens.
      const Tensor q = sequence_rope(heads(q_.forward(x)), rotation.base, *sp),
                   k = sequence_rope(heads(k_.forward(x)), rotation.base, *sp), v = heads(v_.forward(x));
      const std::vector<double> gammas = retention_default_gammas(heads_);
      LinearRecurrence rec;
      rec.kinds = {StateTransition::elementwise};
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        RetentionOutput r = retention(narrow(q, 1, b, n), narrow(k, 1, b, n), narrow(v, 1, b, n),
                                      init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.o, {r.final_state}};
      };
      rec.transition = [&](int64_t, int64_t n) {
        std::vector<double> decay;
        for (double gamma : gammas) decay.push_back(std::pow(gamma, static_cast<double>(n)));
        return std::vector<Tensor>{Tensor::from_vector(decay, {1, heads_, 1, 1}, x.dtype(), x.device())};
      };
      o = sequence_recurrence(rec, T, *sp);
    } else {
      RetentionOutput r = retention(rope(heads(q_.forward(x)), rotation), rope(heads(k_.forward(x)), rotation),
                                    heads(v_.forward(x)), state != nullptr ? state->state : Tensor(), opts);
      if (state != nullptr) state->state = r.final_state.detach();
      o = r.o;
    }
    o = reshape(head_norm_.forward(o), {B, T, C});
    return out_.forward(mul(o, silu(out_gate_.forward(x))));
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<MatrixState>(); }

 private:
  int64_t heads_, head_dim_, chunk_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

const MixerRegistration kRetention{MixerSpec{
    "retention",
    {"retnet"},
    "RetNet's multi-scale retention: a matrix state per head with a fixed decay γ_h = 1 − 2^(−5−h), rotated q, k",
    "docs/variants/retention.md",
    kTraits,
    {chunk_size_option()},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<RetentionMixer>(ctx, opts, gen);
    },
    [](const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
      return chunkwise_recurrence_flops(ctx, opts.integer("chunk_size"), seq_len);
    },
    // q, k, v, out_gate, out: d×d each; the head norm's gain (D).
    [](const MixerContext& ctx, const MixerOptions&) {
      const double d = static_cast<double>(ctx.d_model);
      return 5 * d * d + static_cast<double>(ctx.d_model / ctx.n_heads);
    },
    matrix_state_size}};

}  // namespace
}  // namespace seqlab
