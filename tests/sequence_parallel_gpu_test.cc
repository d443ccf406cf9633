// Sequence parallelism's exchanges over NCCL at world size 1 on GPU 0 (NCCL refuses two ranks on one GPU;
// several ranks run over Gloo in tests/sequence_parallel_test.cc): ring attention with P = 1 — the rank's
// two chunks, the second attending fully to the first and causally to itself, merged by log-sum-exp —
// against the fused attention op over the whole sequence, forward and every input gradient, in f32 and
// bf16 with grouped KV heads; ring_shift and gather_ranks are the identity, forward and backward. Skipped
// where no GPU is usable.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "dist/communicator.h"
#include "layers/attention/attention.h"
#include "layers/attention/ring_attention.h"
#include "layers/sequence_parallel.h"
#include "tensor/kernels.h"

namespace seqlab::testing {
namespace {

class SequenceParallelGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SEQLAB_SKIP_WITHOUT_GPU();
    char tmpl[] = "/tmp/seqlab_sp_gpu_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    folder_ = tmpl;
    comm_ = dist::make_communicator(kGpu, dist::open_file_store(folder_), 0, 1, std::chrono::seconds(60));
  }
  void TearDown() override {
    comm_.reset();
    std::error_code ec;
    if (!folder_.empty()) std::filesystem::remove_all(folder_, ec);
  }
  std::string folder_;
  std::unique_ptr<dist::Communicator> comm_;
  Generator gen_{test_seed(97)};
};

TEST_F(SequenceParallelGpu, RingAttentionAtOneRankIsTheFusedOp) {
  SequenceGroup g(*comm_);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = fused_op_rtol(dtype);
    const std::string what = dtype_name(dtype);
    auto input = [&](const Shape& s) {
      return set_requires_grad(kernel::to_dtype(on_gpu(Tensor::randn(s, gen_)), dtype).detach());
    };
    Tensor q = input({2, 96, 4, 32}), k = input({2, 96, 2, 32}), v = input({2, 96, 2, 32});
    Tensor q2 = set_requires_grad(kernel::clone(q).detach()), k2 = set_requires_grad(kernel::clone(k).detach()),
           v2 = set_requires_grad(kernel::clone(v).detach());
    const Tensor dout = kernel::to_dtype(on_gpu(Tensor::randn({2, 96, 4, 32}, gen_)), dtype);
    const Tensor want = attention(q, k, v);
    const Tensor got = ring_attention(q2, k2, v2, g);
    expect_close(got, want, tol, what + " output");
    backward({want}, {dout});
    backward({got}, {dout});
    expect_close(grad_of(q2), grad_of(q), tol, what + " dq");
    expect_close(grad_of(k2), grad_of(k), tol, what + " dk");
    expect_close(grad_of(v2), grad_of(v), tol, what + " dv");
  }
}

TEST_F(SequenceParallelGpu, ShiftAndGatherAtOneRankAreTheIdentity) {
  SequenceGroup g(*comm_);
  Tensor x = set_requires_grad(on_gpu(Tensor::randn({3, 5}, gen_)));
  const Tensor y = gather_ranks(ring_shift(x, g), g);
  expect_close(y, x.detach(), 0, "forward");
  const Tensor dy = on_gpu(Tensor::randn({3, 5}, gen_));
  backward({y}, {dy});
  expect_close(grad_of(x), dy, 0, "backward");
}

}  // namespace
}  // namespace seqlab::testing
