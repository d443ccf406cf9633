// Token shards in llm.c's .bin layout, so shards prepared by that ecosystem load unchanged:
//
//   bytes 0..1023   256 little-endian int32: [0] = 20240520 (magic), [1] = 1 (version), [2] = token count,
//                   the rest zero
//   bytes 1024..    token count × uint16 tokens
//
// A shard is validated when opened (magic, version, file size = 1024 + 2 × count exactly) and then read
// through a memory map; the loader then checks its ids against the vocabulary (Shard::check_ids) once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "train/data/data_io.h"

namespace seqlab {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int64_t kShardHeaderBytes = 256 * 4;
constexpr int64_t kShardMaxVocab = 65536;  // uint16 tokens

// Writes a shard atomically. A token outside [0, 65535] (a vocabulary larger than 65536) is an error
// naming the token and its position; so is a count above the header's int32 range.
absl::Status write_shard(const std::string& path, const std::vector<int32_t>& tokens);
absl::Status write_shard(const std::string& path, const uint16_t* tokens, int64_t count);

class Shard {
 public:
  // Errors name the file and the mismatch: truncated header, bad magic, unsupported version, a size
  // that disagrees with the token count.
  static absl::StatusOr<Shard> open(const std::string& path);

  int64_t size() const { return count_; }
  const uint16_t* tokens() const { return reinterpret_cast<const uint16_t*>(file_.data() + kShardHeaderBytes); }
  const std::string& path() const { return file_.path(); }
  // An error naming the file, the first id ≥ vocab_size and its position when there is one. One pass
  // over the ids, no slower than summing them: 7–17 ms for a 100M-token shard in the page cache
  // (bench/shard_check_bench.cpp); a shard not yet read adds the disk's time for its bytes.
  absl::Status check_ids(int64_t vocab_size) const;

 private:
  MappedFile file_;
  int64_t count_ = 0;
};

// The shards of one split in `dir`, sorted by name: files ending in ".bin" whose name, cut at '_' and
// '.', contains the word `split` ("train_000000.bin", "fineweb_val_000001.bin", "shakespeare_val.bin").
// An error when there are none.
absl::StatusOr<std::vector<std::string>> find_shards(const std::string& dir, const std::string& split);

}  // namespace seqlab
