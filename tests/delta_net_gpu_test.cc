// CUDA against CPU for the DeltaNet / Gated DeltaNet slots (src/cuda/delta/delta_net.cu against the CPU kernels
// of both forms in src/layers/delta/delta_net.cpp). Skipped where no GPU is usable.
//
// Each case draws random q, unit-norm k, v, β ∈ (0.05, 0.95), log-gates g ∈ (−1, −0.02) (gated cases),
// an initial state (where given), dO and dfinal in the dtype under test, fills every CUDA output with NaN
// first (an element the kernels fail to write shows up) and compares o, final_state and every gradient
// (dq, dk, dv, dβ, dg, dinitial_state) element by element with the CPU slots, for both forms (the CUDA
// kernels serve both with the recurrent schedule). The CPU takes f32 and f64; for bf16 the reference runs
// in f32 on the same bf16 values, so the difference is the CUDA f32 arithmetic plus rounding to bf16.
// Shapes: T not a multiple of the CPU chunk nor of the 32-step backward segment, T = 1, dk ≠ dv both
// ways, head dims from 1 to 128, several blocks of the forward grid, with and without gate and state.
// Tolerance |got − want| ≤ rtol · max(|want|, 1): 1e-4 for f32 (sums over up to 128 terms per step,
// carried through up to 300 steps, in another order than the CPU's), 1e-10 for f64, 2e-2 for bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "layers/delta/delta_net.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

using Case = DeltaNetCase;
using Data = DeltaNetData;

// The schedule test's cases, then a training-like shape over many forward blocks.
const std::vector<Case> kCases = cases_and(kDeltaNetCases, {{4, 300, 4, 64, 64, true, true, 0}});

kernel::DeltaNetParams params(const Case& c, DeltaNetForm form) { return {form, 16, c.resolved_scale()}; }

kernel::DeltaNetGrads grads_like(const Data& x, DType dtype, bool gpu) {
  auto make = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return Tensor();
    return gpu ? poisoned(t.shape(), dtype) : Tensor::empty(t.shape(), dtype);
  };
  return {make(x.q), make(x.k), make(x.v), make(x.beta), make(x.g), make(x.s0)};
}

using CudaDeltaNetVsCpu = VariantGpuTest<77>;

TEST_F(CudaDeltaNetVsCpu, ForwardAndBackwardBothForms) {
  for (DType dtype : kFloatTypes) {
    const double tol = fused_op_rtol(dtype);
    for (const Case& c : kCases) {
      const Data x = make_delta_net_data(c, dtype, gen_);
      for (DeltaNetForm form : {DeltaNetForm::chunkwise, DeltaNetForm::recurrent}) {
        const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " " + delta_net_form_name(form);
        const kernel::DeltaNetParams p = params(c, form);
        const DType rd = reference_type(dtype);

        Tensor o = poisoned({c.B, c.T, c.H, c.dv}, dtype), fin = poisoned({c.B, c.H, c.dk, c.dv}, dtype);
        kernel::delta_net_forward_kernel(kGpu, on_gpu(x.q), on_gpu(x.k), on_gpu(x.v), on_gpu(x.beta), on_gpu(x.g),
                                         on_gpu(x.s0), p, o, fin);
        Tensor o_ref = Tensor::empty(o.shape(), rd), fin_ref = Tensor::empty(fin.shape(), rd);
        kernel::delta_net_forward_kernel(kCpu, as_reference(x.q), as_reference(x.k), as_reference(x.v),
                                         as_reference(x.beta), as_reference(x.g), as_reference(x.s0), p, o_ref,
                                         fin_ref);
        expect_close(o, o_ref, tol, what + " o");
        expect_close(fin, fin_ref, tol, what + " final_state");

        kernel::DeltaNetGrads got = grads_like(x, dtype, true), want = grads_like(x, rd, false);
        kernel::delta_net_backward_kernel(kGpu, on_gpu(x.dout), on_gpu(x.dfinal), on_gpu(x.q), on_gpu(x.k), on_gpu(x.v),
                                          on_gpu(x.beta), on_gpu(x.g), on_gpu(x.s0), p, got);
        kernel::delta_net_backward_kernel(kCpu, as_reference(x.dout), as_reference(x.dfinal), as_reference(x.q),
                                          as_reference(x.k), as_reference(x.v), as_reference(x.beta), as_reference(x.g),
                                          as_reference(x.s0), p, want);
        expect_close(got.dq, want.dq, tol, what + " dq");
        expect_close(got.dk, want.dk, tol, what + " dk");
        expect_close(got.dv, want.dv, tol, what + " dv");
        expect_close(got.dbeta, want.dbeta, tol, what + " dbeta");
        expect_close(got.dg, want.dg, tol, what + " dg");
        expect_close(got.dinitial_state, want.dinitial_state, tol, what + " dinitial_state");
      }
    }
  }
}

// Through the differentiable op on the GPU: decoding token by token from the returned state gives the
// full sequence's outputs (the state contract of the slots), and gradients reach every input.
TEST_F(CudaDeltaNetVsCpu, DecodeStepsMatchTheFullSequence) {
  const Case c{2, 12, 2, 16, 8, true, true, 0};
  const Data x = make_delta_net_data(c, DType::f32, gen_);
  const DeltaNetOutput full = delta_net(on_gpu(x.q), on_gpu(x.k), on_gpu(x.v), on_gpu(x.beta), on_gpu(x.g),
                                        on_gpu(x.s0), {DeltaNetForm::chunkwise, 5, 0});
  Tensor state = on_gpu(x.s0);
  const std::vector<double> o_full = full.o.to_doubles();
  for (int64_t t = 0; t < c.T; ++t) {
    auto step = [&](const Tensor& a) { return kernel::contiguous(kernel::narrow(on_gpu(a), 1, t, 1)); };
    const DeltaNetOutput one =
        delta_net(step(x.q), step(x.k), step(x.v), step(x.beta), step(x.g), state, {DeltaNetForm::recurrent, 64, 0});
    const std::vector<double> o1 = one.o.to_doubles();
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.H; ++h) {
        for (int64_t j = 0; j < c.dv; ++j) {
          const double want = o_full[static_cast<size_t>(((b * c.T + t) * c.H + h) * c.dv + j)];
          EXPECT_NEAR(o1[static_cast<size_t>((b * c.H + h) * c.dv + j)], want, 1e-5 * std::max(1.0, std::fabs(want)))
              << "t=" << t;
        }
      }
    }
    state = one.final_state;
  }
  expect_close(state, kernel::to_device(full.final_state, kGpu), 1e-5, "state after decoding");
}

// The backward writes the same bits on every run (no atomics, fixed summation orders).
TEST_F(CudaDeltaNetVsCpu, BackwardIsDeterministic) {
  const Case c{2, 77, 3, 32, 48, true, true, 0};
  const Data x = make_delta_net_data(c, DType::f32, gen_);
  const kernel::DeltaNetParams p = params(c, DeltaNetForm::chunkwise);
  expect_same_bits_twice(
      [&] {
        kernel::DeltaNetGrads g = grads_like(x, DType::f32, true);
        kernel::delta_net_backward_kernel(kGpu, on_gpu(x.dout), on_gpu(x.dfinal), on_gpu(x.q), on_gpu(x.k), on_gpu(x.v),
                                          on_gpu(x.beta), on_gpu(x.g), on_gpu(x.s0), p, g);
        return std::vector<Tensor>{g.dq, g.dk, g.dv, g.dbeta, g.dg, g.dinitial_state};
      },
      "backward", false);
}

TEST_F(CudaDeltaNetVsCpu, HeadDimsBeyond128AreAClearError) {
  const Case c{1, 3, 1, 129, 4, false, false, 0};
  const Data x = make_delta_net_data(c, DType::f32, gen_);
  try {
    delta_net(on_gpu(x.q), on_gpu(x.k), on_gpu(x.v), on_gpu(x.beta));
    FAIL() << "dk = 129 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab::testing
