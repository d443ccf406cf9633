// The rotary-embedding CUDA kernels (src/cuda/attention/rope_kernels.cuh: the cos/sin tables and the pair
// rotation), run on the CPU against the CPU rope slot (src/layers/attention/rope.cpp). No GPU needed: this is
// the check these kernels get on every build until a GPU runs tests/optim_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA
// thread, an emulated GPU of one multiprocessor, so grids stop at 32 blocks of 256 and the larger
// shapes take the grid-stride loops). Each launch mirrors rope.cu's launcher: θ from the same host
// helper (inverse_frequencies), tables in the compute type, the same grids (grid_stride_blocks) and
// arguments. The tables and y sit between guard bands and start as NaN.
//
// Shapes: odd T and H with D/2 odd, far positions (the angle must be formed in double), one pair per
// head, more pairs than one stride of the grid; f32, f64 and bf16 (computed in f32 and rounded on
// store, as the CPU slot does with its f32 stand-ins); the forward and the inverse rotation. The
// cases: tests/rope_cases.h, shared with the GPU test.
// Tolerance: gpu_rtol (1e-5 f32, 1e-10 f64, 1e-2 bf16, the reference being the CPU kernel in f32 on
// the same bf16 values); the tables against cos and sin in double at the compute type's gpu_rtol.
// What this cannot check: the real compiler and device math library, the hardware, performance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "layers/attention/rope.h"
#include "rope_cases.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/attention/rope_kernels.cuh"

namespace seqlab {
namespace {

namespace rotary = cuda::rotary;
using cuda::compute_t;
using testing::as_reference;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

TEST(RopeEmulation, TablesAndRotationMatchTheCpuKernel) {
  Generator gen(testing::test_seed(59));
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const DType at = accumulate_dtype(dtype);
    for (const testing::RopeCase& c : testing::kRopeCases) {
      for (bool inverse : {false, true}) {
        const RopeOptions opts = testing::rope_options(c);
        const std::string what = testing::rope_name(dtype, c, inverse);
        const int64_t Tn = c.shape[1], H = c.shape[2], D = c.shape[3], P = D / 2;
        const int64_t pairs = c.shape[0] * Tn * H * P;
        Tensor x = Tensor::randn(c.shape, gen, dtype);

        // rope.cu rope_cuda's two launches.
        const std::vector<double> theta = rotary::inverse_frequencies(opts.base, D);
        GuardedOutput cos_t({Tn, P}, at), sin_t({Tn, P}, at), y(c.shape, dtype);
        const double sign = inverse ? -1.0 : 1.0;
        emu::launch(dim3(cuda::grid_stride_blocks(Tn * P, kSMs)), dim3(cuda::kThreads), 0, rotary::rope_tables<A>, Tn,
                    P, theta.data(), opts.start, sign, cos_t.data<A>(), sin_t.data<A>());
        emu::launch(dim3(cuda::grid_stride_blocks(pairs, kSMs)), dim3(cuda::kThreads), 0, rotary::rope_rotate_pairs<T>,
                    pairs, Tn, H * P, P, cos_t.data<A>(), sin_t.data<A>(), x.data<T>(), y.data<T>());

        std::vector<double> want_cos(static_cast<size_t>(Tn * P)), want_sin(want_cos.size());
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < P; ++i) {
            const double phi = static_cast<double>(opts.start + t) * theta[static_cast<size_t>(i)];
            want_cos[static_cast<size_t>(t * P + i)] = std::cos(phi);
            want_sin[static_cast<size_t>(t * P + i)] = sign * std::sin(phi);
          }
        }
        expect_output(cos_t, Tensor::from_vector(want_cos, {Tn, P}, DType::f64), testing::gpu_rtol(at), what + " cos");
        expect_output(sin_t, Tensor::from_vector(want_sin, {Tn, P}, DType::f64), testing::gpu_rtol(at), what + " sin");

        const Tensor xr = as_reference(x);
        Tensor want = Tensor::empty(c.shape, xr.dtype(), kCpu);
        kernel::rope_kernel(kCpu, xr, opts, inverse, want);
        expect_output(y, want, testing::gpu_rtol(dtype), what + " y");
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
