// The GLA token mixer (gated linear attention, seed 000 §7.1) around the `gla` op (gla.h), registered
// as `model.mixer = "gla"` with the options of [model.gla]:
//
//   q, k = x W_q, x W_k      v = x W_v                       per head: [B, T, H, D], D = C / H
//   g    = log σ(x W_g1 W_g2 + b_g) / τ                       log of α = σ(·)^(1/τ) over the key dim
//   o    = gla(q, k, v, g)                                    S_t = diag(α_t) S_{t−1} + k_tᵀ v_t, o_t = q_t S_t
//   y    = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o                per-head norm, swish output gate
//
// The low-rank gate (rank gate_rank) and the temperature τ keep α near 1 at initialisation, so the
// state forgets slowly at first.
//
// Parameters: q, k, v, gate_down, gate_up (with a bias), out_gate, head_norm, out.
#include <memory>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/scan/gla.h"
#include "layers/sequence_parallel.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing, not bidirectional.
constexpr MixerTraits kTraits{};

class GlaMixer : public Mixer {
 public:
  GlaMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : heads_(ctx.n_heads),
        head_dim_(head_dim(ctx, "gla")),
        chunk_(opts.integer("chunk_size")),
        temperature_(opts.number("gate_temperature")),
        q_(add_module("q", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        k_(add_module("k", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        v_(add_module("v", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        gate_down_(add_module("gate_down", std::make_unique<Linear>(ctx.d_model, opts.integer("gate_rank"), false, gen,
                                                                     ctx.init_std))),
        gate_up_(add_module("gate_up", std::make_unique<Linear>(opts.integer("gate_rank"), ctx.d_model, true, gen,
                                                                 ctx.init_std))),
        out_gate_(add_module("out_gate", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, ctx.norm_eps))),
        out_(add_module("out", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))) {}

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "gla", kTraits);
    MatrixState* state = state_of<MatrixState>(decoding, "gla");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
    Tensor g = mul(log_sigmoid(gate_up_.forward(gate_down_.forward(x))), 1.0 / temperature_);
    GlaOptions opts;
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? GlaForm::recurrent : GlaForm::chunkwise;
    const Tensor q = heads(q_.forward(x)), k = heads(k_.forward(x)), v = heads(v_.forward(x)), gh = heads(g);
    Tensor o;
    if (const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr) {
      // Sequence-parallel: S_out = A ⊙ S_in + F over a segment, A = exp(Σ_t g_t) per key channel.
      LinearRecurrence rec;
      rec.kinds = {StateTransition::elementwise};
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        GlaOutput r = gla(narrow(q, 1, b, n), narrow(k, 1, b, n), narrow(v, 1, b, n), narrow(gh, 1, b, n), Tensor(),
                          init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.o, {r.final_state}};
      };
      rec.transition = [&](int64_t b, int64_t n) {
        return std::vector<Tensor>{unsqueeze(exp(sum(narrow(gh, 1, b, n), {1})), -1)};  // [B, H, dk, 1]
      };
      o = sequence_recurrence(rec, T, *sp);
    } else {
      GlaOutput r = gla(q, k, v, gh, Tensor(), state != nullptr ? state->state : Tensor(), opts);
      if (state != nullptr) state->state = r.final_state.detach();
      o = r.o;
    }
    o = reshape(head_norm_.forward(o), {B, T, C});
    return out_.forward(mul(o, silu(out_gate_.forward(x))));
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<MatrixState>(); }

 private:
  int64_t heads_, head_dim_, chunk_;
  double temperature_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& gate_down_;
  Linear& gate_up_;
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

const MixerRegistration kGla{MixerSpec{
    "gla",
    {},
    "gated linear attention: a matrix state per head, decayed per key channel by a data-dependent gate",
    "docs/variants/gla.md",
    kTraits,
    {chunk_size_option(), OptionSpec::integer("gate_rank", 16, 1, "rank of the low-rank gate projection"),
     OptionSpec::number("gate_temperature", 16.0, 0, true,
                        "decay α = σ(·)^(1/τ); a large τ keeps α near 1 (slow forgetting) at first")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<GlaMixer>(ctx, opts, gen);
    },
    [](const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
      return chunkwise_recurrence_flops(ctx, opts.integer("chunk_size"), seq_len);
    },
    // q, k, v, out_gate, out: d×d each; gate_down d×r, gate_up r×d with a bias; the head norm's gain (D).
    [](const MixerContext& ctx, const MixerOptions& opts) {
      const double d = static_cast<double>(ctx.d_model), r = static_cast<double>(opts.integer("gate_rank"));
      return 5 * d * d + 2 * d * r + d + static_cast<double>(ctx.d_model / ctx.n_heads);
    },
    matrix_state_size}};

}  // namespace
}  // namespace seqlab
