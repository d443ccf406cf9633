// CUDA against CPU for the linear attention and Performer feature slots (src/cuda/linear/linear_attention.cu
// against the CPU kernels in src/layers/linear/linear_attention.cpp). Skipped where no GPU is usable.
//
// Linear attention: random positive fq, fk (as the feature maps give them), v, an initial state and
// normaliser (or zeros), dO, dS_T, dz_T; every CUDA output starts as NaN (an unwritten element shows up);
// o, final_state, final_normalizer and dfq, dfk, dv, ds0, dz0 are compared element by element with the
// CPU slots for every form (the CUDA kernels run the causal schedule for chunkwise and recurrent and
// the non-causal one for noncausal), normalised or not. Performer: y, dx and dω with and without
// stabilize, N over several 256-row blocks of the dω sums (rows are few enough that a near-tie of the
// arg-max, which would send the stabilised gradient to another feature on one side, is unlikely).
// Tolerance |got − want| ≤ rtol · max(|want|, 1). f32: rtol 1e-4·max(1, √(T/64)) against the f64 CPU
// kernels on the same f32 values (so only the CUDA rounding counts; linear_attention_f32_rtol in
// variant_cases.h says why it grows with T: 1.5e-4 measured at T = 300 on an H200); f64: 1e-10; bf16:
// 2e-2 against the f32 CPU kernels on the same bf16 values.
// Shapes: T across the 32-step backward tile, T = 1, dk ≠ dv both ways, head dims 1 to 128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/linear/linear_attention.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

// The CPU reference runs in f64 for f32 and f64 inputs, in f32 for bf16 (the CPU kernels take no bf16).
DType ref_type(DType d) { return d == DType::bf16 ? DType::f32 : DType::f64; }
Tensor as_ref(const Tensor& x) { return kernel::to_dtype(x, ref_type(x.dtype())); }  // f64 for f32

using Case = LinearAttentionCase;
using Data = LinearAttentionData;

// The schedule test's cases, then a training-like shape.
const std::vector<Case> kCases = cases_and(kLinearAttentionCases, {{4, 300, 4, 64, 64, true}});

using CudaLinearAttentionVsCpu = VariantGpuTest<91>;

TEST_F(CudaLinearAttentionVsCpu, EveryFormForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      const double tol = dtype == DType::f32 ? linear_attention_f32_rtol(c.T) : fused_op_rtol(dtype);
      const Data x = make_linear_attention_data(c, dtype, gen_);
      for (LinearAttentionForm form :
           {LinearAttentionForm::chunkwise, LinearAttentionForm::recurrent, LinearAttentionForm::noncausal}) {
        for (bool normalize : {true, false}) {
          const kernel::LinearAttentionParams p{form, normalize, 1e-6, 16};
          const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " form " +
                                   std::to_string(static_cast<int>(form)) + (normalize ? " normalized" : "");
          const DType rd = ref_type(dtype);
          Tensor o = poisoned(x.dout.shape(), dtype), s = poisoned(x.s0.shape(), dtype),
                 z = poisoned(x.z0.shape(), dtype);
          kernel::linear_attention_forward_kernel(kGpu, on_gpu(x.fq), on_gpu(x.fk), on_gpu(x.v), on_gpu(x.s0),
                                                  on_gpu(x.z0), p, o, s, z);
          Tensor o_ref = Tensor::empty(o.shape(), rd), s_ref = Tensor::empty(s.shape(), rd),
                 z_ref = Tensor::empty(z.shape(), rd);
          kernel::linear_attention_forward_kernel(kCpu, as_ref(x.fq), as_ref(x.fk), as_ref(x.v), as_ref(x.s0),
                                                  as_ref(x.z0), p, o_ref, s_ref, z_ref);
          expect_close(o, o_ref, tol, what + " o");
          expect_close(s, s_ref, tol, what + " final_state");
          expect_close(z, z_ref, tol, what + " final_normalizer");

          Tensor dfq = poisoned(x.fq.shape(), dtype), dfk = poisoned(x.fk.shape(), dtype),
                 dv = poisoned(x.v.shape(), dtype), ds0 = poisoned(x.s0.shape(), dtype),
                 dz0 = poisoned(x.z0.shape(), dtype);
          kernel::linear_attention_backward_kernel(kGpu, on_gpu(x.fq), on_gpu(x.fk), on_gpu(x.v), on_gpu(x.s0),
                                                   on_gpu(x.z0), on_gpu(x.dout), on_gpu(x.ds), on_gpu(x.dz), p, dfq,
                                                   dfk, dv, ds0, dz0);
          Tensor r[5] = {Tensor::empty(x.fq.shape(), rd), Tensor::empty(x.fk.shape(), rd),
                         Tensor::empty(x.v.shape(), rd), Tensor::empty(x.s0.shape(), rd),
                         Tensor::empty(x.z0.shape(), rd)};
          kernel::linear_attention_backward_kernel(kCpu, as_ref(x.fq), as_ref(x.fk), as_ref(x.v), as_ref(x.s0),
                                                   as_ref(x.z0), as_ref(x.dout), as_ref(x.ds), as_ref(x.dz), p, r[0],
                                                   r[1], r[2], r[3], r[4]);
          expect_close(dfq, r[0], tol, what + " dfq");
          expect_close(dfk, r[1], tol, what + " dfk");
          expect_close(dv, r[2], tol, what + " dv");
          expect_close(ds0, r[3], tol, what + " ds0");
          expect_close(dz0, r[4], tol, what + " dz0");
        }
      }
    }
  }
}

// The backward writes the same bits on every run (no atomics, fixed summation orders).
TEST_F(CudaLinearAttentionVsCpu, BackwardIsDeterministic) {
  const Case c{2, 77, 3, 32, 48, true};
  const Data x = make_linear_attention_data(c, DType::f32, gen_);
  for (LinearAttentionForm form : {LinearAttentionForm::chunkwise, LinearAttentionForm::noncausal}) {
    const kernel::LinearAttentionParams p{form, true, 1e-6, 64};
    expect_same_bits_twice(
        [&] {
          std::vector<Tensor> g = {poisoned(x.fq.shape(), DType::f32), poisoned(x.fk.shape(), DType::f32),
                                   poisoned(x.v.shape(), DType::f32), poisoned(x.s0.shape(), DType::f32),
                                   poisoned(x.z0.shape(), DType::f32)};
          kernel::linear_attention_backward_kernel(kGpu, on_gpu(x.fq), on_gpu(x.fk), on_gpu(x.v), on_gpu(x.s0),
                                                   on_gpu(x.z0), on_gpu(x.dout), on_gpu(x.ds), on_gpu(x.dz), p, g[0],
                                                   g[1], g[2], g[3], g[4]);
          return g;
        },
        std::string("backward form ") + std::to_string(static_cast<int>(form)), false);
  }
}

TEST_F(CudaLinearAttentionVsCpu, HeadDimsBeyond128AreAClearError) {
  const Case c{1, 3, 1, 4, 130, false};
  const Data x = make_linear_attention_data(c, DType::f32, gen_);
  Tensor o = poisoned(x.dout.shape(), DType::f32), s = poisoned(x.s0.shape(), DType::f32),
         z = poisoned(x.z0.shape(), DType::f32);
  try {
    kernel::linear_attention_forward_kernel(kGpu, on_gpu(x.fq), on_gpu(x.fk), on_gpu(x.v), on_gpu(x.s0), on_gpu(x.z0),
                                            kernel::LinearAttentionParams{}, o, s, z);
    FAIL() << "dv = 130 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

TEST_F(CudaLinearAttentionVsCpu, PerformerFeaturesForwardAndBackward) {
  struct PCase {
    int64_t B, L, H, d, m;
  };
  for (DType dtype : kFloatTypes) {
    const double tol = fused_op_rtol(dtype);
    for (PCase pc : {PCase{2, 70, 2, 8, 16}, PCase{1, 5, 3, 16, 16}, PCase{1, 3, 1, 12, 5}, PCase{1, 1, 1, 1, 3},
                     PCase{2, 100, 2, 64, 128}}) {
      for (bool stabilize : {false, true}) {
        const std::string what = std::string(dtype_name(dtype)) + " N=" + std::to_string(pc.B * pc.L * pc.H) +
                                 " d=" + std::to_string(pc.d) + " m=" + std::to_string(pc.m) +
                                 (stabilize ? " stabilized" : "");
        const DType rd = ref_type(dtype);
        const Tensor x = Tensor::randn({pc.B, pc.L, pc.H, pc.d}, gen_, dtype, 0.5);
        const Tensor omega = Tensor::randn({pc.m, pc.d}, gen_, dtype);
        const Tensor dy = Tensor::randn({pc.B, pc.L, pc.H, pc.m}, gen_, dtype);
        Tensor y = poisoned(dy.shape(), dtype), y_ref = Tensor::empty(dy.shape(), rd);
        kernel::performer_forward_kernel(kGpu, on_gpu(x), on_gpu(omega), stabilize, y);
        kernel::performer_forward_kernel(kCpu, as_ref(x), as_ref(omega), stabilize, y_ref);
        expect_close(y, y_ref, tol, what + " y");
        const Tensor y_saved = kernel::to_dtype(y_ref, dtype);  // both sides read the same y
        Tensor dx = poisoned(x.shape(), dtype), dw = poisoned(omega.shape(), dtype);
        Tensor dx_ref = Tensor::empty(x.shape(), rd), dw_ref = Tensor::empty(omega.shape(), rd);
        kernel::performer_backward_kernel(kGpu, on_gpu(dy), on_gpu(x), on_gpu(omega), on_gpu(y_saved), stabilize, dx,
                                          dw);
        kernel::performer_backward_kernel(kCpu, as_ref(dy), as_ref(x), as_ref(omega), as_ref(y_saved), stabilize,
                                          dx_ref, dw_ref);
        expect_close(dx, dx_ref, tol, what + " dx");
        expect_close(dw, dw_ref, tol, what + " domega");
      }
    }
  }
}

}  // namespace
}  // namespace seqlab::testing
