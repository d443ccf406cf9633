// The relative position bias CUDA kernels (src/cuda/attention/relative_position_bias_kernels.cuh: the forward
// gather, the diagonal sums and the per-bucket sums of the backward), and the host bucketing they launch with,
// run on the CPU against the CPU slots (src/layers/attention/relative_position_bias.cpp). No GPU needed: this is
// the check these kernels get on every build until a GPU runs tests/relative_position_bias_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h (one fiber per CUDA thread,
// an emulated GPU of one multiprocessor, so the grid-stride grids stop at 32 blocks of 256 and the larger
// biases take the loops). Each launch mirrors relative_position_bias.cu's launchers: the buckets from the same
// host helper (diagonal_buckets), the same grids and arguments, the scratch diagonal sums in the compute
// type. Outputs and the scratch sit between guard bands and start as NaN.
//
// Cases (tests/relative_position_bias_cases.h, shared with the GPU test): T = S = 1; T = S odd; a block of
// queries against a long cache (distances past max_distance, where the buckets saturate); T > S; decoding;
// the fewest buckets the bucketing allows; bidirectional and causal; f32, f64 and bf16.
// Tolerance: the forward is a copy (equal); the diagonal sums against sums in double at gpu_rtol and dtable
// against the CPU at fused_op_rtol, both scaled by the sum of the magnitudes they add up.
// The bucketing is also checked against values worked out by hand from T5's formula (the default 32
// buckets, max_distance 128, both directions; a case where float32 and float64 disagree), independently of
// the CPU kernels.
// What this cannot check: the real compiler, the hardware, performance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "relative_position_bias_cases.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/attention/relative_position_bias_kernels.cuh"

namespace seqlab {
namespace {

namespace rp = cuda::relative_position;
using cuda::compute_t;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using Case = testing::RelativePositionCase;
constexpr int kSMs = emu::kMultiprocessors;

const Case kCases[] = {
    {1, 1, 1, true, 32, 128},     // one query, one key
    {37, 37, 3, true, 32, 128},   // T = S, odd; the default bucketing
    {5, 300, 2, false, 32, 128},  // new queries against a long cache: distances past max_distance saturate
    {70, 20, 4, true, 16, 40},    // T > S: every diagonal chunk partly outside the matrix
    {1, 200, 1, false, 8, 20},    // decoding
    {33, 65, 2, true, 4, 5},      // the fewest buckets (max_exact = 1), max_distance just past it
    {40, 300, 2, true, 32, 128},  // 12000 elements per head: more than one stride of the forward's grid
};

// relative_position_bias.cu's device_buckets, on the host.
std::vector<int32_t> buckets_of(const Case& c) {
  return rp::diagonal_buckets(c.bidirectional, c.num_buckets, c.max_distance, c.T, c.S);
}

TEST(RelativePositionBiasEmulation, BucketsAreT5s) {
  // Bidirectional, 32 buckets, max_distance 128: 16 per direction, distances 0–7 exact, then log-spaced
  // from 8 to 128 over buckets 8–15 (keys after the query add 16). log(n/8)/log(16)·8 lands exactly on 2,
  // 4 and 6 at n = 16, 32 and 64 (powers of two: exact in float32).
  const struct {
    int64_t rel, bucket;
  } bidirectional[] = {{0, 0},    {-1, 1},   {1, 17},    {-7, 7},    {7, 23},     {-8, 8},
                       {-11, 8},  {-12, 9},  {-16, 10},  {16, 26},   {-20, 10},   {-24, 11},
                       {-32, 12}, {-64, 14}, {-127, 15}, {-128, 15}, {-5000, 15}, {5000, 31}};
  for (const auto& x : bidirectional) {
    EXPECT_EQ(rp::bucket(x.rel, true, 32, 128), x.bucket) << "bidirectional, rel = " << x.rel;
  }
  // Causal, 32 buckets, max_distance 128: keys after the query (rel > 0) share bucket 0; distances 0–15
  // exact, then log(n/16)/log(8)·16 over buckets 16–31.
  const struct {
    int64_t rel, bucket;
  } causal[] = {{5, 0}, {0, 0}, {-1, 1}, {-15, 15}, {-16, 16}, {-32, 21}, {-64, 26}, {-127, 31}, {-1000000, 31}};
  for (const auto& x : causal) EXPECT_EQ(rp::bucket(x.rel, false, 32, 128), x.bucket) << "causal, rel = " << x.rel;
  // A float32 edge: causal, 10 buckets, max_distance 160, n = 10: log 2 / log 32 · 5 is exactly 1 in float32
  // (bucket 6) but 0.99999999999999989 in float64 (bucket 5).
  EXPECT_EQ(rp::bucket(-10, false, 10, 160), 6);
  EXPECT_EQ(rp::bucket(-9, false, 10, 160), 5);

  // Options that leave no log-spaced bucket are refused with a message naming them.
  for (auto [bidir, nb, md] : {std::tuple{true, int64_t{2}, int64_t{128}}, {false, 1, 128}, {true, 32, 8}}) {
    try {
      rp::bucket(3, bidir, nb, md);
      ADD_FAILURE() << "num_buckets = " << nb << ", max_distance = " << md << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("max_distance = " + std::to_string(md)), std::string::npos) << e.what();
    }
  }
}

TEST(RelativePositionBiasEmulation, ForwardAndBackwardMatchTheCpuKernels) {
  Generator gen(testing::test_seed(61));
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const DType at = accumulate_dtype(dtype);
    for (const Case& c : kCases) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
      const testing::RelativePositionInputs in = testing::relative_position_inputs(c, dtype, gen);
      const std::vector<int32_t> buckets = buckets_of(c);
      const int64_t H = c.H, diagonals = c.T + c.S - 1, n = H * c.T * c.S;

      // Forward: relative_position_bias.cu forward_cuda's launch.
      GuardedOutput bias(c.bias_shape(), dtype);
      emu::launch(dim3(cuda::grid_stride_blocks(n, kSMs)), dim3(cuda::kThreads), 0, rp::relative_position_bias_fwd<T>,
                  H, c.T, c.S, buckets.data(), in.table.data<T>(), bias.data<T>());
      expect_output(bias, testing::relative_position_forward_reference(c, in.table), 0.0, what + " bias");

      // Backward: backward_cuda's two launches.
      GuardedOutput diag({H, diagonals}, at), dtable(c.table_shape(), dtype);
      emu::launch(dim3(static_cast<unsigned>((diagonals + 31) / 32), static_cast<unsigned>(H)),
                  dim3(rp::kDiagonalThreads), 0, rp::relative_position_bias_diagonals<T>, c.T, c.S, in.dbias.data<T>(),
                  diag.data<A>());
      emu::launch(dim3(cuda::grid_stride_blocks(c.num_buckets * H, kSMs)), dim3(cuda::kThreads), 0,
                  rp::relative_position_bias_buckets<T>, c.num_buckets, H, diagonals, buckets.data(),
                  static_cast<const A*>(diag.data<A>()), dtable.data<T>());

      // The diagonal sums against sums in double of the same values.
      const std::vector<double> g = in.dbias.to_doubles();
      std::vector<double> want_diag(static_cast<size_t>(H * diagonals)), diag_scale(want_diag.size());
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < c.T; ++i) {
          for (int64_t j = 0; j < c.S; ++j) {
            const double x = g[static_cast<size_t>((h * c.T + i) * c.S + j)];
            const size_t e = static_cast<size_t>(h * diagonals + j - i + c.T - 1);
            want_diag[e] += x;
            diag_scale[e] += std::fabs(x);
          }
        }
      }
      expect_output(diag, Tensor::from_vector(want_diag, {H, diagonals}, at), testing::gpu_rtol(dtype),
                    what + " diagonal sums", Tensor::from_vector(diag_scale, {H, diagonals}, at));
      expect_output(dtable, testing::relative_position_backward_reference(c, in.dbias), testing::fused_op_rtol(dtype),
                    what + " dtable", testing::relative_position_error_scale(c, in.dbias));
    }
  });
}

}  // namespace
}  // namespace seqlab
