// llm.c token shards (train/data/shards.h) and the loader over them (train/data/loader.h), as
// `data.source = "shards"` reads them. The input: one byte of loader options (seq_len 1..16, 1..4
// ranks, shuffling), one byte of a loader position to restore, then the bytes of the shard files
// train_000000.bin, train_000001.bin, ... separated by "SEQLAB-NEXT-SHARD". The stream the loader
// reads must be the files' tokens, and its batches windows of it.
#include <cstring>

#include "fuzz_util.h"
#include "train/data/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  if (size < 2) return 0;
  LoaderOptions options;
  options.seq_len = 1 + (data[0] & 15);
  options.world = 1 + (data[0] >> 4 & 3);
  options.rank = (data[0] >> 6) % options.world;
  options.shuffle = (data[1] & 1) != 0;
  options.seed = data[1];
  const LoaderState restore_to{data[1] >> 5 & 3, data[1] >> 1 & 15};

  namespace fs = std::filesystem;
  const fs::path dir = fuzz::scratch_dir() / "shards";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::vector<absl::string_view> files = fuzz::split_parts(rest, "SEQLAB-NEXT-SHARD");
  for (size_t i = 0; i < files.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "shards/train_%06zu.bin", i);
    fuzz::write_scratch(name, files[i]);
  }

  absl::StatusOr<TokenLoader> loader = TokenLoader::open_split(dir.string(), "train", options);
  if (!loader.ok()) return 0;

  // The stream is the shards' tokens (after each 1024-byte header), in file order.
  std::vector<uint16_t> expected;
  for (absl::string_view file : files) {
    const size_t n = (file.size() - 1024) / 2;
    const size_t at = expected.size();
    expected.resize(at + n);
    std::memcpy(expected.data() + at, file.data() + 1024, 2 * n);
  }
  FUZZ_CHECK(loader->num_tokens() == static_cast<int64_t>(expected.size()), "token count differs from the files'");
  std::vector<int32_t> stream(expected.size());
  loader->read_tokens(0, static_cast<int64_t>(stream.size()), stream.data());
  for (size_t i = 0; i < stream.size(); ++i) FUZZ_CHECK(stream[i] == expected[i], "token " + std::to_string(i));

  // Batches are windows: each row's targets are its inputs shifted by one, read from the stream.
  auto check_batch = [&](const Batch& b) {
    const int64_t rows = b.inputs.shape()[0], t = options.seq_len;
    const int32_t* in = b.inputs.data<int32_t>();
    const int32_t* tg = b.targets.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i + 1 < t; ++i) FUZZ_CHECK(tg[r * t + i] == in[r * t + i + 1], "targets are not shifted");
    }
  };
  for (int k = 0; k < 3; ++k) check_batch(loader->next_batch(2));
  for (int64_t k = 0; k < 2; ++k) check_batch(loader->eval_batch(k, 3));

  // A position restored (as from a checkpoint) continues the same way in a freshly opened loader.
  if (loader->restore(restore_to).ok()) {
    absl::StatusOr<TokenLoader> fresh = TokenLoader::open_split(dir.string(), "train", options);
    FUZZ_CHECK(fresh.ok() && fresh->restore(restore_to).ok(), "a second opening refuses what the first took");
    const Batch a = loader->next_batch(3), b = fresh->next_batch(3);
    FUZZ_CHECK(std::memcmp(a.inputs.raw_data(), b.inputs.raw_data(), a.inputs.nbytes()) == 0,
               "two loaders restored to one position draw different batches");
    FUZZ_CHECK(loader->state() == fresh->state(), "two loaders restored to one position moved differently");
  }
  return 0;
}
