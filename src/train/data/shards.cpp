#include "train/data/shards.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards.cpp reads and writes the little-endian shard layout straight from memory"
#endif

namespace seqlab {

namespace fs = std::filesystem;

absl::Status write_shard(const std::string& path, const uint16_t* tokens, int64_t count) {
  if (count < 0 || count > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", count, " tokens do not fit one shard (at most ", INT32_MAX, ")"));
  }
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(count);
  return write_file_atomic(path, {absl::string_view(reinterpret_cast<const char*>(header), sizeof header),
                                  absl::string_view(reinterpret_cast<const char*>(tokens), 2 * count)});
}

absl::Status write_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kShardMaxVocab) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", tokens[i], " at position ", i,
                                                     " does not fit uint16 (shards hold vocabularies up to ",
                                                     kShardMaxVocab, ")"));
    }
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  return write_shard(path, narrow.data(), static_cast<int64_t>(narrow.size()));
}

absl::StatusOr<Shard> Shard::open(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::open(path);
  if (!file.ok()) return file.status();
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(path + ": " + what); };
  const uint64_t size = file->size();
  if (size < static_cast<uint64_t>(kShardHeaderBytes)) {
    return fail(absl::StrCat("truncated shard: ", size, " bytes, less than the ", kShardHeaderBytes, "-byte header"));
  }
  int32_t header[3];
  std::memcpy(header, file->data(), sizeof header);
  if (header[0] != kShardMagic) {
    return fail(absl::StrCat("not a token shard: magic ", header[0], ", expected ", kShardMagic, " (llm.c .bin layout)"));
  }
  if (header[1] != kShardVersion) {
    return fail(absl::StrCat("shard version ", header[1], " is not supported (version ", kShardVersion,
                             ": uint16 tokens)"));
  }
  if (header[2] < 0) return fail(absl::StrCat("corrupt header: token count ", header[2]));
  const uint64_t expect = static_cast<uint64_t>(kShardHeaderBytes) + 2 * static_cast<uint64_t>(header[2]);
  if (size != expect) {
    return fail(absl::StrCat(size < expect ? "truncated shard" : "size mismatch", ": the header says ", header[2],
                             " tokens (", expect, " bytes) but the file has ", size, " bytes"));
  }
  Shard s;
  s.file_ = std::move(*file);
  s.count_ = header[2];
  return s;
}

absl::Status Shard::check_ids(int64_t vocab_size) const {
  if (vocab_size >= kShardMaxVocab) return absl::OkStatus();  // every uint16 is an id
  const uint16_t* ids = tokens();
  // The maximum of each block of ids (a loop the compiler vectorises), then the first offending id
  // within the first block whose maximum is too large.
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t start = 0; start < count_; start += kBlock) {
    const int64_t end = std::min(count_, start + kBlock);
    uint16_t top = 0;
    for (int64_t i = start; i < end; ++i) top = std::max(top, ids[i]);
    if (top < vocab_size) continue;
    for (int64_t i = start; i < end; ++i) {
      if (ids[i] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(path(), ": token id ", ids[i], " at position ", i,
                                                       " is outside the vocabulary of ", vocab_size, " ids"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> find_shards(const std::string& dir, const std::string& split) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list the shard folder (", ec.message(), ")"));
  std::vector<std::string> found;
  for (const fs::directory_entry& e : it) {
    std::string name = e.path().filename().string();
    if (!absl::EndsWith(name, ".bin") || !e.is_regular_file(ec)) continue;
    std::vector<absl::string_view> words = absl::StrSplit(name, absl::ByAnyChar("_."));
    if (std::find(words.begin(), words.end(), split) != words.end()) found.push_back(e.path().string());
  }
  if (found.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no ", split, " shards (*", split, "*.bin)"));
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace seqlab
