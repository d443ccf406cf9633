#include "layers/model/moe.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "autograd/ops.h"

namespace seqlab {
namespace {

thread_local dist::Communicator* g_routing_group = nullptr;

}  // namespace

dist::Communicator* moe_routing_group() { return g_routing_group; }
MoeRoutingScope::MoeRoutingScope(dist::Communicator* group) : previous_(g_routing_group) { g_routing_group = group; }
MoeRoutingScope::~MoeRoutingScope() { g_routing_group = previous_; }

void check_moe_config(const MoeConfig& moe) {
  if (moe.experts < 1) throw std::invalid_argument("moe: experts must be at least 1, got " + std::to_string(moe.experts));
  if (moe.top_k < 1 || moe.top_k > moe.experts) {
    throw std::invalid_argument("moe: top_k = " + std::to_string(moe.top_k) + " must be in [1, experts = " +
                                std::to_string(moe.experts) + "]");
  }
  if (!(moe.capacity_factor >= 0) || !std::isfinite(moe.capacity_factor)) {
    throw std::invalid_argument("moe: capacity_factor must be 0 (no limit) or positive, got " +
                                std::to_string(moe.capacity_factor));
  }
  if (!(moe.aux_loss_weight >= 0) || !std::isfinite(moe.aux_loss_weight)) {
    throw std::invalid_argument("moe: aux_loss_weight must be 0 or positive, got " + std::to_string(moe.aux_loss_weight));
  }
  if (moe.expert == FfnKind::none || moe.expert == FfnKind::moe) {
    throw std::invalid_argument(std::string("moe: an expert is an FFN (gelu, swiglu, relu, geglu), not ") +
                                ffn_kind_name(moe.expert));
  }
  if (moe.d_ff < 0) throw std::invalid_argument("moe: d_ff must be 0 or positive");
}

int64_t moe_expert_d_ff(const MoeConfig& moe, int64_t model_d_ff, int64_t d_model) {
  if (moe.d_ff > 0) return moe.d_ff;
  return model_d_ff > 0 ? model_d_ff : ffn_d_ff(moe.expert, d_model);
}

double moe_parameter_count(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias) {
  const double router = static_cast<double>(moe.experts) * static_cast<double>(d_model);
  return router + static_cast<double>(moe.experts) *
                      ffn_parameter_count(moe.expert, d_model, moe_expert_d_ff(moe, model_d_ff, d_model), bias);
}

double moe_active_parameter_count(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias) {
  const double router = static_cast<double>(moe.experts) * static_cast<double>(d_model);
  return router + static_cast<double>(moe.top_k) *
                      ffn_parameter_count(moe.expert, d_model, moe_expert_d_ff(moe, model_d_ff, d_model), bias);
}

MoeRouting route_tokens(const std::vector<double>& probs, int64_t B, int64_t T, int64_t E, int64_t k,
                        double capacity_factor, dist::Communicator* group) {
  const int64_t N = B * T;
  if (E < 1 || k < 1 || k > E || static_cast<int64_t>(probs.size()) != N * E) {
    throw std::invalid_argument("moe routing: " + std::to_string(probs.size()) + " probabilities for " +
                                std::to_string(N) + " tokens of " + std::to_string(E) + " experts, top " +
                                std::to_string(k));
  }
  MoeRouting r;
  r.expert.resize(static_cast<size_t>(N * k));
  r.kept.assign(static_cast<size_t>(N * k), 1);
  r.counts.assign(static_cast<size_t>(E), 0);
  // The k most probable experts of every token, the smaller index first among equal probabilities;
  // counts per (row, choice, expert): row_counts[(b·k + j)·E + e].
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::vector<int64_t> row_counts(static_cast<size_t>(B * k * E), 0);
  for (int64_t t = 0; t < N; ++t) {
    const double* p = probs.data() + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      r.expert[static_cast<size_t>(t * k + j)] = e;
      ++row_counts[static_cast<size_t>(((t / T) * k + j) * E + e)];
    }
  }
  // Every row of the routing group: rows[(g·k + j)·E + e] for the group's row g = b·P + rank.
  const int P = group != nullptr ? group->size() : 1, rank = group != nullptr ? group->rank() : 0;
  std::vector<int64_t> rows = row_counts;
  if (P > 1) {
    const Tensor local = Tensor::from_indices(row_counts, {B, k, E}, DType::i64, group->device());
    Tensor all = Tensor::zeros({P * B, k, E}, DType::i64, group->device());
    group->all_gather(local, all);  // rank-major: [P][B][k][E]
    const std::vector<int64_t> gathered = all.to_indices();
    rows.assign(gathered.size(), 0);
    for (int q = 0; q < P; ++q) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t g = b * P + q;
        std::copy_n(gathered.begin() + (q * B + b) * k * E, k * E, rows.begin() + g * k * E);
      }
    }
  }
  const int64_t G = B * P;
  r.group_tokens = G * T;
  // totals[j·E + e]: the group's assignments of choice j to e.
  std::vector<int64_t> totals(static_cast<size_t>(k * E), 0);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t i = 0; i < k * E; ++i) totals[static_cast<size_t>(i)] += rows[static_cast<size_t>(g * k * E + i)];
  }
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t e = 0; e < E; ++e) r.counts[static_cast<size_t>(e)] += totals[static_cast<size_t>(j * E + e)];
  }
  if (capacity_factor <= 0) return r;
  r.capacity = static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(r.group_tokens) *
                                              static_cast<double>(k) / static_cast<double>(E)));
  // The queue of expert e: choice 0 of every row in order, then choice 1, ...; an assignment's place in
  // it is the count of those before it: earlier choices of every row, the same choice of earlier rows,
  // the same choice of earlier tokens of its row.
  std::vector<int64_t> place(static_cast<size_t>(k * E));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t g = b * P + rank;
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t e = 0; e < E; ++e) {
        int64_t before = 0;
        for (int64_t i = 0; i < j; ++i) before += totals[static_cast<size_t>(i * E + e)];
        for (int64_t h = 0; h < g; ++h) before += rows[static_cast<size_t>((h * k + j) * E + e)];
        place[static_cast<size_t>(j * E + e)] = before;
      }
    }
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t a = static_cast<size_t>(t * k + j);
        if (place[static_cast<size_t>(j * E + r.expert[a])]++ >= r.capacity) {
          r.kept[a] = 0;
          ++r.dropped;
        }
      }
    }
  }
  return r;
}

MoeFfn::MoeFfn(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias, Generator& gen, double init_std)
    : moe_(moe), router_(add_module("router", std::make_unique<Linear>(d_model, moe.experts, false, gen, init_std))) {
  check_moe_config(moe);
  const int64_t d_ff = moe_expert_d_ff(moe, model_d_ff, d_model);
  for (int64_t e = 0; e < moe.experts; ++e) {
    experts_.push_back(&add_module("experts." + std::to_string(e),
                                   std::make_unique<Ffn>(moe.expert, d_model, d_ff, bias, gen, init_std)));
  }
}

Tensor MoeFfn::forward(const Tensor& x, MoeStats* stats) const {
  if (x.dim() != 3) throw std::invalid_argument("moe: x must be [B, T, C], got " + shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T, E = moe_.experts, k = moe_.top_k;
  const Device device = x.device();
  const Tensor xf = reshape(x, {N, C});
  const Tensor probs = softmax(router_.forward(xf), -1);  // [N, E]
  const std::vector<double> p = probs.to_doubles();
  const bool train = training();
  const MoeRouting route = route_tokens(p, B, T, E, k, train ? moe_.capacity_factor : 0.0,
                                        train ? moe_routing_group() : nullptr);

  // Each expert on its kept tokens (in token order), the outputs stacked into Y [M + 1, C]: expert e's
  // rows from offset_e, and a last row of zeros that every dropped assignment reads. An expert without
  // a token runs on one row of zeros that nothing reads (its weights then get a zero gradient).
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(E));
  std::vector<int64_t> slot(static_cast<size_t>(N * k));
  for (int64_t a = 0; a < N * k; ++a) {
    if (!route.kept[static_cast<size_t>(a)]) continue;
    std::vector<int64_t>& list = tokens[static_cast<size_t>(route.expert[static_cast<size_t>(a)])];
    slot[static_cast<size_t>(a)] = static_cast<int64_t>(list.size());  // place within the expert's rows
    list.push_back(a / k);
  }
  std::vector<Tensor> ys;
  std::vector<int64_t> offset(static_cast<size_t>(E));
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& list = tokens[static_cast<size_t>(e)];
    offset[static_cast<size_t>(e)] = rows;
    const int64_t n = static_cast<int64_t>(list.size());
    const Tensor in = n > 0 ? embedding(xf, Tensor::from_indices(list, {n}, DType::i64, device))
                            : Tensor::zeros({1, C}, x.dtype(), device);
    ys.push_back(experts_[static_cast<size_t>(e)]->forward(in));
    rows += std::max<int64_t>(n, 1);
  }
  ys.push_back(Tensor::zeros({1, C}, x.dtype(), device));
  const Tensor Y = concat(ys, 0);  // [rows + 1, C]
  std::vector<int64_t> gather(static_cast<size_t>(N * k)), chosen(static_cast<size_t>(N * k));
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = route.expert[static_cast<size_t>(a)];
    gather[static_cast<size_t>(a)] = route.kept[static_cast<size_t>(a)] ? offset[static_cast<size_t>(e)] +
                                                                              slot[static_cast<size_t>(a)]
                                                                        : rows;
    chosen[static_cast<size_t>(a)] = (a / k) * E + e;
  }
  // y_t = Σ_j w_t,j · Y[slot of (t, j)]: the expert outputs and the routing weights gathered per
  // assignment ([N·k, C] and [N·k, 1]), multiplied and summed over the k choices.
  const Tensor Z = embedding(Y, Tensor::from_indices(gather, {N * k}, DType::i64, device));
  Tensor w = embedding(reshape(probs, {N * E, 1}), Tensor::from_indices(chosen, {N * k}, DType::i64, device));
  if (moe_.renormalize) {
    const Tensor wk = reshape(w, {N, k});
    w = reshape(div(wk, sum(wk, {1}, true)), {N * k, 1});
  }
  const Tensor y = sum(reshape(mul(Z, w), {N, k, C}), {1});

  if (train && stats != nullptr) {
    // aux = weight · E · Σ_e f_e P_e: f the group's assignment fractions (constants), P this rank's
    // mean router probabilities (the gradient's path).
    const double assignments = static_cast<double>(route.group_tokens) * static_cast<double>(k);
    std::vector<double> f(static_cast<size_t>(E));
    double balance = 0;
    for (int64_t e = 0; e < E; ++e) {
      f[static_cast<size_t>(e)] = static_cast<double>(route.counts[static_cast<size_t>(e)]) / assignments;
      double pe = 0;
      for (int64_t t = 0; t < N; ++t) pe += p[static_cast<size_t>(t * E + e)];
      balance += f[static_cast<size_t>(e)] * pe / static_cast<double>(N);
    }
    balance *= static_cast<double>(E);
    if (moe_.aux_loss_weight > 0) {
      const Tensor fe = Tensor::from_vector(f, {E}, probs.dtype(), device);
      const Tensor aux = mul(sum(mul(mean(probs, {0}), fe)), moe_.aux_loss_weight * static_cast<double>(E));
      stats->aux_loss = stats->aux_loss.defined() ? add(stats->aux_loss, aux) : aux;
      stats->aux_value += moe_.aux_loss_weight * balance;
    }
    stats->balance += balance;
    stats->blocks += 1;
    stats->assignments += N * k;
    stats->dropped += route.dropped;
  }
  return reshape(y, {B, T, C});
}

}  // namespace seqlab
