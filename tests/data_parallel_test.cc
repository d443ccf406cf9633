// DataParallel (src/train/launch/data_parallel.h) between forked processes over Gloo: gradients
// averaged across buckets split by size and by dtype (a small bucket size, so that one job crosses every
// kind of bucket boundary), the averaged loss, the agreed stop signal, and the loader position that
// checkpoints hold independently of the world size. The values are small integers, so every expected
// average is exact and compared bit for bit. A rank reports through its exit status; a watchdog kills
// the ranks after 30 s so that a hang fails the test.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "rank_processes.h"
#include "train/launch/data_parallel.h"

namespace seqlab {
namespace {

// Runs body(comm) on `size` forked ranks that meet through a fresh file store (rank_processes.h); returns
// how many ranks failed (an exception, a failed expectation, a crash, or the watchdog).
int failed_ranks(int size, const std::function<void(dist::Communicator&)>& body) {
  return static_cast<int>(testing::run_ranks(size, [&](int rank, const std::string& folder) {
                            auto comm = dist::make_communicator(cpu_device(), dist::open_file_store(folder), rank,
                                                                size, std::chrono::seconds(20));
                            body(*comm);
                            // No rank leaves before every rank is connected: one that exits while another is
                            // still in the rendezvous fails that rendezvous ("connection closed by peer").
                            comm->barrier();
                            if (::testing::Test::HasFailure()) throw std::runtime_error("an expectation failed");
                          }).size());
}

// Gradients of sizes 3, 7, 2 (f32) and 4 (f64) with buckets of at most 5 elements: [3] (3 + 7 > 5),
// [7] (larger than a bucket: its own), [2] (the dtype changes after it), [4]. Rank r's element i of
// gradient k is (r + 1)·(i + 1 + 10k), so the average over N ranks is (N + 1)/2·(i + 1 + 10k).
TEST(DataParallel, AveragesGradientsAcrossBucketsOfEverySize) {
  for (int size : {2, 3}) {
    EXPECT_EQ(failed_ranks(size, [size](dist::Communicator& comm) {
      const std::vector<std::pair<int64_t, DType>> shapes = {{3, DType::f32}, {7, DType::f32}, {2, DType::f32}, {4, DType::f64}};
      std::vector<Tensor> weights;
      for (const auto& [n, dtype] : shapes) weights.push_back(Tensor::zeros({n}, dtype));
      std::vector<Parameter> params;
      for (size_t k = 0; k < weights.size(); ++k) {
        std::vector<double> g;
        for (int64_t i = 0; i < weights[k].numel(); ++i) g.push_back((comm.rank() + 1.0) * (i + 1.0 + 10.0 * k));
        set_requires_grad(weights[k]);
        set_grad(weights[k], Tensor::from_vector(g, {weights[k].numel()}, weights[k].dtype()));
        params.push_back({"p" + std::to_string(k), &weights[k], ParamRole::matrix});
      }
      DataParallel dp(comm, 5);
      dp.average_gradients(params);
      for (size_t k = 0; k < weights.size(); ++k) {
        const std::vector<double> got = grad_of(weights[k]).to_doubles();
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i], (size + 1) / 2.0 * (i + 1.0 + 10.0 * k)) << "gradient " << k << " element " << i;
        }
      }
    }), 0) << size << " ranks";
  }
}

// Overlap: averaging started before the backward (start_overlap) and finished after it gives the gradients
// of averaging after the backward, bit for bit (2 ranks: one addition per element either way), and every
// bucket whose gradients the backward reached was ready before the backward ended; a parameter the backward
// does not reach keeps no gradient. Buckets of at most 5 elements, cut in reverse parameter order (the
// order a model's backward reaches them): one per parameter here.
TEST(DataParallel, OverlappedAveragingEqualsAveragingAfterTheBackward) {
  EXPECT_EQ(failed_ranks(2, [](dist::Communicator& comm) {
    auto run = [&](bool overlap) {
      const std::vector<int64_t> sizes = {3, 7, 2, 4, 6};  // the last one unused
      std::vector<Tensor> weights;
      for (int64_t n : sizes) weights.push_back(set_requires_grad(Tensor::ones({n}, DType::f32)));
      std::vector<Parameter> params;
      for (size_t k = 0; k < weights.size(); ++k) params.push_back({"p" + std::to_string(k), &weights[k], ParamRole::matrix});
      DataParallel dp(comm, 5);
      if (overlap) dp.start_overlap(params);
      // loss = Σ_k c_k · Σ_i w_k,i², c_k depending on the rank: dL/dw_k = 2 c_k w_k.
      Tensor loss;
      for (size_t k = 0; k + 1 < weights.size(); ++k) {
        Tensor term = mul(sum(square(weights[k])), 0.1 * (comm.rank() + 1.0) * (k + 1.0) + 1.0 / 3.0);
        loss = loss.defined() ? add(loss, term) : term;
      }
      backward(loss);
      dp.average_gradients(params);
      std::vector<std::vector<double>> grads;
      for (size_t k = 0; k + 1 < weights.size(); ++k) grads.push_back(grad_of(weights[k]).to_doubles());
      EXPECT_FALSE(grad_of(weights.back()).defined());
      if (overlap) {
        const DataParallel::OverlapStats s = dp.last_overlap();
        EXPECT_EQ(s.buckets, 5);  // [6] [4] [2] [7] [3]: the sizes in reverse, none fitting beside another
        EXPECT_EQ(s.ready_during_backward, 4);  // all but the unused parameter's
      }
      return grads;
    };
    EXPECT_EQ(run(true), run(false));
  }), 0);
}

TEST(DataParallel, TheRanksAgreeOnTheLossAndOnStopping) {
  EXPECT_EQ(failed_ranks(2, [](dist::Communicator& comm) {
    DataParallel dp(comm);
    EXPECT_EQ(dp.average(comm.rank() == 0 ? 1.0 : 2.0), 1.5);
    EXPECT_EQ(dp.agreed_stop_signal(0), 0);
    EXPECT_EQ(dp.agreed_stop_signal(comm.rank() == 1 ? SIGTERM : 0), SIGTERM);
    EXPECT_EQ(dp.agreed_stop_signal(comm.rank() == 0 ? SIGINT : SIGTERM), SIGTERM);  // the largest
  }), 0);
}

// A position saved by 2 ranks (3 windows each into epoch 1: 6 in all) continues on 3 ranks at 2 each
// and on 1 at 6; on 4 ranks it does not split and is refused, naming the count and the world size.
TEST(DataParallel, TheSavedLoaderPositionIsIndependentOfTheWorldSize) {
  for (int size : {1, 2, 3, 4}) {
    EXPECT_EQ(failed_ranks(size, [size](dist::Communicator& comm) {
      DataParallel dp(comm);
      EXPECT_EQ(dp.to_global({1, 3}), (LoaderState{1, 3 * size}));
      const absl::StatusOr<LoaderState> back = dp.to_rank({1, 6});
      if (size == 4) {
        ASSERT_FALSE(back.ok());
        EXPECT_NE(std::string(back.status().message()).find("(6 windows into epoch 1) does not split evenly across 4 data-parallel ranks"),
                  std::string::npos) << back.status().message();
      } else {
        ASSERT_TRUE(back.ok()) << back.status().message();
        EXPECT_EQ(*back, (LoaderState{1, 6 / size}));
      }
    }), 0) << size << " ranks";
  }
}

}  // namespace
}  // namespace seqlab
