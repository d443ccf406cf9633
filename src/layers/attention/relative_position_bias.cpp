// T5's relative position bias: the bucketing, the raw entry points, the CPU forward and backward
// kernels side by side, the autograd node, the naive reference and the registry entry. The
// equations are in relative_position_bias.h.
#include "layers/attention/relative_position_bias.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {
namespace {

// f(n, nb) of the header for a distance n ≥ 0 in one direction's nb buckets. The large branch is T5's
// float32 arithmetic step by step: n / max_exact in float32, its float32 log, divided by
// log(max_distance / max_exact) (a double constant, rounded to float32 as the frameworks do when a
// float32 tensor meets a Python scalar), times (nb − max_exact) in float32, truncated toward 0.
int64_t distance_bucket(int64_t n, int64_t nb, int64_t max_distance) {
  const int64_t max_exact = nb / 2;
  if (n < max_exact) return n;
  const float log_ratio = std::log(static_cast<float>(n) / static_cast<float>(max_exact));
  const float log_range =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = log_ratio / log_range * static_cast<float>(nb - max_exact);
  // The clamp first (in double, exact for these integers): a distance far beyond max_distance may scale
  // past what an int64 holds.
  if (static_cast<double>(scaled) >= static_cast<double>(nb - 1 - max_exact)) return nb - 1;
  return max_exact + static_cast<int64_t>(scaled);
}

int64_t bucket_of(int64_t rel, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  if (bidirectional) {
    const int64_t nb = num_buckets / 2;
    return (rel > 0 ? nb : 0) + distance_bucket(rel < 0 ? -rel : rel, nb, max_distance);
  }
  return distance_bucket(std::max<int64_t>(-rel, 0), num_buckets, max_distance);
}

// Positions beyond 2^31 would be no sequence length (and a bias [1, H, T, S] of them no allocation).
constexpr int64_t kMaxPositions = int64_t{1} << 31;

void check_options(const RelativePositionOptions& opts) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("relative_position_bias: " + why); };
  const int64_t min_buckets = opts.bidirectional ? 4 : 2;  // one exact bucket (max_exact ≥ 1) per direction
  if (opts.num_buckets < min_buckets) {
    fail("num_buckets must be at least " + std::to_string(min_buckets) + " with " +
         (opts.bidirectional ? "bidirectional" : "causal") + " bucketing (half of a direction's buckets are exact "
         "distances, and there must be one), got " + std::to_string(opts.num_buckets));
  }
  const int64_t max_exact = (opts.bidirectional ? opts.num_buckets / 2 : opts.num_buckets) / 2;
  if (opts.max_distance <= max_exact) {
    fail("max_distance must exceed the exact distances (max_exact = " + std::to_string(max_exact) +
         " for num_buckets " + std::to_string(opts.num_buckets) + "), got " + std::to_string(opts.max_distance));
  }
}

void check_sizes(int64_t T, int64_t S) {
  if (T < 1 || S < 1 || T >= kMaxPositions || S >= kMaxPositions) {
    throw std::invalid_argument("relative_position_bias: T and S (queries and keys) must be in [1, 2^31), got T = " +
                                std::to_string(T) + ", S = " + std::to_string(S));
  }
}

kernel::RelativePositionParams params_of(const RelativePositionOptions& opts, int64_t T, int64_t S) {
  return {opts.bidirectional, opts.num_buckets, opts.max_distance, T, S};
}

}  // namespace

int64_t relative_position_bucket(int64_t rel, const RelativePositionOptions& opts) {
  check_options(opts);
  return bucket_of(rel, opts.bidirectional, opts.num_buckets, opts.max_distance);
}

namespace kernel {
namespace {

void check_table(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  check_options(opts);
  check_sizes(T, S);
  const std::string got = table.defined() ? shape_str(table.shape()) : std::string("undefined");
  if (!table.defined() || table.dim() != 2 || table.size(0) != opts.num_buckets) {
    throw std::invalid_argument("relative_position_bias: table must be [num_buckets, H] = [" +
                                std::to_string(opts.num_buckets) + ", H], got " + got);
  }
  if (!is_floating(table.dtype())) {
    throw std::invalid_argument(std::string("relative_position_bias: table must be f32, f64 or bf16, got ") +
                                dtype_name(table.dtype()));
  }
}

}  // namespace

Tensor relative_position_bias_forward(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  check_table(table, T, S, opts);
  Tensor bias = Tensor::empty({1, table.size(1), T, S}, table.dtype(), table.device());
  if (bias.numel() > 0) {
    relative_position_bias_forward_kernel(table.device(), kernel::contiguous(table), params_of(opts, T, S), bias);
  }
  return bias;
}

Tensor relative_position_bias_backward(const Tensor& dbias, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  check_options(opts);
  check_sizes(T, S);
  if (!dbias.defined() || dbias.dim() != 4 || dbias.size(0) != 1 || dbias.size(2) != T || dbias.size(3) != S) {
    throw std::invalid_argument("relative_position_bias backward: dbias must be [1, H, T, S] = [1, H, " +
                                std::to_string(T) + ", " + std::to_string(S) + "], got " +
                                (dbias.defined() ? shape_str(dbias.shape()) : std::string("undefined")));
  }
  Tensor dtable = Tensor::empty({opts.num_buckets, dbias.size(1)}, dbias.dtype(), dbias.device());
  if (dtable.numel() > 0) {
    relative_position_bias_backward_kernel(dbias.device(), kernel::contiguous(dbias), params_of(opts, T, S), dtable);
  }
  return dtable;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::RelativePositionParams;

// The bucket of each diagonal d = j − i ∈ [−(T − 1), S − 1], stored at d + T − 1: rel = d − (S − T).
std::vector<int64_t> diagonal_buckets(const RelativePositionParams& p) {
  std::vector<int64_t> buckets(static_cast<size_t>(p.T + p.S - 1));
  for (int64_t d = -(p.T - 1); d < p.S; ++d) {
    buckets[static_cast<size_t>(d + p.T - 1)] = bucket_of(d - (p.S - p.T), p.bidirectional, p.num_buckets, p.max_distance);
  }
  return buckets;
}

// bias[0, h, i, j] = table[bucket(j − i), h]: one bucket per diagonal (T + S − 1 of them, not T·S), then one
// parallel pass over the H·T rows of the output, each a gather from column h of the table.
// Memory: reads table [NB, H]; writes bias [1, H, T, S]; scratch: T + S − 1 bucket indices.
template <class T>
void forward(const Tensor& table, const RelativePositionParams& p, const Tensor& bias) {
  const int64_t H = table.size(1), Tq = p.T, S = p.S;
  const std::vector<int64_t> buckets = diagonal_buckets(p);
  const T* tab = table.data<T>();
  T* out = bias.data<T>();
  parallel_for(H * Tq, std::max<int64_t>(1, kParallelGrain / S), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t h = r / Tq, i = r % Tq;
      const int64_t* bk = buckets.data() + (Tq - 1 - i);  // bk[j] is the bucket of diagonal j − i
      T* row = out + r * S;
      for (int64_t j = 0; j < S; ++j) row[j] = tab[bk[j] * H + h];
    }
  });
}

// dtable[n, h] = Σ_{d: bucket(d) = n} D_hd,  D_hd = Σ_i dbias[0, h, i, i + d]: per head, the diagonal sums
// in one row-order pass over dbias (i ascending, then j), then each into its bucket (d ascending). A task
// owns one head and writes only column h of dtable, so the sums are race-free and their order fixed.
// Memory: reads dbias [1, H, T, S]; writes dtable [NB, H]; scratch per head: T + S − 1 diagonal sums.
template <class T>
void backward(const Tensor& dbias, const RelativePositionParams& p, const Tensor& dtable) {
  const int64_t H = dbias.size(1), Tq = p.T, S = p.S, NB = p.num_buckets;
  const std::vector<int64_t> buckets = diagonal_buckets(p);
  const T* g = dbias.data<T>();
  T* dt = dtable.data<T>();
  parallel_for(H, std::max<int64_t>(1, kParallelGrain / (Tq * S)), [&](int64_t h0, int64_t h1) {
    std::vector<T> diag(buckets.size());
    for (int64_t h = h0; h < h1; ++h) {
      std::fill(diag.begin(), diag.end(), T(0));
      for (int64_t i = 0; i < Tq; ++i) {
        const T* row = g + (h * Tq + i) * S;
        T* di = diag.data() + (Tq - 1 - i);  // di[j] accumulates diagonal j − i
        for (int64_t j = 0; j < S; ++j) di[j] += row[j];
      }
      for (int64_t n = 0; n < NB; ++n) dt[n * H + h] = 0;
      for (size_t d = 0; d < diag.size(); ++d) dt[buckets[d] * H + h] += diag[d];
    }
  });
}

void forward_cpu(const Tensor& table, const RelativePositionParams& p, const Tensor& bias) {
  dispatch_float(table.dtype(), "relative_position_bias", [&](auto tag) { forward<decltype(tag)>(table, p, bias); });
}

void backward_cpu(const Tensor& dbias, const RelativePositionParams& p, const Tensor& dtable) {
  dispatch_float(dbias.dtype(), "relative_position_bias backward",
                 [&](auto tag) { backward<decltype(tag)>(dbias, p, dtable); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(relative_position_bias_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(relative_position_bias_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: the backward needs only the sizes and the options, so nothing is saved.
Tensor relative_position_bias(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  Tensor bias = kernel::relative_position_bias_forward(table, T, S, opts);
  record("relative_position_bias", {table}, {&bias}, {},
         [T, S, opts](const std::vector<Tensor>& g, const std::vector<Tensor>&, const std::vector<bool>&) {
           return std::vector<Tensor>{kernel::relative_position_bias_backward(g[0], T, S, opts)};
         });
  return bias;
}

// index[i, j] = bucket(j − (i + S − T)) as [T, S]; embedding(table, index) is [T, S, H]; heads first.
Tensor relative_position_bias_reference(const Tensor& table, int64_t T, int64_t S, const RelativePositionOptions& opts) {
  kernel::check_table(table, T, S, opts);
  std::vector<int64_t> index(static_cast<size_t>(T * S));
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < S; ++j) index[static_cast<size_t>(i * S + j)] = relative_position_bucket(j - (i + S - T), opts);
  }
  Tensor looked_up = embedding(table, Tensor::from_indices(index, {T, S}, DType::i64, table.device()));
  return unsqueeze(permute(looked_up, {2, 0, 1}), 0);
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "relative_position_bias";
  s.summary =
      "bias[0, h, i, j] = table[bucket(j − (i + S − T)), h], T5's buckets (half exact, half log-spaced up to "
      "max_distance); table [num_buckets, H] → bias [1, H, T, S]";
  s.inputs = {{"table"}};
  s.outputs = {"bias"};
  s.attrs = {{"T", AttrType::integer, "0", "number of queries (required, ≥ 1)"},
             {"S", AttrType::integer, "0", "number of keys (required, ≥ 1)"},
             {"bidirectional", AttrType::boolean, "true",
              "separate buckets for keys after the query (encoder); false: causal bucketing (decoder)"},
             {"num_buckets", AttrType::integer, "32", "buckets of the table (its rows)"},
             {"max_distance", AttrType::integer, "128", "distance from which every key shares the last bucket"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    const RelativePositionOptions opts{a.get_bool("bidirectional"), a.get_int("num_buckets"), a.get_int("max_distance")};
    return std::vector<Tensor>{relative_position_bias(in[0], a.get_int("T"), a.get_int("S"), opts)};
  };
  // T = 6 queries at the end of S = 9 keys, 10 buckets: 5 per direction, 2 of them exact, and distances up to 8,
  // beyond max_distance = 6, so exact, log-spaced and clamped buckets all occur.
  s.example = [](Generator& gen, DType dtype) { return std::vector<Tensor>{Tensor::randn({10, 3}, gen, dtype)}; };
  s.example_attrs = {{"T", "6"}, {"S", "9"}, {"num_buckets", "10"}, {"max_distance", "6"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
