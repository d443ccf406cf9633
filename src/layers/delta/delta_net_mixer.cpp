// The DeltaNet and Gated DeltaNet token mixers (seed 000 §7.4, 002) around the `delta_net` op
// (delta_net.h), registered as `model.mixer = "delta_net"` and `"gated_delta_net"` (older names
// "deltanet", "gated_deltanet") with the options of [model.delta_net] and [model.gated_delta_net]:
//
//   q, k, v = silu(ShortConv(x W_q | x W_k | x W_v))          a causal depthwise convolution of K taps
//   q, k    = q / ‖q‖, k / ‖k‖ per head                        L2-normalised: the delta rule stays stable
//   β       = σ(x W_β)                     [B, T, H]           the write strength
//   g       = log σ(x W_a + b_a) / τ       [B, T, H]           Gated DeltaNet only: the decay α = exp(g)
//   S_t     = α_t (I − β_t k_tᵀ k_t) S_{t−1} + β_t k_tᵀ v_t,   o_t = q_t S_t
//   y       = (RMSNorm_head(o) ⊙ silu(x W_r)) W_o
//
// Parameters: qkv, conv, beta, decay (Gated DeltaNet), out_gate, head_norm, out.
#include <memory>
#include <vector>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/delta/delta_net.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"
#include "layers/ssm/conv1d.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing (a matrix transition), not bidirectional.
constexpr MixerTraits kTraits{};

// Decoding state: the matrix state [B, H, dk, dv] and the convolution's last K − 1 inputs [B, K−1, 3C].
struct DeltaNetState : MixerState {
  Tensor state, conv;
  double size() const override { return elements_per_sequence({&state, &conv}); }
};

class DeltaNetMixer : public Mixer {
 public:
  DeltaNetMixer(const MixerContext& ctx, const MixerOptions& opts, bool gated, Generator& gen)
      : heads_(ctx.n_heads),
        head_dim_(head_dim(ctx, gated ? "gated_delta_net" : "delta_net")),
        chunk_(opts.integer("chunk_size")),
        temperature_(gated ? opts.number("gate_temperature") : 1.0),
        qkv_(add_module("qkv", std::make_unique<Linear>(ctx.d_model, 3 * ctx.d_model, false, gen, ctx.init_std))),
        // The SiLU after the convolution is fused into it (the same arithmetic as silu(conv(·))).
        conv_(add_module("conv", std::make_unique<ShortConv>(3 * ctx.d_model, opts.integer("conv_size"), gen,
                                                             ShortConvOptions{false, true}))),
        beta_(add_module("beta", std::make_unique<Linear>(ctx.d_model, ctx.n_heads, true, gen, ctx.init_std))),
        decay_(gated
                   ? &add_module("decay", std::make_unique<Linear>(ctx.d_model, ctx.n_heads, true, gen, ctx.init_std))
                   : nullptr),
        out_gate_(add_module("out_gate", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, ctx.norm_eps))),
        out_(add_module("out", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))) {}

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, decay_ != nullptr ? "gated_delta_net" : "delta_net", kTraits);
    DeltaNetState* state = state_of<DeltaNetState>(decoding, "delta_net");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr;
    Tensor qkv = sp != nullptr ? conv_.forward_sequence(qkv_.forward(x), *sp)
                               : conv_.forward(qkv_.forward(x), state != nullptr ? &state->conv : nullptr);  // [B, T, 3C]
    auto head = [&](int64_t part) { return reshape(narrow(qkv, 2, part * C, C), {B, T, heads_, head_dim_}); };
    Tensor q = l2_normalize(head(0)), k = l2_normalize(head(1)), v = head(2);
    Tensor beta = sigmoid(beta_.forward(x));  // [B, T, H]
    Tensor g = decay_ != nullptr ? mul(log_sigmoid(decay_->forward(x)), 1.0 / temperature_) : Tensor();
    DeltaNetOptions opts;
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? DeltaNetForm::recurrent : DeltaNetForm::chunkwise;
    Tensor o;
    if (sp != nullptr) {
      // Sequence-parallel: S_out = M S_in + F over a segment, M = Π_t α_t (I − β_t k_t k_tᵀ) [dk, dk], the
      // final state of the same op run from S_in = I with v = 0.
      LinearRecurrence rec;
      rec.kinds = {StateTransition::matrix};
      auto part = [&](const Tensor& t, int64_t b, int64_t n) { return t.defined() ? narrow(t, 1, b, n) : t; };
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        DeltaNetOutput r = delta_net(part(q, b, n), part(k, b, n), part(v, b, n), part(beta, b, n), part(g, b, n),
                                     init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.o, {r.final_state}};
      };
      rec.transition = [&](int64_t b, int64_t n) {
        const Tensor zero_v = Tensor::zeros({B, n, heads_, head_dim_}, x.dtype(), x.device());
        DeltaNetOutput r = delta_net(part(q, b, n), part(k, b, n), zero_v, part(beta, b, n), part(g, b, n),
                                     identity_states(B, x), opts);
        return std::vector<Tensor>{r.final_state};
      };
      o = sequence_recurrence(rec, T, *sp);
    } else {
      DeltaNetOutput r = delta_net(q, k, v, beta, g, state != nullptr ? state->state : Tensor(), opts);
      if (state != nullptr) state->state = r.final_state.detach();
      o = r.o;
    }
    o = reshape(head_norm_.forward(o), {B, T, C});
    return out_.forward(mul(o, silu(out_gate_.forward(x))));
  }

 private:
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<DeltaNetState>(); }

  // I [B, H, dk, dk] in x's dtype, the initial state whose final state is the segment's transition.
  Tensor identity_states(int64_t B, const Tensor& x) const {
    std::vector<double> eye(static_cast<size_t>(head_dim_ * head_dim_), 0.0);
    for (int64_t i = 0; i < head_dim_; ++i) eye[static_cast<size_t>(i * head_dim_ + i)] = 1.0;
    const Tensor one = Tensor::from_vector(eye, {1, 1, head_dim_, head_dim_}, x.dtype(), x.device());
    return contiguous(expand(one, {B, heads_, head_dim_, head_dim_}));
  }

  int64_t heads_, head_dim_, chunk_;
  double temperature_;
  Linear& qkv_;
  ShortConv& conv_;
  Linear& beta_;
  Linear* decay_ = nullptr;  // Gated DeltaNet
  Linear& out_gate_;
  Norm& head_norm_;
  Linear& out_;
};

OptionSpec conv_size_option() {
  OptionSpec s = OptionSpec::integer("conv_size", 4, 1, "taps of the short causal convolution over q, k, v");
  s.max = static_cast<double>(kMaxConv1dWidth);  // the widths of the causal_conv1d op
  return s;
}

// The matrix state H·D·D and the convolution's last K − 1 inputs of q, k, v (3d channels).
double delta_net_state(const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
  return matrix_state_size(ctx, opts, seq_len) +
         static_cast<double>((opts.integer("conv_size") - 1) * 3 * ctx.d_model);
}

double delta_net_flops(const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
  return chunkwise_recurrence_flops(ctx, opts.integer("chunk_size"), seq_len);
}

// qkv d×3d; the convolution's K taps over 3d channels; β (and Gated DeltaNet's decay) d×H with a
// bias; out_gate and out d×d; the head norm's gain (D).
double delta_net_parameters(const MixerContext& ctx, const MixerOptions& opts, bool gated) {
  const double d = static_cast<double>(ctx.d_model), h = static_cast<double>(ctx.n_heads);
  const double k = static_cast<double>(opts.integer("conv_size"));
  return 5 * d * d + 3 * d * k + (gated ? 2.0 : 1.0) * (d * h + h) + static_cast<double>(ctx.d_model / ctx.n_heads);
}

const MixerRegistration kDeltaNet{MixerSpec{
    "delta_net",
    {"deltanet"},
    "DeltaNet: the delta rule S ← S + β kᵀ(v − k S) with L2-normalised keys and a short convolution",
    "docs/variants/delta_net.md",
    kTraits,
    {chunk_size_option(), conv_size_option()},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<DeltaNetMixer>(ctx, opts, /*gated=*/false, gen);
    },
    delta_net_flops,
    [](const MixerContext& ctx, const MixerOptions& opts) { return delta_net_parameters(ctx, opts, false); },
    delta_net_state}};

const MixerRegistration kGatedDeltaNet{MixerSpec{
    "gated_delta_net",
    {"gated_deltanet"},
    "Gated DeltaNet: the delta rule with a data-dependent decay α per token and head",
    "docs/variants/delta_net.md",
    kTraits,
    {chunk_size_option(), conv_size_option(),
     OptionSpec::number("gate_temperature", 16.0, 0, true,
                        "decay α = σ(·)^(1/τ); a large τ keeps α near 1 (slow forgetting) at first")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<DeltaNetMixer>(ctx, opts, /*gated=*/true, gen);
    },
    delta_net_flops,
    [](const MixerContext& ctx, const MixerOptions& opts) { return delta_net_parameters(ctx, opts, true); },
    delta_net_state}};

}  // namespace
}  // namespace seqlab
