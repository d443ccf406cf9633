// Sequence parallelism (src/layers/sequence_parallel.h) against one process: every mixer of the registry,
// run by P = 2 and 4 rank processes over Gloo on the zig-zag chunks of one batch, must give this rank's
// rows of the single-process output, this rank's rows of the input gradient, and — summed over the ranks —
// every parameter's gradient; f64 within 1e-10 and f32 within 1e-5 (relative to the largest element).
// The cases come from the registry (cases() below): today softmax attention with rotary positions and
// grouped KV heads (ring attention), GLA, retention (rotary, fixed decays), linear attention (each
// feature map, both states), DeltaNet and Gated DeltaNet (matrix transitions, the short convolution's
// halo); chunks shorter and longer than the ops' own chunk size; the pieces on their own (positions,
// take/place, ring shift, gather) and the refusals.
//
// Each rank computes the single-process reference itself (same seed, same inputs), so the ranks exchange
// only what sequence parallelism exchanges, plus one all-reduce of the parameter gradients to compare.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "dist/communicator.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"
#include "rank_processes.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using testing::joined;
using testing::run_ranks;

std::unique_ptr<dist::Communicator> join(int rank, int size, const std::string& folder) {
  return dist::make_communicator(cpu_device(), dist::open_file_store(folder), rank, size, std::chrono::seconds(20));
}

// max |a − b| / max(max |b|, 1e-30): the error relative to the reference's scale.
double rel_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  if (x.size() != y.size()) return INFINITY;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return diff / scale;
}

double g_worst[2] = {0, 0};  // the largest error seen in this process: f64, f32

void require_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const double e = rel_error(got, want);
  double& worst = g_worst[want.dtype() == DType::f64 ? 0 : 1];
  worst = std::max(worst, e);
  if (!(e <= tol)) {
    char line[96];
    std::snprintf(line, sizeof line, ": relative error %.3g > %.0e", e, tol);
    throw std::runtime_error(what + line);
  }
}

struct MixerCase {
  std::string mixer;
  std::vector<std::pair<std::string, OptionValue>> options;
  int64_t T;
  std::string name() const {
    std::string s = mixer;
    for (const auto& [k, v] : options) s += " " + k;
    return s + " T=" + std::to_string(T);
  }
};

// One mixer on one rank: the single-process reference, then the same under sequence parallelism.
void check_mixer(const MixerCase& mc, DType dtype, const SequenceGroup& g) {
  const MixerSpec& spec = mixer_spec(mc.mixer);
  MixerContext ctx;
  ctx.d_model = 16;
  ctx.n_heads = 4;
  ctx.n_kv_heads = 2;  // grouped-query attention (the recurrences have no KV heads)
  ctx.positions = PositionKind::rope;
  MixerOptions opts(spec.options);
  for (const auto& [k, v] : mc.options) opts.set(k, v);
  Generator gen(7);
  std::unique_ptr<Mixer> mixer = spec.make(ctx, opts, gen);
  mixer->to(cpu_device(), dtype);
  const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
  const std::string what = mc.name() + " " + dtype_name(dtype) + " P=" + std::to_string(g.size()) + " rank " +
                           std::to_string(g.rank());

  Generator data(11);
  Tensor x = Tensor::randn({2, mc.T, ctx.d_model}, data, dtype);
  const Tensor dy = Tensor::randn({2, mc.T, ctx.d_model}, data, dtype);
  // Reference: one process, whole sequences.
  Tensor x_ref = set_requires_grad(kernel::clone(x));
  MixerInput in_ref;
  in_ref.x = x_ref;
  const Tensor y_ref = mixer->forward(in_ref, nullptr);
  backward({y_ref}, {dy});
  std::vector<Tensor> grads_ref;
  for (const Parameter& p : mixer->parameters()) grads_ref.push_back(kernel::clone(grad_of(*p.tensor)));
  mixer->zero_grad();

  // Sequence-parallel: this rank's chunks.
  Tensor x_local = set_requires_grad(sequence_take_local(x, g).detach());
  Tensor y_local;
  {
    SequenceParallelScope scope(&g);
    MixerInput in_local;
    in_local.x = x_local;
    y_local = mixer->forward(in_local, nullptr);
  }
  require_close(y_local, sequence_take_local(y_ref, g), tol, what + " output");
  backward({y_local}, {sequence_take_local(dy, g)});
  require_close(grad_of(x_local), sequence_take_local(grad_of(x_ref), g), tol, what + " input gradient");
  std::vector<Parameter> params = mixer->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor gsum = grad_of(*params[i].tensor);
    if (!gsum.defined()) gsum = Tensor::zeros(params[i].tensor->shape(), dtype);
    gsum = kernel::clone(gsum);
    g.comm().all_reduce(gsum, dist::ReduceOp::sum);
    require_close(gsum, grads_ref[i], tol, what + " gradient of " + params[i].name);
  }
}

// The cases, from the registry: every mixer whose traits declare sequence parallelism, with its default
// options (chunks of the ops' own size, longer than a rank's chunk), and with each other choice of its
// text options; where it has the shared chunk_size option, those choices (or, without any, one more case)
// run with chunk_size 2, shorter than a rank's chunk, so chunk boundaries fall inside and between ranks.
std::vector<MixerCase> cases() {
  std::vector<MixerCase> out;
  for (const MixerSpec* m : registered_mixers()) {
    if (!m->traits.sequence_parallel) continue;
    out.push_back({m->name, {}, 32});
    const bool chunked = std::any_of(m->options.begin(), m->options.end(),
                                     [](const OptionSpec& o) { return o.key == chunk_size_option().key; });
    std::vector<std::pair<std::string, OptionValue>> small;
    if (chunked) small.push_back({chunk_size_option().key, int64_t{2}});
    bool any_choice = false;
    for (const OptionSpec& o : m->options) {
      for (size_t c = 1; c < o.choices.size(); ++c) {
        std::vector<std::pair<std::string, OptionValue>> options = small;
        options.push_back({o.key, o.choices[c]});
        out.push_back({m->name, options, 32});
        any_choice = true;
      }
    }
    if (chunked && !any_choice) out.push_back({m->name, small, 32});
  }
  return out;
}

void every_mixer(int P) {
  const auto failures = run_ranks(
      P,
      [&](int rank, const std::string& folder) {
        auto comm = join(rank, P, folder);
        SequenceGroup g(*comm);
        for (DType dtype : {DType::f64, DType::f32}) {
          for (const MixerCase& mc : cases()) check_mixer(mc, dtype, g);
        }
        std::printf("P=%d rank %d: largest relative error f64 %.2g, f32 %.2g\n", P, rank, g_worst[0], g_worst[1]);
      },
      std::chrono::seconds(120));
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(SequenceParallel, EveryMixerMatchesOneProcessAtTwoRanks) { every_mixer(2); }
TEST(SequenceParallel, EveryMixerMatchesOneProcessAtFourRanks) { every_mixer(4); }

// A mixer that declares no sequence parallelism is refused by the recipe loader (recipe_test); every
// other one is run above. The cases cover each of them.
TEST(SequenceParallel, EveryMixerThatDeclaresItIsCovered) {
  const std::vector<MixerCase> all = cases();
  for (const MixerSpec* m : registered_mixers()) {
    const bool covered =
        std::any_of(all.begin(), all.end(), [&](const MixerCase& mc) { return mc.mixer == m->name; });
    EXPECT_EQ(covered, m->traits.sequence_parallel) << m->name;
  }
}

TEST(SequenceParallel, LayoutExchangesAndRefusals) {
  const auto failures = run_ranks(3, [](int rank, const std::string& folder) {
    auto comm = join(rank, 3, folder);
    SequenceGroup g(*comm);
    // Zig-zag: 6 chunks of 2; rank r holds chunks r and 5 − r.
    const std::vector<int64_t> pos = sequence_positions(4, g);
    const std::vector<int64_t> want = {2 * rank, 2 * rank + 1, 2 * (5 - rank), 2 * (5 - rank) + 1};
    if (pos != want) throw std::runtime_error("positions");
    const Tensor whole = reshape(Tensor::arange(12, DType::f64), {1, 12});
    const Tensor local = sequence_take_local(whole, g);
    if (local.to_doubles() != std::vector<double>(want.begin(), want.end())) throw std::runtime_error("take_local");
    Tensor placed = kernel::clone(sequence_place_local(local, g));
    comm->all_reduce(placed, dist::ReduceOp::sum);
    if (placed.to_doubles() != whole.to_doubles()) throw std::runtime_error("place_local summed over the ranks");
    // The ring: rank r receives rank r − 1's tensor; the gradient goes back.
    Tensor x = set_requires_grad(Tensor::full({2}, rank, DType::f64));
    const Tensor y = ring_shift(x, g);
    if (y.to_doubles() != std::vector<double>(2, (rank + 2) % 3)) throw std::runtime_error("ring_shift");
    backward({y}, {Tensor::full({2}, 10.0 * rank, DType::f64)});
    if (grad_of(x).to_doubles() != std::vector<double>(2, 10.0 * ((rank + 1) % 3))) {
      throw std::runtime_error("ring_shift backward");
    }
    // Gather: every rank's rows; the gradient of this rank's rows summed over the ranks.
    Tensor z = set_requires_grad(Tensor::full({1, 2}, rank, DType::f64));
    const Tensor all = gather_ranks(z, g);
    if (all.to_doubles() != std::vector<double>{0, 0, 1, 1, 2, 2}) throw std::runtime_error("gather_ranks");
    backward({all}, {Tensor::full({3, 2}, 1.0 + rank, DType::f64)});
    if (grad_of(z).to_doubles() != std::vector<double>(2, 6.0)) throw std::runtime_error("gather_ranks backward");
    // Refused: a sequence that does not split into 2P chunks, a convolution halo longer than a chunk.
    bool refused = false;
    try {
      sequence_take_local(Tensor::zeros({1, 10}), g);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("10 tokens do not split into 6 chunks") != std::string::npos;
    }
    if (!refused) throw std::runtime_error("T = 10 over 3 ranks was not refused with its message");
    refused = false;
    try {
      sequence_halo(Tensor::zeros({1, 4, 3}), 3, g);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("needs the 3 tokens before each chunk, but chunks hold 2") != std::string::npos;
    }
    if (!refused) throw std::runtime_error("a halo longer than a chunk was not refused with its message");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

}  // namespace
}  // namespace seqlab
