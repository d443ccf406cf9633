// The selective scan's CUDA kernels' exact schedule, run on the CPU. src/cuda/ssm/selective_scan.cu
// launches the __host__ __device__ functions of src/cuda/ssm/selective_scan_schedule.h: the forward one
// thread per (b, d); the backward one thread per (b, d) adding into zeroed accumulators, then one thread
// per accumulator element writing the outputs. Here the same functions run for every thread, one after
// another (the threads of a kernel share nothing but the accumulators, whose atomic adds become plain
// adds), and the results are compared with the CPU kernels (src/layers/ssm/selective_scan.cpp) of both
// forms: the chunked form with the forward's checkpoints, the recurrent form without (each thread then
// makes its own).
//
// Outputs and scratch start as NaN, so an element the schedule fails to write, or a scratch element read
// before it is written, shows up. Element types: f64 (against the f64 CPU kernels, ≤ 1e-11), f32
// (against f32, ≤ 1e-5: dB, dC, dA, dD, d bias are summed in another order), and bf16 stored / f32
// computed as on the GPU (against the f32 CPU kernels on the same bf16 values, ≤ 2e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
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

// Both kernels of one form, emulated: element type T stored, A computed.
template <class T, class A>
Run emulate(const Case& c, const SelectiveScanData& x, DType dtype, SelectiveScanForm form) {
  const ss::Dims d{c.B, c.T, c.D, c.N, std::min(c.chunk, std::max<int64_t>(c.T, 1)), true};
  const ss::Inputs<T> in = inputs_of<T>(x.in);
  Run r;
  r.y = poisoned({c.B, c.T, c.D}, dtype, kCpu);
  r.fin = poisoned({c.B, c.D, c.N}, dtype, kCpu);
  if (form == SelectiveScanForm::chunked) r.ckpt = poisoned({c.B, d.chunks(), c.D, c.N}, dtype, kCpu);
  for (int64_t idx = 0; idx < c.B * c.D; ++idx) {
    ss::forward_channel<T, A>(idx, d, in, r.y.data<T>(), r.fin.data<T>(), mut<T>(r.ckpt));
  }
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
  // The launch's buffers: accumulators zeroed, scratch uninitialised (NaN here).
  std::vector<A> acc_buf(static_cast<size_t>(ss::accumulator_elements(d)), A(0));
  const ss::Accumulators<A> acc = ss::accumulators_of(acc_buf.data(), d);
  const bool with_ckpt = r.ckpt.defined();
  const int64_t per = ss::scratch_per_thread(d, with_ckpt);
  std::vector<A> scratch(static_cast<size_t>(c.B * c.D * per), std::numeric_limits<A>::quiet_NaN());
  for (int64_t idx = 0; idx < c.B * c.D; ++idx) {
    ss::backward_channel<T, A>(idx, d, in, x.dy.data<T>(), x.dfinal.data<T>(), with_ckpt ? r.ckpt.data<T>() : nullptr,
                               scratch.data() + idx * per, g, acc);
  }
  for (int64_t i = 0; i < ss::accumulator_elements(d); ++i) ss::finish_element<T, A>(i, d, acc, g);
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

}  // namespace
}  // namespace seqlab::testing
