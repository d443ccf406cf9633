#include "layers/linear_attention_layer.h"

#include <memory>

#include "autograd/ops.h"
#include "layers/linear_attention.h"

namespace seqlab {
LinearAttentionLayer::LinearAttentionLayer(const MixerConfig& cfg, Generator& gen)
    : heads_(cfg.n_heads),
      head_dim_(cfg.d_model / cfg.n_heads),
      chunk_(cfg.chunk),
      feature_map_(cfg.feature_map),
      q_(add_module("q", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      k_(add_module("k", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      v_(add_module("v", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))),
      out_(add_module("out", std::make_unique<Linear>(cfg.d_model, cfg.d_model, false, gen, cfg.init_std))) {
  parse_feature_map(feature_map_);  // fail at construction, not at the first forward
}

Tensor LinearAttentionLayer::forward(const Tensor& x, MixerState* state) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  auto heads = [&](const Tensor& t) { return reshape(t, {B, T, heads_, head_dim_}); };
  LinearAttentionOptions opts;
  opts.feature_map = parse_feature_map(feature_map_);
  opts.chunk = chunk_;
  opts.form = T == 1 && state != nullptr ? LinearAttentionForm::recurrent : LinearAttentionForm::chunkwise;
  LinearAttentionOutput r =
      linear_attention(heads(q_.forward(x)), heads(k_.forward(x)), heads(v_.forward(x)),
                       state != nullptr ? state->state : Tensor(), state != nullptr ? state->normalizer : Tensor(), opts);
  if (state != nullptr) {
    state->state = r.final_state.detach();
    state->normalizer = r.final_normalizer.detach();
  }
  return out_.forward(reshape(r.o, {B, T, C}));
}

}  // namespace seqlab
