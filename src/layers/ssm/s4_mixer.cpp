// The S4 token mixer (S4D's block, Gu et al. 2022) around the `s4` op (s4.h), registered as
// `model.mixer = "s4"` with the options of [model.s4]:
//
//   u   = x                                   [B, T, C]: one SISO state space model per channel, H = C
//   Λ   = −exp(log_a_real) + i·a_imag          [C, N/2] complex modes (Re Λ < 0 by construction)
//   y   = s4(u; Δ = exp(log_dt), Λ, B, C, D)   x_t = Ā x_{t−1} + B̄ u_t, y_t = 2·Re(C x_t) + D u_t
//   out = GLU(gelu(y) W_out + b_out)          W_out C × 2C, GLU(a | b) = a ⊙ σ(b): S4D's output layer
//
// Initialisation: Λ and B from S4D-Lin (init = "lin", the default: Λ_n = −½ + iπn, B = 1) or HiPPO-LegS
// (init = "legs": S4D-LegS, the diagonal of LegS's normal-plus-low-rank form and B = V* B_LegS, s4.h).
// Lin is the default because LegS's fastest modes (Im Λ up to 1303 at N = 64) curve the loss so sharply
// in log Δ that the all-mixer tests' finite differences (h = 1e-5) miss by 3e-6 relative (checked in
// f64 at smaller steps: the analytic gradient is right); S4D reports the two on par. C ~ N(0, ½) per
// part; D ~ N(0, 1); log Δ uniform in [log dt_min, log dt_max]. The SSM's parameters take no weight
// decay (registered with the bias role), as in S4.
//
// Decoding carries the complex state [B, C, N/2, 2] and runs the recurrent form; sequence parallelism
// passes that state between ranks with the complex diagonal transition Ā^len, which the op itself gives
// as the final state of len zero inputs from the state 1 (so its gradient is the op's own).
//
// Parameters: log_dt, log_a_real, a_imag, B, C, D, out.
#include <cmath>
#include <complex>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"
#include "layers/ssm/s4.h"

namespace seqlab {
namespace {

// A causal recurrence: sequence-parallel by state passing (complex diagonal), not bidirectional.
constexpr MixerTraits kTraits{};

// Decoding state: the complex state [B, C, N/2, 2].
struct S4State : MixerState {
  Tensor state;
  double size() const override { return elements_per_sequence({&state}); }
};

class S4Mixer : public Mixer {
 public:
  S4Mixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : channels_(ctx.d_model), modes_(opts.integer("modes")) {
    // The SSM is per channel and has no heads, but a model's n_heads is shared by all its blocks (a
    // hybrid's attention blocks read it): like every mixer, refuse heads that do not divide d_model.
    head_dim(ctx, "s4");
    opts_.form = parse_s4_form(opts.text("form"));
    opts_.discretisation = parse_s4_discretisation(opts.text("discretisation"));
    const double dt_min = opts.number("dt_min"), dt_max = opts.number("dt_max");
    if (!(dt_min <= dt_max)) {
      throw std::invalid_argument("s4: dt_min (" + std::to_string(dt_min) + ") must not exceed dt_max (" +
                                  std::to_string(dt_max) + ")");
    }
    const int64_t H = channels_, N2 = modes_;
    // Λ and B, the same for every channel.
    std::vector<double> a_re(H * N2), a_im(H * N2), b(H * N2 * 2);
    if (opts.text("init") == "legs") {
      const HippoNplr legs = hippo_legs_nplr(2 * N2);
      for (int64_t n = 0; n < N2; ++n) {
        std::complex<double> bn = 0;  // (V* B_LegS)_n
        for (int64_t i = 0; i < 2 * N2; ++i) bn += std::conj(legs.V[i * N2 + n]) * std::sqrt(2.0 * i + 1);
        for (int64_t h = 0; h < H; ++h) {
          a_re[h * N2 + n] = std::log(-legs.lambda[n].real());
          a_im[h * N2 + n] = legs.lambda[n].imag();
          b[(h * N2 + n) * 2] = bn.real();
          b[(h * N2 + n) * 2 + 1] = bn.imag();
        }
      }
    } else {  // lin
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t n = 0; n < N2; ++n) {
          a_re[h * N2 + n] = std::log(0.5);
          a_im[h * N2 + n] = M_PI * static_cast<double>(n);
          b[(h * N2 + n) * 2] = 1;
        }
      }
    }
    // Drawn in this order: log Δ, C, D; then the output layer.
    log_dt_ = &add_parameter("log_dt", Tensor::rand({H}, gen, DType::f32, std::log(dt_min), std::log(dt_max)),
                             ParamRole::bias);
    log_a_real_ = &add_parameter("log_a_real", Tensor::from_vector(a_re, {H, N2}), ParamRole::bias);
    a_imag_ = &add_parameter("a_imag", Tensor::from_vector(a_im, {H, N2}), ParamRole::bias);
    b_ = &add_parameter("B", Tensor::from_vector(b, {H, N2, 2}), ParamRole::bias);
    c_ = &add_parameter("C", Tensor::randn({H, N2, 2}, gen, DType::f32, std::sqrt(0.5)), ParamRole::bias);
    d_ = &add_parameter("D", Tensor::randn({H}, gen, DType::f32), ParamRole::bias);
    out_ = &add_module("out", std::make_unique<Linear>(ctx.d_model, 2 * ctx.d_model, true, gen, ctx.init_std));
  }

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "s4", kTraits);
    S4State* state = state_of<S4State>(decoding, "s4");
    const Tensor& u = in.x;
    const int64_t T = u.shape()[1], C = u.shape()[2];
    const Tensor A = stack({neg(exp(*log_a_real_)), *a_imag_}, -1);  // [C, N/2, 2]
    S4Options opts = opts_;
    Tensor y;
    if (state != nullptr) {
      if (T == 1) opts.form = S4Form::recurrent;
      S4Output r = s4(u, *log_dt_, A, *b_, *c_, *d_, state->state, opts);
      state->state = r.final_state.detach();
      y = r.y;
    } else if (const SequenceGroup* sp = sequence_group()) {
      LinearRecurrence rec;
      rec.kinds = {StateTransition::complex_diagonal};
      rec.run = [&](int64_t begin, int64_t len, const std::vector<Tensor>& init) {
        S4Output r = s4(narrow(u, 1, begin, len), *log_dt_, A, *b_, *c_, *d_, init.empty() ? Tensor() : init[0], opts);
        return RecurrenceSegment{r.y, {r.final_state}};
      };
      rec.transition = [&](int64_t, int64_t len) {
        // Ā^len: len zero inputs from the state 1 + 0i, [1, C, N/2, 2].
        const Tensor one = stack({Tensor::ones({1, C, modes_}, u.dtype(), u.device()),
                                  Tensor::zeros({1, C, modes_}, u.dtype(), u.device())},
                                 -1);
        S4Options step = opts;
        step.form = S4Form::recurrent;
        return std::vector<Tensor>{s4(Tensor::zeros({1, len, C}, u.dtype(), u.device()), *log_dt_, A, *b_, *c_,
                                      Tensor(), one, step)
                                       .final_state};
      };
      y = sequence_recurrence(rec, T, *sp);
    } else {
      y = s4(u, *log_dt_, A, *b_, *c_, *d_, Tensor(), opts).y;
    }
    const Tensor o = out_->forward(gelu(y));  // [B, T, 2C]
    return mul(narrow(o, 2, 0, C), sigmoid(narrow(o, 2, C, C)));
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<S4State>(); }

 private:
  int64_t channels_, modes_;
  S4Options opts_;
  Tensor *log_dt_, *log_a_real_, *a_imag_, *b_, *c_, *d_;
  Linear* out_;
};

// FLOPs per token beyond 6·N (the SSM's parameters are per channel, not weights a token multiplies by
// its width): per channel, the recurrent form's complex step Ā x + B̄ u and 2·Re(C x) over N/2 modes
// (≈ 12·N/2 real), or the convolution form's Σ_{j≤t} K_j u_{t−j} (T on average for 2·(T+1)/2 per
// token) plus the kernel (≈ 8·N/2 per position), each ×3 for forward and backward.
double s4_flops(const MixerContext& ctx, const MixerOptions& opts, int64_t seq_len) {
  const double C = static_cast<double>(ctx.d_model), N2 = static_cast<double>(opts.integer("modes"));
  if (opts.text("form") == "recurrent") return 3 * C * 12 * N2;
  return 3 * C * (static_cast<double>(seq_len + 1) + 8 * N2);
}

const MixerRegistration kS4{MixerSpec{
    "s4",
    {},
    "S4D: one diagonal complex state space model per channel (S4D-Lin or HiPPO-LegS init, zoh or bilinear), GELU, GLU output",
    "docs/variants/s4.md",
    kTraits,
    {OptionSpec::integer("modes", 32, 1, "N/2: complex modes per channel (conjugate pairs dropped), a real state of N"),
     OptionSpec::choice("form", {"convolution", "recurrent"},
                        "training form: the direct causal convolution with K_t = 2·Re(C Ā^t B̄) (O(T²) per channel), "
                        "or the recurrent scan (O(T·N)); decoding always steps the recurrence"),
     OptionSpec::choice("discretisation", {"zoh", "bilinear"}, "Ā, B̄ from Λ, B and the step Δ"),
     OptionSpec::choice("init", {"lin", "legs"},
                        "Λ, B: S4D-Lin (Λ_n = −½ + iπn, B = 1) or S4D-LegS (the diagonal of HiPPO-LegS's "
                        "normal-plus-low-rank form, B = V* B_LegS)"),
     OptionSpec::number("dt_min", 1e-3, 0, true, "log Δ starts uniform in [log dt_min, log dt_max]"),
     OptionSpec::number("dt_max", 1e-1, 0, true, "see dt_min")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<S4Mixer>(ctx, opts, gen);
    },
    s4_flops,
    // log_dt and D (C each); log_a_real, a_imag (C·N/2 each); B, C (C·N/2·2 each); out C × 2C with a bias.
    [](const MixerContext& ctx, const MixerOptions& opts) {
      const double C = static_cast<double>(ctx.d_model), N2 = static_cast<double>(opts.integer("modes"));
      return 2 * C + 6 * C * N2 + 2 * C * C + 2 * C;
    },
    // The complex state: C channels × N/2 modes × (re, im).
    [](const MixerContext& ctx, const MixerOptions& opts, int64_t) {
      return static_cast<double>(ctx.d_model) * 2 * static_cast<double>(opts.integer("modes"));
    }}};

}  // namespace
}  // namespace seqlab
