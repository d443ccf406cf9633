// What checking a shard's ids against the vocabulary costs when the loader opens it
// (Shard::check_ids, src/train/data/shards.h), against its peer: one plain pass that sums the same ids,
// the least any reading of them costs. Writes a shard of --tokens ids (GPT-2-like: below 50257, one
// per position from a fixed generator) into --dir, opens it, and times both over the memory map with the
// file in the page cache (median of --reps after one warm-up each, alternated). A cold first read from
// disk adds the disk's time for 2 bytes per token to either.
//
// Usage: shard_check_bench [--tokens 100000000] [--reps 5]   (the shard goes to $TMPDIR or /tmp)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/tensor.h"
#include "train/data/shards.h"

using namespace seqlab;

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "shard_check_bench: %s\nusage: shard_check_bench [--tokens N] [--reps N]\n", why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 100'000'000, reps = 5;
  bench::Placement unused;
  bench::parse_flags(argc, argv, {{"--tokens", &tokens}, {"--reps", &reps}}, unused, usage);
  if (tokens < 1 || reps < 1) usage("--tokens and --reps must be at least 1");
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path path =
      std::filesystem::path(tmp ? tmp : "/tmp") / ("shard_check_bench_" + std::to_string(::getpid()) + ".bin");

  std::vector<uint16_t> ids(static_cast<size_t>(tokens));
  Generator gen(1);
  for (uint16_t& id : ids) id = static_cast<uint16_t>(gen.next_u64() % 50257);
  if (absl::Status s = write_shard(path.string(), ids.data(), tokens); !s.ok()) usage(std::string(s.message()));
  ids = {};
  absl::StatusOr<Shard> shard = Shard::open(path.string());
  if (!shard.ok()) usage(std::string(shard.status().message()));

  uint64_t sum = 0;
  bool ok = true;
  const bench::PairTiming t = bench::time_pair(
      [&] { ok = ok && shard->check_ids(50257).ok(); },
      [&] {
        const uint16_t* t = shard->tokens();
        uint64_t s = 0;
        for (int64_t i = 0; i < tokens; ++i) s += t[i];
        sum += s;
      },
      1, static_cast<int>(reps));
  std::filesystem::remove(path);
  if (!ok) usage("check_ids refused ids below the vocabulary");
  const double gb = 2.0 * static_cast<double>(tokens) / 1e9;
  std::printf("shard_check_bench: %lld tokens (%.2f GB): check_ids %.3f s (%.1f GB/s); plain sum %.3f s (%.1f GB/s); "
              "ratio %.2f (checksum %llu)\n",
              static_cast<long long>(tokens), gb, t.a_seconds, gb / t.a_seconds, t.b_seconds, gb / t.b_seconds,
              t.a_seconds / t.b_seconds,
              static_cast<unsigned long long>(sum % 1000));
  return 0;
}
