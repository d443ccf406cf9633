// The Mamba-2 token mixer (seed 000 §6.3) around the `ssd` op (ssd.h), registered as
// `model.mixer = "mamba2"` with the options of [model.mamba2]:
//
//   z, xBC, dt = x W_in                     z [B, T, E], xBC [B, T, E + 2GN], dt [B, T, H]   (E = expand·d)
//   x, B, C    = silu(conv(xBC) + b_conv)   the causal depthwise conv1d op (d_conv taps, bias, fused SiLU)
//   Δ          = softplus(dt + dt_bias)     [B, T, H]
//   A          = −exp(A_log)                [H]: one decay rate per head, a_t = exp(Δ_t A) ∈ (0, 1]
//   y          = ssd(x, Δ, A, B, C, D)      heads of dim P = E / H; B, C [B, T, G, N] shared by groups of heads
//   out        = RMSNorm(y ⊙ silu(z)) W_out  the gated RMS norm over E
//
// Initialisation as the Mamba-2 paper's: Δ = softplus(dt_bias) log-uniform in [1e-3, 0.1] (dt_bias its
// inverse softplus), A_log = log U[1, 16], D = 1, the convolution near the identity, its bias 0.
//
// Parameters: in_proj, conv (weight and bias), dt_bias, A_log, D, norm, out_proj.
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"
#include "layers/ssm/conv1d.h"
#include "layers/ssm/ssd.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing (one decay per head), not bidirectional.
constexpr MixerTraits kTraits{};

// Decoding state: the SSM state [B, H, P, N] and the convolution's last d_conv − 1 inputs [B, d_conv−1, E+2GN].
struct Mamba2State : MixerState {
  Tensor ssm, conv;
  double size() const override { return elements_per_sequence({&ssm, &conv}); }
};

// The sizes of one layer, from the model's and the mixer's options; throws std::invalid_argument when
// they do not fit.
struct Mamba2Sizes {
  int64_t inner, heads, head_dim, groups, state, conv;
  int64_t conv_channels() const { return inner + 2 * groups * state; }
  int64_t in_width() const { return 2 * inner + 2 * groups * state + heads; }
};

Mamba2Sizes mamba2_sizes(const MixerContext& ctx, const MixerOptions& opts) {
  Mamba2Sizes s{};
  s.inner = opts.integer("expand") * ctx.d_model;
  const int64_t p = opts.integer("head_dim");
  if (p == 0) {
    if (ctx.n_heads <= 0 || s.inner % ctx.n_heads != 0) {
      throw std::invalid_argument("mamba2: model.n_heads (" + std::to_string(ctx.n_heads) +
                                  ") must divide the inner width expand·d_model (" + std::to_string(s.inner) +
                                  ") when model.mamba2.head_dim = 0");
    }
    s.heads = ctx.n_heads;
    s.head_dim = s.inner / ctx.n_heads;
  } else {
    if (s.inner % p != 0) {
      throw std::invalid_argument("mamba2: model.mamba2.head_dim (" + std::to_string(p) +
                                  ") must divide the inner width expand·d_model (" + std::to_string(s.inner) + ")");
    }
    s.heads = s.inner / p;
    s.head_dim = p;
  }
  s.groups = opts.integer("groups");
  if (s.heads % s.groups != 0) {
    throw std::invalid_argument("mamba2: model.mamba2.groups (" + std::to_string(s.groups) +
                                ") must divide the number of heads (" + std::to_string(s.heads) + ")");
  }
  s.state = opts.integer("state_size");
  s.conv = opts.integer("d_conv");
  return s;
}

class Mamba2Mixer : public Mixer {
 public:
  Mamba2Mixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : s_(mamba2_sizes(ctx, opts)),
        chunk_(opts.integer("chunk_size")),
        in_proj_(add_module("in_proj", std::make_unique<Linear>(ctx.d_model, s_.in_width(), false, gen, ctx.init_std))),
        // The convolution's bias and the SiLU after it are fused into the causal_conv1d op.
        conv_(add_module("conv", std::make_unique<ShortConv>(s_.conv_channels(), s_.conv, gen,
                                                             ShortConvOptions{true, true}))),
        dt_bias_(add_parameter("dt_bias", initial_dt_bias(s_.heads, gen), ParamRole::bias)),
        a_log_(add_parameter("A_log", initial_a_log(s_.heads, gen), ParamRole::bias)),
        d_(add_parameter("D", Tensor::ones({s_.heads}), ParamRole::bias)),
        norm_(add_module("norm", std::make_unique<Norm>(NormKind::rms_norm, s_.inner, ctx.norm_eps))),
        out_proj_(add_module("out_proj", std::make_unique<Linear>(s_.inner, ctx.d_model, false, gen, ctx.init_std))) {}

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "mamba2", kTraits);
    Mamba2State* state = state_of<Mamba2State>(decoding, "mamba2");
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1];
    const int64_t E = s_.inner, GN = s_.groups * s_.state, H = s_.heads;
    const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr;
    const Tensor proj = in_proj_.forward(x);  // [B, T, 2E + 2GN + H]
    const Tensor z = narrow(proj, 2, 0, E);
    Tensor xbc = narrow(proj, 2, E, E + 2 * GN);
    xbc = sp != nullptr ? conv_.forward_sequence(xbc, *sp)
                        : conv_.forward(xbc, state != nullptr ? &state->conv : nullptr);  // silu(conv(xBC) + b)
    const Tensor xs = reshape(narrow(xbc, 2, 0, E), {B, T, H, s_.head_dim});
    const Tensor Bm = reshape(narrow(xbc, 2, E, GN), {B, T, s_.groups, s_.state});
    const Tensor Cm = reshape(narrow(xbc, 2, E + GN, GN), {B, T, s_.groups, s_.state});
    const Tensor dt = softplus(add(narrow(proj, 2, 2 * E + 2 * GN, H), dt_bias_));  // Δ [B, T, H]
    const Tensor A = neg(exp(a_log_));                                              // [H]
    SsdOptions opts;
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? SsdForm::recurrent : SsdForm::chunkwise;
    Tensor y;
    if (sp != nullptr) {
      // Sequence-parallel: S_out = a ⊙ S_in + F over a segment, a = exp(A_h Σ_t Δ_t) one scalar per head.
      LinearRecurrence rec;
      rec.kinds = {StateTransition::elementwise};
      auto part = [](const Tensor& t, int64_t b, int64_t n) { return narrow(t, 1, b, n); };
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        SsdOutput r = ssd(part(xs, b, n), part(dt, b, n), A, part(Bm, b, n), part(Cm, b, n), d_,
                          init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.y, {r.final_state}};
      };
      rec.transition = [&](int64_t b, int64_t n) {
        const Tensor decay = exp(mul(sum(part(dt, b, n), {1}), A));  // [B, H]
        return std::vector<Tensor>{reshape(decay, {B, H, 1, 1})};
      };
      y = sequence_recurrence(rec, T, *sp);
    } else {
      SsdOutput r = ssd(xs, dt, A, Bm, Cm, d_, state != nullptr ? state->ssm : Tensor(), opts);
      if (state != nullptr) state->ssm = r.final_state.detach();
      y = r.y;
    }
    y = norm_.forward(mul(reshape(y, {B, T, E}), silu(z)));
    return out_proj_.forward(y);
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<Mamba2State>(); }

 private:
  // dt_bias = softplus⁻¹(Δ₀) = Δ₀ + log(1 − e^{−Δ₀}) with Δ₀ log-uniform in [1e-3, 0.1]: the initial steps
  // span fast and slow heads.
  static Tensor initial_dt_bias(int64_t heads, Generator& gen) {
    std::vector<double> b(static_cast<size_t>(heads));
    for (double& v : b) {
      const double dt = std::exp(std::log(1e-3) + gen.uniform() * (std::log(0.1) - std::log(1e-3)));
      v = dt + std::log(-std::expm1(-dt));
    }
    return Tensor::from_vector(b, {heads});
  }
  // A_log = log U[1, 16]: decay rates A = −exp(A_log) from −1 to −16.
  static Tensor initial_a_log(int64_t heads, Generator& gen) {
    std::vector<double> a(static_cast<size_t>(heads));
    for (double& v : a) v = std::log(1.0 + 15.0 * gen.uniform());
    return Tensor::from_vector(a, {heads});
  }

  Mamba2Sizes s_;
  int64_t chunk_;
  Linear& in_proj_;
  ShortConv& conv_;
  Tensor& dt_bias_;
  Tensor& a_log_;
  Tensor& d_;
  Norm& norm_;
  Linear& out_proj_;
};

// FLOPs per token of one layer's SSD beyond 6·N, for the chunkwise algorithm with chunks of
// C = min(chunk, seq_len), per head: the scores C Bᵀ of a chunk (2·C·N per token), their product with Δx
// (2·C·P), the output from the entering state C_t S (2·P·N) and the state update (2·P·N); ×3 for the
// forward and backward.
double mamba2_flops(const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
  const Mamba2Sizes s = mamba2_sizes(ctx, opts);
  const double c = static_cast<double>(std::min<int64_t>(opts.integer("chunk_size"), std::max<int64_t>(seq_len, 1)));
  const double n = static_cast<double>(s.state), p = static_cast<double>(s.head_dim);
  return 3.0 * static_cast<double>(s.heads) * (2 * c * n + 2 * c * p + 4 * p * n);
}

// in_proj d × (2E + 2GN + H); the convolution's taps and bias over E + 2GN channels; dt_bias, A_log, D (H
// each); the norm's gain (E); out_proj E × d.
double mamba2_parameters(const MixerContext& ctx, const MixerOptions& opts) {
  const Mamba2Sizes s = mamba2_sizes(ctx, opts);
  const double d = static_cast<double>(ctx.d_model), e = static_cast<double>(s.inner);
  const double ch = static_cast<double>(s.conv_channels()), h = static_cast<double>(s.heads);
  return d * static_cast<double>(s.in_width()) + ch * static_cast<double>(s.conv + 1) + 3 * h + e + e * d;
}

// The SSM state H·P·N = E·N and the convolution's last d_conv − 1 inputs of x, B and C.
double mamba2_state(const MixerContext& ctx, const MixerOptions& opts, int64_t) {
  const Mamba2Sizes s = mamba2_sizes(ctx, opts);
  return static_cast<double>(s.inner * s.state + (s.conv - 1) * s.conv_channels());
}

OptionSpec d_conv_option() {
  OptionSpec s = OptionSpec::integer("d_conv", 4, 1, "taps of the causal depthwise convolution over x, B and C");
  s.max = static_cast<double>(kMaxConv1dWidth);  // the widths of the causal_conv1d op
  return s;
}

const MixerRegistration kMamba2{MixerSpec{
    "mamba2",
    {},
    "Mamba-2: the SSD state space model, a scalar decay per head, B and C shared by groups, gated RMS norm",
    "docs/variants/mamba2.md",
    kTraits,
    {chunk_size_option(), OptionSpec::integer("expand", 2, 1, "inner width E = expand · d_model"),
     OptionSpec::integer("head_dim", 0, 0,
                         "head dim P of the SSM heads (H = E / P); 0: E / model.n_heads, so H = model.n_heads"),
     OptionSpec::integer("state_size", 64, 1, "state size N: each head carries a P × N state"),
     OptionSpec::integer("groups", 1, 1, "groups G of heads sharing B and C (divides the heads)"),
     d_conv_option()},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<Mamba2Mixer>(ctx, opts, gen);
    },
    mamba2_flops,
    mamba2_parameters,
    mamba2_state}};

}  // namespace
}  // namespace seqlab
