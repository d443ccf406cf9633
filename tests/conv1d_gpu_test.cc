// CUDA against CPU for the causal depthwise convolution (src/cuda/ssm/conv1d.cu against the CPU kernels in
// src/layers/ssm/conv1d.cpp). Skipped where no GPU is usable.
//
// The slots: y, final_state, dx, dweight, dbias and dinitial_state of every case of tests/conv1d_cases.h
// (every width class, T = 1, T < W − 1, odd C, bias, initial state and SiLU on and off, one case over
// 10k outputs), every CUDA output starting as NaN so that an unwritten element shows up; gradients not
// asked for are not written. The op: forward and backward through autograd on the GPU against the CPU
// op, and the decode step (token by token from the carried state) equal to the whole sequence.
// Tolerance |got − want| ≤ rtol · max(|want|, 1): gpu_rtol (1e-5 f32, 1e-10 f64, 1e-2 bf16 against the
// CPU kernels in f32 on the same bf16 values); the final state is a copy (exact).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "conv1d_cases.h"
#include "cuda_test_util.h"
#include "layers/ssm/conv1d.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of cuda_test_util.h and variant_cases.h they use.
namespace seqlab::testing {
namespace {

using CudaConv1dVsCpu = VariantGpuTest<97>;

TEST_F(CudaConv1dVsCpu, SlotsForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    const double tol = gpu_rtol(dtype);
    for (const Conv1dCase& c : kConv1dCases) {
      const std::string what = conv1d_name(dtype, c);
      const Conv1dData d = make_conv1d_data(c, dtype, gen_);
      const Shape ys{c.B, c.T, c.C}, ss{c.B, c.W - 1, c.C};
      Tensor y = poisoned(ys, dtype), fs = poisoned(ss, dtype);
      kernel::conv1d_forward_kernel(kGpu, on_gpu(d.x), on_gpu(d.weight), on_gpu(d.bias), on_gpu(d.h0), c.silu, y, fs);
      const DType rt = reference_type(dtype);
      Tensor y_ref = Tensor::empty(ys, rt), fs_ref = Tensor::empty(ss, rt);
      kernel::conv1d_forward_kernel(kCpu, as_reference(d.x), as_reference(d.weight), as_reference(d.bias),
                                    as_reference(d.h0), c.silu, y_ref, fs_ref);
      expect_close(y, y_ref, tol, what + " y");
      expect_close(fs, fs_ref, 0.0, what + " final_state");

      kernel::Conv1dGrads g, r;
      g.dx = poisoned(ys, dtype);
      g.dweight = poisoned({c.W, c.C}, dtype);
      r.dx = Tensor::empty(ys, rt);
      r.dweight = Tensor::empty({c.W, c.C}, rt);
      if (c.bias) {
        g.dbias = poisoned({c.C}, dtype);
        r.dbias = Tensor::empty({c.C}, rt);
      }
      if (c.h0) {
        g.dinitial_state = poisoned(ss, dtype);
        r.dinitial_state = Tensor::empty(ss, rt);
      }
      kernel::conv1d_backward_kernel(kGpu, on_gpu(d.dy), on_gpu(d.dfinal), on_gpu(d.x), on_gpu(d.weight),
                                     on_gpu(d.bias), on_gpu(d.h0), c.silu, g);
      kernel::conv1d_backward_kernel(kCpu, as_reference(d.dy), as_reference(d.dfinal), as_reference(d.x),
                                     as_reference(d.weight), as_reference(d.bias), as_reference(d.h0), c.silu, r);
      expect_close(g.dx, r.dx, tol, what + " dx");
      expect_close(g.dweight, r.dweight, tol, what + " dweight");
      expect_close(g.dbias, r.dbias, tol, what + " dbias");
      expect_close(g.dinitial_state, r.dinitial_state, tol, what + " dinitial_state");

      // Only dx asked for: the kernels leave the other buffers alone.
      kernel::Conv1dGrads only_dx;
      only_dx.dx = poisoned(ys, dtype);
      kernel::conv1d_backward_kernel(kGpu, on_gpu(d.dy), on_gpu(d.dfinal), on_gpu(d.x), on_gpu(d.weight),
                                     on_gpu(d.bias), on_gpu(d.h0), c.silu, only_dx);
      expect_close(only_dx.dx, r.dx, tol, what + " dx alone");
    }
  }
}

TEST_F(CudaConv1dVsCpu, OpThroughAutogradAndTheDecodeStep) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Conv1dCase c{2, 9, 11, 4, true, true, true};
    const std::string what = conv1d_name(dtype, c);
    const Conv1dData d = make_conv1d_data(c, dtype, gen_);
    auto run = [&](Device dev) {
      std::vector<Tensor> v;
      for (const Tensor& t : {d.x, d.weight, d.bias, d.h0}) {
        v.push_back(set_requires_grad(kernel::to_device(t, dev).detach()));
      }
      Conv1dOutput out = causal_conv1d(v[0], v[1], v[2], v[3], true);
      backward({out.y, out.final_state}, {kernel::to_device(d.dy, dev), kernel::to_device(d.dfinal, dev)});
      std::vector<Tensor> r{out.y.detach(), out.final_state.detach()};
      for (const Tensor& t : v) r.push_back(grad_of(t));
      return r;
    };
    const std::vector<Tensor> gpu = run(kGpu), cpu = run(kCpu);
    const char* names[] = {"y", "final_state", "dx", "dweight", "dbias", "dinitial_state"};
    for (size_t i = 0; i < gpu.size(); ++i) expect_close(gpu[i], cpu[i], gpu_rtol(dtype), what + " op " + names[i]);

    // Token by token on the GPU from the carried state: the whole sequence's outputs.
    const Tensor x = on_gpu(d.x), w = on_gpu(d.weight), b = on_gpu(d.bias);
    Tensor state = on_gpu(d.h0);
    std::vector<Tensor> ys;
    for (int64_t t = 0; t < c.T; ++t) {
      Conv1dOutput step = causal_conv1d(narrow(x, 1, t, 1), w, b, state, true);
      ys.push_back(step.y);
      state = step.final_state;
    }
    expect_close(concat(ys, 1), gpu[0], 0.0, what + " token by token");
    expect_close(state, gpu[1], 0.0, what + " final state token by token");
  }
}

}  // namespace
}  // namespace seqlab::testing
