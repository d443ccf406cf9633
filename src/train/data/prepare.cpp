#include "train/data/prepare.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <type_traits>

#include "train/data/data_io.h"
#include "train/data/shards.h"
#include "train/data/tokenizer.h"

namespace seqlab {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSplitSalt = 0x73706c6974;  // "split": keeps the split's stream apart from other uses of the seed
constexpr char kMetaFormat[] = "seqlab-shards 1";

// The shortest decimal form that reads back as the same double (0.05, not 0.050000000000000003).
std::string exact_decimal(double v) {
  for (int precision = 6;; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    double back;
    if (precision >= 17 || (absl::SimpleAtod(s, &back) && back == v)) return s;
  }
}

std::string shard_name(const char* split, int64_t index) { return absl::StrFormat("%s_%06d.bin", split, index); }

// Writes one split's stream (eot before every document) as shards; returns how many.
absl::StatusOr<int64_t> write_split(const std::string& dir, const char* split,
                                    const std::vector<std::vector<int32_t>>& encoded, const std::vector<bool>& is_val,
                                    bool want_val, int32_t eot, int64_t shard_tokens, int64_t* tokens) {
  std::vector<uint16_t> buf;
  buf.reserve(static_cast<size_t>(std::min<int64_t>(shard_tokens, 1 << 24)));
  int64_t shards = 0;
  *tokens = 0;
  auto flush = [&]() -> absl::Status {
    absl::Status s = write_shard((fs::path(dir) / shard_name(split, shards)).string(), buf.data(),
                                 static_cast<int64_t>(buf.size()));
    *tokens += static_cast<int64_t>(buf.size());
    ++shards;
    buf.clear();
    return s;
  };
  auto push = [&](int32_t t) -> absl::Status {
    buf.push_back(static_cast<uint16_t>(t));  // prepare_dataset checked vocab_size <= 65536
    return static_cast<int64_t>(buf.size()) == shard_tokens ? flush() : absl::OkStatus();
  };
  for (size_t d = 0; d < encoded.size(); ++d) {
    if (is_val[d] != want_val) continue;
    absl::Status s = push(eot);
    for (size_t i = 0; s.ok() && i < encoded[d].size(); ++i) s = push(encoded[d][i]);
    if (!s.ok()) return s;
  }
  if (!buf.empty()) {
    absl::Status s = flush();
    if (!s.ok()) return s;
  }
  // Shards a previous prepare left beyond this one's count would otherwise join the split.
  for (int64_t i = shards;; ++i) {
    std::error_code ec;
    if (!fs::remove(fs::path(dir) / shard_name(split, i), ec)) break;
  }
  return shards;
}

std::string meta_json(const DatasetInfo& m) {
  return absl::StrCat(
      "{\n  \"format\": ", json_quote(kMetaFormat), ",\n  \"tokenizer\": ", json_quote(m.tokenizer),
      ",\n  \"tokenizer_path\": ", json_quote(m.tokenizer_path), ",\n  \"vocab_size\": ", m.vocab_size,
      ",\n  \"eot\": ", m.eot, ",\n  \"source\": ", json_quote(m.source), ",\n  \"source_format\": ",
      json_quote(m.source_format), ",\n  \"val_fraction\": ", exact_decimal(m.val_fraction),
      ",\n  \"seed\": ", m.seed, ",\n  \"train_documents\": ", m.train_documents, ",\n  \"val_documents\": ",
      m.val_documents, ",\n  \"train_tokens\": ", m.train_tokens, ",\n  \"val_tokens\": ", m.val_tokens,
      ",\n  \"train_shards\": ", m.train_shards, ",\n  \"val_shards\": ", m.val_shards, "\n}\n");
}

std::string folder_label(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string name = fs::path(p).filename().string();
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.') c = '_';
  }
  return name.empty() ? "data" : name;
}

}  // namespace

absl::StatusOr<std::vector<bool>> split_documents(int64_t n, double val_fraction, uint64_t seed) {
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("val_fraction ", val_fraction, " is outside [0, 1)"));
  }
  std::vector<bool> is_val(static_cast<size_t>(n), false);
  if (val_fraction == 0) return is_val;
  int64_t k = std::max<int64_t>(1, std::llround(static_cast<double>(n) * val_fraction));
  if (k >= n && n == 1) {
    // val takes whole documents, so one document cannot be split, whatever the fraction.
    return absl::InvalidArgumentError(
        "a corpus of 1 document cannot be split between train and val, which take whole documents: give "
        "at least 2 (text files: paragraphs separated by a blank line; fortune: entries separated by "
        "'%' lines; jsonl: one object per line)");
  }
  if (k >= n) {
    // k = max(1, round(n·f)) < n whenever f < (n − 0.5) / n: every f ≤ 0.5 works from 2 documents on.
    return absl::InvalidArgumentError(absl::StrCat("cannot split ", n, " documents with val_fraction ", val_fraction,
                                                   ": train would be empty; use a val_fraction of at most 0.5"));
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  Generator gen(mix_seed(seed, kSplitSalt));
  shuffle_in_place(order, gen);
  for (int64_t i = 0; i < k; ++i) is_val[order[i]] = true;
  return is_val;
}

absl::StatusOr<DatasetInfo> prepare_dataset(const PrepareOptions& options, const std::string& out_dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = make_tokenizer(options.tokenizer, options.tokenizer_path);
  if (!tok.ok()) return tok.status();
  if ((*tok)->vocab_size() > kShardMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer vocabulary ", (*tok)->vocab_size(),
                                                   " exceeds the ", kShardMaxVocab, " that uint16 shards hold"));
  }
  if (options.shard_tokens < 1) return absl::InvalidArgumentError("shard_tokens must be at least 1");
  absl::StatusOr<std::vector<std::string>> docs = read_documents(options.source);
  if (!docs.ok()) return docs.status();
  if (docs->empty()) return absl::InvalidArgumentError(options.source.path + ": no documents (all blank)");
  const int64_t n = static_cast<int64_t>(docs->size());
  absl::StatusOr<std::vector<bool>> is_val = split_documents(n, options.val_fraction, options.seed);
  if (!is_val.ok()) return absl::InvalidArgumentError(absl::StrCat(options.source.path, ": ", is_val.status().message()));

  // Documents encode independently; the order of the results is fixed, so threads change nothing.
  std::vector<std::vector<int32_t>> encoded(docs->size());
  const Tokenizer& t = **tok;
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t d = 0; d < n; ++d) encoded[d] = t.encode((*docs)[d]);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": cannot create the folder (", ec.message(), ")"));
  const std::string meta_path = (fs::path(out_dir) / "meta.json").string();
  fs::remove(meta_path, ec);  // the folder is incomplete until the new meta.json lands

  DatasetInfo info;
  info.dir = out_dir;
  info.tokenizer = t.name();
  info.tokenizer_path = options.tokenizer_path.empty() ? "" : fs::absolute(options.tokenizer_path).string();
  info.vocab_size = t.vocab_size();
  info.eot = t.eot();
  info.source = fs::absolute(options.source.path).string();
  info.source_format = doc_format_name(options.source.format);
  info.val_fraction = options.val_fraction;
  info.seed = options.seed;
  for (bool v : *is_val) ++(v ? info.val_documents : info.train_documents);
  for (bool val : {false, true}) {
    absl::StatusOr<int64_t> shards = write_split(out_dir, val ? "val" : "train", encoded, *is_val, val, t.eot(),
                                                 options.shard_tokens, val ? &info.val_tokens : &info.train_tokens);
    if (!shards.ok()) return shards.status();
    (val ? info.val_shards : info.train_shards) = *shards;
  }
  absl::Status s = write_file_atomic(meta_path, {meta_json(info)});
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<DatasetInfo> read_dataset_info(const std::string& dir) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::map<std::string, JsonValue>> obj = parse_json_object(*text);
  if (!obj.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", obj.status().message()));
  std::string error;
  auto str = [&](const char* key, std::string* out) {
    auto it = obj->find(key);
    if (it == obj->end() || !it->second.is_string) {
      if (error.empty()) error = absl::StrCat("missing string \"", key, "\"");
    } else {
      *out = it->second.text;
    }
  };
  // A number, in [lo, hi]: a vocabulary of 2e9 is refused here, before anything is sized by it.
  auto num = [&](const char* key, auto* out, double lo, double hi, const std::string& why) {
    if (!error.empty()) return;
    auto it = obj->find(key);
    if (it == obj->end() || it->second.is_string) {
      error = absl::StrCat("missing number \"", key, "\"");
      return;
    }
    bool ok;
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, double>) {
      ok = absl::SimpleAtod(it->second.text, out) && *out >= lo && *out <= hi;
    } else {
      ok = absl::SimpleAtoi(it->second.text, out) && static_cast<double>(*out) >= lo && static_cast<double>(*out) <= hi;
    }
    if (!ok) {
      error = absl::StrCat("\"", key, "\" must be ", why, ", got ", it->second.text.substr(0, 40));
    }
  };
  DatasetInfo m;
  m.dir = dir;
  std::string format;
  str("format", &format);
  if (error.empty() && format != kMetaFormat) error = absl::StrCat("format \"", format, "\" is not ", kMetaFormat);
  str("tokenizer", &m.tokenizer);
  str("tokenizer_path", &m.tokenizer_path);
  str("source", &m.source);
  str("source_format", &m.source_format);
  num("vocab_size", &m.vocab_size, 1, static_cast<double>(kShardMaxVocab),
      absl::StrCat("an integer in [1, ", kShardMaxVocab, "] (uint16 shards)"));
  num("eot", &m.eot, 0, static_cast<double>(m.vocab_size) - 1, "an id below vocab_size");
  num("val_fraction", &m.val_fraction, 0, std::nextafter(1.0, 0.0), "a number in [0, 1)");
  num("seed", &m.seed, 0, HUGE_VAL, "an integer ≥ 0");
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"train_documents", &m.train_documents},
                          {"val_documents", &m.val_documents},
                          {"train_tokens", &m.train_tokens},
                          {"val_tokens", &m.val_tokens},
                          {"train_shards", &m.train_shards},
                          {"val_shards", &m.val_shards}}) {
    num(key, out, 0, HUGE_VAL, "an integer ≥ 0");
  }
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", error));
  return m;
}

absl::StatusOr<DatasetInfo> open_shard_folder(const std::string& dir, int64_t vocab_size,
                                              const std::string& tokenizer_path) {
  std::error_code ec;
  const fs::path meta = fs::path(dir) / "meta.json";
  if (fs::exists(meta, ec)) {
    absl::StatusOr<DatasetInfo> info = read_dataset_info(dir);
    if (!info.ok()) return info.status();
    if (vocab_size != 0 && vocab_size != info->vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(meta.string(), ": vocab_size is ", info->vocab_size,
                                                     ", not data.vocab_size = ", vocab_size,
                                                     " (meta.json describes the folder: leave data.vocab_size at 0)"));
    }
    if (!tokenizer_path.empty() && fs::absolute(tokenizer_path, ec) != fs::path(info->tokenizer_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          meta.string(), ": the folder's tokenizer is ", info->tokenizer,
          info->tokenizer_path.empty() ? "" : absl::StrCat(" (", info->tokenizer_path, ")"), ", not data.tokenizer_path = ",
          tokenizer_path, " (meta.json names the tokenizer: leave data.tokenizer_path empty)"));
    }
    return info;
  }
  // llm.c's folder: no meta.json, so the names and the recipe say what it holds.
  absl::StatusOr<std::vector<std::string>> train = find_shards(dir, "train");
  if (!train.ok()) {
    if (!fs::is_directory(dir, ec)) return train.status();
    return absl::NotFoundError(absl::StrCat(dir, ": neither meta.json (seqlab's prepare) nor train shards ",
                                            "(llm.c's <name>_train_NNNNNN.bin): not a folder of token shards"));
  }
  absl::StatusOr<std::vector<std::string>> val = find_shards(dir, "val");
  if (!val.ok()) return val.status();
  DatasetInfo info;
  info.dir = dir;
  info.source_format = "llm.c";
  info.train_shards = static_cast<int64_t>(train->size());
  info.val_shards = static_cast<int64_t>(val->size());
  info.vocab_size = vocab_size != 0 ? vocab_size : kGpt2VocabSize;
  info.tokenizer = "ids";
  info.eot = info.vocab_size - 1;
  if (!tokenizer_path.empty()) {
    absl::StatusOr<LlmcTokenizer> t = LlmcTokenizer::load(tokenizer_path);
    if (!t.ok()) return t.status();
    if (vocab_size != 0 && vocab_size != t->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_path, ": holds ", t->vocab_size(),
                                                     " tokens, not data.vocab_size = ", vocab_size));
    }
    info.vocab_size = t->vocab_size();
    info.tokenizer = t->name();
    info.tokenizer_path = tokenizer_path;
    info.eot = t->eot();
  }
  if (info.vocab_size < 1 || info.vocab_size > kShardMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        info.tokenizer_path.empty() ? dir : info.tokenizer_path, ": a vocabulary of ", info.vocab_size,
        " ids does not fit uint16 shards (1 to ", kShardMaxVocab, ")"));
  }
  return info;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> open_tokenizer(const DatasetInfo& info, const SpecialTokens& table) {
  if (info.tokenizer != "byte" && info.tokenizer != "bpe") {
    return absl::InvalidArgumentError(absl::StrCat(
        info.dir, ": data.objective = \"", table.objective, "\" adds its special tokens to a byte or BPE vocabulary; ",
        info.source_format == "llm.c" ? "llm.c's shards" : "this folder", " come with the ", info.tokenizer,
        " tokenizer: prepare the text with seqlab (data.source = \"text\", or `seqlab prepare`)"));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = make_tokenizer(info.tokenizer, info.tokenizer_path);
  if (!t.ok()) return t.status();
  if ((*t)->vocab_size() != info.vocab_size || (*t)->eot() != info.eot) {
    return absl::InvalidArgumentError(absl::StrCat((fs::path(info.dir) / "meta.json").string(), ": vocab_size ",
                                                   info.vocab_size, " and eot ", info.eot, " are not its ", info.tokenizer,
                                                   " tokenizer's ", (*t)->vocab_size(), " and ", (*t)->eot()));
  }
  (*t)->set_special_tokens(table);
  return t;
}

absl::StatusOr<std::unique_ptr<TokenDecoder>> open_decoder(const DatasetInfo& info, const SpecialTokens& table) {
  if (!(table == special_tokens(Objective::lm))) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = open_tokenizer(info, table);
    if (!t.ok()) return t.status();
    return std::unique_ptr<TokenDecoder>(std::move(*t));
  }
  absl::StatusOr<std::unique_ptr<TokenDecoder>> d = make_decoder(info.tokenizer, info.tokenizer_path, info.vocab_size);
  if (!d.ok()) return d.status();
  if ((*d)->vocab_size() != info.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat((fs::path(info.dir) / "meta.json").string(), ": vocab_size is ",
                                                   info.vocab_size, " but its ", info.tokenizer, " tokenizer has ",
                                                   (*d)->vocab_size(), " ids"));
  }
  return d;
}

absl::StatusOr<DatasetInfo> prepare_cached(const PrepareOptions& options, const std::string& cache_root) {
  absl::StatusOr<std::vector<std::string>> files = source_files(options.source);
  if (!files.ok()) return files.status();
  std::string key = kMetaFormat;
  for (const std::string& f : *files) {
    struct stat st;
    if (::stat(f.c_str(), &st) != 0) return absl::NotFoundError(f + ": cannot stat");
    std::error_code ec;
    absl::StrAppend(&key, "\n", fs::canonical(f, ec).string(), " ", st.st_size, " ", st.st_mtim.tv_sec, ".",
                    st.st_mtim.tv_nsec);
  }
  absl::StrAppend(&key, "\n", doc_format_name(options.source.format), " ", options.source.json_field, "\n",
                  options.tokenizer, "\n", exact_decimal(options.val_fraction), " ", options.seed, " ",
                  options.shard_tokens);
  if (!options.tokenizer_path.empty()) {
    absl::StatusOr<std::string> merges = read_file(options.tokenizer_path);
    if (!merges.ok()) return merges.status();
    absl::StrAppend(&key, "\n", absl::Hex(fnv1a64(*merges), absl::kZeroPad16));
  }
  const fs::path dir = fs::path(cache_root) / absl::StrCat(folder_label(options.source.path), "-",
                                                           absl::Hex(fnv1a64(key), absl::kZeroPad16));
  // A prepare killed midway left its temporary folder behind; nothing else would ever remove it.
  remove_dead_temporaries(cache_root);
  if (absl::StatusOr<DatasetInfo> have = read_dataset_info(dir.string()); have.ok()) return have;

  const std::string tmp = absl::StrCat(dir.string(), ".tmp.", ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  absl::StatusOr<DatasetInfo> made = prepare_dataset(options, tmp);
  if (!made.ok()) {
    fs::remove_all(tmp, ec);
    return made.status();
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Another process finished first, or a broken folder of that name is in the way.
    if (absl::StatusOr<DatasetInfo> theirs = read_dataset_info(dir.string()); theirs.ok()) {
      fs::remove_all(tmp, ec);
      return theirs;
    }
    fs::remove_all(dir, ec);
    fs::rename(tmp, dir, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      return absl::InternalError(absl::StrCat(dir.string(), ": cannot move the prepared data into place (", ec.message(), ")"));
    }
  }
  made->dir = dir.string();
  return made;
}

}  // namespace seqlab
