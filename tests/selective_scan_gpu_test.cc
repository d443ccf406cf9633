// CUDA against CPU for the selective scan's slots (src/cuda/ssm/selective_scan.cu against the CPU kernels
// of both forms in src/layers/ssm/selective_scan.cpp). Skipped where no GPU is usable.
//
// The cases of selective_scan_cases.h (odd shapes, T = 1, T below one chunk, every optional input or none,
// Δ from 1e-4 to 10 with decays from ≈ 0 to ≈ 1, more than one block of threads) plus a training-like
// shape, in f32, f64 and bf16: every CUDA output poisoned with NaN first, then y, final_state, the
// checkpoints and every gradient compared element by element with the CPU slots (for bf16 the CPU runs
// in f32 on the same bf16 values). Tolerance |got − want| ≤ rtol · max(|want|, 1): 1e-4 for f32 (the
// GPU sums dB, dC, dA by atomic adds, in another order than the CPU), 1e-10 for f64, 2e-2 for bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/ssm/selective_scan.h"
#include "selective_scan_cases.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of the shared test headers they use.
namespace seqlab::testing {
namespace {

using Case = SelectiveScanCase;
using CudaSelectiveScanVsCpu = VariantGpuTest<83>;

kernel::SelectiveScanInputs inputs_on(const kernel::SelectiveScanInputs& x, bool gpu) {
  auto put = [&](const Tensor& t) { return gpu ? on_gpu(t) : as_reference(t); };
  return {put(x.u), put(x.delta), put(x.A), put(x.B), put(x.C), put(x.D), put(x.z), put(x.delta_bias),
          put(x.initial_state)};
}

kernel::SelectiveScanGrads grads_like(const kernel::SelectiveScanInputs& x, DType dtype, bool gpu) {
  auto make = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return Tensor();
    return gpu ? poisoned(t.shape(), dtype) : Tensor::empty(t.shape(), dtype);
  };
  return {make(x.u), make(x.delta), make(x.A), make(x.B), make(x.C), make(x.D), make(x.z), make(x.delta_bias),
          make(x.initial_state)};
}

TEST_F(CudaSelectiveScanVsCpu, ForwardAndBackwardBothForms) {
  std::vector<Case> cases = kSelectiveScanCases;
  cases.push_back({4, 300, 256, 16, 64, true});  // a training-like shape: several chunks, many blocks
  for (DType dtype : kFloatTypes) {
    const double tol = fused_op_rtol(dtype);
    const DType rd = reference_type(dtype);
    for (const Case& c : cases) {
      const SelectiveScanData x = make_selective_scan_data(c, dtype, gen_);
      const kernel::SelectiveScanInputs gin = inputs_on(x.in, true), cin = inputs_on(x.in, false);
      for (SelectiveScanForm form : {SelectiveScanForm::chunked, SelectiveScanForm::recurrent}) {
        const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " " + selective_scan_form_name(form);
        const kernel::SelectiveScanParams p{form, std::min(c.chunk, std::max<int64_t>(c.T, 1)), true};
        const int64_t nc = (c.T + p.chunk - 1) / p.chunk;
        Tensor y = poisoned({c.B, c.T, c.D}, dtype), fin = poisoned({c.B, c.D, c.N}, dtype);
        Tensor ckpt = form == SelectiveScanForm::chunked ? poisoned({c.B, nc, c.D, c.N}, dtype) : Tensor();
        kernel::selective_scan_forward_kernel(kGpu, gin, p, y, fin, ckpt);
        Tensor y_ref = Tensor::empty(y.shape(), rd), fin_ref = Tensor::empty(fin.shape(), rd);
        Tensor ckpt_ref = ckpt.defined() ? Tensor::empty(ckpt.shape(), rd) : Tensor();
        kernel::selective_scan_forward_kernel(kCpu, cin, p, y_ref, fin_ref, ckpt_ref);
        expect_close(y, y_ref, tol, what + " y");
        expect_close(fin, fin_ref, tol, what + " final_state");
        if (ckpt.defined()) expect_close(ckpt, ckpt_ref, tol, what + " checkpoints");

        kernel::SelectiveScanGrads got = grads_like(x.in, dtype, true), want = grads_like(x.in, rd, false);
        kernel::selective_scan_backward_kernel(kGpu, on_gpu(x.dy), on_gpu(x.dfinal), gin, ckpt, p, got);
        kernel::selective_scan_backward_kernel(kCpu, as_reference(x.dy), as_reference(x.dfinal), cin, ckpt_ref, p, want);
        expect_close(got.du, want.du, tol, what + " du");
        expect_close(got.ddelta, want.ddelta, tol, what + " ddelta");
        expect_close(got.dA, want.dA, tol, what + " dA");
        expect_close(got.dB, want.dB, tol, what + " dB");
        expect_close(got.dC, want.dC, tol, what + " dC");
        expect_close(got.dD, want.dD, tol, what + " dD");
        expect_close(got.dz, want.dz, tol, what + " dz");
        expect_close(got.ddelta_bias, want.ddelta_bias, tol, what + " ddelta_bias");
        expect_close(got.dinitial_state, want.dinitial_state, tol, what + " dinitial_state");
      }
    }
  }
}

// Through the differentiable op on the GPU: decoding token by token from the returned state gives the
// full sequence's outputs and final state.
TEST_F(CudaSelectiveScanVsCpu, DecodeStepsMatchTheFullSequence) {
  const Case c{2, 12, 6, 8, 5, true};
  const SelectiveScanData x = make_selective_scan_data(c, DType::f32, gen_);
  const kernel::SelectiveScanInputs g = inputs_on(x.in, true);
  const SelectiveScanOutput full = selective_scan(g.u, g.delta, g.A, g.B, g.C, g.D, g.z, g.delta_bias,
                                                  g.initial_state, {SelectiveScanForm::chunked, 5, true});
  Tensor state = g.initial_state;
  for (int64_t t = 0; t < c.T; ++t) {
    auto step = [&](const Tensor& a) { return kernel::contiguous(kernel::narrow(a, 1, t, 1)); };
    const SelectiveScanOutput one = selective_scan(step(g.u), step(g.delta), g.A, step(g.B), step(g.C), g.D,
                                                   step(g.z), g.delta_bias, state, {SelectiveScanForm::recurrent, 64, true});
    expect_close(one.y, kernel::to_device(step(full.y), kCpu), 1e-5, "y at t = " + std::to_string(t));
    state = one.final_state;
  }
  expect_close(state, kernel::to_device(full.final_state, kCpu), 1e-5, "state after decoding");
}

TEST_F(CudaSelectiveScanVsCpu, StateSizesBeyond64AreAClearError) {
  const Case c{1, 3, 2, 65, 4, false};
  const SelectiveScanData x = make_selective_scan_data(c, DType::f32, gen_);
  const kernel::SelectiveScanInputs g = inputs_on(x.in, true);
  try {
    selective_scan(g.u, g.delta, g.A, g.B, g.C);
    FAIL() << "N = 65 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("state sizes up to 64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab::testing
