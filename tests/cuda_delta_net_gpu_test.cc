// CUDA against CPU for the DeltaNet / Gated DeltaNet slots (src/cuda/delta_net.cu against the CPU kernels
// of both forms in src/layers/delta_net.cpp). Skipped where no GPU is usable.
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
#include "layers/delta_net.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using testing::kGpu;
using testing::poisoned;
using testing::reference_type;
using testing::kCpu;
using testing::kFloatTypes;

double rtol(DType d) { return testing::fused_op_rtol(d); }

using testing::as_reference;
using testing::on_gpu;

using testing::expect_close;

Tensor unit_rows(const Shape& shape, Generator& gen, DType dtype) {
  std::vector<double> x = Tensor::randn(shape, gen, DType::f64).to_doubles();
  const size_t d = static_cast<size_t>(shape.back());
  for (size_t r = 0; r < x.size(); r += d) {
    double n2 = 0;
    for (size_t i = 0; i < d; ++i) n2 += x[r + i] * x[r + i];
    for (size_t i = 0; i < d; ++i) x[r + i] /= std::sqrt(n2);
  }
  return Tensor::from_vector(x, shape, dtype);
}

struct Case {
  int64_t B, T, H, dk, dv;
  bool gated, init;
  double scale;  // ≤ 0: 1/√dk
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) + (gated ? " gated" : "") +
           (init ? " initial_state" : "");
  }
};

const Case kCases[] = {
    {2, 70, 3, 16, 24, true, true, 0},    // several segments, the last partial; dk ≠ dv
    {1, 1, 2, 5, 7, true, true, 0},       // one token (decoding from a state)
    {2, 33, 2, 8, 8, false, true, 0},     // DeltaNet (no gate)
    {1, 32, 2, 12, 4, true, false, 0.7},  // one whole segment, no initial state, explicit scale
    {1, 64, 1, 6, 10, false, false, 0},   // two whole segments
    {2, 9, 2, 1, 3, true, true, 0},       // dk = 1
    {1, 40, 1, 128, 128, true, true, 0},  // the largest head dims
    {1, 35, 2, 32, 96, true, true, 0},   {1, 20, 1, 100, 3, false, true, 0},  // dk much larger than dv
    {4, 300, 4, 64, 64, true, true, 0},  // a training-like shape, many forward blocks
};

struct Data {
  Tensor q, k, v, beta, g, s0, dout, dfinal;
};

Data make_data(const Case& c, DType dtype, Generator& gen) {
  Data x;
  x.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.k = unit_rows({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.beta = Tensor::rand({c.B, c.T, c.H}, gen, dtype, 0.05, 0.95);
  if (c.gated) x.g = Tensor::rand({c.B, c.T, c.H}, gen, dtype, -1.0, -0.02);
  if (c.init) x.s0 = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  x.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  return x;
}

kernel::DeltaNetParams params(const Case& c, DeltaNetForm form) {
  return {form, 16, c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.dk))};
}

kernel::DeltaNetGrads grads_like(const Data& x, DType dtype, bool gpu) {
  auto make = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return Tensor();
    return gpu ? poisoned(t.shape(), dtype) : Tensor::empty(t.shape(), dtype);
  };
  return {make(x.q), make(x.k), make(x.v), make(x.beta), make(x.g), make(x.s0)};
}

class CudaDeltaNetVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 77};
};

TEST_F(CudaDeltaNetVsCpu, ForwardAndBackwardBothForms) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      const Data x = make_data(c, dtype, gen_);
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
        expect_close(o, o_ref, rtol(dtype), what + " o");
        expect_close(fin, fin_ref, rtol(dtype), what + " final_state");

        kernel::DeltaNetGrads got = grads_like(x, dtype, true), want = grads_like(x, rd, false);
        kernel::delta_net_backward_kernel(kGpu, on_gpu(x.dout), on_gpu(x.dfinal), on_gpu(x.q), on_gpu(x.k), on_gpu(x.v),
                                          on_gpu(x.beta), on_gpu(x.g), on_gpu(x.s0), p, got);
        kernel::delta_net_backward_kernel(kCpu, as_reference(x.dout), as_reference(x.dfinal), as_reference(x.q),
                                          as_reference(x.k), as_reference(x.v), as_reference(x.beta), as_reference(x.g),
                                          as_reference(x.s0), p, want);
        expect_close(got.dq, want.dq, rtol(dtype), what + " dq");
        expect_close(got.dk, want.dk, rtol(dtype), what + " dk");
        expect_close(got.dv, want.dv, rtol(dtype), what + " dv");
        expect_close(got.dbeta, want.dbeta, rtol(dtype), what + " dbeta");
        expect_close(got.dg, want.dg, rtol(dtype), what + " dg");
        expect_close(got.dinitial_state, want.dinitial_state, rtol(dtype), what + " dinitial_state");
      }
    }
  }
}

// Through the differentiable op on the GPU: decoding token by token from the returned state gives the
// full sequence's outputs (the state contract of the slots), and gradients reach every input.
TEST_F(CudaDeltaNetVsCpu, DecodeStepsMatchTheFullSequence) {
  const Case c{2, 12, 2, 16, 8, true, true, 0};
  const Data x = make_data(c, DType::f32, gen_);
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
  const Data x = make_data(c, DType::f32, gen_);
  const kernel::DeltaNetParams p = params(c, DeltaNetForm::chunkwise);
  std::vector<std::vector<double>> first;
  for (int run = 0; run < 2; ++run) {
    kernel::DeltaNetGrads g = grads_like(x, DType::f32, true);
    kernel::delta_net_backward_kernel(kGpu, on_gpu(x.dout), on_gpu(x.dfinal), on_gpu(x.q), on_gpu(x.k), on_gpu(x.v),
                                      on_gpu(x.beta), on_gpu(x.g), on_gpu(x.s0), p, g);
    const Tensor* all[] = {&g.dq, &g.dk, &g.dv, &g.dbeta, &g.dg, &g.dinitial_state};
    for (size_t i = 0; i < 6; ++i) {
      if (run == 0) {
        first.push_back(all[i]->to_doubles());
      } else {
        EXPECT_EQ(all[i]->to_doubles(), first[i]) << "gradient " << i << " changed between runs";
      }
    }
  }
}

TEST_F(CudaDeltaNetVsCpu, HeadDimsBeyond128AreAClearError) {
  const Case c{1, 3, 1, 129, 4, false, false, 0};
  const Data x = make_data(c, DType::f32, gen_);
  try {
    delta_net(on_gpu(x.q), on_gpu(x.k), on_gpu(x.v), on_gpu(x.beta));
    FAIL() << "dk = 129 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seqlab
