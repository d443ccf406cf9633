#include "layers/scan/gla_mixer.h"

#include <memory>

#include "autograd/ops.h"
#include "layers/scan/gla.h"

namespace seqlab {

GlaLayer::GlaLayer(const MixerConfig& cfg, Generator& gen)
    : heads_(cfg.n_heads),
      head_dim_(cfg.d_model / cfg.n_heads),
      chunk_(cfg.chunk),
      temperature_(cfg.gate_temperature),
      q_(add_module("q", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      k_(add_module("k", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      v_(add_module("v", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      gate_down_(add_module("gate_down", std::make_unique<Linear>(cfg.d_model, cfg.gate_rank, false, gen, cfg.init_std))),
      gate_up_(add_module("gate_up", std::make_unique<Linear>(cfg.gate_rank, cfg.d_model, true, gen, cfg.init_std))),
      out_gate_(add_module("out_gate", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, cfg.norm_eps))),
      out_(add_module("out", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))) {}

Tensor GlaLayer::forward(const Tensor& x, MixerState* state) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
  Tensor g = mul(log_sigmoid(gate_up_.forward(gate_down_.forward(x))), 1.0 / temperature_);
  GlaOptions opts;
  opts.chunk = chunk_;
  opts.form = T == 1 && state != nullptr ? GlaForm::recurrent : GlaForm::chunkwise;
  GlaOutput r = gla(heads(q_.forward(x)), heads(k_.forward(x)), heads(v_.forward(x)), heads(g), Tensor(),
                    state != nullptr ? state->state : Tensor(), opts);
  if (state != nullptr) state->state = r.final_state.detach();
  Tensor o = reshape(head_norm_.forward(r.o), {B, T, C});
  return out_.forward(mul(o, silu(out_gate_.forward(x))));
}

}  // namespace seqlab
