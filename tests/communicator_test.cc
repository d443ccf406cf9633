// The Gloo communicator (src/dist) between processes: every operation on every dtype against values
// computed exactly here, and the errors (calls that differ between ranks, bad arguments, a rank that
// never joins, never makes a call or dies) with the messages that name the rank and the operation.
//
// Each case forks one process per rank; they meet through a file store in a fresh temporary folder.
// A rank reports a failure through its exit status (and the message on stderr); the parent kills every
// rank still running after a watchdog of 30 s, so a hang fails the test instead of stalling CI. The
// values are small integers (and, for one bf16 case, sums that round), so every expected value is exact
// in every dtype and compared bit for bit.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "rank_processes.h"
#include "tensor/kernels.h"

namespace seqlab::dist {
namespace {

using testing::joined;
using testing::run_ranks;
using testing::StoreFolder;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64};


// Inside a rank: a failed check throws, and the rank exits with 1.
void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

void expect_values(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const std::vector<double> g = got.to_doubles();
  check(g.size() == want.size(), what + ": " + std::to_string(g.size()) + " values, expected " +
                                     std::to_string(want.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    check(g[i] == want[i], what + ": element " + std::to_string(i) + " is " + std::to_string(g[i]) + ", expected " +
                               std::to_string(want[i]));
  }
}

// `fn` must throw E whose message contains every one of `parts`.
template <class E, class Fn>
void expect_throw(Fn&& fn, const std::vector<std::string>& parts, const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    const std::string m = e.what();
    for (const auto& p : parts) check(m.find(p) != std::string::npos, what + ": \"" + m + "\" lacks \"" + p + "\"");
    return;
  }
  throw std::runtime_error("check failed: " + what + ": no exception of the expected type");
}

// Rank r's values: small integers in [-9, 9], different on every rank and element.
std::vector<double> values_of(int rank, int64_t n, int salt = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i * 7 + rank * 3 + salt * 5) % 19 - 9);
  return v;
}
Tensor tensor_of(int rank, const Shape& shape, DType dtype, int salt = 0) {
  return Tensor::from_vector(values_of(rank, shape_numel(shape), salt), shape, dtype);
}

// The silent rank of the timeout cases waits for this file (at most 10 s) instead of sleeping a fixed time.
void touch(const std::string& path) { std::fclose(std::fopen(path.c_str(), "w")); }
void wait_for_file(const std::string& path) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(path) && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
}

std::unique_ptr<Communicator> join(int rank, int size, const std::string& folder, milliseconds timeout) {
  return make_communicator(cpu_device(), open_file_store(folder), rank, size, timeout);
}

// Every operation on every dtype and a range of sizes (0, 1, odd, larger than Gloo's 1 MiB segment).
void every_operation(int rank, int size, const std::string& folder) {
  auto comm = join(rank, size, folder, std::chrono::seconds(20));
  check(comm->rank() == rank && comm->size() == size && std::string(comm->backend()) == "gloo", "identity");
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (DType dt : kDtypes) {
    const std::string d = dtype_name(dt);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const std::string what = d + " n=" + std::to_string(n);
      // all_reduce: sum, and the average where the dtype has one (sum / 2 or / 4 is exact).
      std::vector<double> sum(static_cast<size_t>(n), 0.0);
      for (int r = 0; r < size; ++r) {
        const auto v = values_of(r, n);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
      }
      Tensor t = tensor_of(rank, {n}, dt);
      comm->all_reduce(t, ReduceOp::sum);
      expect_values(t, sum, "all_reduce sum " + what);
      if (is_floating(dt)) {
        Tensor a = tensor_of(rank, {n}, dt);
        comm->all_reduce(a, ReduceOp::average);
        std::vector<double> avg = sum;
        for (double& x : avg) x /= size;
        expect_values(a, avg, "all_reduce average " + what);
      }
      // broadcast from every root.
      for (int root = 0; root < size; ++root) {
        Tensor b = tensor_of(rank, {n}, dt);
        comm->broadcast(b, root);
        expect_values(b, values_of(root, n), "broadcast root " + std::to_string(root) + " " + what);
      }
      // send_recv around the ring, both ways, each rank sending a length of its own.
      const int64_t mine = n + rank, from_prev = n + prev, from_next = n + next;
      Tensor got = Tensor::full({from_prev}, -100, dt);
      comm->send_recv(tensor_of(rank, {mine}, dt), next, got, prev);
      expect_values(got, values_of(prev, from_prev), "send_recv forward " + what);
      Tensor back = Tensor::full({from_next}, -100, dt);
      comm->send_recv(tensor_of(rank, {mine}, dt), prev, back, next);
      expect_values(back, values_of(next, from_next), "send_recv backward " + what);
    }
    for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      const std::string what = d + " k=" + std::to_string(k);
      // reduce_scatter: this rank's k rows of the sum of [size·k, 3].
      const int64_t rows = size * k;
      std::vector<double> sum(static_cast<size_t>(rows * 3), 0.0);
      for (int r = 0; r < size; ++r) {
        const auto v = values_of(r, rows * 3);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
      }
      const auto first = sum.begin() + rank * k * 3;
      std::vector<double> want(first, first + k * 3);
      Tensor out = Tensor::full({k, 3}, -100, dt);
      comm->reduce_scatter(tensor_of(rank, {rows, 3}, dt), out, ReduceOp::sum);
      expect_values(out, want, "reduce_scatter sum " + what);
      if (is_floating(dt)) {
        for (double& x : want) x /= size;
        comm->reduce_scatter(tensor_of(rank, {rows, 3}, dt), out, ReduceOp::average);
        expect_values(out, want, "reduce_scatter average " + what);
      }
      // all_gather: the ranks' [k, 2] in rank order.
      std::vector<double> gathered;
      for (int r = 0; r < size; ++r) {
        const auto v = values_of(r, k * 2);
        gathered.insert(gathered.end(), v.begin(), v.end());
      }
      Tensor all = Tensor::full({size * k, 2}, -100, dt);
      comm->all_gather(tensor_of(rank, {k, 2}, dt), all);
      expect_values(all, gathered, "all_gather " + what);
    }
  }
  // Non-contiguous tensors: a transposed view is reduced in place and gathered from.
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    const std::string d = dtype_name(dt);
    std::vector<double> want(15, 0.0);
    for (int r = 0; r < size; ++r) {
      const auto v = kernel::transpose(tensor_of(r, {5, 3}, dt), 0, 1).to_doubles();
      for (size_t i = 0; i < want.size(); ++i) want[i] += v[i];
    }
    Tensor base = tensor_of(rank, {5, 3}, dt);
    Tensor view = kernel::transpose(base, 0, 1);
    check(!view.is_contiguous(), "the transposed view is not contiguous");
    comm->all_reduce(view, ReduceOp::sum);
    expect_values(view, want, "all_reduce of a transposed view " + d);
    Tensor all = Tensor::zeros({size * 3, 5}, dt);
    comm->all_gather(kernel::transpose(tensor_of(rank, {5, 3}, dt), 0, 1), all);
    std::vector<double> gathered;
    for (int r = 0; r < size; ++r) {
      const auto v = kernel::transpose(tensor_of(r, {5, 3}, dt), 0, 1).to_doubles();
      gathered.insert(gathered.end(), v.begin(), v.end());
    }
    expect_values(all, gathered, "all_gather of a transposed view " + d);
    Tensor out_base = Tensor::zeros({5, 3}, dt);
    Tensor out_view = kernel::transpose(out_base, 0, 1);
    comm->broadcast(out_view, 0);  // every rank's zeros: the root's zeros again
    expect_values(out_view, std::vector<double>(15, 0.0), "broadcast into a transposed view " + d);
  }
  // A large f32 tensor (1.2 MB: several of Gloo's ring segments).
  {
    const int64_t n = 300001;
    std::vector<double> sum(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size; ++r) {
      const auto v = values_of(r, n);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
    }
    Tensor t = tensor_of(rank, {n}, DType::f32);
    comm->all_reduce(t);
    expect_values(t, sum, "all_reduce of 300001 f32");
  }
  // bf16 is summed in f32 and rounded once: 1 + r/128 summed over the ranks lands on a tie that
  // rounds to even, where pairwise bf16 sums would round 1 + 1/128 + 1 down first.
  {
    double exact = 0.0;
    for (int r = 0; r < size; ++r) exact += 1.0 + r / 128.0;
    Tensor t = Tensor::full({5}, 1.0 + rank / 128.0, DType::bf16);
    comm->all_reduce(t);
    const double want = static_cast<float>(bf16(static_cast<float>(exact)));
    expect_values(t, std::vector<double>(5, want), "bf16 sum rounded once");
  }
  // barrier: no rank leaves before the last (rank 0, 300 ms late) arrives.
  if (rank == 0) std::this_thread::sleep_for(milliseconds(300));
  const auto start = Clock::now();
  comm->barrier();
  if (rank != 0) check(Clock::now() - start > milliseconds(200), "barrier returned before rank 0 arrived");
}

TEST(Communicator, EveryOperationEveryDtypeTwoRanks) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) { every_operation(rank, 2, folder); });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, EveryOperationEveryDtypeFourRanks) {
  const auto failures = run_ranks(4, [](int rank, const std::string& folder) { every_operation(rank, 4, folder); });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

// One rank: every operation is a copy (or nothing), and every bad argument is refused before any
// transfer with a message naming the problem.
TEST(Communicator, OneRankAndBadArguments) {
  const auto failures = run_ranks(1, [](int rank, const std::string& folder) {
    auto comm = join(rank, 1, folder, std::chrono::seconds(5));
    Tensor t = tensor_of(0, {4}, DType::f64);
    comm->all_reduce(t, ReduceOp::average);
    expect_values(t, values_of(0, 4), "all_reduce at size 1");
    Tensor out = Tensor::zeros({4}, DType::f64);
    comm->all_gather(t, out);
    expect_values(out, values_of(0, 4), "all_gather at size 1");
    comm->reduce_scatter(t, out);
    expect_values(out, values_of(0, 4), "reduce_scatter at size 1");
    Tensor r = Tensor::zeros({4}, DType::f64);
    comm->send_recv(t, 0, r, 0);
    expect_values(r, values_of(0, 4), "send_recv to itself");
    comm->barrier();

    Tensor ints = Tensor::zeros({3}, DType::i32);
    expect_throw<std::invalid_argument>([&] { comm->all_reduce(ints, ReduceOp::average); },
                                        {"rank 0 of 1: all_reduce: ", "average of an i32 tensor"}, "integer average");
    Tensor wrong = Tensor::zeros({5}, DType::f64);
    expect_throw<std::invalid_argument>([&] { comm->all_gather(t, wrong); },
                                        {"rank 0 of 1: all_gather: ", "the output is f64 [5]", "must be [4]"},
                                        "all_gather output shape");
    Tensor f32 = Tensor::zeros({4}, DType::f32);
    expect_throw<std::invalid_argument>([&] { comm->all_gather(t, f32); },
                                        {"the input is f64 [4] but the output is f32 [4]"}, "all_gather dtypes");
    expect_throw<std::invalid_argument>([&] { comm->broadcast(t, 1); }, {"broadcast: root 1 is not a rank"},
                                        "broadcast root");
    expect_throw<std::invalid_argument>([&] { comm->send_recv(t, 1, r, 0); }, {"send_recv: peer 1 is not a rank"},
                                        "send_recv peer");
    Tensor deep = Tensor::zeros(Shape(9, 1), DType::f32);
    expect_throw<std::invalid_argument>([&] { comm->all_reduce(deep); }, {"has 9 dimensions; at most 8"},
                                        "too many dimensions");
    Tensor undefined;
    expect_throw<std::invalid_argument>([&] { comm->all_reduce(undefined); }, {"undefined tensor"}, "undefined");
    expect_throw<std::invalid_argument>([&] { comm->set_timeout(milliseconds(0)); }, {"must be positive"},
                                        "timeout 0");
    // A GPU communicator without a GPU (or without NCCL in the build) ends with a message, not a crash.
    if (!cuda_available()) {
      expect_throw<std::runtime_error>(
          [&] { make_communicator(cuda_device(0), open_file_store(folder + "/gpu"), 0, 1, milliseconds(1000)); },
          {"cuda:0"}, "a GPU communicator without a GPU");
    }
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

// Where the Gloo transport listens: a variable this machine cannot use is refused naming it and its
// value (a host name that does not resolve crashed the rank inside Gloo, which reads getaddrinfo's result
// without looking at its error). In a forked rank, whose environment is its own.
TEST(Communicator, TransportVariablesThisMachineCannotUseAreNamed) {
  const auto failures = run_ranks(1, [](int rank, const std::string& folder) {
    auto refused = [&](const char* name, const char* value, std::vector<std::string> parts) {
      ::setenv(name, value, 1);
      expect_throw<std::invalid_argument>([&] { join(rank, 1, folder, std::chrono::seconds(5)); }, parts, name);
      ::unsetenv(name);
    };
    refused("SEQLAB_GLOO_HOST", "nosuchhost.invalid", {"SEQLAB_GLOO_HOST=nosuchhost.invalid: cannot resolve the host name ("});
    refused("SEQLAB_GLOO_HOST", "192.0.2.1", {"SEQLAB_GLOO_HOST=192.0.2.1: no address of this name is one of this machine's"});
    refused("SEQLAB_GLOO_IFACE", "nosuchif0", {"SEQLAB_GLOO_IFACE=nosuchif0: no network interface of this name"});
    ::setenv("SEQLAB_GLOO_IFACE", "lo", 1);  // the loopback interface, which every machine has
    auto comm = join(rank, 1, folder + "/lo", std::chrono::seconds(5));
    comm->barrier();
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, RanksCallingDifferentlyAreNamedAndTheCommunicatorStaysUsable) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) {
    auto comm = join(rank, 2, folder, std::chrono::seconds(10));
    // Shapes differ.
    Tensor t = Tensor::zeros({rank == 0 ? 4 : 5});
    expect_throw<std::invalid_argument>(
        [&] { comm->all_reduce(t); },
        {"rank " + std::to_string(rank) + " of 2: all_reduce: the ranks' calls differ:",
         "rank 0 called all_reduce(sum) of f32 [4]", "rank 1 called all_reduce(sum) of f32 [5]"},
        "mismatched shapes");
    // Operations differ.
    Tensor b = Tensor::zeros({2}, DType::i64);
    expect_throw<std::invalid_argument>(
        [&] {
          if (rank == 0) comm->barrier();
          else comm->broadcast(b, 0);
        },
        {"rank 0 called barrier", "rank 1 called broadcast(root 0) of i64 [2]"}, "mismatched operations");
    // A pair disagreeing on what travels: both ends say so.
    Tensor send = Tensor::zeros({rank == 0 ? 3 : 4}), recv = Tensor::zeros({rank == 0 ? 3 : 2});
    const int peer = 1 - rank;
    expect_throw<std::invalid_argument>(
        [&] { comm->send_recv(send, peer, recv, peer); },
        {rank == 0 ? "rank 1 sends f32 [4] but recv here is f32 [3]" : "rank 0 sends f32 [3] but recv here is f32 [2]"},
        "mismatched send_recv");
    // Still usable.
    Tensor ok = Tensor::full({3}, rank + 1, DType::i32);
    comm->all_reduce(ok);
    expect_values(ok, {3, 3, 3}, "all_reduce after the refused calls");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, RankThatNeverJoinsTimesOutTheRendezvous) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) {
    if (rank == 1) return;  // never joins
    const auto start = Clock::now();
    expect_throw<CommError>([&] { join(rank, 2, folder, milliseconds(1000)); },
                            {"rank 0 of 2: rendezvous timed out after 1 s"}, "rendezvous without rank 1");
    // Gloo's file store checks its deadline in whole seconds: it gives up at most 1 s late.
    check(Clock::now() - start < std::chrono::seconds(3), "the rendezvous timeout took more than 3 s");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, RankThatNeverCallsTimesOutAndBreaksTheCommunicator) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) {
    auto comm = join(rank, 2, folder, milliseconds(1000));
    if (rank == 1) {  // joins, then makes no call until rank 0 has given up
      wait_for_file(folder + "/rank0_done");
      return;
    }
    Tensor t = Tensor::ones({8});
    const auto start = Clock::now();
    expect_throw<CommError>([&] { comm->all_reduce(t); },
                            {"rank 0 of 2: all_reduce timed out after 1 s", "did not make this call"},
                            "all_reduce without rank 1");
    check(Clock::now() - start < std::chrono::seconds(3), "the all_reduce timeout took more than 3 s");
    expect_throw<CommError>([&] { comm->barrier(); },
                            {"rank 0 of 2: barrier: the communicator is unusable after an earlier failure",
                             "all_reduce timed out"},
                            "barrier after the failure");
    touch(folder + "/rank0_done");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, SendRecvWithAPeerThatNeverCallsTimesOut) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) {
    auto comm = join(rank, 2, folder, milliseconds(1000));
    if (rank == 1) {
      wait_for_file(folder + "/rank0_done");
      return;
    }
    Tensor send = Tensor::ones({8}), recv = Tensor::zeros({8});
    expect_throw<CommError>([&] { comm->send_recv(send, 1, recv, 1); }, {"rank 0 of 2: send_recv timed out after 1 s"},
                            "send_recv without rank 1");
    touch(folder + "/rank0_done");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

TEST(Communicator, RankThatDiesEndsTheOthersCallWithAnError) {
  const auto failures = run_ranks(2, [](int rank, const std::string& folder) {
    auto comm = join(rank, 2, folder, milliseconds(5000));
    // Both ranks finish connecting first (a rank that died during the rendezvous would end the other's
    // rendezvous instead, with "rendezvous failed").
    comm->barrier();
    if (rank == 1) _exit(0);  // dies without a word: its sockets close
    Tensor t = Tensor::ones({8});
    const auto start = Clock::now();
    expect_throw<CommError>([&] { comm->all_reduce(t); }, {"rank 0 of 2: all_reduce "}, "all_reduce after rank 1 died");
    check(Clock::now() - start < std::chrono::seconds(6), "the error took longer than the timeout");
  });
  EXPECT_TRUE(failures.empty()) << joined(failures);
}

}  // namespace
}  // namespace seqlab::dist
