#include "layers/scan/retention_mixer.h"

#include <memory>

#include "autograd/ops.h"
#include "layers/scan/retention.h"
#include "layers/attention/rope.h"

namespace seqlab {

RetNetLayer::RetNetLayer(const MixerConfig& cfg, Generator& gen)
    : heads_(cfg.n_heads),
      head_dim_(cfg.d_model / cfg.n_heads),
      chunk_(cfg.chunk),
      q_(add_module("q", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      k_(add_module("k", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      v_(add_module("v", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      out_gate_(add_module("out_gate", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      head_norm_(add_module("head_norm", std::make_unique<Norm>(NormKind::rms_norm, head_dim_, cfg.norm_eps))),
      out_(add_module("out", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))) {}

Tensor RetNetLayer::forward(const Tensor& x, MixerState* state) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
  RopeOptions rotation;
  rotation.start = state != nullptr ? state->position : 0;
  RetentionOptions opts;
  opts.chunk = chunk_;
  opts.form = T == 1 && state != nullptr ? RetentionForm::recurrent : RetentionForm::chunkwise;
  RetentionOutput r = retention(rope(heads(q_.forward(x)), rotation), rope(heads(k_.forward(x)), rotation),
                                heads(v_.forward(x)), state != nullptr ? state->state : Tensor(), opts);
  if (state != nullptr) {
    state->state = r.final_state.detach();
    state->position += T;
  }
  Tensor o = reshape(head_norm_.forward(r.o), {B, T, C});
  return out_.forward(mul(o, silu(out_gate_.forward(x))));
}

}  // namespace seqlab
