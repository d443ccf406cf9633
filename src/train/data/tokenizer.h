// Tokenizers: text <-> token ids.
//
// Every tokenizer has a regular vocabulary (ids 0..n-1, each standing for a byte string) followed by the
// same 19 special tokens: end-of-text, pad, mask and 16 sentinels (T5 span corruption):
//   eot = n, pad = n+1, mask = n+2, sentinel(i) = n+3+i,   vocab_size() = n+19.
// encode() never produces a special id (text such as "<|eot|>" is encoded as its bytes); the data
// pipeline inserts them. decode() renders them as "<|eot|>", "<|pad|>", "<|mask|>", "<|sentinel_3|>".
//
// ByteTokenizer: ids 0..255 are the bytes, so any byte string round trips (vocab 275).
// BpeTokenizer: byte-level BPE. Merge k joins two existing ids into id 256+k. Text is first cut into
// chunks (see below) and merges never cross a chunk, so tokens do not span words. Merges file format:
//   seqlab-bpe 1
//   104 101        <- merge 0: 'h' 'e' -> id 256
//   256 108        <- merge 1: "he" 'l' -> id 257
//   ...
// one merge per line, two decimal ids each already defined (a byte or an earlier merge).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

namespace seqlab {

constexpr int kNumSentinels = 16;
constexpr int kNumSpecialTokens = 3 + kNumSentinels;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(absl::string_view text) const = 0;
  // Ids outside the vocabulary (a model whose output layer is padded) decode to "<|unknown_N|>".
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token, or the special token's marker.
  std::string token_text(int32_t id) const;

  int32_t vocab_size() const { return first_special_ + kNumSpecialTokens; }
  int32_t eot() const { return first_special_; }
  int32_t pad() const { return first_special_ + 1; }
  int32_t mask() const { return first_special_ + 2; }
  int32_t sentinel(int i) const;  // 0 <= i < kNumSentinels
  bool is_special(int32_t id) const { return id >= first_special_ && id < vocab_size(); }

  // "byte" or "bpe": recorded in dataset metadata and checkpoints.
  virtual std::string name() const = 0;

 protected:
  explicit Tokenizer(int32_t first_special) : first_special_(first_special) {}
  // The bytes of a regular token, 0 <= id < first_special.
  virtual const std::string& regular_bytes(int32_t id) const = 0;
  void set_first_special(int32_t n) { first_special_ = n; }

 private:
  int32_t first_special_;
};

class ByteTokenizer : public Tokenizer {
 public:
  ByteTokenizer();
  std::vector<int32_t> encode(absl::string_view text) const override;
  std::string name() const override { return "byte"; }

 protected:
  const std::string& regular_bytes(int32_t id) const override { return bytes_[id]; }

 private:
  std::vector<std::string> bytes_;  // 256 one-byte strings
};

class BpeTokenizer : public Tokenizer {
 public:
  using Merge = std::pair<int32_t, int32_t>;

  // Learns merges from `documents` until vocab_size() reaches `vocab_size` (bytes + merges + specials),
  // or until no adjacent pair occurs twice (so the result may be smaller). Each step merges the most
  // frequent pair; ties go to the smallest (left id, right id), so training is deterministic.
  static absl::StatusOr<BpeTokenizer> train(const std::vector<std::string>& documents, int32_t vocab_size);
  // Validates that every merge refers to ids defined before it and that no pair repeats.
  static absl::StatusOr<BpeTokenizer> from_merges(std::vector<Merge> merges);

  static absl::StatusOr<BpeTokenizer> load(const std::string& path);
  absl::Status save(const std::string& path) const;

  std::vector<int32_t> encode(absl::string_view text) const override;
  std::string name() const override { return "bpe"; }
  const std::vector<Merge>& merges() const { return merges_; }

 protected:
  const std::string& regular_bytes(int32_t id) const override { return bytes_[id]; }

 private:
  BpeTokenizer() : Tokenizer(256) {}
  void encode_chunk(absl::string_view chunk, std::vector<int32_t>* out) const;

  std::vector<Merge> merges_;
  std::vector<std::string> bytes_;              // id -> its bytes, for 256 + merges ids
  absl::flat_hash_map<uint64_t, int32_t> rank_;  // packed (left, right) -> merge index
};

// The pre-tokenisation both training and encoding use: a chunk is an optional single leading space and
// then a run of one character class (letters, where bytes >= 0x80 count as letters so UTF-8 stays
// whole; digits; other symbols), or a run of whitespace that leaves its last space to a following word.
// Chunks longer than 256 bytes are cut every 256 bytes to bound the cost of encoding one chunk.
// "Hi  there, 42!" -> "Hi" " " " there" "," " 42" "!"
std::vector<absl::string_view> split_chunks(absl::string_view text);

// "byte" needs no path; "bpe" loads a merges file from `path`. Errors name the kind or the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& kind, const std::string& path = "");

}  // namespace seqlab
