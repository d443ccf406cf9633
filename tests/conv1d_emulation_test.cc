// The causal-convolution CUDA kernels (src/cuda/ssm/conv1d_kernels.cuh: the forward, the final state, dz,
// the input gradients and the parameter gradients), run on the CPU against the CPU slots
// (src/layers/ssm/conv1d.cpp). No GPU needed: this is the check these kernels get on every build until a
// GPU runs tests/conv1d_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA
// thread, an emulated GPU of one multiprocessor, so grids stop at 32 blocks of 256 and the largest case
// takes the grid-stride loops). Each launch mirrors conv1d.cu's launchers: the same grids, arguments and
// A scratch for dz. Every output sits between guard bands and starts as NaN.
//
// Cases: tests/conv1d_cases.h (shared with the GPU test): every width class, T = 1, T < W − 1, odd C,
// bias, initial state and SiLU on and off; f32, f64 and bf16 (computed in f32 and rounded on store, as
// the CPU slot does with its f32 stand-ins). Tolerance gpu_rtol (1e-5 f32, 1e-10 f64, 1e-2 bf16, the
// reference being the CPU kernel in f32 on the same bf16 values). The f32 forward without SiLU is also
// required to equal the CPU's to the last bit (the same products, rounded alike, in the same order).
// What this cannot check: the real compiler (nvcc's FMA contraction, which rounded_product guards
// against with __fmul_rn), the device's math library, the hardware, performance.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "conv1d_cases.h"
#include "cuda_emulation_util.h"
#include "layers/ssm/conv1d.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/ssm/conv1d_kernels.cuh"

namespace seqlab {
namespace {

using cuda::compute_t;
using testing::as_reference;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data<T>() : nullptr;
}

dim3 grid_for(int64_t n) { return dim3(static_cast<unsigned>(cuda::grid_stride_blocks(n, kSMs))); }

TEST(Conv1dEmulation, ForwardAndBackwardMatchTheCpuKernels) {
  Generator gen(testing::test_seed(83));
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const DType at = accumulate_dtype(dtype);
    const double tol = testing::gpu_rtol(dtype);
    for (const testing::Conv1dCase& c : testing::kConv1dCases) {
      const std::string what = testing::conv1d_name(dtype, c);
      const testing::Conv1dData d = testing::make_conv1d_data(c, dtype, gen);
      const cuda::conv1d::Geometry g{c.B, c.T, c.C, static_cast<int>(c.W)};
      const int64_t n = c.B * c.T * c.C, nf = c.B * (c.W - 1) * c.C, nd = c.B * (c.W - 1 + c.T) * c.C,
                    np = (c.W + 1) * c.C;

      // conv1d.cu forward_cuda's two launches.
      GuardedOutput y({c.B, c.T, c.C}, dtype), fs({c.B, c.W - 1, c.C}, dtype);
      emu::launch(grid_for(n), dim3(cuda::kThreads), 0, cuda::conv1d::conv1d_forward<T>, g, d.x.data<T>(),
                  d.weight.data<T>(), data_or_null<T>(d.bias), data_or_null<T>(d.h0), c.silu, y.data<T>());
      if (nf > 0) {
        emu::launch(grid_for(nf), dim3(cuda::kThreads), 0, cuda::conv1d::conv1d_final_state<T>, g, d.x.data<T>(),
                    data_or_null<T>(d.h0), fs.data<T>());
      }
      const Tensor xr = as_reference(d.x), wr = as_reference(d.weight), br = as_reference(d.bias),
                   hr = as_reference(d.h0);
      const DType rt = xr.dtype();
      Tensor want_y = Tensor::empty({c.B, c.T, c.C}, rt, kCpu), want_f = Tensor::empty({c.B, c.W - 1, c.C}, rt, kCpu);
      kernel::conv1d_forward_kernel(kCpu, xr, wr, br, hr, c.silu, want_y, want_f);
      expect_output(y, want_y, tol, what + " y");
      expect_output(fs, want_f, 0.0, what + " final_state");  // a copy
      if (dtype == DType::f32 && !c.silu) {
        EXPECT_EQ(std::memcmp(y.value().data<float>(), want_y.data<float>(), static_cast<size_t>(n) * sizeof(float)), 0)
            << what << ": the f32 forward differs from the CPU's in some bit";
      }

      // backward_cuda's three launches.
      GuardedOutput dz({c.B, c.T, c.C}, at), dx({c.B, c.T, c.C}, dtype), dh0({c.B, c.W - 1, c.C}, dtype),
          dw({c.W, c.C}, dtype), db({c.C}, dtype);
      emu::launch(grid_for(n), dim3(cuda::kThreads), 0, cuda::conv1d::conv1d_dz<T>, g, d.dy.data<T>(), d.x.data<T>(),
                  d.weight.data<T>(), data_or_null<T>(d.bias), data_or_null<T>(d.h0), c.silu, dz.data<A>());
      emu::launch(grid_for(nd), dim3(cuda::kThreads), 0, cuda::conv1d::conv1d_dinput<T>, g,
                  static_cast<const A*>(dz.data<A>()), d.weight.data<T>(), data_or_null<T>(d.dfinal), dx.data<T>(),
                  c.h0 ? dh0.data<T>() : nullptr);
      emu::launch(grid_for(np), dim3(cuda::kThreads), 0, cuda::conv1d::conv1d_dparams<T>, g,
                  static_cast<const A*>(dz.data<A>()), d.x.data<T>(), data_or_null<T>(d.h0), dw.data<T>(),
                  c.bias ? db.data<T>() : nullptr);

      kernel::Conv1dGrads want;
      want.dx = Tensor::empty({c.B, c.T, c.C}, rt, kCpu);
      want.dweight = Tensor::empty({c.W, c.C}, rt, kCpu);
      if (c.bias) want.dbias = Tensor::empty({c.C}, rt, kCpu);
      if (c.h0) want.dinitial_state = Tensor::empty({c.B, c.W - 1, c.C}, rt, kCpu);
      kernel::conv1d_backward_kernel(kCpu, as_reference(d.dy), as_reference(d.dfinal), xr, wr, br, hr, c.silu, want);
      expect_output(dx, want.dx, tol, what + " dx");
      expect_output(dw, want.dweight, tol, what + " dweight");
      if (c.bias) expect_output(db, want.dbias, tol, what + " dbias");
      if (c.h0) expect_output(dh0, want.dinitial_state, tol, what + " dinitial_state");
      // Outputs the launch was told not to write stay untouched.
      if (!c.bias) expect_output(db, testing::poisoned({c.C}, dtype, kCpu), 0.0, what + " dbias (not asked for)");
      if (!c.h0 && nf > 0) {
        expect_output(dh0, testing::poisoned({c.B, c.W - 1, c.C}, dtype, kCpu), 0.0,
                      what + " dinitial_state (not asked for)");
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
