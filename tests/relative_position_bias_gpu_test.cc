// CUDA against CPU for T5's relative position bias slots (src/cuda/attention/relative_position_bias.cu against
// the CPU kernels in src/layers/attention/relative_position_bias.cpp). Skipped where no GPU is usable.
//
// Each case draws a fresh table [NB, H] and dbias [1, H, T, S] in the dtype under test, fills the CUDA
// outputs with NaN first (an element the kernels fail to write shows up) and compares the bias (a copy:
// equal) and dtable (sums in another order: fused_op_rtol, scaled by the sum of the magnitudes each entry
// adds up) with the CPU slots, which run bf16 in f32 on the same values. Cases: the emulation test's
// (tests/relative_position_bias_cases.h; T = S = 1, odd T = S, a query block against a long cache, T > S,
// decoding, the fewest buckets) and larger ones (T5's 512-token encoder and a 2048-token cache, whose
// diagonal sums run over many rows). Then the backward twice gives the same bits (no atomics), and the
// differentiable op (relative_position_bias) gives the same bias and table gradient on both devices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/attention/relative_position_bias.h"
#include "relative_position_bias_cases.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace {

using testing::expect_close;
using testing::kCpu;
using testing::kFloatTypes;
using testing::kGpu;
using testing::on_gpu;
using testing::poisoned;
using Case = testing::RelativePositionCase;

const Case kCases[] = {
    {1, 1, 1, true, 32, 128},      {37, 37, 3, true, 32, 128},   {5, 300, 2, false, 32, 128},
    {70, 20, 4, true, 16, 40},     {1, 200, 1, false, 8, 20},    {33, 65, 2, true, 4, 5},
    {40, 300, 2, true, 32, 128},   {512, 512, 8, true, 32, 128},  // T5's encoder
    {64, 2048, 4, false, 32, 128},                                // decoder queries against a long cache
};

class CudaRelativePositionBiasVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{testing::test_seed(67)};
};

TEST_F(CudaRelativePositionBiasVsCpu, ForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    for (const Case& c : kCases) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
      const testing::RelativePositionInputs in = testing::relative_position_inputs(c, dtype, gen_);
      Tensor bias = poisoned(c.bias_shape(), dtype), dtable = poisoned(c.table_shape(), dtype);
      kernel::relative_position_bias_forward_kernel(kGpu, on_gpu(in.table), c.params(), bias);
      kernel::relative_position_bias_backward_kernel(kGpu, on_gpu(in.dbias), c.params(), dtable);
      expect_close(bias, testing::relative_position_forward_reference(c, in.table), 0.0, what + " bias");
      expect_close(dtable, testing::relative_position_backward_reference(c, in.dbias), testing::fused_op_rtol(dtype),
                   what + " dtable", testing::relative_position_error_scale(c, in.dbias));
    }
  }
}

TEST_F(CudaRelativePositionBiasVsCpu, BackwardIsDeterministic) {
  const Case c{300, 700, 6, true, 32, 128};
  const Tensor dbias = on_gpu(Tensor::randn(c.bias_shape(), gen_));
  std::vector<double> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dtable = poisoned(c.table_shape(), DType::f32);
    kernel::relative_position_bias_backward_kernel(kGpu, dbias, c.params(), dtable);
    if (run == 0) {
      first = dtable.to_doubles();
    } else {
      EXPECT_EQ(dtable.to_doubles(), first) << "dtable changed between runs";
    }
  }
}

// The op on both devices: the same bias, and the same table gradient from the same upstream gradient.
TEST_F(CudaRelativePositionBiasVsCpu, DifferentiableOp) {
  RelativePositionOptions opts;
  opts.bidirectional = false;
  opts.num_buckets = 16;
  opts.max_distance = 50;
  const int64_t T = 23, S = 61;
  const Tensor table = Tensor::randn({16, 3}, gen_), g = Tensor::randn({1, 3, T, S}, gen_);
  auto run = [&](Device device) {
    Tensor t = set_requires_grad(kernel::to_device(table, device));
    const Tensor bias = relative_position_bias(t, T, S, opts);
    backward({bias}, {kernel::to_device(g, device)});
    return std::vector<Tensor>{bias.detach(), grad_of(t)};
  };
  const std::vector<Tensor> gpu = run(kGpu), cpu = run(kCpu);
  expect_close(gpu[0], cpu[0], 0.0, "relative_position_bias");
  expect_close(gpu[1], cpu[1], testing::fused_op_rtol(DType::f32), "relative_position_bias: dtable");
}

}  // namespace
}  // namespace seqlab
