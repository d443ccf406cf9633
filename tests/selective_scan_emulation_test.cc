// The selective scan's CUDA kernels' exact schedule, run on the CPU. src/cuda/ssm/selective_scan.cu
// launches the __host__ __device__ functions of src/cuda/ssm/selective_scan_schedule.h: the forward one
// thread per (b, d); the backward a begin launch per (b, d), then per chunk (last first) a walk back per
// (b, d) writing each channel's terms of dB, dC and a reduce per (b, step, n) summing them over d, then a
// finish per (d, n) and per d summing dA, dD, d bias over b. Here every launch runs in queue order and its
// threads one after another, and the results are compared with the CPU kernels
// (src/layers/ssm/selective_scan.cpp) of both forms: the chunked form with the forward's checkpoints, the
// recurrent form without (each thread then makes its own). A second run with every launch's threads in
// another order (blocks last first, threads shuffled) must give the same bits: the kernels' sums over
// threads run in a fixed order, whatever order a GPU schedules them in.
//
// Outputs and scratch start as NaN, so an element the schedule fails to write, or a scratch element read
// before it is written, shows up. Element types: f64 (against the f64 CPU kernels, ≤ 1e-11), f32
// (against f32, ≤ 1e-5: dB, dC, dA, dD, d bias are summed in another order than the CPU's), and bf16
// stored / f32 computed as on the GPU (against the f32 CPU kernels on the same bf16 values, ≤ 2e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/ssm/selective_scan_schedule.h"
#include "cuda_test_util.h"
#include "layers/ssm/selective_scan.h"
#include "selective_scan_cases.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of the shared test headers they use.
namespace seqlab::testing {
namespace {

namespace ss = selective_scan_cuda;
using Case = SelectiveScanCase;

template <class T>
ss::Inputs<T> inputs_of(const kernel::SelectiveScanInputs& in) {
  return {ptr<T>(in.u), ptr<T>(in.delta), ptr<T>(in.A), ptr<T>(in.B), ptr<T>(in.C),
          ptr<T>(in.D), ptr<T>(in.z), ptr<T>(in.delta_bias), ptr<T>(in.initial_state)};
}

struct Run {
  Tensor y, fin, ckpt;
  kernel::SelectiveScanGrads g;
};

// The order the emulated threads of a launch run in: as numbered, or the launch's blocks of 128 (the
// kernels' block size) last first with each block's threads in a fixed shuffled order — standing for a
// GPU that schedules blocks and warps as it likes. A schedule whose sums depend on which thread comes
// first (atomic adds, or any unsynchronised accumulation) gives other bits in the second order.
enum class Order { numbered, shuffled };

template <class F>
void launch(int64_t n, Order order, F&& thread) {
  constexpr int64_t kBlock = 128;
  if (order == Order::numbered) {
    for (int64_t i = 0; i < n; ++i) thread(i);
    return;
  }
  std::mt19937_64 rng(n);
  for (int64_t start = (n - 1) / kBlock * kBlock; start >= 0; start -= kBlock) {
    std::vector<int64_t> block;
    for (int64_t i = start; i < std::min(n, start + kBlock); ++i) block.push_back(i);
    std::shuffle(block.begin(), block.end(), rng);
    for (int64_t i : block) thread(i);
  }
}

// Every kernel of one form, emulated launch by launch as selective_scan.cu queues them: element type T
// stored, A computed, the threads of each launch in `order`.
template <class T, class A>
Run emulate(const Case& c, const SelectiveScanData& x, DType dtype, SelectiveScanForm form,
            Order order = Order::numbered) {
  const ss::Dims d{c.B, c.T, c.D, c.N, std::min(c.chunk, std::max<int64_t>(c.T, 1)), true};
  const ss::Inputs<T> in = inputs_of<T>(x.in);
  Run r;
  r.y = poisoned({c.B, c.T, c.D}, dtype, kCpu);
  r.fin = poisoned({c.B, c.D, c.N}, dtype, kCpu);
  if (form == SelectiveScanForm::chunked) r.ckpt = poisoned({c.B, d.chunks(), c.D, c.N}, dtype, kCpu);
  const int64_t n = c.B * c.D;
  launch(n, order,
         [&](int64_t idx) { ss::forward_channel<T, A>(idx, d, in, r.y.data<T>(), r.fin.data<T>(), mut<T>(r.ckpt)); });
  auto out = [&](const Tensor& like) { return like.defined() ? poisoned(like.shape(), dtype, kCpu) : Tensor(); };
  r.g.du = out(x.in.u);
  r.g.ddelta = out(x.in.delta);
  r.g.dA = out(x.in.A);
  r.g.dB = out(x.in.B);
  r.g.dC = out(x.in.C);
  r.g.dD = out(x.in.D);
  r.g.dz = out(x.in.z);
  r.g.ddelta_bias = out(x.in.delta_bias);
  r.g.dinitial_state = out(x.in.initial_state);
  const ss::Grads<T> g{mut<T>(r.g.du), mut<T>(r.g.ddelta), mut<T>(r.g.dz), mut<T>(r.g.dinitial_state), mut<T>(r.g.dB),
                       mut<T>(r.g.dC), mut<T>(r.g.dA),     mut<T>(r.g.dD), mut<T>(r.g.ddelta_bias)};
  // The launch's workspace, uninitialised on the GPU: NaN here.
  const bool with_ckpt = r.ckpt.defined();
  std::vector<A> ws(static_cast<size_t>(ss::workspace_elements(d, with_ckpt)), std::numeric_limits<A>::quiet_NaN());
  const ss::Workspace<A> w = ss::workspace_of(ws.data(), d, with_ckpt);
  const T* ckpt = with_ckpt ? r.ckpt.data<T>() : nullptr;
  launch(n, order,
         [&](int64_t idx) { ss::backward_begin_channel<T, A>(idx, d, in, x.dfinal.data<T>(), with_ckpt, w); });
  for (int64_t ci = d.chunks() - 1; ci >= 0; --ci) {
    launch(n, order,
           [&](int64_t idx) { ss::backward_chunk_channel<T, A>(idx, ci, d, in, x.dy.data<T>(), ckpt, w, g); });
    const int64_t steps = std::min(d.chunk, d.T - ci * d.chunk);
    launch(c.B * steps * c.N, order, [&](int64_t i) { ss::reduce_chunk_element<T, A>(i, ci, d, w, g); });
  }
  launch(c.D * c.N + 2 * c.D, order, [&](int64_t i) { ss::finish_channel_element<T, A>(i, d, w, g); });
  return r;
}

// The CPU kernels of `form` in the reference dtype.
Run cpu_reference(const Case& c, const SelectiveScanData& x, SelectiveScanForm form) {
  const kernel::SelectiveScanInputs in{as_reference(x.in.u), as_reference(x.in.delta), as_reference(x.in.A),
                                       as_reference(x.in.B), as_reference(x.in.C), as_reference(x.in.D),
                                       as_reference(x.in.z), as_reference(x.in.delta_bias),
                                       as_reference(x.in.initial_state)};
  SelectiveScanOptions opts{form, c.chunk, true};
  const kernel::SelectiveScanRaw raw = kernel::selective_scan_forward(in, opts);
  Run r{raw.y, raw.final_state, raw.checkpoints, {}};
  r.g = kernel::selective_scan_backward(as_reference(x.dy), as_reference(x.dfinal), in, raw.checkpoints, opts,
                                        std::vector<bool>(9, true));
  return r;
}

void expect_run_close(const Run& got, const Run& want, double tol, const std::string& what) {
  expect_values_close(got.y, want.y, tol, what + " y");
  expect_values_close(got.fin, want.fin, tol, what + " final_state");
  if (got.ckpt.defined()) expect_values_close(got.ckpt, want.ckpt, tol, what + " checkpoints");
  expect_values_close(got.g.du, want.g.du, tol, what + " du");
  expect_values_close(got.g.ddelta, want.g.ddelta, tol, what + " ddelta");
  expect_values_close(got.g.dA, want.g.dA, tol, what + " dA");
  expect_values_close(got.g.dB, want.g.dB, tol, what + " dB");
  expect_values_close(got.g.dC, want.g.dC, tol, what + " dC");
  expect_values_close(got.g.dD, want.g.dD, tol, what + " dD");
  expect_values_close(got.g.dz, want.g.dz, tol, what + " dz");
  expect_values_close(got.g.ddelta_bias, want.g.ddelta_bias, tol, what + " ddelta_bias");
  expect_values_close(got.g.dinitial_state, want.g.dinitial_state, tol, what + " dinitial_state");
}

template <class T, class A>
void check_all(DType dtype, double tol) {
  Generator gen(test_seed(41));
  for (const Case& c : kSelectiveScanCases) {
    const SelectiveScanData x = make_selective_scan_data(c, dtype, gen);
    for (SelectiveScanForm form : {SelectiveScanForm::chunked, SelectiveScanForm::recurrent}) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " " + selective_scan_form_name(form);
      expect_run_close(emulate<T, A>(c, x, dtype, form), cpu_reference(c, x, form), tol, what);
    }
  }
}

TEST(SelectiveScanEmulation, F64MatchesTheCpuKernels) { check_all<double, double>(DType::f64, 1e-11); }
TEST(SelectiveScanEmulation, F32MatchesTheCpuKernels) { check_all<float, float>(DType::f32, 1e-5); }
TEST(SelectiveScanEmulation, Bf16ComputedInF32MatchesTheCpuKernels) { check_all<bf16, float>(DType::bf16, 2e-2); }

// A run's tensors, in the order of kOutputNames (undefined where the case has no such input).
const char* const kOutputNames[] = {"y",  "final_state", "checkpoints", "du", "ddelta",      "dA",
                                    "dB", "dC",          "dD",          "dz", "ddelta_bias", "dinitial_state"};
std::vector<Tensor> outputs_of(const Run& r) {
  return {r.y,    r.fin,  r.ckpt, r.g.du, r.g.ddelta,      r.g.dA,
          r.g.dB, r.g.dC, r.g.dD, r.g.dz, r.g.ddelta_bias, r.g.dinitial_state};
}

// Determinism: every launch's threads run in another order (blocks last first, threads shuffled) and
// every output, gradient and checkpoint keeps its bits. Each element has one writer per launch and every
// sum over threads (dB, dC over d; dA, dD, d bias over b) is taken by one thread in a fixed order, so the
// order in which a GPU runs blocks and warps cannot change a bit; the atomic adds this replaced would have
// summed in thread order and failed here.
template <class T, class A>
void check_order_free(DType dtype) {
  Generator gen(test_seed(43));
  for (const Case& c : kSelectiveScanCases) {
    const SelectiveScanData x = make_selective_scan_data(c, dtype, gen);
    for (SelectiveScanForm form : {SelectiveScanForm::chunked, SelectiveScanForm::recurrent}) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " " + selective_scan_form_name(form);
      const Run first = emulate<T, A>(c, x, dtype, form, Order::numbered);
      const Run second = emulate<T, A>(c, x, dtype, form, Order::shuffled);
      const std::vector<Tensor> a = outputs_of(first), b = outputs_of(second);
      for (size_t k = 0; k < a.size(); ++k) {
        const std::string name = what + " " + kOutputNames[k];
        ASSERT_EQ(a[k].defined(), b[k].defined()) << name;
        if (!a[k].defined()) continue;
        const std::vector<double> va = a[k].to_doubles(), vb = b[k].to_doubles();
        for (double v : va) ASSERT_TRUE(std::isfinite(v)) << name << " has a non-finite value";
        EXPECT_EQ(va, vb) << name << " changed with the order the threads ran in";
      }
    }
  }
}

TEST(SelectiveScanEmulation, F64BitsDoNotDependOnThreadOrder) { check_order_free<double, double>(DType::f64); }
TEST(SelectiveScanEmulation, F32BitsDoNotDependOnThreadOrder) { check_order_free<float, float>(DType::f32); }
TEST(SelectiveScanEmulation, Bf16BitsDoNotDependOnThreadOrder) { check_order_free<bf16, float>(DType::bf16); }

}  // namespace
}  // namespace seqlab::testing
