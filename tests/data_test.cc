// The data pipeline: shards (round trip, a hand-built llm.c shard, every way a shard can be broken, ids
// beyond the vocabulary), document formats (fortune, paragraphs, JSONL with escapes), prepare (split,
// streams, determinism, cache, leftovers of killed prepares, meta.json's ranges), shard folders (seqlab's
// with meta.json, llm.c's without) and the loader (determinism, epochs, ranks, state and restore, the
// eval walk).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "train/data/data_io.h"
#include "train/data/documents.h"
#include "train/data/loader.h"
#include "train/data/prepare.h"
#include "train/data/shards.h"
#include "train/data/tokenizer.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;

class Data : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("data_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string put(const std::string& name, const std::string& bytes) const {
    fs::create_directories(fs::path(path(name)).parent_path());
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string slurp(const std::string& p) const {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // A shard built byte by byte as llm.c's data scripts write it.
  static std::string llmc_shard(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
    std::string b(1024, '\0');
    std::memcpy(&b[0], &magic, 4);
    std::memcpy(&b[4], &version, 4);
    std::memcpy(&b[8], &count, 4);
    b.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
    return b;
  }
  // The shard error for `bytes`; it must name the file.
  std::string shard_error(const std::string& bytes) const {
    std::string p = put("bad.bin", bytes);
    auto s = Shard::open(p);
    if (s.ok()) return "opened";
    std::string m(s.status().message());
    EXPECT_EQ(m.rfind(p + ": ", 0), 0u) << m;
    return m.substr(p.size() + 2);
  }
  // A shard holding 0, 1, ..., n-1 (mod 65536).
  std::string counting_shard(const std::string& name, int64_t first, int64_t n) const {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((first + i) % 65536);
    EXPECT_TRUE(write_shard(path(name), t).ok());
    return path(name);
  }
  fs::path dir_;
};

std::vector<int64_t> ints(const Tensor& t) { return t.to_indices(); }

// ---------------------------------------------------------------------------------------------------
// Shards

TEST_F(Data, ShardRoundTripAndLayout) {
  std::vector<int32_t> tokens{0, 1, 65535, 256, 42};
  ASSERT_TRUE(write_shard(path("a.bin"), tokens).ok());
  std::string bytes = slurp(path("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 10u);
  EXPECT_EQ(bytes, llmc_shard(20240520, 1, 5, {0, 1, 65535, 256, 42}));
  auto s = Shard::open(path("a.bin"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 5);
  EXPECT_EQ(std::vector<uint16_t>(s->tokens(), s->tokens() + 5), (std::vector<uint16_t>{0, 1, 65535, 256, 42}));
  EXPECT_FALSE(fs::exists(path("a.bin.tmp." + std::to_string(::getpid()))));

  ASSERT_TRUE(write_shard(path("empty.bin"), std::vector<int32_t>{}).ok());
  auto e = Shard::open(path("empty.bin"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0);
}

TEST_F(Data, ShardRefusesTokensBeyondUint16) {
  auto s = write_shard(path("a.bin"), {1, 2, 65536});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), path("a.bin") + ": token 65536 at position 2 does not fit uint16 (shards hold vocabularies up to 65536)");
  EXPECT_FALSE(write_shard(path("a.bin"), {-1}).ok());
  EXPECT_FALSE(fs::exists(path("a.bin")));
}

TEST_F(Data, HandBuiltLlmcShardLoadsUnchanged) {
  std::string p = put("tiny_val.bin", llmc_shard(20240520, 1, 6, {50256, 464, 2068, 7586, 21831, 50256}));
  auto s = Shard::open(p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(std::vector<uint16_t>(s->tokens(), s->tokens() + s->size()),
            (std::vector<uint16_t>{50256, 464, 2068, 7586, 21831, 50256}));
  LoaderOptions o;
  o.seq_len = 5;
  auto l = TokenLoader::open({p}, o);
  ASSERT_TRUE(l.ok()) << l.status();
  Batch b = l->next_batch(1);
  EXPECT_EQ(ints(b.inputs), (std::vector<int64_t>{50256, 464, 2068, 7586, 21831}));
  EXPECT_EQ(ints(b.targets), (std::vector<int64_t>{464, 2068, 7586, 21831, 50256}));
}

TEST_F(Data, BrokenShardsAreRefusedWithTheMismatch) {
  EXPECT_EQ(shard_error(std::string(100, '\0')), "truncated shard: 100 bytes, less than the 1024-byte header");
  EXPECT_EQ(shard_error(llmc_shard(12345, 1, 0, {})), "not a token shard: magic 12345, expected 20240520 (llm.c .bin layout)");
  EXPECT_EQ(shard_error(llmc_shard(20240520, 2, 1, {7, 0})), "shard version 2 is not supported (version 1: uint16 tokens)");
  EXPECT_EQ(shard_error(llmc_shard(20240520, 1, 10, {1, 2, 3, 4, 5})),
            "truncated shard: the header says 10 tokens (1044 bytes) but the file has 1034 bytes");
  EXPECT_EQ(shard_error(llmc_shard(20240520, 1, 2, {1, 2, 3})),
            "size mismatch: the header says 2 tokens (1028 bytes) but the file has 1030 bytes");
  EXPECT_EQ(shard_error(llmc_shard(20240520, 1, -4, {})), "corrupt header: token count -4");
  auto missing = Shard::open(path("nope.bin"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path("nope.bin") + ": cannot open"), std::string::npos);
}

TEST_F(Data, IdsBeyondTheVocabularyAreFoundWhenTheShardOpens) {
  // 70000 tokens: the bad id sits in the second block of 65536 that check_ids scans.
  std::vector<int32_t> t(70000, 5);
  t[68001] = 300;
  t[69000] = 400;
  ASSERT_TRUE(write_shard(path("x_train_000000.bin"), t).ok());
  auto s = Shard::open(path("x_train_000000.bin"));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->check_ids(401).ok());
  EXPECT_TRUE(s->check_ids(kShardMaxVocab).ok());
  absl::Status bad = s->check_ids(300);
  EXPECT_EQ(bad.message(), path("x_train_000000.bin") + ": token id 300 at position 68001 is outside the vocabulary of 300 ids");
  EXPECT_EQ(s->check_ids(6).message(), path("x_train_000000.bin") + ": token id 300 at position 68001 is outside the vocabulary of 6 ids");
  EXPECT_EQ(s->check_ids(5).message(), path("x_train_000000.bin") + ": token id 5 at position 0 is outside the vocabulary of 5 ids");
  // The loader checks every shard as it opens them, before any batch.
  std::string good = counting_shard("a_train_000000.bin", 0, 100);
  LoaderOptions o;
  o.seq_len = 4;
  o.vocab_size = 350;
  auto l = TokenLoader::open({good, path("x_train_000000.bin")}, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().message(), path("x_train_000000.bin") + ": token id 400 at position 69000 is outside the vocabulary of 350 ids");
  o.vocab_size = 0;
  EXPECT_EQ(TokenLoader::open({good}, o).status().message(), "vocab_size 0 must be at least 1");
  o.vocab_size = 100;
  EXPECT_TRUE(TokenLoader::open({good}, o).ok());
}

TEST_F(Data, FindShardsBySplitWord) {
  for (const char* n : {"train_000001.bin", "train_000000.bin", "fineweb_val_000001.bin", "tiny_shakespeare_val.bin",
                        "trainval.bin", "val_notes.txt"}) {
    put(n, "x");
  }
  auto val = find_shards(dir_.string(), "val");
  ASSERT_TRUE(val.ok());
  EXPECT_EQ(*val, (std::vector<std::string>{path("fineweb_val_000001.bin"), path("tiny_shakespeare_val.bin")}));
  auto train = find_shards(dir_.string(), "train");
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(*train, (std::vector<std::string>{path("train_000000.bin"), path("train_000001.bin")}));
  auto test = find_shards(dir_.string(), "test");
  ASSERT_FALSE(test.ok());
  EXPECT_EQ(test.status().message(), dir_.string() + ": no test shards (*test*.bin)");
}

// ---------------------------------------------------------------------------------------------------
// Documents

TEST(Documents, FortunesSplitOnPercentLines) {
  EXPECT_EQ(split_fortunes("a\n%\nb\n\nc\n%\n \n%\nd"), (std::vector<std::string>{"a\n", "b\n\nc\n", "d\n"}));
  EXPECT_EQ(split_fortunes("x\r\n%\r\ny 100%\r\n"), (std::vector<std::string>{"x\r\n", "y 100%\r\n"}));
  EXPECT_EQ(split_fortunes("%\n%\n"), std::vector<std::string>{});
}

TEST(Documents, ParagraphsSplitOnBlankLines) {
  EXPECT_EQ(split_paragraphs("p1 l1\np1 l2\n\n  \t\np2"), (std::vector<std::string>{"p1 l1\np1 l2\n", "p2\n"}));
  EXPECT_EQ(split_paragraphs("\n\n"), std::vector<std::string>{});
}

TEST(Documents, JsonStringsDecodeEveryEscape) {
  auto o = parse_json_object(
      R"( {"id": 7, "text": "a\"b\\c\/d\n\t\b\f\r \u00e9\u4E16\ud83d\ude00 \ud800x", "x": [1, {"y": null}], "t": true} )");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->size(), 4u);
  EXPECT_TRUE(o->at("text").is_string);
  EXPECT_EQ(o->at("text").text, "a\"b\\c/d\n\t\b\f\r \xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80 \xef\xbf\xbdx");
  EXPECT_FALSE(o->at("id").is_string);
  EXPECT_EQ(o->at("id").text, "7");
  EXPECT_EQ(o->at("x").text, R"([1, {"y": null}])");
  EXPECT_EQ(o->at("t").text, "true");
  auto raw = parse_json_object("{\"k\": \"caf\xc3\xa9\"}");  // raw UTF-8 passes through
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->at("k").text, "caf\xc3\xa9");
  auto empty = parse_json_object("{}");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(Documents, MalformedJsonSaysWhere) {
  auto err = [](const std::string& s) {
    auto o = parse_json_object(s);
    return o.ok() ? std::string("parsed") : std::string(o.status().message());
  };
  EXPECT_EQ(err(R"({"text": "abc)"), "invalid JSON: unterminated string at character 14");
  EXPECT_EQ(err(R"({"text": "a\qb"})"), "invalid JSON: bad escape '\\q' at character 13");
  EXPECT_EQ(err(R"({"text": "\u12G4"})"), "invalid JSON: bad hex digit in a \\u escape at character 15");
  EXPECT_EQ(err(R"({"text" "x"})"), "invalid JSON: expected ':' at character 9");
  EXPECT_EQ(err(R"({"a": 1} x)"), "invalid JSON: unexpected text after the object at character 10");
  EXPECT_EQ(err(R"({"a": nope})"), "invalid JSON: expected a value at character 7");
  EXPECT_EQ(err(R"(["a"])"), "invalid JSON: expected '{' at character 1");
  EXPECT_EQ(json_quote("a\"b\\\n\x01"), "\"a\\\"b\\\\\\n\\u0001\"");
  auto back = parse_json_object("{\"k\": " + json_quote("tab\there \"q\" \x1f") + "}");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->at("k").text, "tab\there \"q\" \x1f");
}

TEST_F(Data, JsonlDocumentsWithLineNumbersInErrors) {
  std::string p = put("docs.jsonl", "{\"body\": \"first\\nline\", \"n\": 1}\n\n{\"n\": 2, \"body\": \"second \\u00e9\"}\n");
  DocSource src{p, DocFormat::jsonl, "body"};
  auto docs = read_documents(src);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ(*docs, (std::vector<std::string>{"first\nline", "second \xc3\xa9"}));
  src.json_field = "text";
  auto missing = read_documents(src);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), p + ":1: no field \"text\"");
  src.json_field = "n";
  auto number = read_documents(src);
  ASSERT_FALSE(number.ok());
  EXPECT_EQ(number.status().message(), p + ":1: the field \"n\" is not a string");
  std::string bad = put("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": oops}\n");
  auto broken = read_documents({bad, DocFormat::jsonl, "text"});
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().message(), bad + ":3: invalid JSON: expected a value at character 10");
}

TEST_F(Data, FoldersSkipIndexesHiddenFilesAndSymlinkTwins) {
  put("f/art", "one\n%\ntwo\n");
  put("f/art.dat", std::string("\x00\x01\x02", 3));
  fs::create_symlink("art", path("f/art.u8"));
  put("f/.hidden", "secret\n%\n");
  put("f/zen", "three\n");
  put("f/sub/deep", "four\n");
  auto files = source_files({path("f"), DocFormat::fortune, "text"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{path("f/art"), path("f/zen")}));
  // auto reads "art" as fortunes (it has % lines) and "zen" as paragraphs.
  auto docs = read_documents({path("f"), DocFormat::automatic, "text"});
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(*docs, (std::vector<std::string>{"one\n", "two\n", "three\n"}));
  auto none = source_files({path("f"), DocFormat::jsonl, "text"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), path("f") + ": the folder holds no jsonl files");
  auto absent = read_documents({path("absent"), DocFormat::text, "text"});
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().message(), path("absent") + ": no such file or folder");
  EXPECT_EQ(*parse_doc_format("auto"), DocFormat::automatic);
  EXPECT_FALSE(parse_doc_format("csv").ok());
}

// ---------------------------------------------------------------------------------------------------
// prepare

TEST(Prepare, SplitIsExactAndDeterministic) {
  auto a = split_documents(100, 0.05, 7), b = split_documents(100, 0.05, 7), c = split_documents(100, 0.05, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(std::count(a->begin(), a->end(), true), 5);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  auto small = split_documents(3, 0.01, 0);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(std::count(small->begin(), small->end(), true), 1);  // at least one when val_fraction > 0
  auto none = split_documents(3, 0, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(std::count(none->begin(), none->end(), true), 0);
  // One document: the advice is more documents (val_fraction 0 is no advice: a recipe refuses it).
  auto one = split_documents(1, 0.1, 0);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().message(),
            "a corpus of 1 document cannot be split between train and val, which take whole documents: give at "
            "least 2 (text files: paragraphs separated by a blank line; fortune: entries separated by '%' lines; "
            "jsonl: one object per line)");
  EXPECT_TRUE(split_documents(2, 0.5, 0).ok());  // from 2 documents on, every fraction a recipe allows works
  EXPECT_TRUE(split_documents(3, 0.5, 0).ok());
  auto most = split_documents(5, 0.9, 0);
  ASSERT_FALSE(most.ok());
  EXPECT_EQ(most.status().message(),
            "cannot split 5 documents with val_fraction 0.9: train would be empty; use a val_fraction of at most 0.5");
  EXPECT_FALSE(split_documents(10, 1.0, 0).ok());
  EXPECT_FALSE(split_documents(10, -0.1, 0).ok());
}

class PrepareTest : public Data {
 protected:
  // 40 fortunes "fortune number i\n" of different lengths.
  std::string corpus() {
    std::string text;
    for (int i = 0; i < 40; ++i) text += "fortune number " + std::to_string(i) + std::string(i % 5, '!') + "\n%\n";
    return put("corpus/fortunes", text);
  }
  // The tokens of every shard of a split, concatenated.
  std::vector<uint16_t> stream(const std::string& dir, const std::string& split) {
    std::vector<uint16_t> all;
    auto paths = find_shards(dir, split);
    EXPECT_TRUE(paths.ok()) << paths.status();
    for (const std::string& p : *paths) {
      auto s = Shard::open(p);
      EXPECT_TRUE(s.ok());
      all.insert(all.end(), s->tokens(), s->tokens() + s->size());
    }
    return all;
  }
};

TEST_F(PrepareTest, StreamsAreDocumentsAfterEndOfText) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  o.val_fraction = 0.1;
  o.seed = 3;
  auto info = prepare_dataset(o, path("out"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->train_documents, 36);
  EXPECT_EQ(info->val_documents, 4);
  EXPECT_EQ(info->vocab_size, 275);
  EXPECT_EQ(info->eot, 256);

  auto docs = read_documents(o.source);
  auto is_val = split_documents(40, 0.1, 3);
  std::string want_train, want_val;
  for (size_t i = 0; i < docs->size(); ++i) ((*is_val)[i] ? want_val : want_train) += "<|eot|>" + (*docs)[i];
  ByteTokenizer byte;
  auto decode = [&](const std::vector<uint16_t>& s) { return byte.decode(std::vector<int32_t>(s.begin(), s.end())); };
  EXPECT_EQ(decode(stream(path("out"), "train")), want_train);
  EXPECT_EQ(decode(stream(path("out"), "val")), want_val);
  EXPECT_EQ(info->train_tokens, static_cast<int64_t>(stream(path("out"), "train").size()));

  auto meta = read_dataset_info(path("out"));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->tokenizer, "byte");
  EXPECT_EQ(meta->source_format, "fortune");
  EXPECT_EQ(meta->val_fraction, 0.1);
  EXPECT_EQ(meta->seed, 3u);
  EXPECT_EQ(meta->train_tokens, info->train_tokens);
  EXPECT_EQ(meta->val_tokens, info->val_tokens);
  EXPECT_EQ(meta->train_shards, 1);
  EXPECT_NE(slurp(path("out/meta.json")).find("\"val_fraction\": 0.1,"), std::string::npos);
}

TEST_F(PrepareTest, SameSeedSameBytesOtherSeedOtherSplit) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  o.val_fraction = 0.2;
  ASSERT_TRUE(prepare_dataset(o, path("a")).ok());
  ASSERT_TRUE(prepare_dataset(o, path("b")).ok());
  o.seed = 1;
  ASSERT_TRUE(prepare_dataset(o, path("c")).ok());
  EXPECT_EQ(slurp(path("a/train_000000.bin")), slurp(path("b/train_000000.bin")));
  EXPECT_EQ(slurp(path("a/val_000000.bin")), slurp(path("b/val_000000.bin")));
  EXPECT_NE(slurp(path("a/val_000000.bin")), slurp(path("c/val_000000.bin")));
}

TEST_F(PrepareTest, SmallShardsConcatenateToTheSameStreamAndStaleShardsGo) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  auto whole = prepare_dataset(o, path("whole"));
  o.shard_tokens = 100;
  auto parts = prepare_dataset(o, path("parts"));
  ASSERT_TRUE(whole.ok() && parts.ok());
  EXPECT_EQ(parts->train_shards, (parts->train_tokens + 99) / 100);
  EXPECT_GT(parts->train_shards, 5);
  EXPECT_EQ(stream(path("parts"), "train"), stream(path("whole"), "train"));
  EXPECT_TRUE(fs::exists(path("parts/train_000005.bin")));
  o.shard_tokens = 100'000;
  ASSERT_TRUE(prepare_dataset(o, path("parts")).ok());
  EXPECT_EQ(find_shards(path("parts"), "train")->size(), 1u);
  EXPECT_EQ(stream(path("parts"), "train"), stream(path("whole"), "train"));
}

TEST_F(PrepareTest, BpeTokenizerAndErrors) {
  auto docs = read_documents({corpus(), DocFormat::fortune, "text"});
  auto bpe = BpeTokenizer::train(*docs, 300);
  ASSERT_TRUE(bpe.ok());
  ASSERT_TRUE(bpe->save(path("bpe.txt")).ok());
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  o.tokenizer = "bpe";
  o.tokenizer_path = path("bpe.txt");
  auto info = prepare_dataset(o, path("out"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tokenizer, "bpe");
  EXPECT_EQ(info->vocab_size, bpe->vocab_size());
  std::vector<uint16_t> all = stream(path("out"), "train");
  EXPECT_EQ(static_cast<int64_t>(all.size()), info->train_tokens);
  EXPECT_EQ(all.front(), bpe->eot());
  auto is_val = split_documents(40, o.val_fraction, o.seed);
  std::string want;
  int64_t bytes = 0;
  for (size_t i = 0; i < docs->size(); ++i) {
    if ((*is_val)[i]) continue;
    want += "<|eot|>" + (*docs)[i];
    bytes += static_cast<int64_t>((*docs)[i].size()) + 1;
  }
  EXPECT_EQ(bpe->decode(std::vector<int32_t>(all.begin(), all.end())), want);
  EXPECT_LT(info->train_tokens * 2, bytes);  // the merges compress this repetitive text

  o.tokenizer_path = path("missing.txt");
  EXPECT_FALSE(prepare_dataset(o, path("out2")).ok());
  PrepareOptions one;
  one.source = {put("one.txt", "a single paragraph\n"), DocFormat::text, "text"};
  auto s = prepare_dataset(one, path("out3"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("a corpus of 1 document cannot be split between train and val"),
            std::string::npos)
      << s.status();
  EXPECT_EQ(s.status().message().rfind(path("one.txt"), 0), 0u);
}

TEST_F(PrepareTest, CachedPrepareIsKeyedByInputsAndOptions) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  auto a = prepare_cached(o, path("cache"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(fs::path(a->dir).parent_path(), fs::path(path("cache")));
  EXPECT_EQ(fs::path(a->dir).filename().string().rfind("fortunes-", 0), 0u);
  put(fs::path(a->dir).lexically_relative(dir_).string() + "/marker", "kept");  // a re-prepare would not keep it
  auto again = prepare_cached(o, path("cache"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->dir, a->dir);
  EXPECT_TRUE(fs::exists(fs::path(a->dir) / "marker"));
  EXPECT_EQ(again->train_tokens, a->train_tokens);

  o.seed = 9;
  auto seeded = prepare_cached(o, path("cache"));
  ASSERT_TRUE(seeded.ok());
  EXPECT_NE(seeded->dir, a->dir);
  o.seed = 0;
  put("corpus/fortunes", "changed\n%\ncontent, longer than before\n%\nthird\n");
  auto changed = prepare_cached(o, path("cache"));
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed->dir, a->dir);
  EXPECT_EQ(changed->train_documents + changed->val_documents, 3);
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(path("cache"))) leftovers += e.path().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(leftovers, 0);
}

TEST_F(PrepareTest, MetaJsonNumbersAreCheckedBeforeUse) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  auto prepared = prepare_dataset(o, path("out"));
  ASSERT_TRUE(prepared.ok());
  const std::string meta = slurp(path("out/meta.json"));
  auto error_with = [&](const std::string& from, const std::string& to) {
    std::string text = meta;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    put("out/meta.json", text);
    auto info = read_dataset_info(path("out"));
    return info.ok() ? std::string("read") : std::string(info.status().message());
  };
  const std::string file = path("out/meta.json") + ": ";
  EXPECT_EQ(error_with("\"vocab_size\": 275", "\"vocab_size\": 2e9"),
            file + "\"vocab_size\" must be an integer in [1, 65536] (uint16 shards), got 2e9");
  EXPECT_EQ(error_with("\"vocab_size\": 275", "\"vocab_size\": 2000000000"),
            file + "\"vocab_size\" must be an integer in [1, 65536] (uint16 shards), got 2000000000");
  EXPECT_EQ(error_with("\"vocab_size\": 275", "\"vocab_size\": 0"),
            file + "\"vocab_size\" must be an integer in [1, 65536] (uint16 shards), got 0");
  EXPECT_EQ(error_with("\"vocab_size\": 275", "\"vocab_size\": 99999999999999999999999"),
            file + "\"vocab_size\" must be an integer in [1, 65536] (uint16 shards), got 99999999999999999999999");
  EXPECT_EQ(error_with("\"vocab_size\": 275", "\"vocab_size\": \"275\""), file + "missing number \"vocab_size\"");
  EXPECT_EQ(error_with("\"eot\": 256", "\"eot\": 275"), file + "\"eot\" must be an id below vocab_size, got 275");
  EXPECT_EQ(error_with("\"train_tokens\": ", "\"train_tokens\": -"), file + "\"train_tokens\" must be an integer ≥ 0, got -" +
                                                                    std::to_string(prepared->train_tokens));
  EXPECT_EQ(error_with("\"val_fraction\": 0.05", "\"val_fraction\": 1"), file + "\"val_fraction\" must be a number in [0, 1), got 1");
  EXPECT_EQ(error_with("\"seed\": 0", "\"seed\": 7"), "read");
  // The tokenizer meta.json names must have its vocabulary.
  std::string text = meta;
  text.replace(text.find("\"vocab_size\": 275"), 17, "\"vocab_size\": 300");
  put("out/meta.json", text);
  auto info = read_dataset_info(path("out"));
  ASSERT_TRUE(info.ok()) << info.status();
  auto decoder = open_decoder(*info);
  ASSERT_FALSE(decoder.ok());
  EXPECT_EQ(decoder.status().message(), path("out/meta.json") + ": vocab_size is 300 but its byte tokenizer has 275 ids");
}

TEST_F(PrepareTest, ShardFoldersWithMetaJsonAgreeWithTheRecipe) {
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  ASSERT_TRUE(prepare_dataset(o, path("out")).ok());
  auto info = open_shard_folder(path("out"), 0, "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tokenizer, "byte");
  EXPECT_EQ(info->vocab_size, 275);
  EXPECT_TRUE(open_shard_folder(path("out"), 275, "").ok());
  EXPECT_EQ(open_shard_folder(path("out"), 50257, "").status().message(),
            path("out/meta.json") + ": vocab_size is 275, not data.vocab_size = 50257 (meta.json describes the folder: "
                                    "leave data.vocab_size at 0)");
  EXPECT_EQ(open_shard_folder(path("out"), 0, path("tok.bin")).status().message(),
            path("out/meta.json") + ": the folder's tokenizer is byte, not data.tokenizer_path = " + path("tok.bin") +
                " (meta.json names the tokenizer: leave data.tokenizer_path empty)");
}

// A folder as llm.c's data scripts leave it: <name>_train_NNNNNN.bin, <name>_val_NNNNNN.bin, no meta.json.
TEST_F(Data, LlmcShardFoldersTakeTheirVocabularyFromTheRecipeOrTheTokenizer) {
  put("llmc/tiny_train_000000.bin", llmc_shard(20240520, 1, 4, {50256, 464, 2068, 7586}));
  put("llmc/tiny_train_000001.bin", llmc_shard(20240520, 1, 2, {50256, 13}));
  put("llmc/tiny_val_000000.bin", llmc_shard(20240520, 1, 3, {50256, 40, 41}));
  auto gpt2 = open_shard_folder(path("llmc"), 0, "");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ(gpt2->vocab_size, 50257);
  EXPECT_EQ(gpt2->eot, 50256);
  EXPECT_EQ(gpt2->tokenizer, "ids");
  EXPECT_EQ(gpt2->source_format, "llm.c");
  EXPECT_EQ(gpt2->train_shards, 2);
  EXPECT_EQ(gpt2->val_shards, 1);
  auto ids = open_decoder(*gpt2);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ((*ids)->decode({50256, 464, 2068}), "50256 464 2068");
  auto set = open_shard_folder(path("llmc"), 60000, "");
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->vocab_size, 60000);
  EXPECT_EQ(set->eot, 59999);

  // A tokenizer file: its count is the vocabulary, and a recipe's data.vocab_size must agree.
  std::string tok(1024, '\0');
  const uint32_t header[4] = {20240328, 2, 50257, 50256};
  std::memcpy(&tok[0], header, sizeof header);
  for (int i = 0; i < 50257; ++i) {
    std::string bytes = i == 50256 ? "<|endoftext|>" : i == 464 ? "The" : i == 2068 ? " quick" : "t" + std::to_string(i);
    tok += static_cast<char>(bytes.size()) + bytes;
  }
  std::string tok_path = put("gpt2_tokenizer.bin", tok);
  auto with = open_shard_folder(path("llmc"), 0, tok_path);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->tokenizer, "llmc");
  EXPECT_EQ(with->tokenizer_path, tok_path);
  EXPECT_EQ(with->vocab_size, 50257);
  auto text = open_decoder(*with);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ((*text)->decode({50256, 464, 2068}), "<|endoftext|>The quick");
  EXPECT_TRUE(open_shard_folder(path("llmc"), 50257, tok_path).ok());
  EXPECT_EQ(open_shard_folder(path("llmc"), 50304, tok_path).status().message(),
            tok_path + ": holds 50257 tokens, not data.vocab_size = 50304");
  std::string merges = put("merges.txt", "seqlab-bpe 1\n104 101\n");
  EXPECT_EQ(open_shard_folder(path("llmc"), 0, merges).status().message(),
            merges + ": not an llm.c tokenizer file: magic 1819370867, expected 20240328");

  // What is not such a folder.
  put("empty/notes.txt", "x");
  EXPECT_EQ(open_shard_folder(path("empty"), 0, "").status().message(),
            path("empty") + ": neither meta.json (seqlab's prepare) nor train shards (llm.c's <name>_train_NNNNNN.bin): "
                            "not a folder of token shards");
  EXPECT_NE(open_shard_folder(path("absent"), 0, "").status().message().find(path("absent") + ": cannot list"),
            std::string::npos);
  put("trainonly/tiny_train_000000.bin", llmc_shard(20240520, 1, 1, {1}));
  EXPECT_EQ(open_shard_folder(path("trainonly"), 0, "").status().message(),
            path("trainonly") + ": no val shards (*val*.bin)");
}

TEST_F(PrepareTest, TemporariesOfDeadWritersAreRemovedOnTheNextStart) {
  // A pid that has just exited (and been reaped) belongs to no process.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string dead = std::to_string(child), alive = std::to_string(::getppid()), self = std::to_string(::getpid());
  put("cache/fortunes-0123456789abcdef.tmp." + dead + "/train_000000.bin", "half");
  put("cache/meta.json.tmp." + dead, "half");
  put("cache/other-0123456789abcdef.tmp." + alive + "/train_000000.bin", "a live writer's");
  put("cache/mine.tmp." + self + "/x", "this process's");
  put("cache/notes.tmp.txt", "not a pid");
  put("cache/keep-0123456789abcdef/meta.json", "{}");
  std::vector<std::string> gone = remove_dead_temporaries(path("cache"));
  std::sort(gone.begin(), gone.end());
  EXPECT_EQ(gone, (std::vector<std::string>{"fortunes-0123456789abcdef.tmp." + dead, "meta.json.tmp." + dead}));
  EXPECT_TRUE(fs::exists(path("cache/other-0123456789abcdef.tmp." + alive)));
  EXPECT_TRUE(fs::exists(path("cache/mine.tmp." + self)));
  EXPECT_TRUE(fs::exists(path("cache/notes.tmp.txt")));
  EXPECT_TRUE(fs::exists(path("cache/keep-0123456789abcdef/meta.json")));
  EXPECT_TRUE(remove_dead_temporaries(path("absent")).empty());

  // prepare_cached does it at every start, whether the data is prepared already or not.
  put("cache/fortunes-0123456789abcdef.tmp." + dead + "/train_000000.bin", "half");
  PrepareOptions o;
  o.source = {corpus(), DocFormat::fortune, "text"};
  ASSERT_TRUE(prepare_cached(o, path("cache")).ok());
  EXPECT_FALSE(fs::exists(path("cache/fortunes-0123456789abcdef.tmp." + dead)));
  put("cache/fortunes-0123456789abcdef.tmp." + dead + "/train_000000.bin", "half");
  ASSERT_TRUE(prepare_cached(o, path("cache")).ok());
  EXPECT_FALSE(fs::exists(path("cache/fortunes-0123456789abcdef.tmp." + dead)));
  EXPECT_TRUE(fs::exists(path("cache/other-0123456789abcdef.tmp." + alive)));
}

// ---------------------------------------------------------------------------------------------------
// TokenLoader

// Over 0..1000 with seq_len 10 there are 100 windows; window w starts at token 10·w.
class LoaderTest : public Data {
 protected:
  void SetUp() override {
    Data::SetUp();
    shard_ = counting_shard("train_000000.bin", 0, 1001);
  }
  TokenLoader open(uint64_t seed, int rank = 0, int world = 1, bool shuffle = true) {
    LoaderOptions o;
    o.seq_len = 10;
    o.seed = seed;
    o.rank = rank;
    o.world = world;
    o.shuffle = shuffle;
    auto l = TokenLoader::open({shard_}, o);
    EXPECT_TRUE(l.ok()) << l.status();
    return std::move(*l);
  }
  // The window index of each row, checking that every row is a window and targets are inputs shifted.
  static std::vector<int64_t> windows(const Batch& b) {
    std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets), w;
    EXPECT_EQ(b.inputs.dtype(), DType::i32);
    for (size_t r = 0; r < in.size() / 10; ++r) {
      EXPECT_EQ(in[r * 10] % 10, 0);
      for (int t = 0; t < 10; ++t) {
        EXPECT_EQ(in[r * 10 + t], in[r * 10] + t);
        EXPECT_EQ(tg[r * 10 + t], in[r * 10] + t + 1);
      }
      w.push_back(in[r * 10] / 10);
    }
    return w;
  }
  std::string shard_;
};

TEST_F(LoaderTest, EpochsArePermutationsThatDifferAndRepeatBySeed) {
  TokenLoader l = open(5);
  EXPECT_EQ(l.num_tokens(), 1001);
  EXPECT_EQ(l.num_windows(), 100);
  Batch first = l.next_batch(100);
  EXPECT_EQ(first.inputs.shape(), (Shape{100, 10}));
  std::vector<int64_t> e0 = windows(first), e1 = windows(l.next_batch(100));
  EXPECT_EQ(l.state(), (LoaderState{1, 100}));
  std::vector<int64_t> sorted0 = e0, sorted1 = e1, all(100);
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted0, all);
  EXPECT_EQ(sorted1, all);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, all);

  TokenLoader same = open(5), other = open(6);
  EXPECT_EQ(windows(same.next_batch(100)), e0);
  EXPECT_NE(windows(other.next_batch(100)), e0);
  EXPECT_EQ(windows(open(5, 0, 1, false).next_batch(100)), all);
}

TEST_F(LoaderTest, RanksPartitionEachEpoch) {
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    TokenLoader l = open(5, r, 3);
    EXPECT_EQ(l.windows_per_rank(), 33);
    for (int64_t w : windows(l.next_batch(33))) EXPECT_TRUE(seen.insert(w).second) << "window " << w << " twice";
    EXPECT_EQ(l.state(), (LoaderState{0, 33}));
  }
  EXPECT_EQ(seen.size(), 99u);
  // Rank r of 3 takes entries r, r+3, ... of the one-rank order.
  std::vector<int64_t> order = windows(open(5).next_batch(99)), rank1 = windows(open(5, 1, 3).next_batch(33));
  for (int j = 0; j < 33; ++j) EXPECT_EQ(rank1[j], order[3 * j + 1]);
}

TEST_F(LoaderTest, RestoreYieldsTheSameBatches) {
  TokenLoader a = open(11);
  for (int i = 0; i < 15; ++i) a.next_batch(6);  // 90 windows: the next batches cross into epoch 1
  LoaderState saved = a.state();
  EXPECT_EQ(saved, (LoaderState{0, 90}));
  std::vector<std::vector<int64_t>> after;
  for (int i = 0; i < 5; ++i) after.push_back(ints(a.next_batch(6).inputs));
  EXPECT_EQ(a.state(), (LoaderState{1, 20}));

  TokenLoader b = open(11);
  ASSERT_TRUE(b.restore(saved).ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ints(b.next_batch(6).inputs), after[i]) << "batch " << i;
  EXPECT_FALSE(b.restore({0, 101}).ok());
  EXPECT_FALSE(b.restore({-1, 0}).ok());
}

TEST_F(LoaderTest, EvalWalksInOrderWithoutMovingTraining) {
  TokenLoader l = open(3, 1, 2);
  Batch t0 = l.next_batch(4);
  LoaderState s = l.state();
  EXPECT_EQ(windows(l.eval_batch(0, 4)), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(windows(l.eval_batch(1, 4)), (std::vector<int64_t>{9, 11, 13, 15}));
  EXPECT_EQ(l.eval_batches(4), 12);
  EXPECT_EQ(windows(l.eval_batch(12, 4)), (std::vector<int64_t>{97, 99, 1, 3}));  // wraps after 50 windows
  EXPECT_EQ(l.state(), s);
  TokenLoader fresh = open(3, 1, 2);
  fresh.next_batch(4);
  EXPECT_EQ(ints(l.next_batch(4).inputs), ints(fresh.next_batch(4).inputs));
}

TEST_F(LoaderTest, WindowsCrossShardBoundaries) {
  std::string a = counting_shard("split_train_000000.bin", 0, 333), b = counting_shard("split_train_000001.bin", 333, 668);
  LoaderOptions o;
  o.seq_len = 10;
  o.seed = 5;
  auto two = TokenLoader::open({a, b}, o);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->num_tokens(), 1001);
  EXPECT_EQ(ints(two->next_batch(100).inputs), ints(open(5).next_batch(100).inputs));
  std::vector<int32_t> buf(4);
  two->read_tokens(331, 4, buf.data());
  EXPECT_EQ(buf, (std::vector<int32_t>{331, 332, 333, 334}));
}

TEST_F(LoaderTest, TooFewTokensIsAClearError) {
  std::string p = counting_shard("short_train.bin", 0, 10);
  LoaderOptions o;
  o.seq_len = 10;
  auto l = TokenLoader::open({p}, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().message(), p + ": 10 tokens, fewer than seq_len + 1 = 11 (one window)");
  o.seq_len = 5;
  o.world = 4;
  auto ranks = TokenLoader::open({p}, o);
  ASSERT_FALSE(ranks.ok());
  EXPECT_EQ(ranks.status().message(), p + ": 10 tokens make 1 window(s) of 6 tokens, fewer than the 4 ranks");
  auto none = TokenLoader::open_split(dir_.string(), "val", o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no val shards"), std::string::npos);
}

}  // namespace
}  // namespace seqlab
