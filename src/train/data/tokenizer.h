// Tokenizers: text <-> token ids, and decoders: token ids -> text.
//
// TokenDecoder is what sampling needs of a vocabulary: the text of each id, the end-of-text id that
// starts every document, which ids stand for no text, and the ids of a prompt. Tokenizer adds encode()
// (the data pipeline tokenises corpora with it); the decoders below have none.
//
// Every Tokenizer has a regular vocabulary (ids 0..n-1, each standing for a byte string) followed by a
// table of special tokens (special_tokens.h), chosen by data.objective; by default the language model's
// 19 (end-of-text, pad, mask and 16 sentinels):
//   eot = n, pad = n+1, mask = n+2, sentinel(i) = n+3+i,   vocab_size() = n+19;
// masked_lm's [PAD] [CLS] [SEP] [MASK] (vocab n+4) and span_corruption's [PAD] [EOS] <extra_id_0> ...
// take their place for those objectives, the regular ids unchanged. encode() never produces a special id
// (text such as "<|eot|>" or "[MASK]" in a corpus is encoded as its bytes); the data pipeline inserts
// them. decode() renders them as their table's texts ("<|eot|>", "<|sentinel_3|>", "[MASK]",
// "<extra_id_0>"), and encode_prompt() reads those texts back as the ids for the masked_lm and
// span_corruption tables (a prompt "The [MASK] sat" holds the [MASK] id), not for the lm table's markers.
//
// ByteTokenizer: ids 0..255 are the bytes, so any byte string round trips (vocab 275 with the lm table).
// BpeTokenizer: byte-level BPE. Merge k joins two existing ids into id 256+k. Text is first cut into
// chunks (see below) and merges never cross a chunk, so tokens do not span words. Merges file format:
//   seqlab-bpe 1
//   104 101        <- merge 0: 'h' 'e' -> id 256
//   256 108        <- merge 1: "he" 'l' -> id 257
//   ...
// one merge per line, two decimal ids each already defined (a byte or an earlier merge).
//
// LlmcTokenizer: llm.c's tokenizer file (gpt2_tokenizer.bin), a decoder of llm.c's token shards:
//   bytes 0..1023   256 little-endian uint32: [0] = 20240328 (magic), [1] = version (1 or 2),
//                   [2] = n, the number of tokens (GPT-2: 50257), [3] = the end-of-text id (version 2
//                   only; version 1 means llm.c's 50256), the rest unread
//   then, for each id 0..n-1 in order: one byte L > 0 and the id's L bytes.
// Its vocabulary is those n ids, end-of-text among them (no pad, mask or sentinels). It holds no BPE
// merges, so it cannot encode text: a prompt is given as token ids ("464 2068 7586") instead.
// TokenIdDecoder: no tokenizer at all (llm.c shards without a tokenizer file): an id decodes to its
// decimal number, and end-of-text is taken to be the last id, where GPT-2 has it (50256 of 50257).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include "train/data/special_tokens.h"

namespace seqlab {

// The lm table's sentinels and special tokens (special_tokens.h): a BPE vocabulary's size counts these.
constexpr int kNumSentinels = kLmSentinels;
constexpr int kNumSpecialTokens = 3 + kNumSentinels;

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t eot() const = 0;
  // Ids that stand for no text (end-of-text, padding, masks, sentinels): sampling draws none of them
  // but end-of-text.
  virtual bool is_special(int32_t id) const = 0;
  // The bytes of one token, or a special token's marker; ids outside the vocabulary (a model whose
  // output layer is padded) give "<|unknown_N|>".
  virtual std::string token_text(int32_t id) const = 0;
  // The tokens' texts one after another (TokenIdDecoder: the ids separated by spaces).
  virtual std::string decode(const std::vector<int32_t>& ids) const;
  // The ids a prompt stands for: its text encoded by a Tokenizer; token ids, separated by spaces or
  // commas, for a decoder that cannot encode. Errors say what is wrong with the prompt.
  virtual absl::StatusOr<std::vector<int32_t>> encode_prompt(absl::string_view prompt) const = 0;

  // "byte", "bpe", "llmc" or "ids": recorded in dataset metadata and checkpoints.
  virtual std::string name() const = 0;
};

class Tokenizer : public TokenDecoder {
 public:
  virtual std::vector<int32_t> encode(absl::string_view text) const = 0;
  // encode(prompt), except that with a table whose texts are read in prompts (masked_lm, span_corruption)
  // each occurrence of a special token's text is that token's id (the longest text where several start).
  absl::StatusOr<std::vector<int32_t>> encode_prompt(absl::string_view prompt) const override;
  std::string token_text(int32_t id) const override;

  int32_t vocab_size() const override { return first_special_ + special_tokens_.size(); }
  int32_t num_regular() const { return first_special_; }  // n: the ids that stand for text
  // The ids of the table's roles (special_tokens.h). std::out_of_range, naming the table, for a role the
  // table lacks (cls() of the lm table) and for a sentinel past the last.
  int32_t eot() const override { return role_id(special_tokens_.eot, "end-of-text"); }
  int32_t pad() const { return role_id(special_tokens_.pad, "padding"); }
  int32_t mask() const { return role_id(special_tokens_.mask, "mask"); }
  int32_t cls() const { return role_id(special_tokens_.cls, "[CLS]"); }
  int32_t sep() const { return role_id(special_tokens_.sep, "[SEP]"); }
  int32_t eos() const { return role_id(special_tokens_.eos, "[EOS]"); }
  int32_t sentinel(int i) const;  // 0 <= i < num_sentinels()
  int num_sentinels() const { return special_tokens_.sentinels; }
  bool is_special(int32_t id) const override { return id >= first_special_ && id < vocab_size(); }

  const SpecialTokens& special_tokens() const { return special_tokens_; }
  // Puts another objective's table after the same regular ids.
  void set_special_tokens(SpecialTokens table) { special_tokens_ = std::move(table); }

 protected:
  explicit Tokenizer(int32_t first_special)
      : first_special_(first_special), special_tokens_(seqlab::special_tokens(Objective::lm)) {}
  // The bytes of a regular token, 0 <= id < first_special.
  virtual const std::string& regular_bytes(int32_t id) const = 0;
  void set_first_special(int32_t n) { first_special_ = n; }

 private:
  int32_t role_id(int index, const char* role) const;

  int32_t first_special_;
  SpecialTokens special_tokens_;
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

class LlmcTokenizer : public TokenDecoder {
 public:
  static constexpr uint32_t kMagic = 20240328;
  static constexpr int32_t kVersion1Eot = 50256;  // GPT-2's <|endoftext|>, which version-1 files imply

  // Errors name the file and what is wrong: a header shorter than 1024 bytes, the magic, the version,
  // a token count the file is too small to hold (checked before anything is allocated), an end-of-text
  // id outside the vocabulary, a zero length, a token cut off by the end of the file, trailing bytes.
  static absl::StatusOr<LlmcTokenizer> load(const std::string& path);
  // The same from the file's bytes; `path` only names the source in errors.
  static absl::StatusOr<LlmcTokenizer> parse(absl::string_view bytes, const std::string& path);

  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t eot() const override { return eot_; }
  bool is_special(int32_t id) const override { return id == eot_; }
  std::string token_text(int32_t id) const override;
  absl::StatusOr<std::vector<int32_t>> encode_prompt(absl::string_view prompt) const override;
  std::string name() const override { return "llmc"; }
  int version() const { return version_; }

 private:
  LlmcTokenizer() = default;
  std::vector<std::string> tokens_;  // id -> its bytes
  int32_t eot_ = 0;
  int version_ = 0;
};

class TokenIdDecoder : public TokenDecoder {
 public:
  explicit TokenIdDecoder(int32_t vocab_size) : vocab_size_(vocab_size) {}
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t eot() const override { return vocab_size_ - 1; }
  bool is_special(int32_t id) const override { return id == eot(); }
  std::string token_text(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  absl::StatusOr<std::vector<int32_t>> encode_prompt(absl::string_view prompt) const override;
  std::string name() const override { return "ids"; }

 private:
  int32_t vocab_size_;
};

// Token ids written out, separated by spaces or commas ("464 2068, 7586"), each in [0, vocab_size).
// `why_no_text` starts the error for a prompt of text: why the decoder cannot encode it.
absl::StatusOr<std::vector<int32_t>> parse_prompt_ids(absl::string_view prompt, int32_t vocab_size,
                                                      const std::string& why_no_text);

// "byte" needs no path; "bpe" loads a merges file from `path`; either with the special tokens `table`.
// Errors name the kind or the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& kind, const std::string& path = "",
                                                          const SpecialTokens& table = special_tokens(Objective::lm));
// make_tokenizer's kinds, "llmc" (llm.c's tokenizer file at `path`) and "ids" (a TokenIdDecoder of
// `vocab_size` ids).
absl::StatusOr<std::unique_ptr<TokenDecoder>> make_decoder(const std::string& kind, const std::string& path,
                                                           int64_t vocab_size);

}  // namespace seqlab
