// CUDA against CPU for the SSD slots (src/cuda/ssm/ssd.cu running src/cuda/ssm/ssd_kernels.cuh, against the
// CPU kernels of src/layers/ssm/ssd.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh random x, Δ, A, B, C (and D, the initial state, dy, dfinal) in the dtype under test,
// fills every CUDA output with NaN first (an element the kernels fail to write shows up), and compares y,
// final_state and the gradients of every input with the CPU slots of both forms (the CUDA kernels compute
// both forms the same way). For bf16 the CPU reference runs in f32 on the same bf16 values.
// Shapes: T not a multiple of the √T segment, T = 1, P and N beyond a block of 128 threads, G = 1,
// 1 < G < H and G = H, mamba2_small's heads (P = N = 64) over T = 300; Δ from 1e-4 to 10.
// Tolerance fused_op_rtol: 1e-4 for f32, 1e-10 for f64, 2e-2 for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/ssm/ssd.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

struct Case {
  int64_t B, T, H, P, G, N;
  double dt_lo, dt_hi;
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " P" + std::to_string(P) +
           " G" + std::to_string(G) + " N" + std::to_string(N) + " dt [" + std::to_string(dt_lo) + ", " +
           std::to_string(dt_hi) + "]";
  }
};

const Case kCases[] = {
    {2, 37, 4, 3, 2, 5, 0.05, 1.2},   // segments of 7 and a partial one; 1 < G < H
    {1, 1, 2, 5, 1, 7, 0.05, 1.2},    // T = 1 (the decode step)
    {1, 9, 3, 130, 3, 4, 0.05, 1.2},  // P beyond a block; G = H
    {2, 20, 2, 4, 1, 131, 0.05, 1.2}, // N beyond a block
    {1, 40, 4, 6, 2, 8, 1e-4, 10.0},  // Δ from 1e-4 to 10 (log-decays down to −30)
    {2, 300, 8, 64, 1, 64, 1e-3, 0.1},  // mamba2_small's heads
};

struct Inputs {
  Tensor x, dt, A, Bm, Cm, D, h0;
};

Inputs make_inputs(const Case& c, DType dtype, bool with_D, bool with_h0, Generator& gen) {
  std::vector<double> dtv(static_cast<size_t>(c.B * c.T * c.H));
  for (double& v : dtv) v = std::exp(std::log(c.dt_lo) + gen.uniform() * std::log(c.dt_hi / c.dt_lo));
  Inputs in;
  in.x = Tensor::randn({c.B, c.T, c.H, c.P}, gen, dtype);
  in.dt = Tensor::from_vector(dtv, {c.B, c.T, c.H}, dtype);
  in.A = Tensor::rand({c.H}, gen, dtype, -3.0, -0.01);
  in.Bm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype);
  in.Cm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype);
  if (with_D) in.D = Tensor::randn({c.H}, gen, dtype);
  if (with_h0) in.h0 = Tensor::randn({c.B, c.H, c.P, c.N}, gen, dtype);
  return in;
}

using CudaSsdVsCpu = VariantGpuTest<79>;

template <class Body>
void for_each_combination(Body&& body) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      for (bool optional : {false, true}) {
        for (SsdForm form : {SsdForm::chunkwise, SsdForm::recurrent}) {
          body(dtype, c, optional, form,
               std::string(dtype_name(dtype)) + " " + c.name() + (optional ? " D h0" : "") + " " + ssd_form_name(form));
        }
      }
    }
  }
}

TEST_F(CudaSsdVsCpu, ForwardAndBackward) {
  for_each_combination([&](DType dtype, const Case& c, bool optional, SsdForm form, const std::string& what) {
    const double tol = fused_op_rtol(dtype);
    const DType rd = reference_type(dtype);
    const Inputs in = make_inputs(c, dtype, optional, optional, gen_);
    const kernel::SsdParams p{form, 16};
    const Shape s_shape{c.B, c.H, c.P, c.N};
    Tensor y = poisoned(in.x.shape(), dtype), fs = poisoned(s_shape, dtype);
    kernel::ssd_forward_kernel(kGpu, on_gpu(in.x), on_gpu(in.dt), on_gpu(in.A), on_gpu(in.Bm), on_gpu(in.Cm),
                               on_gpu(in.D), on_gpu(in.h0), p, y, fs);
    Tensor y_ref = Tensor::empty(y.shape(), rd), fs_ref = Tensor::empty(s_shape, rd);
    kernel::ssd_forward_kernel(kCpu, as_reference(in.x), as_reference(in.dt), as_reference(in.A), as_reference(in.Bm),
                               as_reference(in.Cm), as_reference(in.D), as_reference(in.h0), p, y_ref, fs_ref);
    expect_close(y, y_ref, tol, what + " y");
    expect_close(fs, fs_ref, tol, what + " final_state");

    const Tensor dy = Tensor::randn(in.x.shape(), gen_, dtype), dfinal = Tensor::randn(s_shape, gen_, dtype);
    kernel::SsdGrads got, want;
    got.dx = poisoned(in.x.shape(), dtype), want.dx = Tensor::empty(in.x.shape(), rd);
    got.ddt = poisoned(in.dt.shape(), dtype), want.ddt = Tensor::empty(in.dt.shape(), rd);
    got.dA = poisoned(in.A.shape(), dtype), want.dA = Tensor::empty(in.A.shape(), rd);
    got.dB = poisoned(in.Bm.shape(), dtype), want.dB = Tensor::empty(in.Bm.shape(), rd);
    got.dC = poisoned(in.Cm.shape(), dtype), want.dC = Tensor::empty(in.Cm.shape(), rd);
    if (optional) {
      got.dD = poisoned(in.D.shape(), dtype), want.dD = Tensor::empty(in.D.shape(), rd);
      got.dinitial_state = poisoned(s_shape, dtype), want.dinitial_state = Tensor::empty(s_shape, rd);
    }
    kernel::ssd_backward_kernel(kGpu, on_gpu(dy), on_gpu(dfinal), on_gpu(in.x), on_gpu(in.dt), on_gpu(in.A),
                                on_gpu(in.Bm), on_gpu(in.Cm), on_gpu(in.D), on_gpu(in.h0), p, got);
    kernel::ssd_backward_kernel(kCpu, as_reference(dy), as_reference(dfinal), as_reference(in.x), as_reference(in.dt),
                                as_reference(in.A), as_reference(in.Bm), as_reference(in.Cm), as_reference(in.D),
                                as_reference(in.h0), p, want);
    expect_close(got.dx, want.dx, tol, what + " → dx");
    expect_close(got.ddt, want.ddt, tol, what + " → ddt");
    expect_close(got.dA, want.dA, tol, what + " → dA");
    expect_close(got.dB, want.dB, tol, what + " → dB");
    expect_close(got.dC, want.dC, tol, what + " → dC");
    if (optional) {
      expect_close(got.dD, want.dD, tol, what + " → dD");
      expect_close(got.dinitial_state, want.dinitial_state, tol, what + " → d initial_state");
    }
  });
}

// The kernels are deterministic: the same inputs give the same bits, forward and backward.
TEST_F(CudaSsdVsCpu, Deterministic) {
  const Case c{2, 77, 4, 40, 2, 24, 0.01, 1.0};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Inputs in = make_inputs(c, dtype, true, true, gen_);
    const Tensor x = on_gpu(in.x), dt = on_gpu(in.dt), A = on_gpu(in.A), Bm = on_gpu(in.Bm), Cm = on_gpu(in.Cm),
                 D = on_gpu(in.D), h0 = on_gpu(in.h0);
    const Tensor dy = on_gpu(Tensor::randn(in.x.shape(), gen_, dtype));
    const Tensor dfinal = on_gpu(Tensor::randn({c.B, c.H, c.P, c.N}, gen_, dtype));
    const kernel::SsdParams p{SsdForm::chunkwise, 64};
    expect_same_bits_twice(
        [&] {
          Tensor y = poisoned(x.shape(), dtype), fs = poisoned(h0.shape(), dtype);
          kernel::ssd_forward_kernel(kGpu, x, dt, A, Bm, Cm, D, h0, p, y, fs);
          kernel::SsdGrads gr{poisoned(x.shape(), dtype),  poisoned(dt.shape(), dtype), poisoned(A.shape(), dtype),
                              poisoned(Bm.shape(), dtype), poisoned(Cm.shape(), dtype), poisoned(D.shape(), dtype),
                              poisoned(h0.shape(), dtype)};
          kernel::ssd_backward_kernel(kGpu, dy, dfinal, x, dt, A, Bm, Cm, D, h0, p, gr);
          return std::vector<Tensor>{y, fs, gr.dx, gr.ddt, gr.dA, gr.dB, gr.dC, gr.dD, gr.dinitial_state};
        },
        dtype_name(dtype), true);
  }
}

// Through the differentiable op on GPU tensors: outputs and every input's gradient as on the CPU.
TEST_F(CudaSsdVsCpu, DifferentiableOp) {
  const Case c{2, 21, 4, 12, 2, 10, 0.05, 1.0};
  const Inputs in = make_inputs(c, DType::f32, true, true, gen_);
  const Tensor dy = Tensor::randn(in.x.shape(), gen_), dfinal = Tensor::randn({c.B, c.H, c.P, c.N}, gen_);
  const SsdOptions opts{SsdForm::chunkwise, 8};
  std::vector<Tensor> grads[2];
  SsdOutput outs[2];
  for (int side = 0; side < 2; ++side) {
    auto dev = [&](const Tensor& t) { return set_requires_grad((side == 0 ? on_gpu(t) : t).detach()); };
    std::vector<Tensor> x = {dev(in.x), dev(in.dt), dev(in.A), dev(in.Bm), dev(in.Cm), dev(in.D), dev(in.h0)};
    outs[side] = ssd(x[0], x[1], x[2], x[3], x[4], x[5], x[6], opts);
    backward({outs[side].y, outs[side].final_state}, {side == 0 ? on_gpu(dy) : dy, side == 0 ? on_gpu(dfinal) : dfinal});
    for (const Tensor& t : x) grads[side].push_back(grad_of(t));
  }
  expect_close(outs[0].y, outs[1].y, 1e-4, "ssd y");
  expect_close(outs[0].final_state, outs[1].final_state, 1e-4, "ssd final_state");
  const char* names[7] = {"x", "dt", "A", "B", "C", "D", "initial_state"};
  for (int i = 0; i < 7; ++i) expect_close(grads[0][i], grads[1][i], 1e-4, std::string("ssd d") + names[i]);
}

}  // namespace
}  // namespace seqlab::testing
