// Tokenizers: byte round trips and special tokens, the pre-tokenisation, BPE training on text whose
// merges can be worked out by hand, exact round trips, the merges file and each way it can be wrong.
#include "train/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace seqlab {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

std::string all_bytes() {
  std::string s;
  for (int b = 0; b < 256; ++b) s.push_back(static_cast<char>(b));
  return s;
}

TEST(ByteTokenizer, IdsAreBytesAndRoundTripAnyString) {
  ByteTokenizer t;
  EXPECT_EQ(t.encode("hé\0!"), (Ids{104, 195, 169}));  // a C string stops at \0
  std::string s = std::string("h\xc3\xa9 \xe4\xb8\x96 \xf0\x9f\x99\x82 ") + std::string(1, '\0') + all_bytes();
  Ids ids = t.encode(s);
  ASSERT_EQ(ids.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(s[i]));
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(ByteTokenizer, SpecialTokensFollowTheBytes) {
  ByteTokenizer t;
  EXPECT_EQ(t.name(), "byte");
  EXPECT_EQ(t.vocab_size(), 275);
  EXPECT_EQ(t.eot(), 256);
  EXPECT_EQ(t.pad(), 257);
  EXPECT_EQ(t.mask(), 258);
  EXPECT_EQ(t.sentinel(0), 259);
  EXPECT_EQ(t.sentinel(15), 274);
  EXPECT_THROW(t.sentinel(16), std::out_of_range);
  EXPECT_TRUE(t.is_special(256));
  EXPECT_FALSE(t.is_special(255));
  EXPECT_FALSE(t.is_special(275));
  EXPECT_EQ(t.decode({72, 256, 105, 257, 258, 262, 274}), "H<|eot|>i<|pad|><|mask|><|sentinel_3|><|sentinel_15|>");
  EXPECT_EQ(t.decode({275, -1}), "<|unknown_275|><|unknown_-1|>");
  // Marker text in the input is ordinary bytes, never a special id.
  EXPECT_EQ(t.encode("<|eot|>").size(), 7u);
}

TEST(SplitChunks, WordsKeepOneLeadingSpaceAndClassesSplit) {
  using V = std::vector<absl::string_view>;
  EXPECT_EQ(split_chunks("Hi  there, 42!"), (V{"Hi", " ", " there", ",", " 42", "!"}));
  EXPECT_EQ(split_chunks("a\n\nb \tc"), (V{"a", "\n\n", "b", " \t", "c"}));
  EXPECT_EQ(split_chunks("h\xc3\xa9llo w\xc3\xb6rld"), (V{"h\xc3\xa9llo", " w\xc3\xb6rld"}));
  EXPECT_EQ(split_chunks(" x"), (V{" x"}));
  EXPECT_EQ(split_chunks("x  "), (V{"x", "  "}));
  EXPECT_EQ(split_chunks(""), V{});
  std::string long_word(600, 'a');
  V chunks = split_chunks(long_word);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].size(), 256u);
  EXPECT_EQ(chunks[2].size(), 88u);
}

// "the the the the cat": pairs (t,h) and (h,e) occur 4 times each; the tie goes to the smaller pair
// (h,e) = (104,101), then (t,"he") 4 times, then (" ","the") 3 times; every other pair occurs once.
TEST(BpeTokenizer, LearnsTheObviousMergesInOrder) {
  auto t = BpeTokenizer::train({"the the the the cat"}, 1000);
  ASSERT_TRUE(t.ok()) << t.status();
  using M = std::vector<BpeTokenizer::Merge>;
  EXPECT_EQ(t->merges(), (M{{104, 101}, {116, 256}, {32, 257}}));
  EXPECT_EQ(t->vocab_size(), 256 + 3 + kNumSpecialTokens);
  EXPECT_EQ(t->eot(), 259);
  EXPECT_EQ(t->name(), "bpe");
  EXPECT_EQ(t->token_text(258), " the");
  EXPECT_EQ(t->encode("the the cat"), (Ids{257, 258, 32, 99, 97, 116}));
  EXPECT_EQ(t->decode({257, 259, 258}), "the<|eot|> the");

  auto capped = BpeTokenizer::train({"the the the the cat"}, 256 + kNumSpecialTokens + 1);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->merges(), (M{{104, 101}}));
  EXPECT_EQ(capped->vocab_size(), 276);
}

TEST(BpeTokenizer, MergesNeverCrossChunks) {
  // "a b" repeats, but the chunks are "a", " b", " a", " b", ...: only (" ", "b") four times and
  // (" ", "a") three times are pairs, never ("a", " ").
  auto t = BpeTokenizer::train({"a b a b a b a b"}, 1000);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->merges(), (std::vector<BpeTokenizer::Merge>{{32, 98}, {32, 97}}));
}

TEST(BpeTokenizer, RejectsAVocabularyBelowBytesAndSpecials) {
  auto t = BpeTokenizer::train({"abc"}, 274);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("below 275"), std::string::npos) << t.status();
}

const char* kText =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of\n"
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light,\n"
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair.\n";

TEST(BpeTokenizer, RoundTripsExactlyIncludingUnseenBytes) {
  auto t = BpeTokenizer::train({kText, kText}, 400);
  ASSERT_TRUE(t.ok());
  EXPECT_GT(t->merges().size(), 50u);
  for (const std::string& s : {std::string(kText), std::string("it was \xf0\x9f\x99\x82 the\0 age", 20), all_bytes(),
                               std::string("   \n\n\t it   was  ")}) {
    Ids ids = t->encode(s);
    EXPECT_EQ(t->decode(ids), s);
    for (int32_t id : ids) EXPECT_LT(id, t->eot());
  }
  // Training text compresses: each chunk seen often becomes few tokens.
  EXPECT_LT(t->encode(kText).size() * 3, std::string(kText).size());
  EXPECT_EQ(t->encode(" was").size(), 1u);
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
  auto a = BpeTokenizer::train({kText}, 330);
  auto b = BpeTokenizer::train({kText}, 330);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->merges(), b->merges());
}

class BpeFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("tokenizer_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string put(const std::string& text) const {
    std::string p = (dir_ / "merges.txt").string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // The error of loading `text`; it must name the file.
  std::string error_of(const std::string& text) const {
    std::string p = put(text);
    auto t = BpeTokenizer::load(p);
    if (t.ok()) return "loaded";
    std::string m(t.status().message());
    EXPECT_NE(m.find(p), std::string::npos) << m;
    return m.substr(m.find(p) + p.size());
  }
  fs::path dir_;
};

TEST_F(BpeFile, SaveLoadRoundTrip) {
  auto t = BpeTokenizer::train({kText}, 330);
  ASSERT_TRUE(t.ok());
  std::string p = (dir_ / "bpe.txt").string();
  ASSERT_TRUE(t->save(p).ok());
  std::ifstream in(p, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text.substr(0, 13), "seqlab-bpe 1\n");
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(t->merges().size() + 1));
  auto back = BpeTokenizer::load(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->merges(), t->merges());
  EXPECT_EQ(back->vocab_size(), t->vocab_size());
  EXPECT_EQ(back->encode(kText), t->encode(kText));

  auto made = make_tokenizer("bpe", p);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->encode(kText), t->encode(kText));
  // CRLF line ends load too.
  EXPECT_EQ(error_of("seqlab-bpe 1\r\n104 101\r\n256 108\r\n"), "loaded");
}

TEST_F(BpeFile, MalformedFilesNameTheLine) {
  EXPECT_EQ(error_of(""), ": empty file (expected the header 'seqlab-bpe 1')");
  EXPECT_EQ(error_of("seqlab-bpe 2\n104 101\n"), ":1: expected the header 'seqlab-bpe 1', got 'seqlab-bpe 2'");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 101\n104\n"), ":3: expected two token ids separated by a space, got '104'");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 101 3\n"), ":2: expected two token ids separated by a space, got '104 101 3'");
  EXPECT_EQ(error_of("seqlab-bpe 1\nh e\n"), ":2: expected two token ids separated by a space, got 'h e'");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 101\n\n"), ":3: expected two token ids separated by a space, got ''");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 256\n"), ":2: id 256 is not defined yet (merge 0 may use ids 0..255)");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 101\n-1 5\n"), ":3: id -1 is not defined yet (merge 1 may use ids 0..256)");
  EXPECT_EQ(error_of("seqlab-bpe 1\n104 101\n1 2\n104 101\n"), ":4: merge 104 101 repeats merge 0");
}

TEST_F(BpeFile, MissingFileAndUnknownKinds) {
  std::string p = (dir_ / "absent.txt").string();
  auto t = BpeTokenizer::load(p);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(p + ": cannot open"), std::string::npos) << t.status();
  EXPECT_FALSE(make_tokenizer("bpe").ok());
  auto bad = make_tokenizer("wordpiece");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown tokenizer 'wordpiece' (byte or bpe)");
  auto byte = make_tokenizer("byte");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->vocab_size(), 275);
}

TEST(BpeTokenizer, FromMergesValidates) {
  EXPECT_TRUE(BpeTokenizer::from_merges({{1, 2}, {256, 3}}).ok());
  auto bad = BpeTokenizer::from_merges({{1, 2}, {258, 3}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "BPE merge 1: id 258 is not defined yet (merge 1 may use ids 0..256)");
}

TEST(BpeTokenizer, EncodesMegabytesQuickly) {
  // Not a benchmark: a guard against an accidentally quadratic encoder (a few MB must take seconds).
  auto t = BpeTokenizer::train({kText}, 500);
  ASSERT_TRUE(t.ok());
  std::string big;
  while (big.size() < (2u << 20)) big += kText;
  big += std::string(5000, '=');  // one long run of one symbol
  auto t0 = std::chrono::steady_clock::now();
  Ids ids = t->encode(big);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(t->decode(ids), big);
  EXPECT_LT(s, 10.0);
}

}  // namespace
}  // namespace seqlab
