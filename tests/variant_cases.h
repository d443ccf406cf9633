// Case structs, case tables and input generators shared by the tests of the recurrent variants — the CPU
// tests (tests/{delta_net,gla,retention,linear_attention}_test.cc), the CUDA schedules run on the CPU
// (tests/*_cuda_schedule_test.cc) and the GPU tests (tests/cuda_*_gpu_test.cc) — so that a schedule
// test and a GPU test of one variant draw their inputs the same way. A program keeps its own case table
// where its shapes differ, and everything it checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// ---------------------------------------------------------------- helpers

inline bool all_finite(const Tensor& t) {
  for (double x : t.to_doubles()) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Rows of unit L2 norm over the last dimension, as the DeltaNet layer normalises its keys; drawn in f64
// and rounded to dtype.
inline Tensor unit_rows(const Shape& shape, Generator& gen, DType dtype) {
  std::vector<double> x = Tensor::randn(shape, gen, DType::f64).to_doubles();
  const size_t d = static_cast<size_t>(shape.back());
  for (size_t r = 0; r < x.size(); r += d) {
    double n2 = 0;
    for (size_t i = 0; i < d; ++i) n2 += x[r + i] * x[r + i];
    for (size_t i = 0; i < d; ++i) x[r + i] /= std::sqrt(n2);
  }
  return Tensor::from_vector(x, shape, dtype);
}

// t in dtype d; undefined stays undefined (an absent optional input).
inline Tensor cast_or_none(const Tensor& t, DType d) { return t.defined() ? kernel::to_dtype(t, d) : t; }

// A tensor's elements, or null for an absent optional one (the schedules' pointer arguments).
template <class T>
const T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* mut(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

inline std::string heads_name(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv) {
  return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
         " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv);
}

// A shared case table, then cases of a program's own.
template <class Case, size_t N>
std::vector<Case> cases_and(const Case (&shared)[N], std::initializer_list<Case> own) {
  std::vector<Case> all(std::begin(shared), std::end(shared));
  all.insert(all.end(), own);
  return all;
}

// The message of the std::invalid_argument that call() throws, or "no error".
template <class Call>
std::string error_message_of(Call&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// The shape errors of an op taking q, k [B, T, H, dk], v [B, T, H, dv] and initial_state [B, H, dk, dv]
// (retention, linear attention): error(q, k, v, initial_state) runs the op and returns
// error_message_of it.
template <class Error>
void expect_qkv_state_shape_errors(Error&& error) {
  const Tensor q = Tensor::zeros({2, 5, 3, 4}), v = Tensor::zeros({2, 5, 3, 6});
  std::string e = error(q, Tensor::zeros({2, 5, 3, 3}), v, Tensor());
  EXPECT_NE(e.find("q and k differ"), std::string::npos) << e;
  EXPECT_NE(e.find("k [2, 5, 3, 3]"), std::string::npos) << e;
  e = error(q, q, v, Tensor::zeros({2, 3, 6, 4}));
  EXPECT_NE(e.find("initial_state must be [B, H, dk, dv]"), std::string::npos) << e;
}

// Runs run() twice — each call launches the kernels on fresh outputs and returns them — and expects the
// second call's bits to equal the first's; with require_finite, also every value finite (outputs start
// as NaN, so this catches an element neither call wrote).
template <class Run>
void expect_same_bits_twice(Run&& run, const std::string& what, bool require_finite) {
  std::vector<std::vector<double>> first;
  for (int call = 0; call < 2; ++call) {
    const std::vector<Tensor> outs = run();
    for (size_t t = 0; t < outs.size(); ++t) {
      std::vector<double> now = outs[t].to_doubles();
      if (require_finite) {
        for (double x : now) ASSERT_TRUE(std::isfinite(x)) << what << " output " << t << " has a non-finite value";
      }
      if (call == 0) {
        first.push_back(std::move(now));
      } else {
        EXPECT_EQ(now, first[t]) << what << " output " << t << " changed between runs";
      }
    }
  }
}

// An emulated schedule's result (got, NaN where it wrote nothing) against the CPU kernels' (want),
// element by element: |got − want| ≤ rtol · max(1, |want|), so NaN always fails. Two undefined tensors
// agree. Reports the first five elements that differ.
inline void expect_schedule_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what << ": one side is undefined";
  if (!got.defined()) return;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  int failures = 0;
  for (size_t i = 0; i < g.size() && failures < 5; ++i) {
    if (!(std::fabs(g[i] - w[i]) <= rtol * std::max(1.0, std::fabs(w[i])))) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " in the schedule, " << w[i] << " on the CPU";
    }
  }
}

// The fixture of the variant GPU tests: skipped where no GPU is usable; gen_ seeded with GoogleTest's
// random seed plus a number of the program's own (kSalt), so that the programs draw different inputs.
template <uint64_t kSalt>
class VariantGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{test_seed(kSalt)};
};

// ---------------------------------------------------------------- numerics at every decay
// The shared grid of the numerics sweeps (docs/reliability.md, "Numerics at every decay"): every gated op,
// every form, f32 and f64, against its f64 recurrent form, at per-step log-decays from −1e-7 to −30.

// ‖a − b‖₂ / ‖b‖₂ over all elements: the norm-wise relative error of a against the reference b. A zero b
// asks for a zero a (0 when it is, ∞ otherwise), so an exactly vanishing gradient must come out exactly 0.
inline double norm_rel_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff += (x[i] - y[i]) * (x[i] - y[i]);
    ref += y[i] * y[i];
  }
  if (ref == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / ref);
}

// ---------------------------------------------------------------- bf16 on the CPU
// The chunkwise variant kernels take bf16 tensors themselves, widen a head's rows and run in f32
// (layers/variant_rows.h); their tests hold a bf16 result against the f32 kernel on the same bf16
// values. Tolerances: the 2e-2 of the bf16 GPU tests, but relative to the tensor's largest magnitude,
// |got − want| ≤ 2e-2 · max(max |want|, 1), and norm-wise ≤ 1e-2 — not per element against
// max(|want|, 1) as on the GPU. These bounds were set for a version whose GEMMs rounded their operands
// (scaled rows, scores, states) to bf16, where a cancelling sum's element carries its terms' error; the
// kernels now round only their outputs, well inside them (each test prints its worst of all three measures).

// max |got − want| / max(max |want|, 1): the largest error against the tensor's scale.
inline double max_error_of_scale(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<double> x = got.to_doubles(), y = want.to_doubles();
  double err = 0, scale = 1;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return err / scale;
}

// The worst errors of a test's bf16 results: norm-wise, against the scale, and per element against
// max(|want|, 1) (the GPU tests' measure, printed for comparison, not bounded).
struct Bf16Worst {
  double norm = 0, scale = 0, element = 0;
  void print(const char* what) const {
    std::printf("    %s, bf16 against f32, worst: norm-wise %.3g, max |error| / max(max |f32|, 1) %.3g, "
                "per element |error| / max(|f32|, 1) %.3g\n",
                what, norm, scale, element);
  }
};

// A bf16 result of a kernel with bf16 GEMMs against the f32 kernel's `want`: bf16, finite, and within the
// tolerances above.
inline void expect_bf16_close(const Tensor& got, const Tensor& want, const std::string& what, Bf16Worst& worst) {
  EXPECT_EQ(got.dtype(), DType::bf16) << what;
  EXPECT_TRUE(all_finite(got)) << what;
  const double n = norm_rel_error(got, want), s = max_error_of_scale(got, want);
  double e = 0;
  const std::vector<double> x = got.to_doubles(), y = want.to_doubles();
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) e = std::max(e, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  worst.norm = std::max(worst.norm, n);
  worst.scale = std::max(worst.scale, s);
  worst.element = std::max(worst.element, e);
  EXPECT_LE(n, 1e-2) << what;
  EXPECT_LE(s, 2e-2) << what;
}

// A bf16 result of a kernel with no GEMM (a recurrent form) is the f32 kernel's result rounded once.
inline void expect_rounded_from(const Tensor& got, const Tensor& want32, const std::string& what) {
  EXPECT_EQ(got.dtype(), DType::bf16) << what;
  EXPECT_EQ(got.to_doubles(), kernel::to_dtype(want32, DType::bf16).to_doubles()) << what;
}

// Restores the bf16 GEMM path (native or widened, kernel::set_cpu_bf16_gemm_widened) a test found.
struct Bf16GemmPath {
  const bool native = kernel::cpu_bf16_gemm_native();
  ~Bf16GemmPath() { kernel::set_cpu_bf16_gemm_widened(!native); }
};

// How the per-step log-decays of a sweep point are drawn (each element independently):
enum class Decay {
  weak,      // −|x|, |x| log-uniform in [1e-7, 1e-3]: decays within 1e-3 of 1
  moderate,  // U(−1.5, −0.02), what the other tests use
  all20,     // exactly −20 everywhere (α = 2e-9)
  all30,     // exactly −30 everywhere (α = 9e-14)
  uniform,   // U(−30, −1e-7)
  logmix,    // −|x|, |x| log-uniform in [1e-7, 30]: every scale at once
  bimodal,   // half weak (as `weak`), half in U(−30, −10), at random: the worst mixture for cancellation
};
inline constexpr Decay kDecays[] = {Decay::weak,    Decay::moderate, Decay::all20,  Decay::all30,
                                    Decay::uniform, Decay::logmix,   Decay::bimodal};

inline const char* decay_name(Decay d) {
  static const char* const kNames[] = {"weak", "moderate", "all -20", "all -30", "uniform", "log-mix", "bimodal"};
  return kNames[static_cast<int>(d)];
}

// Log-decays of the given shape drawn as `d` says, in dtype (f32 rounds them, so that an f64 reference on the
// same values can be formed by widening).
inline Tensor draw_log_decays(Decay d, const Shape& shape, Generator& gen, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto log_uniform = [&](double lo, double hi) { return -std::exp(std::log(lo) + gen.uniform() * std::log(hi / lo)); };
  auto draw = [&]() {
    if (d == Decay::weak) return log_uniform(1e-7, 1e-3);
    if (d == Decay::moderate) return -1.5 + 1.48 * gen.uniform();
    if (d == Decay::all20) return -20.0;
    if (d == Decay::all30) return -30.0;
    if (d == Decay::uniform) return -1e-7 - (30.0 - 1e-7) * gen.uniform();
    if (d == Decay::logmix) return log_uniform(1e-7, 30.0);
    return gen.uniform() < 0.5 ? log_uniform(1e-7, 1e-3) : -10.0 - 20.0 * gen.uniform();  // bimodal
  };
  std::vector<double> x(static_cast<size_t>(n));
  for (double& e : x) e = draw();
  return Tensor::from_vector(x, shape, dtype);
}

// The worst error of one quantity over a sweep, with where it happened, printed at the end so that a run
// documents the margins (docs/reliability.md quotes these lines).
struct WorstError {
  explicit WorstError(std::string quantity = "") : what(std::move(quantity)) {}
  std::string what;
  double error = 0;
  std::string where;
  void take(double e, const std::string& at) {
    if (!(e <= error)) {  // NaN is taken too
      error = e;
      where = at;
    }
  }
  void print() const { std::printf("    %-34s %.3g  (%s)\n", what.c_str(), error, where.c_str()); }
};

// Each tensor of `got` (the run `run`, at `at`) within tol of the one of `want` in the same place (named by
// names[i]), norm-wise; an absent reference asks for an absent result. Each error also goes to worst[i]
// where given.
inline void expect_normwise(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const char* const* names,
                            double tol, const std::string& run, const std::string& at, WorstError* worst = nullptr) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << names[i] << " " << run << " at " << at;
    if (!want[i].defined()) continue;
    const double e = norm_rel_error(got[i], want[i]);
    if (worst) worst[i].take(e, at);
    EXPECT_LE(e, tol) << names[i] << " " << run << " at " << at;
  }
}

// One point of a sweep: chunk size, sequence length, how the decays are drawn, and whether the optional
// inputs (a value gate where the op has one, the initial state) are given.
struct SweepPoint {
  int64_t chunk, T;
  Decay decay;
  bool with_gv, with_h0;
  std::string name() const {
    return "chunk " + std::to_string(chunk) + " T " + std::to_string(T) + " decay " + decay_name(decay) +
           (with_gv ? " gv" : "") + (with_h0 ? " h0" : "");
  }
};

// The sampled grid: chunk ∈ {1, 3, 16, 64, 128} × T ∈ {1, 2, chunk − 1, chunk, chunk + 1, 300} (positive,
// each once). At T = 300 every decay profile runs; at the shorter lengths two points per (chunk, T) whose
// profiles cycle through kDecays, and the optional inputs (value gate, initial state) cycle through their
// four combinations from one round of profiles to the next, so that every profile meets every chunk size
// and every combination: 77 of the 840 points of the full product.
inline std::vector<SweepPoint> numerics_sweep() {
  std::vector<SweepPoint> points;
  size_t k = 0;
  auto add = [&](int64_t chunk, int64_t T, Decay d) {
    const size_t opt = (k++ / std::size(kDecays)) % 4;
    points.push_back({chunk, T, d, (opt & 1) != 0, (opt & 2) != 0});
  };
  for (int64_t chunk : {1, 3, 16, 64, 128}) {
    std::vector<int64_t> lengths;
    for (int64_t T : {int64_t{1}, int64_t{2}, chunk - 1, chunk, chunk + 1}) {
      if (T >= 1 && std::find(lengths.begin(), lengths.end(), T) == lengths.end()) lengths.push_back(T);
    }
    for (int64_t T : lengths) {
      for (int i = 0; i < 2; ++i) add(chunk, T, kDecays[k % std::size(kDecays)]);
    }
    for (Decay d : kDecays) add(chunk, 300, d);
  }
  return points;
}

// ---------------------------------------------------------------- DeltaNet / Gated DeltaNet

struct DeltaNetCase {
  int64_t B, T, H, dk, dv;
  bool gated, init;
  double scale;  // ≤ 0: 1/√dk
  std::string name() const {
    return heads_name(B, T, H, dk, dv) + (gated ? " gated" : "") + (init ? " initial_state" : "");
  }
  double resolved_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk)); }
};

// T not a multiple of the kernels' 32-step backward segment (70, 33) nor of the CPU chunk, exactly one
// and two segments (32, 64), T = 1 (decoding from a state), T below one segment, dk ≠ dv both ways,
// head dims 1 and 128 (every block thread a column), with and without gate and initial state.
inline const DeltaNetCase kDeltaNetCases[] = {
    {2, 70, 3, 16, 24, true, true, 0},    // several segments, the last partial; dk ≠ dv
    {1, 1, 2, 5, 7, true, true, 0},       // one token
    {2, 33, 2, 8, 8, false, true, 0},     // DeltaNet (no gate)
    {1, 32, 2, 12, 4, true, false, 0.7},  // one whole segment, no initial state, explicit scale
    {1, 64, 1, 6, 10, false, false, 0},   // two whole segments
    {2, 9, 2, 1, 3, true, true, 0},       // dk = 1
    {1, 40, 1, 128, 128, true, true, 0},  // the largest head dims
    {1, 35, 2, 32, 96, true, true, 0},    // dv much larger than dk
    {1, 20, 1, 100, 3, false, true, 0},   // dk much larger than dv
};

struct DeltaNetData {
  Tensor q, k, v, beta, g, s0, dout, dfinal;  // g, s0 undefined where the case has none
  std::vector<Tensor> inputs() const { return {q, k, v, beta, g, s0}; }
};

// In this order from gen: q ~ N(0, 1), unit-norm k, v ~ N(0, 1), β ~ U(0.05, 0.95), log-gates
// g ~ U(g_lo, g_hi) (gated cases), initial state ~ N(0, 0.5²) (where given), dO ~ N(0, 1),
// dfinal ~ N(0, 0.5²).
inline DeltaNetData make_delta_net_data(const DeltaNetCase& c, DType dtype, Generator& gen, double g_lo = -1.0,
                                        double g_hi = -0.02) {
  DeltaNetData x;
  x.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.k = unit_rows({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.beta = Tensor::rand({c.B, c.T, c.H}, gen, dtype, 0.05, 0.95);
  if (c.gated) x.g = Tensor::rand({c.B, c.T, c.H}, gen, dtype, g_lo, g_hi);
  if (c.init) x.s0 = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  x.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  return x;
}

// ---------------------------------------------------------------- linear attention

struct LinearAttentionCase {
  int64_t B, T, H, dk, dv;
  bool init;
  std::string name() const { return heads_name(B, T, H, dk, dv) + (init ? " initial state" : ""); }
};

// The f32 tolerance of the CUDA schedule against the f64 CPU kernels: linear attention has no decay, so
// its state and gradient sums run over all T steps in f32 and their rounding grows as √T (terms of
// either sign whose partial sums reach far above the result): 1e-4 up to T = 64, then 1e-4·√(T/64).
// Measured on an H200 and in the emulation at T = 300: 1.5e-4 (dfq, dfk), under this bound's 2.2e-4.
inline double linear_attention_f32_rtol(int64_t T) {
  return 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(T) / 64.0));
}

// T across the kernels' 32-step tile (70, 33), exactly one and two tiles, T = 1, dk ≠ dv both ways,
// head dims 1 and 128 (every block thread a column and a row), with and without an initial state.
inline const LinearAttentionCase kLinearAttentionCases[] = {
    {2, 70, 3, 16, 24, true}, {1, 1, 2, 5, 7, true}, {2, 33, 2, 8, 8, false},    {1, 32, 2, 12, 4, true},
    {1, 64, 1, 6, 10, false}, {2, 9, 2, 1, 3, true}, {1, 40, 1, 128, 128, true}, {1, 35, 2, 96, 32, true}};

struct LinearAttentionData {
  Tensor fq, fk, v, s0, z0, dout, ds, dz;
};

// In this order from gen: fq, fk ~ U(0.05, 1.5) (positive, as the feature maps give them, so the
// normaliser stays away from 0), v ~ N(0, 1), initial state ~ N(0, 0.5²) and normaliser ~ U(0, 2) (or
// zeros without one), dO ~ N(0, 1), dS_T ~ N(0, 0.5²), dz_T ~ N(0, 0.5²).
inline LinearAttentionData make_linear_attention_data(const LinearAttentionCase& c, DType dtype, Generator& gen) {
  LinearAttentionData x;
  x.fq = Tensor::rand({c.B, c.T, c.H, c.dk}, gen, dtype, 0.05, 1.5);
  x.fk = Tensor::rand({c.B, c.T, c.H, c.dk}, gen, dtype, 0.05, 1.5);
  x.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.s0 = c.init ? Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5) : Tensor::zeros({c.B, c.H, c.dk, c.dv}, dtype);
  x.z0 = c.init ? Tensor::rand({c.B, c.H, c.dk}, gen, dtype, 0.0, 2.0) : Tensor::zeros({c.B, c.H, c.dk}, dtype);
  x.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.ds = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  x.dz = Tensor::randn({c.B, c.H, c.dk}, gen, dtype, 0.5);
  return x;
}

// ---------------------------------------------------------------- GLA

struct GlaCase {
  int64_t B, T, H, dk, dv;
  double g_lo, g_hi;  // log-gates uniform in [g_lo, g_hi]
  std::string name() const {
    return heads_name(B, T, H, dk, dv) + " g in [" + std::to_string(g_lo) + ", " + std::to_string(g_hi) + "]";
  }
};

struct GlaInputs {
  Tensor q, k, v, g, gv, h0, dout, dfinal;  // gv, h0 undefined where not asked for
};

// In this order from gen: q, k, v ~ N(0, 1), g ~ U(g_lo, g_hi), gv ~ U(−1, −0.02) (with_gv), the
// initial state ~ N(0, 1) (with_h0). dout and dfinal are left to the caller.
inline GlaInputs make_gla_inputs(const GlaCase& c, DType dtype, bool with_gv, bool with_h0, Generator& gen) {
  GlaInputs in;
  in.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.k = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  in.g = Tensor::rand({c.B, c.T, c.H, c.dk}, gen, dtype, c.g_lo, c.g_hi);
  if (with_gv) in.gv = Tensor::rand({c.B, c.T, c.H, c.dv}, gen, dtype, -1.0, -0.02);
  if (with_h0) in.h0 = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype);
  return in;
}

// ---------------------------------------------------------------- retention

struct RetentionCase {
  int64_t B, T, H, dk, dv;
  std::vector<double> gammas;  // empty: RetNet's defaults
  std::string name() const { return heads_name(B, T, H, dk, dv) + (gammas.empty() ? " default γ" : " given γ"); }
};

struct RetentionInputs {
  Tensor q, k, v, s0, dout, ds;
};

// In this order from gen: q, k, v ~ N(0, 1), s0 ~ N(0, 1) (random_s0; zeros otherwise), dO ~ N(0, 1),
// dS_T ~ N(0, 1).
inline RetentionInputs make_retention_inputs(const RetentionCase& c, bool random_s0, DType dtype, Generator& gen) {
  RetentionInputs in;
  in.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.k = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  in.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  in.s0 = random_s0 ? Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype) : Tensor::zeros({c.B, c.H, c.dk, c.dv}, dtype);
  in.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  in.ds = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype);
  return in;
}

}  // namespace seqlab::testing
