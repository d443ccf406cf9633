#include "layers/delta/delta_net_mixer.h"

#include <memory>

#include "autograd/ops.h"
#include "layers/delta/delta_net.h"

namespace seqlab {

DeltaNetLayer::DeltaNetLayer(const MixerConfig& cfg, Generator& gen)
    : heads_(cfg.n_heads),
      head_dim_(cfg.d_model / cfg.n_heads),
      chunk_(cfg.chunk),
      temperature_(cfg.gate_temperature),
      qkv_(add_module("qkv", std::make_unique<Linear>(cfg.d_model, 3 * cfg.d_model, false, gen, cfg.init_std))),
      conv_(add_module("conv", std::make_unique<ShortConv>(3 * cfg.d_model, cfg.conv_size, gen))),
      beta_(add_module("beta", std::make_unique<Linear>(cfg.d_model, cfg.n_heads, true, gen, cfg.init_std))),
      decay_(cfg.gated ? &add_module("decay", std::make_unique<Linear>(cfg.d_model, cfg.n_heads, true, gen, cfg.init_std))
                       : nullptr),
      out_gate_(add_module("out_gate", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, cfg.norm_eps))),
      out_(add_module("out", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))) {}

Tensor DeltaNetLayer::forward(const Tensor& x, MixerState* state) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  Tensor qkv = silu(conv_.forward(qkv_.forward(x), state != nullptr ? &state->conv : nullptr));  // [B, T, 3C]
  auto head = [&](int64_t part) { return reshape(narrow(qkv, 2, part * C, C), {B, T, heads_, head_dim_}); };
  Tensor q = l2_normalize(head(0)), k = l2_normalize(head(1)), v = head(2);
  Tensor beta = sigmoid(beta_.forward(x));  // [B, T, H]
  Tensor g = decay_ != nullptr ? mul(log_sigmoid(decay_->forward(x)), 1.0 / temperature_) : Tensor();
  DeltaNetOptions opts;
  opts.chunk = chunk_;
  opts.form = T == 1 && state != nullptr ? DeltaNetForm::recurrent : DeltaNetForm::chunkwise;
  DeltaNetOutput r = delta_net(q, k, v, beta, g, state != nullptr ? state->state : Tensor(), opts);
  if (state != nullptr) state->state = r.final_state.detach();
  Tensor o = reshape(head_norm_.forward(r.o), {B, T, C});
  return out_.forward(mul(o, silu(out_gate_.forward(x))));
}

}  // namespace seqlab
