// `seqlab tokenizer train|encode` and `seqlab prepare`: the data layer from the command line. The
// training loop calls the same functions (prepare_cached, BpeTokenizer::load) from a recipe.
#include "train/cli_data.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>

#include <chrono>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <type_traits>

#include "train/cli.h"
#include "train/documents.h"
#include "train/prepare.h"
#include "train/tokenizer.h"

namespace seqlab::cli {
namespace {

constexpr char kTokenizerUsage[] =
    "usage: seqlab tokenizer train [--input PATH] [--format auto|text|fortune|jsonl] [--field NAME] --vocab N --out FILE\n"
    "       seqlab tokenizer encode [--tokenizer FILE|byte] --text TEXT\n"
    "\n"
    "train   learns byte-level BPE merges from the documents of PATH (a file or a folder; default: the\n"
    "        fortunes corpus) until the vocabulary, 256 bytes + merges + 19 special tokens, reaches N,\n"
    "        and writes them to FILE (seqlab-bpe 1 format)\n"
    "encode  prints TEXT's token ids, then each token as a JSON string (default tokenizer: byte)\n"
    "\n"
    "  --format  text: paragraphs separated by blank lines; fortune: entries separated by '%' lines;\n"
    "            jsonl: one JSON object per line; auto (default), per file: jsonl for *.jsonl and *.json,\n"
    "            fortune when a line holds only '%', text otherwise\n"
    "  --field   the JSONL string field holding the document (default: text)\n";

constexpr char kPrepareUsage[] =
    "usage: seqlab prepare [--input PATH] --out DIR [--format auto|text|fortune|jsonl] [--field NAME]\n"
    "                      [--tokenizer byte|bpe] [--tokenizer-path FILE] [--val-fraction F] [--seed N]\n"
    "                      [--shard-tokens N]\n"
    "\n"
    "Tokenises the documents of PATH (default: the fortunes corpus, /usr/share/games/fortunes), each\n"
    "preceded by end-of-text, splits them between train and val by document, and writes\n"
    "DIR/train_000000.bin ..., DIR/val_000000.bin ... (llm.c .bin shards) and DIR/meta.json.\n"
    "\n"
    "  --format          as for seqlab tokenizer train (see seqlab tokenizer --help)\n"
    "  --tokenizer       byte (default) or bpe; --tokenizer-path FILE alone implies bpe\n"
    "  --val-fraction F  share of documents for val, in [0, 1) (default 0.05)\n"
    "  --seed N          picks the val documents (default 0)\n"
    "  --shard-tokens N  tokens per shard at most (default 100000000)\n";

// `--flag value` and `--flag=value`; `valued` lists the flags taking a value, `switches` the others.
std::map<std::string, std::string> parse_flags(const std::vector<std::string>& args, const std::set<std::string>& valued,
                                               const std::set<std::string>& switches, const std::string& command) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    size_t eq = arg.find('=');
    std::string flag = absl::StartsWith(arg, "--") ? arg.substr(0, eq) : arg;
    if (switches.count(flag)) {
      if (eq != std::string::npos) throw UserError(flag + " takes no value");
      out[flag] = "";
    } else if (valued.count(flag)) {
      if (eq == std::string::npos && i + 1 >= args.size()) throw UserError(flag + " needs a value");
      if (out.count(flag)) throw UserError(flag + " given twice");
      out[flag] = eq != std::string::npos ? arg.substr(eq + 1) : args[++i];
    } else {
      throw UserError(absl::StrCat(absl::StartsWith(arg, "-") ? "unknown flag '" : "unexpected argument '", arg,
                                   "' (see seqlab ", command, " --help)"));
    }
  }
  return out;
}

std::string get(const std::map<std::string, std::string>& f, const std::string& key, const std::string& fallback = "") {
  auto it = f.find(key);
  return it == f.end() ? fallback : it->second;
}

template <class T>
T number(const std::map<std::string, std::string>& f, const std::string& key, T fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  T v;
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(it->second, &v);
  } else {
    ok = absl::SimpleAtoi(it->second, &v);
  }
  if (!ok) throw UserError(key + " expects a number, got '" + it->second + "'");
  return v;
}

template <class T>
T ok_or_throw(absl::StatusOr<T> v) {
  if (!v.ok()) throw UserError(std::string(v.status().message()));
  return std::move(*v);
}

DocSource source_from(const std::map<std::string, std::string>& f) {
  DocSource s;
  s.path = get(f, "--input", kDefaultCorpus);
  s.format = ok_or_throw(parse_doc_format(get(f, "--format", "auto")));
  s.json_field = get(f, "--field", "text");
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void tokenizer_train(const std::vector<std::string>& args) {
  auto f = parse_flags(args, {"--input", "--format", "--field", "--vocab", "--out"}, {}, "tokenizer");
  if (!f.count("--vocab")) throw UserError("--vocab N is required (the vocabulary size, at least 275)");
  if (!f.count("--out")) throw UserError("--out FILE is required (where the merges go)");
  auto t0 = std::chrono::steady_clock::now();
  DocSource source = source_from(f);
  std::vector<std::string> docs = ok_or_throw(read_documents(source));
  BpeTokenizer bpe = ok_or_throw(BpeTokenizer::train(docs, number<int32_t>(f, "--vocab", 0)));
  absl::Status s = bpe.save(get(f, "--out"));
  if (!s.ok()) throw UserError(std::string(s.message()));
  std::cout << absl::StrFormat("learned %d merges (vocab %d) from %d documents of %s in %.2f s -> %s\n",
                               bpe.merges().size(), bpe.vocab_size(), docs.size(), source.path, seconds_since(t0),
                               get(f, "--out"));
}

void tokenizer_encode(const std::vector<std::string>& args) {
  auto f = parse_flags(args, {"--tokenizer", "--text"}, {}, "tokenizer");
  if (!f.count("--text")) throw UserError("--text TEXT is required");
  std::string which = get(f, "--tokenizer", "byte");
  auto tok = which == "byte" ? ok_or_throw(make_tokenizer("byte")) : ok_or_throw(make_tokenizer("bpe", which));
  std::vector<int32_t> ids = tok->encode(get(f, "--text"));
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(json_quote(tok->token_text(id)));
  std::cout << absl::StrJoin(ids, " ") << "\n" << absl::StrJoin(pieces, " ") << "\n";
}

void prepare(const std::vector<std::string>& args) {
  auto f = parse_flags(args,
                       {"--input", "--out", "--format", "--field", "--tokenizer", "--tokenizer-path", "--val-fraction",
                        "--seed", "--shard-tokens"},
                       {"--help", "-h"}, "prepare");
  if (f.count("--help") || f.count("-h")) {
    std::cout << kPrepareUsage;
    return;
  }
  if (!f.count("--out")) throw UserError("--out DIR is required (the folder for the shards)");
  PrepareOptions o;
  o.source = source_from(f);
  o.tokenizer_path = get(f, "--tokenizer-path");
  o.tokenizer = get(f, "--tokenizer", o.tokenizer_path.empty() ? "byte" : "bpe");
  if (o.tokenizer == "bpe" && o.tokenizer_path.empty()) throw UserError("--tokenizer bpe needs --tokenizer-path FILE");
  if (o.tokenizer == "byte" && !o.tokenizer_path.empty()) throw UserError("--tokenizer-path goes with --tokenizer bpe");
  o.val_fraction = number<double>(f, "--val-fraction", o.val_fraction);
  o.seed = number<uint64_t>(f, "--seed", o.seed);
  o.shard_tokens = number<int64_t>(f, "--shard-tokens", o.shard_tokens);
  auto t0 = std::chrono::steady_clock::now();
  DatasetInfo info = ok_or_throw(prepare_dataset(o, get(f, "--out")));
  std::cout << absl::StrFormat(
      "%s: train %d documents, %d tokens in %d shard(s); val %d documents, %d tokens in %d shard(s); "
      "%s tokenizer, vocab %d; %.2f s\n",
      info.dir, info.train_documents, info.train_tokens, info.train_shards, info.val_documents, info.val_tokens,
      info.val_shards, info.tokenizer, info.vocab_size, seconds_since(t0));
}

int guarded(const char* command, void (*fn)(const std::vector<std::string>&), const std::vector<std::string>& args) {
  auto report = [&](const std::string& message) {
    std::cerr << "seqlab " << command << ": " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  };
  try {
    fn(args);
    return 0;
  } catch (const UserError& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::exception& e) {  // a broken invariant inside seqlab, not the user's doing
    report(std::string("internal error: ") + e.what());
    return 1;
  }
}

}  // namespace

int tokenizer_command(const std::vector<std::string>& args) {
  std::string sub = args.empty() ? "" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "train") return guarded("tokenizer train", tokenizer_train, rest);
  if (sub == "encode") return guarded("tokenizer encode", tokenizer_encode, rest);
  if (sub == "--help" || sub == "-h") {
    std::cout << kTokenizerUsage;
    return 0;
  }
  std::cerr << "seqlab tokenizer: " << (sub.empty() ? "expected train or encode" : "unknown subcommand '" + sub + "'")
            << " (see seqlab tokenizer --help)\n";
  return kUsageError;
}

int prepare_command(const std::vector<std::string>& args) { return guarded("prepare", prepare, args); }

}  // namespace seqlab::cli
