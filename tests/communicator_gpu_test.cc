// The NCCL communicator (src/dist/nccl_communicator.cpp) at world size 1 on GPU 0: every operation on
// every dtype goes through NCCL (send_recv to itself as a grouped send and receive) and returns the
// values a one-rank job must give, compared bit for bit on the host. Skipped where no GPU is usable
// (tests/communicator_test.cc checks the message a GPU communicator ends with there).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "dist/communicator.h"
#include "tensor/kernels.h"

namespace seqlab::dist {
namespace {

using testing::kGpu;

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64};

std::vector<double> values(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i % 19 - 9);
  return v;
}
Tensor on_gpu(const Shape& shape, DType dt) { return Tensor::from_vector(values(shape_numel(shape)), shape, dt, kGpu); }

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SEQLAB_SKIP_WITHOUT_GPU();
    char tmpl[] = "/tmp/seqlab_nccl_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    folder_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!folder_.empty()) std::filesystem::remove_all(folder_, ec);
  }
  std::string folder_;
};

TEST_F(NcclCommunicatorTest, EveryOperationAtWorldSizeOne) {
  auto comm = make_communicator(kGpu, open_file_store(folder_), 0, 1, std::chrono::seconds(60));
  ASSERT_STREQ(comm->backend(), "nccl");
  for (DType dt : kDtypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      Tensor t = on_gpu({n}, dt);
      comm->all_reduce(t);
      EXPECT_EQ(t.to_doubles(), values(n)) << "all_reduce " << what;
      if (is_floating(dt)) {
        comm->all_reduce(t, ReduceOp::average);
        EXPECT_EQ(t.to_doubles(), values(n)) << "all_reduce average " << what;
      }
      Tensor out = Tensor::full({n}, -100, dt, kGpu);
      comm->reduce_scatter(t, out);
      EXPECT_EQ(out.to_doubles(), values(n)) << "reduce_scatter " << what;
      Tensor gathered = Tensor::full({n}, -100, dt, kGpu);
      comm->all_gather(t, gathered);
      EXPECT_EQ(gathered.to_doubles(), values(n)) << "all_gather " << what;
      comm->broadcast(t, 0);
      EXPECT_EQ(t.to_doubles(), values(n)) << "broadcast " << what;
      Tensor got = Tensor::full({n}, -100, dt, kGpu);
      comm->send_recv(t, 0, got, 0);
      EXPECT_EQ(got.to_doubles(), values(n)) << "send_recv to itself " << what;
    }
  }
  comm->barrier();
  // A transposed (non-contiguous) view is reduced in place.
  Tensor base = on_gpu({5, 3}, DType::f32);
  Tensor view = kernel::transpose(base, 0, 1);
  const std::vector<double> want = view.to_doubles();
  comm->all_reduce(view);
  EXPECT_EQ(view.to_doubles(), want);
  // A CPU tensor is refused by name.
  Tensor cpu = Tensor::zeros({3});
  try {
    comm->all_reduce(cpu);
    ADD_FAILURE() << "a CPU tensor was accepted by the NCCL communicator";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is on cpu, the communicator's device is cuda:0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace seqlab::dist
