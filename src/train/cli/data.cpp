// `seqlab tokenizer train|encode` and `seqlab prepare`: the data layer from the command line. The
// training loop calls the same functions (prepare_cached, BpeTokenizer::load) from a recipe. And a run's
// tokenizer, for the commands that open a run (sample, export).
#include "train/cli/data.h"

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

#include "train/cli/commands.h"
#include "train/cli/util.h"
#include "train/data/documents.h"
#include "train/data/prepare.h"
#include "train/data/tokenizer.h"
#include "train/recipe/configs.h"

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

DocSource source_from(const Flags& f) {
  DocSource s;
  s.path = f.get("--input", kDefaultCorpus);
  s.format = value_or_throw(parse_doc_format(f.get("--format", "auto")));
  s.json_field = f.get("--field", "text");
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void tokenizer_train(const std::vector<std::string>& args) {
  Flags f(args, "tokenizer", {"--input", "--format", "--field", "--vocab", "--out"});
  if (!f.has("--vocab")) throw UserError("--vocab N is required (the vocabulary size, at least 275)");
  if (!f.has("--out")) throw UserError("--out FILE is required (where the merges go)");
  auto t0 = std::chrono::steady_clock::now();
  DocSource source = source_from(f);
  std::vector<std::string> docs = value_or_throw(read_documents(source));
  BpeTokenizer bpe = value_or_throw(BpeTokenizer::train(docs, f.number<int32_t>("--vocab", 0)));
  absl::Status s = bpe.save(f.get("--out"));
  if (!s.ok()) throw UserError(std::string(s.message()));
  std::cout << absl::StrFormat("learned %d merges (vocab %d) from %d documents of %s in %.2f s -> %s\n",
                               bpe.merges().size(), bpe.vocab_size(), docs.size(), source.path, seconds_since(t0),
                               f.get("--out"));
}

void tokenizer_encode(const std::vector<std::string>& args) {
  Flags f(args, "tokenizer", {"--tokenizer", "--text"});
  if (!f.has("--text")) throw UserError("--text TEXT is required");
  std::string which = f.get("--tokenizer", "byte");
  auto tok = which == "byte" ? value_or_throw(make_tokenizer("byte")) : value_or_throw(make_tokenizer("bpe", which));
  std::vector<int32_t> ids = tok->encode(f.get("--text"));
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(json_quote(tok->token_text(id)));
  std::cout << absl::StrJoin(ids, " ") << "\n" << absl::StrJoin(pieces, " ") << "\n";
}

void prepare(const std::vector<std::string>& args) {
  Flags f(args, "prepare",
          {"--input", "--out", "--format", "--field", "--tokenizer", "--tokenizer-path", "--val-fraction", "--seed",
           "--shard-tokens"},
          {"--help", "-h"});
  if (f.has("--help") || f.has("-h")) {
    std::cout << kPrepareUsage;
    return;
  }
  if (!f.has("--out")) throw UserError("--out DIR is required (the folder for the shards)");
  PrepareOptions o;
  o.source = source_from(f);
  o.tokenizer_path = f.get("--tokenizer-path");
  o.tokenizer = f.get("--tokenizer", o.tokenizer_path.empty() ? "byte" : "bpe");
  if (o.tokenizer == "bpe" && o.tokenizer_path.empty()) throw UserError("--tokenizer bpe needs --tokenizer-path FILE");
  if (o.tokenizer == "byte" && !o.tokenizer_path.empty()) throw UserError("--tokenizer-path goes with --tokenizer bpe");
  o.val_fraction = f.number<double>("--val-fraction", o.val_fraction);
  // Checked here too, so that the message names the flag (prepare_dataset names its option, after reading
  // the documents).
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    throw UserError("--val-fraction expects a number in [0, 1), got '" + f.get("--val-fraction") + "'");
  }
  o.seed = f.number<uint64_t>("--seed", o.seed);
  o.shard_tokens = f.number<int64_t>("--shard-tokens", o.shard_tokens, 1);
  auto t0 = std::chrono::steady_clock::now();
  DatasetInfo info = value_or_throw(prepare_dataset(o, f.get("--out")));
  std::cout << absl::StrFormat(
      "%s: train %d documents, %d tokens in %d shard(s); val %d documents, %d tokens in %d shard(s); "
      "%s tokenizer, vocab %d; %.2f s\n",
      info.dir, info.train_documents, info.train_tokens, info.train_shards, info.val_documents, info.val_tokens,
      info.val_shards, info.tokenizer, info.vocab_size, seconds_since(t0));
}

}  // namespace

int tokenizer_command(const std::vector<std::string>& args) {
  std::string sub = args.empty() ? "" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "train") return run_guarded("tokenizer train", [&] { tokenizer_train(rest); });
  if (sub == "encode") return run_guarded("tokenizer encode", [&] { tokenizer_encode(rest); });
  if (sub == "--help" || sub == "-h") {
    std::cout << kTokenizerUsage;
    return 0;
  }
  std::cerr << "seqlab tokenizer: " << (sub.empty() ? "expected train or encode" : "unknown subcommand '" + sub + "'")
            << " (see seqlab tokenizer --help)\n";
  return kUsageError;
}

int prepare_command(const std::vector<std::string>& args) { return run_guarded("prepare", [&] { prepare(args); }); }

bool run_has_text(const Recipe& r) { return r.data.source == "text" || r.data.source == "shards"; }

std::unique_ptr<TokenDecoder> run_tokenizer(const Recipe& r) {
  if (r.data.source == "text") {
    return std::unique_ptr<TokenDecoder>(
        value_or_throw(make_tokenizer(r.data.tokenizer, r.data.tokenizer_path, objective_special_tokens(r))));
  }
  if (r.data.source == "shards") {
    return value_or_throw(open_decoder(
        value_or_throw(open_shard_folder(r.data.path, r.data.vocab_size, r.data.tokenizer_path)),
        objective_special_tokens(r)));
  }
  throw UserError("the run trains on the synthetic task " + r.data.source + ", which has no tokenizer");
}

}  // namespace seqlab::cli
