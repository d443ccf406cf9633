#include "layers/linear/linear_attention_mixer.h"

#include <cmath>
#include <memory>

#include "autograd/ops.h"
#include "layers/linear/linear_attention.h"
#include "tensor/kernels.h"

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
  if (feature_map_ == "performer") {
    omega_ = orthogonal_random_features(cfg.feature_count, head_dim_, gen);
  } else {
    parse_feature_map(feature_map_);  // fail at construction, not at the first forward
  }
}

Tensor LinearAttentionLayer::forward(const Tensor& x, MixerState* state) const {
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
  LinearAttentionOutput r =
      linear_attention(q, k, heads(v_.forward(x)),
                       state != nullptr ? state->state : Tensor(), state != nullptr ? state->normalizer : Tensor(), opts);
  if (state != nullptr) {
    state->state = r.final_state.detach();
    state->normalizer = r.final_normalizer.detach();
  }
  return out_.forward(reshape(r.o, {B, T, C}));
}

}  // namespace seqlab
