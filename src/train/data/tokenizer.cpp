// BPE training keeps, for every adjacent pair, its weighted count over the unique chunks and the list
// of chunks it occurs in; a merge rewrites only those chunks and adjusts the counts of the pairs they
// lose and gain. The most frequent pair comes from a max-heap with lazy deletion: an entry whose count
// no longer matches the table is stale and skipped. This makes training on a few MB take well under a
// second instead of recounting every pair for every merge.
#include "train/data/tokenizer.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <queue>
#include <stdexcept>

#include "train/data/data_io.h"

namespace seqlab {

namespace {

constexpr char kBpeHeader[] = "seqlab-bpe 1";
constexpr size_t kMaxChunk = 256;

uint64_t pack(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
int32_t left_of(uint64_t p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(uint64_t p) { return static_cast<int32_t>(p & 0xffffffffu); }

bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// 0 letters (and every byte of a multi-byte UTF-8 character), 1 digits, 2 other symbols.
int char_class(unsigned char c) {
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 0;
  if (c >= '0' && c <= '9') return 1;
  return 2;
}

std::vector<int32_t> bytes_of(absl::string_view s) {
  std::vector<int32_t> ids(s.size());
  for (size_t i = 0; i < s.size(); ++i) ids[i] = static_cast<unsigned char>(s[i]);
  return ids;
}

// Replaces every non-overlapping occurrence of (a, b), left to right, by `id`.
void apply_merge(std::vector<int32_t>& ids, int32_t a, int32_t b, int32_t id) {
  size_t out = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
      ids[out++] = id;
      ++i;
    } else {
      ids[out++] = ids[i];
    }
  }
  ids.resize(out);
}

// "" when `m` (merge number `k`) refers only to ids defined before it and is new; else what is wrong.
std::string check_merge(const BpeTokenizer::Merge& m, size_t k, absl::flat_hash_map<uint64_t, size_t>& seen) {
  int64_t limit = 256 + static_cast<int64_t>(k);
  for (int32_t id : {m.first, m.second}) {
    if (id < 0 || id >= limit) {
      return absl::StrCat("id ", id, " is not defined yet (merge ", k, " may use ids 0..", limit - 1, ")");
    }
  }
  auto [it, inserted] = seen.emplace(pack(m.first, m.second), k);
  if (!inserted) return absl::StrCat("merge ", m.first, " ", m.second, " repeats merge ", it->second);
  return "";
}

std::string unknown_marker(int32_t id) { return absl::StrCat("<|unknown_", id, "|>"); }

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Tokenizer

int32_t Tokenizer::role_id(int index, const char* role) const {
  if (index < 0) {
    throw std::out_of_range(absl::StrCat("the ", special_tokens_.objective, " vocabulary has no ", role, " token"));
  }
  return first_special_ + index;
}

int32_t Tokenizer::sentinel(int i) const {
  if (i < 0 || i >= special_tokens_.sentinels) {
    throw std::out_of_range(absl::StrCat("sentinel ", i, " requested; the ", special_tokens_.objective,
                                         " vocabulary has ", special_tokens_.sentinels));
  }
  return first_special_ + special_tokens_.first_sentinel + i;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id >= 0 && id < first_special_) return regular_bytes(id);
  if (is_special(id)) return special_tokens_.texts[static_cast<size_t>(id - first_special_)];
  return unknown_marker(id);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::encode_prompt(absl::string_view prompt) const {
  if (!special_tokens_.in_prompts) return encode(prompt);
  std::vector<int32_t> ids;
  auto text = [&](absl::string_view piece) {
    std::vector<int32_t> more = encode(piece);
    ids.insert(ids.end(), more.begin(), more.end());
  };
  size_t start = 0;  // of the text not yet encoded
  for (size_t i = 0; i < prompt.size();) {
    int found = -1;
    size_t found_size = 0;
    for (int k = 0; k < special_tokens_.size(); ++k) {
      const std::string& s = special_tokens_.texts[static_cast<size_t>(k)];
      if (s.size() > found_size && prompt.substr(i, s.size()) == s) found = k, found_size = s.size();
    }
    if (found < 0) {
      ++i;
      continue;
    }
    text(prompt.substr(start, i - start));
    ids.push_back(first_special_ + found);
    i += found_size;
    start = i;
  }
  text(prompt.substr(start));
  return ids;
}

std::string TokenDecoder::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_text(id);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// ByteTokenizer

ByteTokenizer::ByteTokenizer() : Tokenizer(256) {
  for (int b = 0; b < 256; ++b) bytes_.emplace_back(1, static_cast<char>(b));
}

std::vector<int32_t> ByteTokenizer::encode(absl::string_view text) const { return bytes_of(text); }

// ---------------------------------------------------------------------------------------------------
// Pre-tokenisation

std::vector<absl::string_view> split_chunks(absl::string_view text) {
  std::vector<absl::string_view> chunks;
  const size_t n = text.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    if (!is_space(at(i)) || (at(i) == ' ' && i + 1 < n && !is_space(at(i + 1)))) {
      if (at(j) == ' ') ++j;  // a single leading space belongs to the word
      int cls = char_class(at(j));
      while (j < n && !is_space(at(j)) && char_class(at(j)) == cls) ++j;
    } else {
      while (j < n && is_space(at(j))) ++j;
      if (j < n && j - i > 1 && at(j - 1) == ' ') --j;  // leave the last space to the next word
    }
    for (size_t k = i; k < j; k += kMaxChunk) chunks.push_back(text.substr(k, std::min(kMaxChunk, j - k)));
    i = j;
  }
  return chunks;
}

// ---------------------------------------------------------------------------------------------------
// BpeTokenizer

absl::StatusOr<BpeTokenizer> BpeTokenizer::from_merges(std::vector<Merge> merges) {
  BpeTokenizer t;
  absl::flat_hash_map<uint64_t, size_t> seen;
  for (size_t k = 0; k < merges.size(); ++k) {
    std::string error = check_merge(merges[k], k, seen);
    if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat("BPE merge ", k, ": ", error));
  }
  t.bytes_.reserve(256 + merges.size());
  for (int b = 0; b < 256; ++b) t.bytes_.emplace_back(1, static_cast<char>(b));
  for (size_t k = 0; k < merges.size(); ++k) {
    t.bytes_.push_back(t.bytes_[merges[k].first] + t.bytes_[merges[k].second]);
    t.rank_[pack(merges[k].first, merges[k].second)] = static_cast<int32_t>(k);
  }
  t.merges_ = std::move(merges);
  t.set_first_special(static_cast<int32_t>(256 + t.merges_.size()));
  return t;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::train(const std::vector<std::string>& documents, int32_t vocab_size) {
  const int32_t min_vocab = 256 + kNumSpecialTokens;
  if (vocab_size < min_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("BPE vocab_size ", vocab_size, " is below ", min_vocab,
                                                   " (256 bytes + ", kNumSpecialTokens, " special tokens)"));
  }
  const size_t max_merges = static_cast<size_t>(vocab_size - min_vocab);

  // Unique chunks with their counts; sorted so that word indices do not depend on hash order.
  absl::flat_hash_map<absl::string_view, int64_t> chunk_count;
  for (const std::string& doc : documents) {
    for (absl::string_view c : split_chunks(doc)) ++chunk_count[c];
  }
  std::vector<std::pair<absl::string_view, int64_t>> unique(chunk_count.begin(), chunk_count.end());
  std::sort(unique.begin(), unique.end());
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [chunk, count] : unique) {
    if (chunk.size() < 2) continue;  // a single byte has no pair
    words.push_back(bytes_of(chunk));
    freq.push_back(count);
  }

  absl::flat_hash_map<uint64_t, int64_t> pair_count;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> pair_words;  // may hold stale or repeated entries
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t p = pack(words[w][i], words[w][i + 1]);
      pair_count[p] += freq[w];
      pair_words[p].push_back(static_cast<int32_t>(w));
    }
  }
  // Highest count first; among equal counts the smallest packed pair, i.e. smallest (left, right).
  using Entry = std::pair<int64_t, uint64_t>;
  auto lower = [](const Entry& x, const Entry& y) { return x.first < y.first || (x.first == y.first && x.second > y.second); };
  std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> heap(lower);
  for (const auto& [p, c] : pair_count) heap.push({c, p});

  std::vector<Merge> merges;
  std::vector<size_t> stamp(words.size(), SIZE_MAX);  // the merge that last rewrote each word
  absl::flat_hash_set<uint64_t> touched;
  while (merges.size() < max_merges && !heap.empty()) {
    auto [count, p] = heap.top();
    heap.pop();
    auto it = pair_count.find(p);
    if (it == pair_count.end() || it->second != count) continue;  // stale entry
    if (count < 2) break;  // merging a pair seen once only memorises that one chunk
    const int32_t a = left_of(p), b = right_of(p), id = static_cast<int32_t>(256 + merges.size());
    merges.push_back({a, b});
    pair_count.erase(it);
    std::vector<int32_t> where = std::move(pair_words[p]);
    pair_words.erase(p);
    touched.clear();
    for (int32_t w : where) {
      if (stamp[w] == merges.size()) continue;
      stamp[w] = merges.size();
      std::vector<int32_t>& ids = words[w];
      bool holds = false;
      for (size_t i = 0; i + 1 < ids.size() && !holds; ++i) holds = ids[i] == a && ids[i + 1] == b;
      if (!holds) continue;  // a stale listing: an earlier merge took the pair from this word
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        uint64_t q = pack(ids[i], ids[i + 1]);
        if (q == p) continue;
        if ((pair_count[q] -= freq[w]) == 0) pair_count.erase(q);
        touched.insert(q);
      }
      apply_merge(ids, a, b, id);
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        uint64_t q = pack(ids[i], ids[i + 1]);
        pair_count[q] += freq[w];
        touched.insert(q);
        // Pairs without the new id were in this word before, so the word is already listed for them.
        if (ids[i] == id || ids[i + 1] == id) pair_words[q].push_back(w);
      }
    }
    for (uint64_t q : touched) {
      auto c = pair_count.find(q);
      if (c != pair_count.end()) heap.push({c->second, q});
    }
  }
  return from_merges(std::move(merges));
}

void BpeTokenizer::encode_chunk(absl::string_view chunk, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids = bytes_of(chunk);
  // Apply the earliest-learned merge present, everywhere in the chunk, until none applies: the order
  // training used, so training text encodes into the tokens training formed.
  while (ids.size() >= 2) {
    int32_t best = INT32_MAX;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = rank_.find(pack(ids[i], ids[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second;
    }
    if (best == INT32_MAX) break;
    apply_merge(ids, merges_[best].first, merges_[best].second, 256 + best);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

std::vector<int32_t> BpeTokenizer::encode(absl::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  for (absl::string_view chunk : split_chunks(text)) encode_chunk(chunk, &out);
  return out;
}

absl::Status BpeTokenizer::save(const std::string& path) const {
  std::string text = absl::StrCat(kBpeHeader, "\n");
  for (const Merge& m : merges_) absl::StrAppend(&text, m.first, " ", m.second, "\n");
  return write_file_atomic(path, {text});
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
  auto fail = [&](size_t line, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
  };
  auto strip_cr = [](absl::string_view s) {
    absl::ConsumeSuffix(&s, "\r");
    return s;
  };
  if (lines.empty()) return absl::InvalidArgumentError(path + ": empty file (expected the header '" + kBpeHeader + "')");
  uint32_t magic = 0;
  if (text->size() >= sizeof magic) std::memcpy(&magic, text->data(), sizeof magic);
  if (magic == LlmcTokenizer::kMagic) {
    return absl::InvalidArgumentError(path + ": llm.c's tokenizer file, not BPE merges: it decodes llm.c's shards "
                                             "(data.source = \"shards\") but holds no merges to encode text with");
  }
  if (strip_cr(lines[0]) != kBpeHeader) {
    return fail(1, absl::StrCat("expected the header '", kBpeHeader, "', got '", lines[0].substr(0, 40), "'"));
  }
  std::vector<Merge> merges;
  absl::flat_hash_map<uint64_t, size_t> seen;
  for (size_t n = 1; n < lines.size(); ++n) {
    absl::string_view line = strip_cr(lines[n]);
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    Merge m;
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &m.first) || !absl::SimpleAtoi(fields[1], &m.second)) {
      return fail(n + 1, absl::StrCat("expected two token ids separated by a space, got '", line.substr(0, 40), "'"));
    }
    std::string error = check_merge(m, merges.size(), seen);
    if (!error.empty()) return fail(n + 1, error);
    merges.push_back(m);
  }
  return from_merges(std::move(merges));
}

// ---------------------------------------------------------------------------------------------------
// Decoders without an encoder

absl::StatusOr<std::vector<int32_t>> parse_prompt_ids(absl::string_view prompt, int32_t vocab_size,
                                                      const std::string& why_no_text) {
  std::vector<int32_t> ids;
  for (absl::string_view word : absl::StrSplit(prompt, absl::ByAnyChar(" \t\n,"), absl::SkipEmpty())) {
    int64_t id;
    if (!absl::SimpleAtoi(word, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(why_no_text, ": give the prompt as token ids separated by "
                                                     "spaces, such as \"464 2068\", not '", word.substr(0, 40), "'"));
    }
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary of ", vocab_size, " ids"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

absl::StatusOr<LlmcTokenizer> LlmcTokenizer::parse(absl::string_view bytes, const std::string& path) {
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", what)); };
  constexpr size_t kHeaderBytes = 256 * 4;
  uint32_t header[4] = {};
  if (!bytes.empty()) std::memcpy(header, bytes.data(), std::min(sizeof header, bytes.size()));
  if (bytes.size() >= 4 && header[0] != kMagic) {
    return fail(absl::StrCat("not an llm.c tokenizer file: magic ", header[0], ", expected ", kMagic));
  }
  if (bytes.size() < kHeaderBytes) {
    return fail(absl::StrCat("truncated llm.c tokenizer file: ", bytes.size(), " bytes, less than the ", kHeaderBytes,
                             "-byte header"));
  }
  if (header[1] != 1 && header[1] != 2) {
    return fail(absl::StrCat("llm.c tokenizer version ", header[1], " is not supported (1 or 2)"));
  }
  // Every token takes at least two bytes (its length and one byte), so the count is bounded by the
  // file's size before anything is allocated for it.
  const uint64_t n = header[2], body = bytes.size() - kHeaderBytes;
  if (n == 0) return fail("the header's vocab_size is 0");
  if (n > body / 2) {
    return fail(absl::StrCat("the header's vocab_size ", n, " does not fit the file: ", body,
                             " bytes after the header hold at most ", body / 2, " tokens"));
  }
  LlmcTokenizer t;
  t.version_ = static_cast<int>(header[1]);
  const uint64_t eot = header[1] == 2 ? header[3] : static_cast<uint64_t>(kVersion1Eot);
  if (eot >= n) {
    return fail(absl::StrCat("end-of-text id ", eot, header[1] == 1 ? " (implied by version 1)" : "",
                             " is outside the vocabulary of ", n, " tokens"));
  }
  t.eot_ = static_cast<int32_t>(eot);
  t.tokens_.reserve(n);
  size_t at = kHeaderBytes;
  for (uint64_t id = 0; id < n; ++id) {
    if (at >= bytes.size()) return fail(absl::StrCat("the file ends before token ", id, " of ", n));
    const size_t len = static_cast<unsigned char>(bytes[at]);
    if (len == 0) return fail(absl::StrCat("token ", id, " has length 0 (at byte ", at, ")"));
    if (len > bytes.size() - at - 1) {
      return fail(absl::StrCat("token ", id, " of ", len, " bytes is cut off by the end of the file"));
    }
    t.tokens_.emplace_back(bytes.substr(at + 1, len));
    at += 1 + len;
  }
  if (at != bytes.size()) return fail(absl::StrCat(bytes.size() - at, " bytes follow the last token"));
  return t;
}

absl::StatusOr<LlmcTokenizer> LlmcTokenizer::load(const std::string& path) {
  absl::StatusOr<std::string> bytes = read_file(path);
  if (!bytes.ok()) return bytes.status();
  return parse(*bytes, path);
}

std::string LlmcTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return unknown_marker(id);
  return tokens_[static_cast<size_t>(id)];
}

absl::StatusOr<std::vector<int32_t>> LlmcTokenizer::encode_prompt(absl::string_view prompt) const {
  return parse_prompt_ids(prompt, vocab_size(), "llm.c's tokenizer file holds no BPE merges, so text cannot be encoded");
}

std::string TokenIdDecoder::token_text(int32_t id) const {
  return id >= 0 && id < vocab_size_ ? absl::StrCat(id) : unknown_marker(id);
}

std::string TokenIdDecoder::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) absl::StrAppend(&out, out.empty() ? "" : " ", token_text(id));
  return out;
}

absl::StatusOr<std::vector<int32_t>> TokenIdDecoder::encode_prompt(absl::string_view prompt) const {
  return parse_prompt_ids(prompt, vocab_size_,
                          "without a tokenizer file (data.tokenizer_path) text cannot be encoded");
}

// ---------------------------------------------------------------------------------------------------
// Construction by kind

absl::StatusOr<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& kind, const std::string& path,
                                                          const SpecialTokens& table) {
  std::unique_ptr<Tokenizer> t;
  if (kind == "byte") {
    t = std::make_unique<ByteTokenizer>();
  } else if (kind == "bpe") {
    if (path.empty()) return absl::InvalidArgumentError("tokenizer 'bpe' needs the path of a merges file");
    absl::StatusOr<BpeTokenizer> bpe = BpeTokenizer::load(path);
    if (!bpe.ok()) return bpe.status();
    t = std::make_unique<BpeTokenizer>(std::move(*bpe));
  } else {
    return absl::InvalidArgumentError("unknown tokenizer '" + kind + "' (byte or bpe)");
  }
  t->set_special_tokens(table);
  return t;
}

absl::StatusOr<std::unique_ptr<TokenDecoder>> make_decoder(const std::string& kind, const std::string& path,
                                                           int64_t vocab_size) {
  if (kind == "llmc") {
    absl::StatusOr<LlmcTokenizer> t = LlmcTokenizer::load(path);
    if (!t.ok()) return t.status();
    return std::unique_ptr<TokenDecoder>(new LlmcTokenizer(std::move(*t)));
  }
  if (kind == "ids") {
    if (vocab_size < 1 || vocab_size > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("a token-id decoder needs a vocabulary of 1 to ", INT32_MAX,
                                                     " ids, not ", vocab_size));
    }
    return std::unique_ptr<TokenDecoder>(new TokenIdDecoder(static_cast<int32_t>(vocab_size)));
  }
  if (kind == "byte" || kind == "bpe") {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = make_tokenizer(kind, path);
    if (!t.ok()) return t.status();
    return std::unique_ptr<TokenDecoder>(std::move(*t));
  }
  return absl::InvalidArgumentError("unknown tokenizer '" + kind + "' (byte, bpe, llmc or ids)");
}

}  // namespace seqlab
