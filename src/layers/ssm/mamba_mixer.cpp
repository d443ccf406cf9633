// The Mamba token mixer (S6, seed 000 §6.2, the Mamba paper's block) around the `selective_scan` op
// (selective_scan.h), registered as `model.mixer = "mamba"` with the options of [model.mamba]:
//
//   x, z  = split(h W_in)                    [B, T, E] each, E = d_inner = expand · d_model
//   x     = silu(conv1d(x) + b_conv)         causal depthwise convolution of d_conv taps (ShortConv, fused)
//   r, B, C = split(x W_x)                   [B, T, R], [B, T, N], [B, T, N]   (R = dt_rank)
//   delta = r W_dt                           [B, T, E]; the op takes Δ = softplus(delta + dt_bias)
//   A     = −exp(A_log)                      [E, N], so every decay exp(Δ A) is in (0, 1]
//   y     = selective_scan(x, delta, A, B, C, D, z, dt_bias)
//           h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t x_t B_t,  y_t = (C_t·h_t + D x_t) ⊙ silu(z_t)
//   out   = y W_out
//
// Initialisation as the paper's code: dt_bias so that softplus(dt_bias) is log-uniform in
// [dt_min, dt_max] (dt_bias = Δ + log(1 − e^{−Δ}), the inverse of softplus), W_dt uniform in ±R^{−1/2},
// A_log[e, n] = log(n + 1) (S4D-real), D = 1, the convolution as ShortConv starts it, its bias 0. A_log,
// D and the biases take no weight decay (their role is bias). d_conv is 1 … 4 (the causal_conv1d op's
// widths; ShortConv refuses others).
//
// Decoding state: the convolution's last d_conv − 1 inputs [B, d_conv − 1, E] and the SSM state
// [B, E, N]; one token runs the op's recurrent form. Sequence parallelism: the convolution's halo (the
// d_conv − 1 inputs before each local chunk) and state passing with an elementwise transition,
// exp(A ⊙ Σ_t Δ_t) [B, E, N] over a segment (selective_scan_decay).
//
// Parameters: in_proj, conv (weight, bias), x_proj, dt_proj, dt_bias, A_log, D, out_proj.
#include <algorithm>
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
#include "layers/ssm/selective_scan.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing, not bidirectional.
constexpr MixerTraits kTraits{};

// The sizes the options give, shared by the mixer and its counts.
struct MambaSizes {
  int64_t d, inner, state, conv, rank;
};
MambaSizes sizes_of(const MixerContext& ctx, const MixerOptions& opts) {
  const int64_t rank = opts.integer("dt_rank");
  return {ctx.d_model, opts.integer("expand") * ctx.d_model, opts.integer("state_size"), opts.integer("d_conv"),
          rank > 0 ? rank : (ctx.d_model + 15) / 16};
}

// The mixer has channels, not heads, but n_heads is the model's: like every mixer it refuses a head count
// that does not divide d_model (head_dim throws, naming the mixer), so a recipe means the same for any mixer.
MambaSizes checked_sizes(const MixerContext& ctx, const MixerOptions& opts) {
  head_dim(ctx, "mamba");
  return sizes_of(ctx, opts);
}

// Decoding state: the convolution's last d_conv − 1 inputs [B, d_conv − 1, E] and the SSM state [B, E, N].
struct MambaState : MixerState {
  Tensor conv, ssm;
  double size() const override { return elements_per_sequence({&conv, &ssm}); }
};

class MambaMixer : public Mixer {
 public:
  MambaMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : s_(checked_sizes(ctx, opts)),
        chunk_(opts.integer("chunk_size")),
        in_proj_(add_module("in_proj", std::make_unique<Linear>(s_.d, 2 * s_.inner, false, gen, ctx.init_std))),
        conv_(add_module("conv", std::make_unique<ShortConv>(s_.inner, s_.conv, gen, ShortConvOptions{true, true}))),
        x_proj_(add_module("x_proj",
                           std::make_unique<Linear>(s_.inner, s_.rank + 2 * s_.state, false, gen, ctx.init_std))),
        dt_proj_(add_module("dt_proj", std::make_unique<Linear>(s_.rank, s_.inner, false, gen, ctx.init_std))),
        dt_bias_(add_parameter("dt_bias", initial_dt_bias(opts, gen), ParamRole::bias)),
        a_log_(add_parameter("A_log", initial_a_log(), ParamRole::bias)),
        d_(add_parameter("D", Tensor::ones({s_.inner}), ParamRole::bias)),
        out_proj_(add_module("out_proj", std::make_unique<Linear>(s_.inner, s_.d, false, gen, ctx.init_std))) {
    // W_dt uniform in ±R^{−1/2}: Δ starts near softplus(dt_bias), whatever x.
    const double bound = 1.0 / std::sqrt(static_cast<double>(s_.rank));
    kernel::copy_(dt_proj_.weight(), Tensor::rand({s_.inner, s_.rank}, gen, DType::f32, -bound, bound));
  }

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "mamba", kTraits);
    MambaState* state = state_of<MambaState>(decoding, "mamba");
    const Tensor& h = in.x;
    const int64_t T = h.shape()[1];
    const SequenceGroup* sp = state == nullptr ? sequence_group() : nullptr;
    const Tensor xz = in_proj_.forward(h);  // [B, T, 2E]
    const Tensor x_in = narrow(xz, 2, 0, s_.inner), z = narrow(xz, 2, s_.inner, s_.inner);
    // [B, T, E]: silu(conv(x) + b), the SiLU and bias fused into the convolution
    const Tensor x = sp != nullptr ? conv_.forward_sequence(x_in, *sp)
                                   : conv_.forward(x_in, state != nullptr ? &state->conv : nullptr);
    const Tensor rbc = x_proj_.forward(x);          // [B, T, R + 2N]
    const Tensor delta = dt_proj_.forward(narrow(rbc, 2, 0, s_.rank));
    const Tensor Bm = narrow(rbc, 2, s_.rank, s_.state), Cm = narrow(rbc, 2, s_.rank + s_.state, s_.state);
    const Tensor A = neg(exp(a_log_));
    SelectiveScanOptions opts;
    opts.chunk = chunk_;
    opts.form = T == 1 && state != nullptr ? SelectiveScanForm::recurrent : SelectiveScanForm::chunked;
    Tensor y;
    if (sp != nullptr) {
      // Sequence-parallel: h_out = exp(A ⊙ Σ_t Δ_t) ⊙ h_in + F over a segment.
      LinearRecurrence rec;
      rec.kinds = {StateTransition::elementwise};
      auto part = [](const Tensor& t, int64_t b, int64_t n) { return narrow(t, 1, b, n); };
      rec.run = [&](int64_t b, int64_t n, const std::vector<Tensor>& init) {
        SelectiveScanOutput r = selective_scan(part(x, b, n), part(delta, b, n), A, part(Bm, b, n), part(Cm, b, n), d_,
                                               part(z, b, n), dt_bias_, init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.y, {r.final_state}};
      };
      rec.transition = [&](int64_t b, int64_t n) {
        return std::vector<Tensor>{selective_scan_decay(part(delta, b, n), A, dt_bias_, opts.delta_softplus)};
      };
      y = sequence_recurrence(rec, T, *sp);
    } else {
      SelectiveScanOutput r = selective_scan(x, delta, A, Bm, Cm, d_, z, dt_bias_,
                                             state != nullptr ? state->ssm : Tensor(), opts);
      if (state != nullptr) state->ssm = r.final_state.detach();
      y = r.y;
    }
    return out_proj_.forward(y);
  }

  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<MambaState>(); }

 private:
  // softplus(dt_bias) log-uniform in [dt_min, dt_max] (floored at 1e-4): dt_bias = Δ + log(1 − e^{−Δ}).
  Tensor initial_dt_bias(const MixerOptions& opts, Generator& gen) const {
    const double lo = std::log(opts.number("dt_min")), hi = std::log(opts.number("dt_max"));
    const std::vector<double> r = Tensor::rand({s_.inner}, gen, DType::f64, 0.0, 1.0).to_doubles();
    std::vector<double> bias(r.size());
    for (size_t i = 0; i < r.size(); ++i) {
      const double dt = std::max(std::exp(lo + r[i] * (hi - lo)), 1e-4);
      bias[i] = dt + std::log(-std::expm1(-dt));
    }
    return Tensor::from_vector(bias, {s_.inner});
  }

  // A_log[e, n] = log(n + 1): A = −(1, 2, …, N) in every channel (S4D-real).
  Tensor initial_a_log() const {
    std::vector<double> a(static_cast<size_t>(s_.inner * s_.state));
    for (int64_t e = 0; e < s_.inner; ++e) {
      for (int64_t n = 0; n < s_.state; ++n) a[static_cast<size_t>(e * s_.state + n)] = std::log(double(n + 1));
    }
    return Tensor::from_vector(a, {s_.inner, s_.state});
  }

  MambaSizes s_;
  int64_t chunk_;
  Linear& in_proj_;
  ShortConv& conv_;
  Linear& x_proj_;
  Linear& dt_proj_;
  Tensor& dt_bias_;
  Tensor& a_log_;
  Tensor& d_;
  Linear& out_proj_;
};

OptionSpec d_conv_option() {
  OptionSpec s = OptionSpec::integer("d_conv", 4, 1, "taps of the causal depthwise convolution before the scan");
  s.max = static_cast<double>(kMaxConv1dWidth);  // the widths of the causal_conv1d op
  return s;
}

// in_proj d×2E; the convolution's d_conv taps and bias over E channels; x_proj E×(R + 2N); dt_proj R×E
// and dt_bias E; A_log E×N; D E; out_proj E×d.
double mamba_parameters(const MixerContext& ctx, const MixerOptions& opts) {
  const MambaSizes s = sizes_of(ctx, opts);
  const double d = static_cast<double>(s.d), e = static_cast<double>(s.inner), n = static_cast<double>(s.state),
               k = static_cast<double>(s.conv), r = static_cast<double>(s.rank);
  return 2 * d * e + (k + 1) * e + e * (r + 2 * n) + r * e + e + e * n + e + e * d;
}

// The convolution's last d_conv − 1 inputs (E channels) and the SSM state E·N.
double mamba_state(const MixerContext& ctx, const MixerOptions& opts, int64_t) {
  const MambaSizes s = sizes_of(ctx, opts);
  return static_cast<double>((s.conv - 1) * s.inner + s.inner * s.state);
}

// Beyond 6·N (every weight, the convolution's included): the scan touches each of the E·N state
// elements per token with about 7 FLOPs forward — exp(Δ A), Δ u B, a h + ·, C·h — and twice that
// backward (the backward also recomputes the states inside each chunk: one more forward), so 4 × 7.
double mamba_flops(const MixerContext& ctx, const MixerOptions& opts, int64_t) {
  const MambaSizes s = sizes_of(ctx, opts);
  return 28.0 * static_cast<double>(s.inner) * static_cast<double>(s.state);
}

const MixerRegistration kMamba{MixerSpec{
    "mamba",
    {},
    "Mamba (S6): a selective state space model, input-dependent Δ, B, C over a diagonal state per channel",
    "docs/variants/mamba.md",
    kTraits,
    {chunk_size_option(), OptionSpec::integer("expand", 2, 1, "d_inner = expand · d_model channels of the scan"),
     OptionSpec::integer("state_size", 16, 1, "N: state elements per channel"),
     d_conv_option(),
     OptionSpec::integer("dt_rank", 0, 0, "rank R of the Δ projection; 0: ⌈d_model / 16⌉"),
     OptionSpec::number("dt_min", 1e-3, 0, true, "softplus(dt_bias) starts log-uniform in [dt_min, dt_max]"),
     OptionSpec::number("dt_max", 0.1, 0, true, "softplus(dt_bias) starts log-uniform in [dt_min, dt_max]")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      if (opts.number("dt_min") > opts.number("dt_max")) {
        throw std::invalid_argument("mamba: dt_min (" + std::to_string(opts.number("dt_min")) +
                                    ") must not exceed dt_max (" + std::to_string(opts.number("dt_max")) + ")");
      }
      return std::make_unique<MambaMixer>(ctx, opts, gen);
    },
    mamba_flops, mamba_parameters, mamba_state}};

}  // namespace
}  // namespace seqlab
