// The SSD CUDA kernels (src/cuda/ssm/ssd_kernels.cuh: the forward, the backward from checkpoints, the sums of
// a group's heads and of the batch) run on the CPU against the CPU kernels of both forms
// (src/layers/ssm/ssd.cpp). No GPU needed: this is the check these kernels get on every build until a GPU runs
// tests/ssd_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA thread;
// the blocks' threads interleave at every barrier in a seeded order, so a missing barrier shows up as a stale
// read). Each launch mirrors ssd.cu's launchers: the same grids, block size, segment length and scratch, the
// scratch and outputs between guard bands and poisoned (NaN) at first, so a read of anything not yet written
// shows up.
//
// Cases: T not a multiple of the √T segment, T = 1, T below a segment; P and N above and below the 128
// threads of a block (rows and columns that loop); G = 1, 1 < G < H and G = H; with and without D and the
// initial state; Δ from 1e-4 to 10 with per-step log-decays down to −30. f32, f64 and bf16 (computed in f32
// and rounded on store; the reference is the CPU kernel in f32 on the same bf16 values).
// Tolerance fused_op_rtol (1e-4 f32, 1e-10 f64, 2e-2 bf16) against the CPU's recurrent and chunkwise forms.
// What this cannot check: the real compiler and device math library, the hardware, performance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "layers/ssm/ssd.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/ssm/ssd_kernels.cuh"

namespace seqlab {
namespace {

using cuda::compute_t;
using testing::as_reference;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

struct Case {
  int64_t B, T, H, P, G, N;
  bool with_D, with_h0;
  double dt_lo, dt_hi, a_lo, a_hi;
};

const Case kCases[] = {
    {2, 11, 4, 3, 2, 5, true, true, 0.05, 1.2, -1.5, -0.1},      // T = 11: segments of 4, the last partial
    {1, 1, 2, 5, 1, 7, true, true, 0.05, 1.2, -1.5, -0.1},       // T = 1
    {1, 3, 3, 130, 3, 4, false, true, 0.05, 1.2, -1.5, -0.1},    // P beyond a block of 128 rows; G = H
    {2, 20, 2, 4, 1, 131, true, false, 0.05, 1.2, -1.5, -0.1},   // N beyond a block of 128 columns
    {1, 26, 4, 6, 2, 8, true, true, 1e-4, 10.0, -3.0, -1e-3},    // Δ from 1e-4 to 10: log-decays to −30
    {1, 17, 2, 8, 1, 16, false, false, 1e-4, 1e-3, -1.0, -0.1},  // decays ≈ 1
};

std::string name_of(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" +
         std::to_string(c.H) + " P" + std::to_string(c.P) + " G" + std::to_string(c.G) + " N" + std::to_string(c.N) +
         " dt [" + std::to_string(c.dt_lo) + ", " + std::to_string(c.dt_hi) + "]";
}

TEST(SsdEmulation, ForwardAndBackwardMatchTheCpuKernels) {
  Generator gen(testing::test_seed(71));
  for_each_type([&](auto tag, DType dtype) {
    using E = decltype(tag);
    using A = compute_t<E>;
    const DType at = accumulate_dtype(dtype);
    for (const Case& c : kCases) {
      const std::string what = name_of(c, dtype);
      // Inputs in the storage type (Δ log-uniform, A uniform), and the cotangents.
      std::vector<double> dtv(static_cast<size_t>(c.B * c.T * c.H));
      for (double& v : dtv) v = std::exp(std::log(c.dt_lo) + gen.uniform() * std::log(c.dt_hi / c.dt_lo));
      const Tensor x = Tensor::randn({c.B, c.T, c.H, c.P}, gen, dtype);
      const Tensor dt = Tensor::from_vector(dtv, {c.B, c.T, c.H}, dtype);
      const Tensor Av = Tensor::rand({c.H}, gen, dtype, c.a_lo, c.a_hi);
      const Tensor Bm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype), Cm = Tensor::randn({c.B, c.T, c.G, c.N}, gen, dtype);
      const Tensor D = c.with_D ? Tensor::randn({c.H}, gen, dtype) : Tensor();
      const Tensor h0 = c.with_h0 ? Tensor::randn({c.B, c.H, c.P, c.N}, gen, dtype) : Tensor();
      const Tensor dy = Tensor::randn(x.shape(), gen, dtype), dfinal = Tensor::randn({c.B, c.H, c.P, c.N}, gen, dtype);
      const cuda::ssd::SsdProblem<E> pb{c.B,           c.T,           c.H,          c.P,          c.G,
                                        c.N,           x.data<E>(),   dt.data<E>(), Av.data<E>(), Bm.data<E>(),
                                        Cm.data<E>(),  c.with_D ? D.data<E>() : nullptr,
                                        c.with_h0 ? h0.data<E>() : nullptr};
      const dim3 grid(static_cast<unsigned>(c.H), static_cast<unsigned>(c.B));

      // ssd.cu forward_cuda.
      GuardedOutput y(x.shape(), dtype), fs({c.B, c.H, c.P, c.N}, dtype), state({c.B, c.H, c.P, c.N}, at);
      emu::launch(grid, dim3(cuda::ssd::kBlock), 0, cuda::ssd::ssd_forward_kernel<E, A>, pb, y.data<E>(), fs.data<E>(),
                  state.data<A>());

      // ssd.cu backward_cuda: the backward kernel, then the sums of heads and of the batch.
      const int64_t K = cuda::ssd::ssd_segment(c.T), nseg = (c.T + K - 1) / K;
      GuardedOutput dx(x.shape(), dtype), ddt(dt.shape(), dtype), dA({c.H}, dtype), dB(Bm.shape(), dtype),
          dC(Cm.shape(), dtype), dD({c.H}, dtype), dh0({c.B, c.H, c.P, c.N}, dtype);
      GuardedOutput dB_head({c.B, c.T, c.H, c.N}, at), dC_head({c.B, c.T, c.H, c.N}, at), dA_part({c.B, c.H}, at),
          dD_part({c.B, c.H}, at), dS({c.B, c.H, c.P, c.N}, at), ckpt({c.B, c.H, nseg, c.P, c.N}, at),
          seg({c.B, c.H, K, c.P, c.N}, at), rows({c.B, c.H, 3, c.P}, at);
      cuda::ssd::SsdBackwardIO<E, A> io;
      io.dy = dy.data<E>();
      io.dfinal = dfinal.data<E>();
      io.dx = dx.data<E>();
      io.ddt = ddt.data<E>();
      io.dh0 = c.with_h0 ? dh0.data<E>() : nullptr;
      io.dB_head = dB_head.data<A>();
      io.dC_head = dC_head.data<A>();
      io.dA_part = dA_part.data<A>();
      io.dD_part = dD_part.data<A>();
      io.dS = dS.data<A>();
      io.ckpt = ckpt.data<A>();
      io.seg = seg.data<A>();
      io.rows = rows.data<A>();
      io.K = K;
      emu::launch(grid, dim3(cuda::ssd::kBlock), 0, cuda::ssd::ssd_backward_kernel<E, A>, pb, io);
      const int64_t count = c.B * c.T * c.G * c.N;
      emu::launch(dim3(cuda::grid_stride_blocks(count, kSMs)), dim3(cuda::kThreads), 0, cuda::ssd::ssd_sum_heads<E, A>,
                  count, c.H, c.G, c.N, dB_head.data<A>(), dC_head.data<A>(), dB.data<E>(), dC.data<E>());
      emu::launch(dim3(cuda::grid_stride_blocks(c.H, kSMs)), dim3(cuda::kThreads), 0, cuda::ssd::ssd_sum_batch<E, A>,
                  c.B, c.H, dA_part.data<A>(), dD_part.data<A>(), dA.data<E>(), c.with_D ? dD.data<E>() : nullptr);

      // The CPU kernels of both forms, on the same values (bf16 widened to f32).
      const double tol = testing::fused_op_rtol(dtype);
      for (SsdForm form : {SsdForm::recurrent, SsdForm::chunkwise}) {
        const std::string at_form = what + " " + ssd_form_name(form);
        const SsdOptions opts{form, 4};
        const SsdOutput want = kernel::ssd_forward(as_reference(x), as_reference(dt), as_reference(Av), as_reference(Bm),
                                                   as_reference(Cm), as_reference(D), as_reference(h0), opts);
        expect_output(y, want.y, tol, at_form + " y");
        expect_output(fs, want.final_state, tol, at_form + " final_state");
        const kernel::SsdGrads g =
            kernel::ssd_backward(as_reference(dy), as_reference(dfinal), as_reference(x), as_reference(dt),
                                 as_reference(Av), as_reference(Bm), as_reference(Cm), as_reference(D),
                                 as_reference(h0), opts, std::vector<bool>(7, true));
        expect_output(dx, g.dx, tol, at_form + " dx");
        expect_output(ddt, g.ddt, tol, at_form + " ddt");
        expect_output(dA, g.dA, tol, at_form + " dA");
        expect_output(dB, g.dB, tol, at_form + " dB");
        expect_output(dC, g.dC, tol, at_form + " dC");
        if (c.with_D) expect_output(dD, g.dD, tol, at_form + " dD");
        if (c.with_h0) expect_output(dh0, g.dinitial_state, tol, at_form + " dinitial_state");
      }
      // Nothing written outside the scratch either.
      for (const GuardedOutput* s : {&state, &dB_head, &dC_head, &dA_part, &dD_part, &dS, &ckpt, &seg, &rows}) {
        s->expect_guards_intact(what + " scratch");
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
