// CUDA against CPU for the retention slots (src/cuda/scan/retention.cu running the schedule of
// src/cuda/scan/gated_scan_schedule.h with a constant decay per head, against the CPU kernels of
// src/layers/scan/retention.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random q, k, v, s0 (and dO, dS) in the dtype under test, fills every CUDA output
// with NaN first (an element the kernels fail to write shows up), and compares o, the final state, dq,
// dk, dv and ds0 with the CPU slots of each form (parallel, chunkwise, recurrent; the CUDA kernels compute
// all three the same way). For bf16 the CPU reference runs in f32 on the same bf16 values.
// Shapes: T not a multiple of the 16-step segment, T below a segment, T = 1, dk ≠ dv, dv over several
// 32-column tiles, head dims 128; RetNet's default decays and γ = 0, γ = 1; zero and random s0.
// Tolerance |got − want| ≤ rtol · max(|want|, 1): 1e-4 for f32 (γ^n by repeated products here, by
// std::pow on the CPU; sums in a different order), 1e-10 for f64, 2e-2 for bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/scan/retention.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

using Case = RetentionCase;

const std::vector<Case> kCases = {
    {2, 37, 3, 16, 16, {}},                // segments of 16 and a partial one
    {1, 1, 2, 5, 7, {}},                   // T = 1 (the decode step)
    {2, 50, 2, 20, 40, {0.0, 1.0}},        // γ = 0 and γ = 1; dk ≠ dv, two column tiles
    {1, 12, 3, 3, 70, {0.5, 0.9, 0.999}},  // T below a segment, three tiles
    {1, 33, 2, 128, 128, {}},              // the largest head dims
    {2, 150, 4, 64, 64, {}},               // many segments
};

const RetentionForm kForms[] = {RetentionForm::parallel, RetentionForm::chunkwise, RetentionForm::recurrent};
const char* form_name(RetentionForm f) {
  return f == RetentionForm::parallel ? "parallel" : f == RetentionForm::chunkwise ? "chunkwise" : "recurrent";
}

kernel::RetentionParams params(const Case& c, RetentionForm form) {
  return {form, 16, 1.0 / std::sqrt(static_cast<double>(c.dk)),
          c.gammas.empty() ? retention_default_gammas(c.H) : c.gammas};
}

using CudaRetentionVsCpu = VariantGpuTest<67>;

TEST_F(CudaRetentionVsCpu, ForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    const double tol = fused_op_rtol(dtype);
    for (const Case& c : kCases) {
      for (bool random_s0 : {false, true}) {
        for (RetentionForm form : kForms) {
          const std::string what =
              std::string(dtype_name(dtype)) + " " + c.name() + (random_s0 ? " s0" : "") + " " + form_name(form);
          const DType rd = reference_type(dtype);
          const RetentionInputs x = make_retention_inputs(c, random_s0, dtype, gen_);
          const Tensor &q = x.q, &k = x.k, &v = x.v, &s0 = x.s0, &dout = x.dout, &ds = x.ds;
          const kernel::RetentionParams p = params(c, form);

          Tensor o = poisoned({c.B, c.T, c.H, c.dv}, dtype), s = poisoned({c.B, c.H, c.dk, c.dv}, dtype);
          kernel::retention_forward_kernel(kGpu, on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(s0), p, o, s);
          Tensor o_ref = Tensor::empty(o.shape(), rd), s_ref = Tensor::empty(s.shape(), rd);
          kernel::retention_forward_kernel(kCpu, as_reference(q), as_reference(k), as_reference(v), as_reference(s0), p,
                                           o_ref, s_ref);
          expect_close(o, o_ref, tol, what + " o");
          expect_close(s, s_ref, tol, what + " final state");

          Tensor dq = poisoned(q.shape(), dtype), dk = poisoned(k.shape(), dtype), dv = poisoned(v.shape(), dtype),
                 ds0 = poisoned(s0.shape(), dtype);
          kernel::retention_backward_kernel(kGpu, on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(s0), on_gpu(dout), on_gpu(ds),
                                            p, dq, dk, dv, ds0);
          Tensor dq_ref = Tensor::empty(q.shape(), rd), dk_ref = Tensor::empty(k.shape(), rd),
                 dv_ref = Tensor::empty(v.shape(), rd), ds0_ref = Tensor::empty(s0.shape(), rd);
          kernel::retention_backward_kernel(kCpu, as_reference(q), as_reference(k), as_reference(v), as_reference(s0),
                                            as_reference(dout), as_reference(ds), p, dq_ref, dk_ref, dv_ref, ds0_ref);
          expect_close(dq, dq_ref, tol, what + " → dq");
          expect_close(dk, dk_ref, tol, what + " → dk");
          expect_close(dv, dv_ref, tol, what + " → dv");
          expect_close(ds0, ds0_ref, tol, what + " → ds0");
        }
      }
    }
  }
}

// The same inputs give the same bits, forward and backward.
TEST_F(CudaRetentionVsCpu, Deterministic) {
  const Case c{2, 77, 3, 40, 72, {}};
  const kernel::RetentionParams p = params(c, RetentionForm::chunkwise);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const RetentionInputs x = make_retention_inputs(c, true, dtype, gen_);
    const Tensor q = on_gpu(x.q), k = on_gpu(x.k), v = on_gpu(x.v), s0 = on_gpu(x.s0), dout = on_gpu(x.dout),
                 ds = on_gpu(x.ds);
    expect_same_bits_twice(
        [&] {
          Tensor o = poisoned(dout.shape(), dtype), s = poisoned(s0.shape(), dtype);
          kernel::retention_forward_kernel(kGpu, q, k, v, s0, p, o, s);
          Tensor dq = poisoned(q.shape(), dtype), dk = poisoned(k.shape(), dtype), dv = poisoned(v.shape(), dtype),
                 ds0 = poisoned(s0.shape(), dtype);
          kernel::retention_backward_kernel(kGpu, q, k, v, s0, dout, ds, p, dq, dk, dv, ds0);
          return std::vector<Tensor>{o, s, dq, dk, dv, ds0};
        },
        dtype_name(dtype), true);
  }
}

// Through the differentiable op on GPU tensors (no initial state: the op passes zeros), outputs and the
// gradients of q, k, v as on the CPU; head dims beyond 128 refused with a clear message.
TEST_F(CudaRetentionVsCpu, DifferentiableOpAndHeadDimLimit) {
  const int64_t B = 2, T = 19, H = 3, dk = 8, dv = 12;
  const Tensor q = Tensor::randn({B, T, H, dk}, gen_), k = Tensor::randn({B, T, H, dk}, gen_),
               v = Tensor::randn({B, T, H, dv}, gen_), dout = Tensor::randn({B, T, H, dv}, gen_);
  std::vector<Tensor> grads[2];
  Tensor outs[2];
  for (int side = 0; side < 2; ++side) {
    auto dev = [&](const Tensor& t) { return set_requires_grad((side == 0 ? on_gpu(t) : t).detach()); };
    std::vector<Tensor> x = {dev(q), dev(k), dev(v)};
    RetentionOutput r = retention(x[0], x[1], x[2]);
    outs[side] = r.o.detach();
    backward({r.o}, {side == 0 ? on_gpu(dout) : dout});
    for (const Tensor& t : x) grads[side].push_back(grad_of(t));
  }
  expect_close(outs[0], outs[1], 1e-4, "retention o");
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) expect_close(grads[0][i], grads[1][i], 1e-4, std::string("retention d") + names[i]);

  const Tensor big = on_gpu(Tensor::randn({1, 3, 1, 129}, gen_));
  try {
    retention(big, big, on_gpu(Tensor::randn({1, 3, 1, 4}, gen_)));
    ADD_FAILURE() << "dk = 129 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab::testing
