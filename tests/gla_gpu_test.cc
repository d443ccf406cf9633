// CUDA against CPU for the GLA slots (src/cuda/scan/gla.cu running the schedule of src/cuda/scan/gated_scan_schedule.h,
// against the CPU kernels of src/layers/scan/gla.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random q, k, v, log-gates g (and gv, the initial state, dO, dfinal) in the dtype
// under test, fills every CUDA output with NaN first (an element the kernels fail to write shows up), and
// compares o, final_state and the gradients of every input with the CPU slots of the same form (the CUDA
// kernels compute both forms the same way). For bf16 the CPU reference runs in f32 on the same bf16 values,
// so the difference is the CUDA kernel's f32 arithmetic plus rounding the results to bf16.
// Shapes: T not a multiple of the 16-step segment, T below a segment, T = 1, dk ≠ dv, dk not a multiple
// of 8, dv over several 32-column tiles with a partial last one, head dims 128, strong gates; with and
// without gv and the initial state; every gradient and only some.
// Tolerance |got − want| ≤ rtol · max(|want|, 1): 1e-4 for f32 (sums over up to 128 terms and a recurrence
// over up to 150 steps in a different order, and a different exp), 1e-10 for f64, 2e-2 for bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/scan/gla.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

using Case = GlaCase;
using Inputs = GlaInputs;

const Case kCases[] = {
    {2, 37, 3, 16, 16, -1.5, -0.02},    // segments of 16 and a partial one
    {1, 1, 2, 5, 7, -1.5, -0.02},       // T = 1 (the decode step)
    {2, 50, 2, 20, 40, -1.0, -0.01},    // dk ≠ dv, dk not a multiple of 8, two column tiles
    {1, 12, 1, 3, 70, -0.5, -0.01},     // T below a segment, three tiles, the last of 6 columns
    {1, 33, 2, 128, 128, -0.3, -0.01},  // the largest head dims
    {2, 150, 4, 64, 64, -1.0, -0.01},   // gla_small's head size, many segments
    {1, 70, 2, 64, 48, -20, -10},       // strong gates
};

kernel::GlaParams params(GlaForm form, const Case& c) {
  return {form, 16, 8, 1.0 / std::sqrt(static_cast<double>(c.dk))};
}

using CudaGlaVsCpu = VariantGpuTest<53>;

// body(dtype, case, with_gv, with_h0, form, label) for every dtype, case, with and without gv and the
// initial state, and both forms, in that nesting order.
template <class Body>
void for_each_combination(Body&& body) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      for (bool with_gv : {false, true}) {
        for (bool with_h0 : {false, true}) {
          for (GlaForm form : {GlaForm::chunkwise, GlaForm::recurrent}) {
            body(dtype, c, with_gv, with_h0, form,
                 std::string(dtype_name(dtype)) + " " + c.name() + (with_gv ? " gv" : "") + (with_h0 ? " h0" : "") +
                     " " + gla_form_name(form));
          }
        }
      }
    }
  }
}

TEST_F(CudaGlaVsCpu, Forward) {
  for_each_combination(
      [&](DType dtype, const Case& c, bool with_gv, bool with_h0, GlaForm form, const std::string& what) {
        const double tol = fused_op_rtol(dtype);
        const Inputs in = make_gla_inputs(c, dtype, with_gv, with_h0, gen_);
        const kernel::GlaParams p = params(form, c);
        Tensor o = poisoned({c.B, c.T, c.H, c.dv}, dtype), fs = poisoned({c.B, c.H, c.dk, c.dv}, dtype);
        kernel::gla_forward_kernel(kGpu, on_gpu(in.q), on_gpu(in.k), on_gpu(in.v), on_gpu(in.g), on_gpu(in.gv),
                                   on_gpu(in.h0), p, o, fs);
        const DType rd = reference_type(dtype);
        Tensor o_ref = Tensor::empty(o.shape(), rd), fs_ref = Tensor::empty(fs.shape(), rd);
        kernel::gla_forward_kernel(kCpu, as_reference(in.q), as_reference(in.k), as_reference(in.v), as_reference(in.g),
                                   as_reference(in.gv), as_reference(in.h0), p, o_ref, fs_ref);
        expect_close(o, o_ref, tol, what + " o");
        expect_close(fs, fs_ref, tol, what + " final_state");
      });
}

TEST_F(CudaGlaVsCpu, BackwardAllAndSomeGradients) {
  for_each_combination([&](DType dtype, const Case& c, bool with_gv, bool with_h0, GlaForm form,
                           const std::string& label) {
    const double tol = fused_op_rtol(dtype);
    for (bool all : {true, false}) {
      const std::string what = label + (all ? " all gradients" : " dq, dk, dv only");
      const DType rd = reference_type(dtype);
      const Inputs in = make_gla_inputs(c, dtype, with_gv, with_h0, gen_);
      Tensor dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen_, dtype);
      Tensor dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen_, dtype);
      const kernel::GlaParams p = params(form, c);

      kernel::GlaGrads got, want;
      got.dq = poisoned(in.q.shape(), dtype), want.dq = Tensor::empty(in.q.shape(), rd);
      got.dk = poisoned(in.k.shape(), dtype), want.dk = Tensor::empty(in.k.shape(), rd);
      got.dv = poisoned(in.v.shape(), dtype), want.dv = Tensor::empty(in.v.shape(), rd);
      if (all) got.dg = poisoned(in.g.shape(), dtype), want.dg = Tensor::empty(in.g.shape(), rd);
      if (all && with_gv) got.dgv = poisoned(in.gv.shape(), dtype), want.dgv = Tensor::empty(in.gv.shape(), rd);
      if (all && with_h0) {
        got.dinitial_state = poisoned(in.h0.shape(), dtype);
        want.dinitial_state = Tensor::empty(in.h0.shape(), rd);
      }
      kernel::gla_backward_kernel(kGpu, on_gpu(dout), on_gpu(dfinal), on_gpu(in.q), on_gpu(in.k), on_gpu(in.v),
                                  on_gpu(in.g), on_gpu(in.gv), on_gpu(in.h0), p, got);
      kernel::gla_backward_kernel(kCpu, as_reference(dout), as_reference(dfinal), as_reference(in.q),
                                  as_reference(in.k), as_reference(in.v), as_reference(in.g), as_reference(in.gv),
                                  as_reference(in.h0), p, want);
      expect_close(got.dq, want.dq, tol, what + " → dq");
      expect_close(got.dk, want.dk, tol, what + " → dk");
      expect_close(got.dv, want.dv, tol, what + " → dv");
      if (got.dg.defined()) expect_close(got.dg, want.dg, tol, what + " → dg");
      if (got.dgv.defined()) expect_close(got.dgv, want.dgv, tol, what + " → dgv");
      if (got.dinitial_state.defined()) {
        expect_close(got.dinitial_state, want.dinitial_state, tol, what + " → d initial_state");
      }
    }
  });
}

// The kernels are deterministic: the same inputs give the same bits, forward and backward.
TEST_F(CudaGlaVsCpu, Deterministic) {
  const Case c{2, 77, 3, 40, 72, -1.0, -0.01};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Inputs in = make_gla_inputs(c, dtype, true, true, gen_);
    const Tensor q = on_gpu(in.q), k = on_gpu(in.k), v = on_gpu(in.v), g = on_gpu(in.g), gv = on_gpu(in.gv),
                 h0 = on_gpu(in.h0);
    const Tensor dout = on_gpu(Tensor::randn({c.B, c.T, c.H, c.dv}, gen_, dtype));
    const Tensor dfinal = on_gpu(Tensor::randn({c.B, c.H, c.dk, c.dv}, gen_, dtype));
    const kernel::GlaParams p = params(GlaForm::chunkwise, c);
    expect_same_bits_twice(
        [&] {
          Tensor o = poisoned({c.B, c.T, c.H, c.dv}, dtype), fs = poisoned({c.B, c.H, c.dk, c.dv}, dtype);
          kernel::gla_forward_kernel(kGpu, q, k, v, g, gv, h0, p, o, fs);
          kernel::GlaGrads gr{poisoned(q.shape(), dtype), poisoned(k.shape(), dtype),  poisoned(v.shape(), dtype),
                              poisoned(g.shape(), dtype), poisoned(gv.shape(), dtype), poisoned(h0.shape(), dtype)};
          kernel::gla_backward_kernel(kGpu, dout, dfinal, q, k, v, g, gv, h0, p, gr);
          return std::vector<Tensor>{o, fs, gr.dq, gr.dk, gr.dv, gr.dg, gr.dgv, gr.dinitial_state};
        },
        dtype_name(dtype), true);
  }
}

// Through the differentiable op on GPU tensors: outputs and every input's gradient as on the CPU, and
// head dims beyond the kernels' reach refused with a clear message.
TEST_F(CudaGlaVsCpu, DifferentiableOpAndHeadDimLimit) {
  const Case c{2, 21, 2, 12, 20, -1.0, -0.05};
  const Inputs in = make_gla_inputs(c, DType::f32, true, true, gen_);
  const Tensor dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen_), dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen_);
  GlaOptions opts;
  opts.chunk = 8;
  opts.sub_chunk = 4;
  std::vector<Tensor> grads[2];
  GlaOutput outs[2];
  for (int side = 0; side < 2; ++side) {
    auto dev = [&](const Tensor& t) { return set_requires_grad((side == 0 ? on_gpu(t) : t).detach()); };
    std::vector<Tensor> x = {dev(in.q), dev(in.k), dev(in.v), dev(in.g), dev(in.gv), dev(in.h0)};
    outs[side] = gla(x[0], x[1], x[2], x[3], x[4], x[5], opts);
    backward({outs[side].o, outs[side].final_state},
             {side == 0 ? on_gpu(dout) : dout, side == 0 ? on_gpu(dfinal) : dfinal});
    for (const Tensor& t : x) grads[side].push_back(grad_of(t));
  }
  expect_close(outs[0].o, outs[1].o, 1e-4, "gla o");
  expect_close(outs[0].final_state, outs[1].final_state, 1e-4, "gla final_state");
  const char* names[6] = {"q", "k", "v", "g", "gv", "initial_state"};
  for (int i = 0; i < 6; ++i) expect_close(grads[0][i], grads[1][i], 1e-4, std::string("gla d") + names[i]);

  const Tensor big = on_gpu(Tensor::randn({1, 3, 1, 129}, gen_));
  try {
    kernel::gla_forward(big, big, on_gpu(Tensor::randn({1, 3, 1, 4}, gen_)), big, Tensor(), Tensor(), opts);
    ADD_FAILURE() << "dk = 129 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab::testing
