#include "layers/model/recurrent_lm.h"

#include <algorithm>
#include <stdexcept>

#include "autograd/ops.h"
#include "layers/delta/delta_net_mixer.h"
#include "layers/scan/gla_mixer.h"
#include "layers/linear/linear_attention_mixer.h"
#include "layers/scan/retention_mixer.h"

namespace seqlab {
namespace {

// A Module holding the modules of one block, so their names read blocks.{i}.<name>.
class BlockModule : public Module {
 public:
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return add_module(name, std::move(m));
  }
};

RecurrentLmConfig resolved(RecurrentLmConfig cfg) {
  const MixerConfig& m = cfg.mixer_config;
  if (cfg.vocab_size <= 0 || m.d_model <= 0 || cfg.n_layers < 0 || m.n_heads <= 0 || m.chunk <= 0) {
    throw std::invalid_argument("RecurrentLm: sizes must be positive");
  }
  if (m.d_model % m.n_heads != 0) {
    throw std::invalid_argument("RecurrentLm: d_model " + std::to_string(m.d_model) + " not divisible by n_heads " +
                                std::to_string(m.n_heads));
  }
  if (cfg.d_ff == 0) cfg.d_ff = std::max<int64_t>(64, (8 * m.d_model / 3 + 32) / 64 * 64);
  return cfg;
}

std::unique_ptr<Mixer> make_mixer(MixerKind kind, MixerConfig cfg, Generator& gen) {
  switch (kind) {
    case MixerKind::gla: return std::make_unique<GlaLayer>(cfg, gen);
    case MixerKind::retnet: return std::make_unique<RetNetLayer>(cfg, gen);
    case MixerKind::linear_attention: return std::make_unique<LinearAttentionLayer>(cfg, gen);
    case MixerKind::delta_net: cfg.gated = false; return std::make_unique<DeltaNetLayer>(cfg, gen);
    case MixerKind::gated_delta_net: cfg.gated = true; return std::make_unique<DeltaNetLayer>(cfg, gen);
  }
  throw std::invalid_argument("RecurrentLm: unknown mixer");
}

}  // namespace

MixerKind parse_mixer_kind(const std::string& name) {
  if (name == "gla") return MixerKind::gla;
  if (name == "retnet") return MixerKind::retnet;
  if (name == "linear") return MixerKind::linear_attention;
  if (name == "deltanet") return MixerKind::delta_net;
  if (name == "gated_deltanet") return MixerKind::gated_delta_net;
  throw std::invalid_argument("unknown mixer '" + name + "' (gla, retnet, linear, deltanet, gated_deltanet)");
}

RecurrentLm::RecurrentLm(const RecurrentLmConfig& cfg, Generator& gen)
    : cfg_(resolved(cfg)),
      dropout_gen_(cfg_.dropout_seed),
      wte_(add_module("wte", std::make_unique<Embedding>(cfg_.vocab_size, cfg_.mixer_config.d_model, gen,
                                                         cfg_.mixer_config.init_std))),
      blocks_() {
  const MixerConfig& m = cfg_.mixer_config;
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    auto block = std::make_unique<BlockModule>();
    Block b;
    b.norm1 = &block->add("norm1", std::make_unique<Norm>(NormKind::rms_norm, m.d_model, m.norm_eps));
    b.mixer = &block->add("mixer", make_mixer(cfg_.mixer, m, gen));
    b.norm2 = &block->add("norm2", std::make_unique<Norm>(NormKind::rms_norm, m.d_model, m.norm_eps));
    b.fc = &block->add("mlp.fc", std::make_unique<Linear>(m.d_model, cfg_.d_ff, false, gen, m.init_std));
    b.gate = &block->add("mlp.gate", std::make_unique<Linear>(m.d_model, cfg_.d_ff, false, gen, m.init_std));
    b.proj = &block->add("mlp.proj", std::make_unique<Linear>(cfg_.d_ff, m.d_model, false, gen, m.init_std));
    blocks_.push_back(b);
    add_module("blocks." + std::to_string(i), std::move(block));
  }
  norm_f_ = &add_module("norm_f", std::make_unique<Norm>(NormKind::rms_norm, m.d_model, m.norm_eps));
}

Tensor RecurrentLm::drop(const Tensor& x) {
  return cfg_.dropout > 0 && training() ? dropout(x, cfg_.dropout, dropout_gen_, true) : x;
}

Tensor RecurrentLm::run(const Tensor& tokens, RecurrentLmState* state) {
  if (tokens.dim() != 2) throw std::invalid_argument("RecurrentLm: tokens must be [B, T], got " + shape_str(tokens.shape()));
  if (state != nullptr) state->mixers.resize(blocks_.size());
  // Pre-norm residual blocks x + drop(mixer(norm1 x)), then + drop(swiglu(norm2 ·)); each residual add
  // is fused with the norm that reads its result (add_forward), so a block's MLP output (`branch`) is
  // added by the next block's norm1, and the last one by norm_f.
  Tensor x = drop(wte_.forward(tokens));  // [B, T, C]
  Tensor branch;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    const AddNormResult in = b.norm1->add_forward(x, branch);
    const AddNormResult mid = b.norm2->add_forward(
        in.sum, drop(b.mixer->forward(in.y, state != nullptr ? &state->mixers[i] : nullptr)));
    x = mid.sum;
    branch = drop(b.proj->forward(mul(silu(b.fc->forward(mid.y)), b.gate->forward(mid.y))));
  }
  if (state != nullptr) state->position += tokens.shape()[1];
  return linear(norm_f_->add_forward(x, branch).y, wte_.weight());
}

double RecurrentLm::mixing_flops_per_token(int64_t seq_len) const {
  const MixerConfig& m = cfg_.mixer_config;
  const double d = static_cast<double>(m.d_model), head = d / static_cast<double>(m.n_heads);
  const double chunk = static_cast<double>(std::min(m.chunk, seq_len));
  return static_cast<double>(cfg_.n_layers) * (6.0 * chunk * d + 12.0 * d * head);
}

Tensor RecurrentLm::forward(const Tensor& tokens) { return run(tokens, nullptr); }

Tensor RecurrentLm::forward_step(const Tensor& tokens, DecodeState& state) {
  auto* s = dynamic_cast<RecurrentLmState*>(&state);
  if (s == nullptr) throw std::invalid_argument("RecurrentLm::forward_step: the state is not a RecurrentLmState");
  return run(tokens, s);
}

}  // namespace seqlab
