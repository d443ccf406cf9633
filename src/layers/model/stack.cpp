#include "layers/model/stack.h"

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "autograd/ops.h"
#include "layers/attention/relative_position_bias.h"

namespace seqlab {

Stack::Stack(const ModelConfig& cfg, const std::vector<BlockSpec>& specs, bool cross, Generator& init_gen,
             Generator& dropout_gen)
    : dropout_(cfg.dropout),
      dropout_gen_(dropout_gen),
      post_norm_(cfg.norm_placement == NormPlacement::post) {
  if (cfg.positions == PositionKind::relative) {
    Embedding& table = add_module("relative_bias", std::make_unique<Embedding>(cfg.relative_buckets, cfg.n_heads,
                                                                              init_gen, cfg.init_std));
    relative_ = &table;
    relative_table_ = &table.weight();
    relative_buckets_ = cfg.relative_buckets;
    relative_max_distance_ = cfg.relative_max_distance;
  }
  if (post_norm_) norm_in_ = &add_module("norm_in", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps));
  const MixerContext ctx = mixer_context_of(cfg);
  for (size_t i = 0; i < specs.size(); ++i) {
    blocks_.push_back(&add_module("blocks." + std::to_string(i),
                                  std::make_unique<Block>(cfg, specs[i], ctx, cross, init_gen, dropout_gen)));
  }
  if (!post_norm_) norm_f_ = &add_module("norm_f", std::make_unique<Norm>(cfg.norm, cfg.d_model, cfg.norm_eps));
  // The shared block and its projections come last, so a model without them draws its weights as before.
  if (const int64_t uses = cross ? 0 : shared_attention_uses(cfg, specs.size()); uses > 0) {
    if (post_norm_) throw std::invalid_argument("stack: the shared attention block needs pre-norm blocks");
    shared_every_ = cfg.shared_attention_every;
    shared_ = &add_module("shared", std::make_unique<Block>(cfg, BlockSpec{"attention", cfg.shared_attention_ffn}, ctx,
                                                            false, init_gen, dropout_gen));
    for (int64_t u = 0; u < uses; ++u) {
      shared_in_.push_back(&add_module("shared_in." + std::to_string(u),
                                       std::make_unique<Linear>(2 * cfg.d_model, cfg.d_model, false, init_gen,
                                                                cfg.init_std)));
    }
  }
}

double stack_parameter_count(const ModelConfig& cfg, const std::vector<BlockSpec>& specs, bool cross) {
  const double d = static_cast<double>(cfg.d_model);
  const double norm = cfg.norm == NormKind::layer_norm ? 2 * d : d;  // gain (and bias)
  double n = norm;                                                     // norm_in or norm_f
  if (cfg.positions == PositionKind::relative) {
    n += static_cast<double>(cfg.relative_buckets) * static_cast<double>(cfg.n_heads);
  }
  // Blocks come in few kinds: count each kind once.
  std::map<std::pair<std::string, FfnKind>, double> kinds;
  for (const BlockSpec& b : specs) kinds[{b.mixer, b.ffn}] += 1;
  for (const auto& [kind, count] : kinds) n += count * block_parameter_count(cfg, BlockSpec{kind.first, kind.second}, cross);
  if (const int64_t uses = cross ? 0 : shared_attention_uses(cfg, specs.size()); uses > 0) {
    n += block_parameter_count(cfg, BlockSpec{"attention", cfg.shared_attention_ffn}, false) +
         static_cast<double>(uses) * 2 * d * d;  // the shared block once, an input projection per use
  }
  return n;
}

Tensor Stack::drop(const Tensor& x) const {
  return dropout_ > 0 && training() ? dropout(x, dropout_, dropout_gen_) : x;
}

std::vector<BlockState> Stack::new_states() const {
  std::vector<BlockState> states;
  for (const Block* b : blocks_) states.push_back(b->new_state());
  for (size_t u = 0; u < shared_in_.size(); ++u) states.push_back(shared_->new_state());  // a cache per use
  return states;
}

Tensor Stack::forward(const Tensor& x_in, const StackInput& input, int64_t start,
                      std::vector<BlockState>* states) const {
  StackInput in = input;
  if (relative_table_ != nullptr) {
    if (in.bias.defined()) throw std::logic_error("stack: a score bias given to a stack with relative positions");
    RelativePositionOptions opts;
    opts.bidirectional = !in.causal;
    opts.num_buckets = relative_buckets_;
    opts.max_distance = relative_max_distance_;
    const int64_t T = x_in.size(1);
    in.bias = relative_position_bias(*relative_table_, T, start + T, opts);
  }
  if (states != nullptr) {
    if (states->empty()) *states = new_states();
    for (BlockState& s : *states) {  // the new tokens start at `start` for every mixer
      s.mixer->position = start;
      if (s.cross != nullptr) s.cross->position = start;
    }
  }
  Tensor x = x_in;
  if (norm_in_ != nullptr) x = norm_in_->forward(x);
  x = drop(x);
  const Tensor x0 = x;  // what the shared block's uses read besides the stream
  Tensor branch;  // pre-norm: the last block's output not yet added to x
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::tie(x, branch) = blocks_[i]->forward(x, branch, in, states != nullptr ? &(*states)[i] : nullptr);
    if (shared_ == nullptr || (static_cast<int64_t>(i) + 1) % shared_every_ != 0) continue;
    // x = x + shared(W_u [x ; x_0]): the stream, then the shared block's whole output as the branch.
    const size_t use = (i + 1) / static_cast<size_t>(shared_every_) - 1;
    if (branch.defined()) x = add(x, branch);
    const Tensor z = shared_in_[use]->forward(concat({x, x0}, 2));
    auto [s, last] = shared_->forward(z, Tensor(), in, states != nullptr ? &(*states)[blocks_.size() + use] : nullptr);
    branch = last.defined() ? add(s, last) : s;
  }
  return norm_f_ != nullptr ? norm_f_->add_forward(x, branch).y : x;
}

Tensor sinusoidal_positions(const std::vector<int64_t>& positions, int64_t d, DType dtype, Device device) {
  std::vector<double> pe(positions.size() * static_cast<size_t>(d));
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t i = 0; 2 * i < d; ++i) {
      const double angle = static_cast<double>(positions[t]) / std::pow(10000.0, 2.0 * static_cast<double>(i) / static_cast<double>(d));
      pe[t * static_cast<size_t>(d) + static_cast<size_t>(2 * i)] = std::sin(angle);
      if (2 * i + 1 < d) pe[t * static_cast<size_t>(d) + static_cast<size_t>(2 * i + 1)] = std::cos(angle);
    }
  }
  return Tensor::from_vector(pe, {static_cast<int64_t>(positions.size()), d}, dtype, device);
}

}  // namespace seqlab
