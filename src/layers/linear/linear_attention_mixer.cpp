// The linear-attention token mixer (Katharopoulos et al., seed 000 §5.1) around the
// `linear_attention` op (linear_attention.h), registered as `model.mixer = "linear_attention"` (older
// name "linear") with the options of [model.linear_attention]:
//
//   q, k, v = x W_q, x W_k, x W_v                            per head: [B, T, H, D], D = C / H
//   o_t     = φ(q_t) S_t / (φ(q_t)·z_t + ε),  S_t = Σ_{s≤t} φ(k_s)ᵀ v_s,  z_t = Σ_{s≤t} φ(k_s)
//   y       = o W_o
//
// φ is the feature_map option: elu+1 (default), relu, identity, or performer — FAVOR+ positive
// orthogonal random features (Choromanski et al.), φ(x) = exp(ω_i·x' − ‖x'‖²/2)/√m with
// x' = x / D^(1/4), so that φ(q)·φ(k) estimates exp(q·k/√D), the softmax kernel. ω [m, D] (m =
// feature_count) is drawn once per layer from the model's initialisation seed and not trained; the
// same recipe and seed give the same ω, so checkpoints need not hold it.
//
// Parameters: q, k, v, out.
#include <cmath>
#include <memory>
#include <string>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/linear/linear_attention.h"
#include "layers/sequence_parallel.h"
#include "layers/mixer.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing (additive states), not bidirectional.
constexpr MixerTraits kTraits{};

// Decoding state: S [B, H, dk, dv] and the normaliser z [B, H, dk].
struct LinearAttentionState : MixerState {
  Tensor state, normalizer;
  double size() const override { return elements_per_sequence({&state, &normalizer}); }
};

class LinearAttentionMixer : public Mixer {
 public:
  LinearAttentionMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : heads_(ctx.n_heads),
        head_dim_(head_dim(ctx, "linear_attention")),
        chunk_(opts.integer("chunk_size")),
        feature_map_(opts.text("feature_map")),
        q_(add_module("q", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        k_(add_module("k", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        v_(add_module("v", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        out_(add_module("out", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))) {
    if (feature_map_ == "performer") {
      omega_ = orthogonal_random_features(opts.integer("feature_count"), head_dim_, gen);
    } else {
      parse_feature_map(feature_map_);  // fail at construction, not at the first forward
    }
  }

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "linear_attention", kTraits);
    LinearAttentionState* state = state_of<LinearAttentionState>(decoding, "linear_attention");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
    Tensor q = heads(q_.forward(x)), k = heads(k_.forward(x));
    LinearAttentionOptions opts;
    if (omega_.defined()) {
      // φ(q)·φ(k) ≈ exp(q·k/√D): scale both by D^(−1/4); queries may subtract their row maximum (it
      // cancels in the normalised output), keys may not.
      const double s = std::pow(static_cast<double>(head_dim_), -0.25);
      const Tensor omega = kernel::to_dtype(omega_, x.dtype());
      q = performer_features(mul(q, s), omega, /*stabilize=*/true);
      k = performer_features(mul(k, s), omega, /*stabilize=*/false);
      opts.feature_map = FeatureMap::identity;
    } else {
      opts.feature_map = parse_feature_map(feature_map_);
    }
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? LinearAttentionForm::recurrent : LinearAttentionForm::chunkwise;
    const Tensor v = heads(v_.forward(x));
    if (const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr) {
      // Sequence-parallel: no decay, so S and z add up over the chunks.
      LinearRecurrence rec;
      rec.kinds = {StateTransition::additive, StateTransition::additive};
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        LinearAttentionOutput r = linear_attention(narrow(q, 1, b, n), narrow(k, 1, b, n), narrow(v, 1, b, n),
                                                   init.empty() ? Tensor() : init[0], init.empty() ? Tensor() : init[1],
                                                   opts);
        return RecurrenceSegment{r.o, {r.final_state, r.final_normalizer}};
      };
      return out_.forward(reshape(sequence_recurrence(rec, T, *sp), {B, T, C}));
    }
    LinearAttentionOutput r = linear_attention(q, k, v, state != nullptr ? state->state : Tensor(),
                                               state != nullptr ? state->normalizer : Tensor(), opts);
    if (state != nullptr) {
      state->state = r.final_state.detach();
      state->normalizer = r.final_normalizer.detach();
    }
    return out_.forward(reshape(r.o, {B, T, C}));
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<LinearAttentionState>(); }

 private:
  int64_t heads_, head_dim_, chunk_;
  std::string feature_map_;
  Tensor omega_;  // performer only: [m, D] random features
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& out_;
};

const MixerRegistration kLinearAttention{MixerSpec{
    "linear_attention",
    {"linear"},
    "linear attention φ(q)·Σφ(k)ᵀv with a normaliser; φ elu+1, relu, identity or Performer's random features",
    "docs/variants/linear_attention.md",
    kTraits,
    {chunk_size_option(),
     OptionSpec::choice("feature_map", {"elu+1", "relu", "identity", "performer"},
                        "the feature map φ applied to queries and keys; performer: FAVOR+ positive orthogonal "
                        "random features (feature_count of them, drawn from train.seed)"),
     OptionSpec::integer("feature_count", 64, 1, "with feature_map = \"performer\": random features per head")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<LinearAttentionMixer>(ctx, opts, gen);
    },
    [](const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
      return chunkwise_recurrence_flops(ctx, opts.integer("chunk_size"), seq_len);
    },
    // q, k, v, out: d×d each (Performer's random features are drawn, not trained).
    [](const MixerContext& ctx, const MixerOptions&) {
      const double d = static_cast<double>(ctx.d_model);
      return 4 * d * d;
    },
    // S [H, m, D] and the normaliser z [H, m], m the feature dimension (D, or feature_count for Performer).
    [](const MixerContext& ctx, const MixerOptions& opts, int64_t) {
      const double h = static_cast<double>(ctx.n_heads), d = static_cast<double>(ctx.d_model / ctx.n_heads);
      const double m = opts.text("feature_map") == "performer" ? static_cast<double>(opts.integer("feature_count")) : d;
      return h * m * d + h * m;
    }}};

}  // namespace
}  // namespace seqlab
