// Peak activation memory per rank under sequence parallelism (docs/distributed.md, docs/perf.md): one
// forward and backward of a small language model over ONE long sequence of T tokens, by P = 1, 2, 4 rank
// processes (Gloo, CPU) each holding T/P of its tokens. Each rank reports its allocator's peak above what was
// live before the step (the weights; so the peak is the activations, the gradients and the exchange buffers),
// and its time; printed: the largest over the ranks, and the ratio to P = 1. The goal: ≤ 0.3× at
// P = 4. Every rank runs one OpenMP thread, so the times compare the same total cores only at P = 1 with
// --threads 1; they are printed, not judged.
//
// Usage: sequence_parallel_bench [--mixer attention|gla|...] [--T 4096] [--d 64] [--layers 2] [--heads 4]
//                                [--max_ranks 4] [--threads 1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "layers/model/decoder.h"
#include "layers/sequence_parallel.h"
#include "tensor/device.h"
#include "tests/rank_processes.h"

using namespace seqlab;

namespace {

struct Flags {
  std::string mixer = "attention";
  int64_t T = 4096, d = 64, layers = 2, heads = 4, max_ranks = 4, threads = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "sequence_parallel_bench: %s\nusage: sequence_parallel_bench [--mixer NAME] [--T N] [--d N] "
               "[--layers N] [--heads N] [--max_ranks N] [--threads N]\n",
               why.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[i + 1];
    if (k == "--mixer") {
      f.mixer = v;
      continue;
    }
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1) usage(k + " takes an integer ≥ 1, got " + v);
    if (k == "--T") f.T = n;
    else if (k == "--d") f.d = n;
    else if (k == "--layers") f.layers = n;
    else if (k == "--heads") f.heads = n;
    else if (k == "--max_ranks") f.max_ranks = n;
    else if (k == "--threads") f.threads = n;
    else usage("unknown flag " + k);
  }
  return f;
}

// One rank's step: returns "peak_bytes seconds".
std::string rank_step(const Flags& f, int P, int rank, const std::string& folder) {
  omp_set_num_threads(static_cast<int>(f.threads));
  ModelConfig cfg;
  cfg.vocab_size = 256;
  cfg.d_model = f.d;
  cfg.n_heads = f.heads;
  cfg.max_seq_len = f.T;
  cfg.positions = f.mixer == "attention" ? PositionKind::learned : PositionKind::none;
  for (int64_t l = 0; l < f.layers; ++l) cfg.blocks.push_back({f.mixer, FfnKind::gelu});
  Generator gen(1);
  Decoder model(cfg, gen);
  std::vector<int64_t> ids(static_cast<size_t>(f.T));
  for (int64_t t = 0; t < f.T; ++t) ids[static_cast<size_t>(t)] = (t * 7 + t / 13) % 256;
  Batch whole(Tensor::from_indices(ids, {1, f.T}, DType::i32), Tensor::from_indices(ids, {1, f.T}, DType::i32));
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<SequenceGroup> group;
  Batch batch = whole;
  if (P > 1) {
    comm = dist::make_communicator(cpu_device(), dist::open_file_store(folder), rank, P);
    group = std::make_unique<SequenceGroup>(*comm);
    batch = Batch(sequence_take_local(whole.inputs, *group), sequence_take_local(whole.targets, *group));
    comm->barrier();
  }
  Allocator& alloc = cpu_allocator();
  const int64_t live = alloc.stats().live_bytes;
  alloc.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  {
    SequenceParallelScope scope(group.get());
    backward(model.loss(batch));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::to_string(alloc.stats().peak_bytes - live) + " " + std::to_string(seconds);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  std::printf("# %s, %ld layers, d %ld, %ld heads, one sequence of T = %ld; per rank: allocator peak above the "
              "weights during one forward + backward, %ld thread(s) each\n",
              f.mixer.c_str(), static_cast<long>(f.layers), static_cast<long>(f.d), static_cast<long>(f.heads),
              static_cast<long>(f.T), static_cast<long>(f.threads));
  std::printf("%4s  %14s  %10s  %10s\n", "P", "peak MiB/rank", "ratio", "seconds");
  double base = 0;
  for (int P = 1; P <= f.max_ranks; P *= 2) {
    const seqlab::testing::StoreFolder folder;  // the ranks' results, removed afterwards
    const std::string& results = folder.path;
    const auto failures = seqlab::testing::run_ranks(
        P,
        [&](int rank, const std::string& folder) {
          std::ofstream(results + "/rank" + std::to_string(rank)) << rank_step(f, P, rank, folder) << "\n";
        },
        std::chrono::seconds(1800));
    if (!failures.empty()) {
      std::fprintf(stderr, "sequence_parallel_bench: P = %d failed:\n%s", P, seqlab::testing::joined(failures).c_str());
      return 1;
    }
    double peak = 0, seconds = 0;
    for (int r = 0; r < P; ++r) {
      std::ifstream in(results + "/rank" + std::to_string(r));
      double b = 0, s = 0;
      in >> b >> s;
      peak = std::max(peak, b / (1024.0 * 1024.0));
      seconds = std::max(seconds, s);
    }
    if (P == 1) base = peak;
    std::printf("%4d  %14.1f  %10.3f  %10.2f\n", P, peak, peak / base, seconds);
    std::fflush(stdout);
  }
  return 0;
}
