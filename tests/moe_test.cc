// The mixture-of-experts FFN (layers/model/moe.h): the forward against a naive per-token loop over the
// weights (capacity binding and not, renormalised and raw router weights, SwiGLU and GELU experts),
// the routing on constructed probabilities (top-k with ties broken by index, the queue by choice then
// token, the exact dropped count, the capacity), the aux loss on a constructed case, float64 finite
// differences of the input, the router and the experts through the output and the aux loss (capacity
// not binding, and binding), two data-parallel ranks (forked, over Gloo) against one process over the
// same batch (outputs, drops, aux loss and averaged gradients), a decoder with MoE blocks (names, counts,
// active parameters, decoding equals the full forward, the aux loss in its objective) and the errors.
#include "layers/model/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "model_gradcheck.h"
#include "rank_processes.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

constexpr int64_t kC = 6;

MoeConfig moe_config(int64_t experts, int64_t k, double capacity_factor, FfnKind expert = FfnKind::swiglu,
                     bool renormalize = true) {
  MoeConfig m;
  m.experts = experts;
  m.top_k = k;
  m.capacity_factor = capacity_factor;
  m.expert = expert;
  m.d_ff = 5;
  m.renormalize = renormalize;
  m.aux_loss_weight = 0.01;
  return m;
}

// An f64 MoE FFN in training mode, weights large enough that the router is far from uniform.
std::unique_ptr<MoeFfn> make_moe(const MoeConfig& m, uint64_t seed = 5) {
  Generator gen(seed);
  auto moe = std::make_unique<MoeFfn>(m, kC, 0, false, gen, 0.5);
  moe->to(cpu_device(), DType::f64);
  moe->set_training(true);
  return moe;
}

Tensor random_x(int64_t B, int64_t T, uint64_t seed) {
  Generator gen(seed);
  return Tensor::randn({B, T, kC}, gen, DType::f64);
}

std::map<std::string, std::vector<double>> weights_of(MoeFfn& moe) {
  std::map<std::string, std::vector<double>> w;
  for (const Parameter& p : moe.parameters()) w[p.name] = p.tensor->to_doubles();
  return w;
}

double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu(double x) { return x / (1 + std::exp(-x)); }

// out = W x for W [rows, cols] row-major.
std::vector<double> matvec(const std::vector<double>& W, const double* x, int64_t rows, int64_t cols) {
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) y[static_cast<size_t>(i)] += W[static_cast<size_t>(i * cols + j)] * x[j];
  }
  return y;
}

// The MoE of moe.h written out token by token over the weights: router softmax, the k largest (smaller
// index first among equals), the queue of each expert (choice, then token) against the capacity,
// each kept expert's FFN on the token, weighted and summed.
std::vector<double> naive_moe(MoeFfn& moe, const Tensor& x_tensor, int64_t* dropped) {
  const MoeConfig& m = moe.config();
  auto w = weights_of(moe);
  const std::vector<double> x = x_tensor.to_doubles();
  const int64_t N = x_tensor.size(0) * x_tensor.size(1), E = m.experts, k = m.top_k, F = m.d_ff;
  std::vector<std::vector<double>> probs(static_cast<size_t>(N));
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> l = matvec(w["router.weight"], &x[static_cast<size_t>(t * kC)], E, kC);
    const double top = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (double& v : l) z += (v = std::exp(v - top));
    for (double& v : l) v /= z;
    probs[static_cast<size_t>(t)] = l;
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    chosen[static_cast<size_t>(t)].assign(order.begin(), order.begin() + k);
  }
  const int64_t cap = m.capacity_factor > 0 ? static_cast<int64_t>(std::ceil(m.capacity_factor * N * k / E)) : N * k;
  std::vector<std::vector<bool>> kept(static_cast<size_t>(N), std::vector<bool>(static_cast<size_t>(k)));
  std::vector<int64_t> queue(static_cast<size_t>(E), 0);
  *dropped = 0;
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < N; ++t) {
      const int64_t e = chosen[static_cast<size_t>(t)][static_cast<size_t>(j)];
      kept[static_cast<size_t>(t)][static_cast<size_t>(j)] = queue[static_cast<size_t>(e)]++ < cap;
      if (!kept[static_cast<size_t>(t)][static_cast<size_t>(j)]) ++*dropped;
    }
  }
  std::vector<double> out(static_cast<size_t>(N * kC), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    double norm = 0;
    for (int64_t j = 0; j < k; ++j) norm += probs[static_cast<size_t>(t)][chosen[static_cast<size_t>(t)][j]];
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[static_cast<size_t>(t)][static_cast<size_t>(j)]) continue;
      const int64_t e = chosen[static_cast<size_t>(t)][static_cast<size_t>(j)];
      const std::string p = "experts." + std::to_string(e) + ".";
      const double* xt = &x[static_cast<size_t>(t * kC)];
      std::vector<double> h = matvec(w[p + "fc.weight"], xt, F, kC);
      if (m.expert == FfnKind::swiglu) {
        const std::vector<double> g = matvec(w[p + "gate.weight"], xt, F, kC);
        for (int64_t i = 0; i < F; ++i) h[static_cast<size_t>(i)] = silu(h[static_cast<size_t>(i)]) * g[static_cast<size_t>(i)];
      } else {
        for (double& v : h) v = gelu_tanh(v);
      }
      const std::vector<double> y = matvec(w[p + "proj.weight"], h.data(), kC, F);
      const double pe = probs[static_cast<size_t>(t)][static_cast<size_t>(e)];
      const double weight = m.renormalize ? pe / norm : pe;
      for (int64_t c = 0; c < kC; ++c) out[static_cast<size_t>(t * kC + c)] += weight * y[static_cast<size_t>(c)];
    }
  }
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(Moe, ForwardEqualsANaivePerTokenLoop) {
  struct Case {
    const char* name;
    MoeConfig m;
    bool binds;
  };
  const Case cases[] = {
      {"top2 no capacity", moe_config(4, 2, 0.0), false},
      {"top2 capacity 0.6", moe_config(4, 2, 0.6), true},
      {"top1 gelu raw weights capacity 0.9", moe_config(3, 1, 0.9, FfnKind::gelu, false), true},
      {"top3 of 5 capacity 2", moe_config(5, 3, 2.0), false},
  };
  for (const Case& c : cases) {
    auto moe = make_moe(c.m);
    const Tensor x = random_x(2, 7, 11);
    MoeStats stats;
    const Tensor y = moe->forward(x, &stats);
    int64_t dropped = 0;
    const std::vector<double> want = naive_moe(*moe, x, &dropped);
    EXPECT_LE(max_diff(y.to_doubles(), want), 1e-12) << c.name;
    EXPECT_EQ(stats.dropped, dropped) << c.name;
    EXPECT_EQ(stats.assignments, 14 * c.m.top_k) << c.name;
    EXPECT_EQ(stats.dropped > 0, c.binds) << c.name;
    // Evaluation mode: no capacity, nothing dropped, the naive loop without a limit.
    moe->set_training(false);
    MoeConfig unlimited = c.m;
    unlimited.capacity_factor = 0;
    auto free_moe = make_moe(unlimited);
    int64_t none = 0;
    const std::vector<double> want_eval = naive_moe(*free_moe, x, &none);
    EXPECT_LE(max_diff(moe->forward(x, nullptr).to_doubles(), want_eval), 1e-12) << c.name << " (evaluation)";
  }
}

// Tokens of probabilities chosen by hand (B = 1, T = 4, E = 2, k = 2, capacity_factor 0.75: cap =
// ceil(0.75·4·2/2) = 3). First choices e0, e1, e0, e0; second e1, e0, e1, e1. Expert 0's queue: its
// first choices t0, t2, t3 (places 0-2), then t1's second choice (place 3: dropped). Expert 1's: t1's
// first choice (0), then the second choices of t0, t2, t3 (1-3: t3's dropped).
TEST(Moe, RoutingQueuesByChoiceThenTokenAndCountsDrops) {
  const std::vector<double> p = {0.9, 0.1, 0.3, 0.7, 0.6, 0.4, 0.8, 0.2};
  const MoeRouting r = route_tokens(p, 1, 4, 2, 2, 0.75, nullptr);
  EXPECT_EQ(r.capacity, 3);
  EXPECT_EQ(r.expert, (std::vector<int64_t>{0, 1, 1, 0, 0, 1, 0, 1}));
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.counts, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(r.group_tokens, 4);
  // No limit: nothing dropped.
  EXPECT_EQ(route_tokens(p, 1, 4, 2, 2, 0.0, nullptr).dropped, 0);
  // k = 1, capacity ceil(1·4/2) = 2: three tokens want e0, the third (t3) is dropped; rows count in order
  // across the batch: B = 2 rows of T = 2 give the same queue.
  for (int64_t B : {1, 2}) {
    const MoeRouting one = route_tokens(p, B, 4 / B, 2, 1, 1.0, nullptr);
    EXPECT_EQ(one.capacity, 2);
    EXPECT_EQ(one.kept, (std::vector<uint8_t>{1, 1, 1, 0})) << B;
    EXPECT_EQ(one.dropped, 1);
    EXPECT_EQ(one.counts, (std::vector<int64_t>{3, 1}));
  }
  // Ties go to the smaller index, for the order of the k choices too.
  const MoeRouting tie = route_tokens({0.25, 0.25, 0.25, 0.25}, 1, 1, 4, 3, 0.0, nullptr);
  EXPECT_EQ(tie.expert, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_THROW(route_tokens(p, 1, 4, 2, 3, 1.0, nullptr), std::invalid_argument);
  EXPECT_THROW(route_tokens(p, 1, 3, 2, 1, 1.0, nullptr), std::invalid_argument);
}

// Router W = I (E = C = 2) and tokens whose logits are (ln 3, 0) or (0, ln 3): probabilities (3/4, 1/4)
// or (1/4, 3/4). Tokens 0, 2, 3 prefer e0, token 1 e1 (k = 1): f = (3/4, 1/4), P = (5/8, 3/8), so
// aux = w · 2 · (3/4 · 5/8 + 1/4 · 3/8) = 1.125 w.
TEST(Moe, AuxLossOnAConstructedCase) {
  MoeConfig m;
  m.experts = 2;
  m.top_k = 1;
  m.capacity_factor = 0;
  m.aux_loss_weight = 0.01;
  m.d_ff = 3;
  Generator gen(1);
  MoeFfn moe(m, 2, 0, false, gen, 0.1);
  moe.to(cpu_device(), DType::f64);
  for (const Parameter& p : moe.parameters()) {
    if (p.name == "router.weight") {
      double* w = p.tensor->data<double>();
      w[0] = 1, w[1] = 0, w[2] = 0, w[3] = 1;
    }
  }
  const double l3 = std::log(3.0);
  const Tensor x = Tensor::from_vector({l3, 0, 0, l3, l3, 0, l3, 0}, {1, 4, 2}, DType::f64);
  MoeStats stats;
  moe.forward(x, &stats);
  ASSERT_TRUE(stats.aux_loss.defined());
  EXPECT_NEAR(stats.aux_loss.item(), 0.01125, 1e-15);
  EXPECT_NEAR(stats.aux_value, 0.01125, 1e-15);
  EXPECT_NEAR(stats.balance, 1.125, 1e-14);
  EXPECT_EQ(stats.blocks, 1);
  // A balanced router (W = 0: every probability 1/2) gives E · Σ f_e / E = 1 whatever the choices.
  for (const Parameter& p : moe.parameters()) {
    if (p.name == "router.weight") kernel::fill_(*p.tensor, 0.0);
  }
  MoeStats balanced;
  moe.forward(x, &balanced);
  EXPECT_NEAR(balanced.balance, 1.0, 1e-15);
  // Weight 0: no aux term is added to the objective, the balance is still measured.
  m.aux_loss_weight = 0;
  Generator gen2(1);
  MoeFfn unweighted(m, 2, 0, false, gen2, 0.1);
  unweighted.to(cpu_device(), DType::f64);
  MoeStats none;
  unweighted.forward(x, &none);
  EXPECT_FALSE(none.aux_loss.defined());
  EXPECT_GT(none.balance, 0.0);
}

// The objective of the gradient checks: ⟨y, R⟩ for fixed R, plus the aux loss.
Tensor objective(const MoeFfn& moe, const Tensor& x, const Tensor& R) {
  MoeStats stats;
  const Tensor y = moe.forward(x, &stats);
  Tensor loss = sum(mul(y, R));
  return stats.aux_loss.defined() ? add(loss, stats.aux_loss) : loss;
}

TEST(Moe, GradientsMatchFiniteDifferencesF64) {
  for (double capacity : {0.0, 0.7}) {
    const MoeConfig m = moe_config(4, 2, capacity);
    auto moe = make_moe(m);
    const Tensor x = random_x(2, 5, 13);
    const Tensor R = random_x(2, 5, 17);
    {
      MoeStats stats;
      moe->forward(x, &stats);
      EXPECT_EQ(stats.dropped > 0, capacity > 0) << "capacity binds only when set";
    }
    // Every weight of the router and of two experts, and the middle one of every other parameter.
    std::vector<std::pair<std::string, std::vector<int64_t>>> checked;
    for (const Parameter& p : moe->parameters()) {
      std::vector<int64_t> all(static_cast<size_t>(p.tensor->numel()));
      std::iota(all.begin(), all.end(), 0);
      const bool whole = p.name == "router.weight" || p.name.rfind("experts.0.", 0) == 0 ||
                         p.name.rfind("experts.3.", 0) == 0;
      checked.push_back({p.name, whole ? all : std::vector<int64_t>{p.tensor->numel() / 2}});
    }
    expect_parameter_gradients_match(*moe, [&] { return objective(*moe, x, R); }, checked,
                                     "capacity " + std::to_string(capacity));
    moe->zero_grad();
    // The input, through the router and the experts (the routing stays put under ±1e-6).
    GradcheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{objective(*moe, in[0], R)}; },
                                  {x});
    EXPECT_TRUE(r.ok) << "capacity " << capacity << ": " << r.worst;
  }
}

// Two data-parallel ranks over Gloo, each with rows r, r + 2 of a batch of 4 (the loader's split),
// routing together: the same outputs, drops and aux loss as one process over the whole batch, and the
// ranks' averaged gradients equal its gradients. The objective is each process's mean over its rows.
TEST(Moe, TwoDataParallelRanksRouteAsOneProcess) {
  const MoeConfig m = moe_config(4, 2, 0.8);
  const int64_t B = 4, T = 3;
  const auto failures = testing::run_ranks(2, [&](int rank, const std::string& folder) {
    auto comm = dist::make_communicator(cpu_device(), dist::open_file_store(folder), rank, 2, std::chrono::seconds(20));
    auto moe = make_moe(m);
    const Tensor x = random_x(B, T, 21), R = random_x(B, T, 23);
    // One process: the whole batch.
    MoeStats whole;
    const Tensor y_whole = moe->forward(x, &whole);
    backward(add(mul(sum(mul(y_whole, R)), 1.0 / static_cast<double>(B)), whole.aux_loss));
    std::map<std::string, std::vector<double>> want;
    for (const Parameter& p : moe->parameters()) want[p.name] = grad_of(*p.tensor).to_doubles();
    moe->zero_grad();
    // This rank: rows rank, rank + 2.
    const Tensor rows = Tensor::from_indices({rank, rank + 2}, {2}, DType::i64);
    auto take = [&](const Tensor& t) { return reshape(embedding(reshape(t, {B, T * kC}), rows), {2, T, kC}); };
    MoeStats mine;
    Tensor y;
    {
      MoeRoutingScope scope(comm.get());
      y = moe->forward(take(x), &mine);
    }
    if (max_diff(y.to_doubles(), take(y_whole).to_doubles()) > 1e-14) throw std::runtime_error("outputs differ");
    backward(add(mul(sum(mul(y, take(R))), 0.5), mine.aux_loss));
    Tensor dropped = Tensor::from_vector({static_cast<double>(mine.dropped), mine.aux_value}, {2}, DType::f64);
    comm->all_reduce(dropped);
    const std::vector<double> d = dropped.to_doubles();
    if (whole.dropped == 0 || d[0] != static_cast<double>(whole.dropped)) throw std::runtime_error("drops differ");
    if (std::abs(d[1] / 2 - whole.aux_value) > 1e-15) throw std::runtime_error("aux losses differ");
    for (const Parameter& p : moe->parameters()) {
      Tensor g = grad_of(*p.tensor);
      ASSERT_TRUE(g.defined()) << p.name;  // every expert has a gradient on every rank
      g = contiguous(g);
      comm->all_reduce(g, dist::ReduceOp::average);
      if (max_diff(g.to_doubles(), want[p.name]) > 1e-13) throw std::runtime_error("gradient of " + p.name + " differs");
    }
    comm->barrier();
    if (::testing::Test::HasFailure()) throw std::runtime_error("an expectation failed");
  });
  EXPECT_TRUE(failures.empty());
}

ModelConfig moe_decoder() {
  ModelConfig cfg;
  cfg.vocab_size = 11;
  cfg.d_model = kC;
  cfg.n_heads = 2;
  cfg.max_seq_len = 16;
  cfg.blocks = {{"gla", FfnKind::moe}, {"attention", FfnKind::swiglu}, {"gla", FfnKind::moe}};
  cfg.moe = moe_config(4, 2, 0.5);
  cfg.init_std = 0.3;
  return cfg;
}

TEST(Moe, DecoderNamesCountsAndObjective) {
  const ModelConfig cfg = moe_decoder();
  Generator gen(3);
  Decoder model(cfg, gen);
  std::vector<std::string> names;
  for (const Parameter& p : model.parameters()) names.push_back(p.name);
  for (const char* name : {"blocks.0.moe.router.weight", "blocks.0.moe.experts.3.gate.weight",
                           "blocks.2.moe.experts.0.proj.weight", "blocks.1.mlp.fc.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_EQ(model_parameter_count(cfg), static_cast<double>(model.num_parameters()));
  // Per MoE block the router (4·6) and 4 experts of 3·6·5: a token passes through 2 of them.
  EXPECT_EQ(moe_parameter_count(cfg.moe, kC, 0, false), 24.0 + 4 * 90);
  EXPECT_EQ(model_parameter_count(cfg) - model_active_parameter_count(cfg), 2 * 2 * 90.0);
  // Training: the objective is the cross-entropy plus both blocks' aux loss, reported by name.
  model.to(cpu_device(), DType::f64);
  model.set_training(true);
  Generator tok(9);
  std::vector<int64_t> ids(2 * 8);
  for (int64_t& v : ids) v = static_cast<int64_t>(tok.next_u64() % 11);
  const Tensor tokens = Tensor::from_indices(ids, {2, 8});
  const Batch batch(tokens, tokens);
  const double loss = model.loss(batch).item();
  const auto metrics = model.training_metrics();
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0].first, "aux_loss");
  EXPECT_EQ(metrics[2].first, "moe_dropped");
  EXPECT_GT(metrics[2].second, 0.0);  // capacity 0.5 drops
  const double ce = model.loss_from_logits(batch, model.logits(batch)).item();
  EXPECT_NEAR(loss, ce + metrics[0].second, 1e-12);
  EXPECT_GT(metrics[0].second, 0.019);  // two blocks of about 0.01 each
  // A model without MoE blocks reports nothing.
  ModelConfig plain = cfg;
  plain.blocks = {{"gla", FfnKind::swiglu}};
  Generator gen2(3);
  EXPECT_TRUE(Decoder(plain, gen2).training_metrics().empty());
}

// Evaluation mode routes without capacity: a prompt and then one token at a time give the full forward.
TEST(Moe, DecodingEqualsTheFullForward) {
  Generator gen(3);
  Decoder model(moe_decoder(), gen);
  model.to(cpu_device(), DType::f64);
  model.set_training(false);
  NoGradGuard no_grad;
  std::vector<int64_t> ids = {1, 5, 2, 9, 3, 3, 7, 0, 4, 10, 6, 8, 2, 2, 1, 5, 9, 4};
  const Tensor all = Tensor::from_indices(ids, {2, 9});
  const Tensor full = model.logits({all});
  std::unique_ptr<DecodeState> state = model.new_decode_state();
  std::vector<Tensor> parts = {model.forward_step(narrow(all, 1, 0, 4), *state)};
  for (int64_t t = 4; t < 9; ++t) parts.push_back(model.forward_step(narrow(all, 1, t, 1), *state));
  EXPECT_LE(max_diff(concat(parts, 1).to_doubles(), full.to_doubles()), 1e-12);
}

TEST(Moe, ConfigurationErrorsNameWhatIsWrong) {
  auto message = [](const ModelConfig& cfg) {
    try {
      Generator gen(1);
      Decoder model(cfg, gen);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig cfg = moe_decoder();
  cfg.moe.top_k = 5;
  EXPECT_NE(message(cfg).find("top_k = 5 must be in [1, experts = 4]"), std::string::npos) << message(cfg);
  cfg = moe_decoder();
  cfg.moe.expert = FfnKind::none;
  EXPECT_NE(message(cfg).find("an expert is an FFN"), std::string::npos) << message(cfg);
  cfg = moe_decoder();
  cfg.moe.capacity_factor = -1;
  EXPECT_NE(message(cfg).find("capacity_factor"), std::string::npos) << message(cfg);
  cfg = moe_decoder();
  cfg.kind = ModelKind::encoder;
  cfg.blocks = {{"attention", FfnKind::moe}};
  try {
    Generator gen(1);
    make_model(cfg, gen);
    ADD_FAILURE() << "an encoder with an MoE block was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("decoder models only"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab
