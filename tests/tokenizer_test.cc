// Tokenizers: byte round trips and special tokens, the pre-tokenisation, BPE training on text whose
// merges can be worked out by hand, exact round trips, the merges file and each way it can be wrong;
// llm.c's tokenizer file (decoding, prompts as ids, each way it can be wrong) and the token-id decoder.
#include "train/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

TEST(SpecialTokens, OneTablePerObjective) {
  const SpecialTokens lm = special_tokens(Objective::lm);
  EXPECT_EQ(lm.size(), kNumSpecialTokens);
  EXPECT_EQ(lm.texts[0], "<|eot|>");
  EXPECT_EQ(lm.texts[18], "<|sentinel_15|>");
  EXPECT_FALSE(lm.in_prompts);
  const SpecialTokens mlm = special_tokens(Objective::masked_lm);
  EXPECT_EQ(mlm.texts, (std::vector<std::string>{"[PAD]", "[CLS]", "[SEP]", "[MASK]"}));
  EXPECT_TRUE(mlm.in_prompts);
  EXPECT_EQ(mlm.eot, mlm.sep);  // a BERT row ends with [SEP]
  const SpecialTokens t5 = special_tokens(Objective::span_corruption, 3);
  EXPECT_EQ(t5.texts, (std::vector<std::string>{"[PAD]", "[EOS]", "<extra_id_0>", "<extra_id_1>", "<extra_id_2>"}));
  EXPECT_EQ(t5.eot, t5.eos);
  EXPECT_EQ(t5.sentinels, 3);
  EXPECT_THROW(special_tokens(Objective::span_corruption, 0), std::invalid_argument);
  EXPECT_FALSE(special_tokens(Objective::span_corruption, 3) == special_tokens(Objective::span_corruption, 4));
  auto o = parse_objective("masked_lm");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(*o, Objective::masked_lm);
  EXPECT_STREQ(objective_name(Objective::span_corruption), "span_corruption");
  EXPECT_EQ(parse_objective("mlm").status().message(), "unknown objective 'mlm' (lm, masked_lm or span_corruption)");
}

// The masked_lm table takes the lm table's place after the same 256 bytes: [PAD] 256 ... [MASK] 259.
TEST(ByteTokenizer, MaskedLmTokensFollowTheBytesAndReadInPrompts) {
  ByteTokenizer t;
  t.set_special_tokens(special_tokens(Objective::masked_lm));
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.num_regular(), 256);
  EXPECT_EQ(t.pad(), 256);
  EXPECT_EQ(t.cls(), 257);
  EXPECT_EQ(t.sep(), 258);
  EXPECT_EQ(t.mask(), 259);
  EXPECT_EQ(t.eot(), 258);
  EXPECT_EQ(t.num_sentinels(), 0);
  EXPECT_TRUE(t.is_special(259));
  EXPECT_FALSE(t.is_special(260));
  try {
    t.eos();
    FAIL() << "the masked_lm table has no [EOS]";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "the masked_lm vocabulary has no [EOS] token");
  }
  EXPECT_THROW(t.sentinel(0), std::out_of_range);
  EXPECT_EQ(t.decode({257, 84, 259, 258, 256}), "[CLS]T[MASK][SEP][PAD]");
  EXPECT_EQ(t.decode({260}), "<|unknown_260|>");
  // encode() (corpora) never makes a special id; a prompt's "[MASK]" is the [MASK] id.
  EXPECT_EQ(t.encode("[MASK]").size(), 6u);
  auto ids = t.encode_prompt("The [MASK] sat");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (Ids{'T', 'h', 'e', ' ', 259, ' ', 's', 'a', 't'}));
  EXPECT_EQ(*t.encode_prompt("[CLS][MASK][MASK[SEP]"), (Ids{257, 259, '[', 'M', 'A', 'S', 'K', 258}));
  EXPECT_EQ(t.decode(*t.encode_prompt("a [MASK] b [SEP]")), "a [MASK] b [SEP]");
  // The lm table's markers stay text in a prompt, as before objectives.
  ByteTokenizer lm;
  EXPECT_EQ(lm.encode_prompt("<|eot|>")->size(), 7u);
  EXPECT_EQ(lm.encode_prompt("[MASK]")->size(), 6u);
  try {
    lm.cls();
    FAIL() << "the lm table has no [CLS]";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "the lm vocabulary has no [CLS] token");
  }
}

TEST(ByteTokenizer, SpanCorruptionSentinelsFollowPadAndEos) {
  ByteTokenizer t;
  t.set_special_tokens(special_tokens(Objective::span_corruption, 12));
  EXPECT_EQ(t.vocab_size(), 256 + 2 + 12);
  EXPECT_EQ(t.pad(), 256);
  EXPECT_EQ(t.eos(), 257);
  EXPECT_EQ(t.eot(), 257);
  EXPECT_EQ(t.sentinel(0), 258);
  EXPECT_EQ(t.sentinel(11), 269);
  EXPECT_THROW(t.sentinel(12), std::out_of_range);
  EXPECT_THROW(t.mask(), std::out_of_range);
  EXPECT_EQ(t.decode({'a', 258, 'b', 268, 257}), "a<extra_id_0>b<extra_id_10>[EOS]");
  // "<extra_id_1>" is no prefix of "<extra_id_10>" ('>' closes each); "<extra_id_12>" is past the table: text.
  EXPECT_EQ(*t.encode_prompt("a<extra_id_10>b<extra_id_1>"), (Ids{'a', 268, 'b', 259}));
  EXPECT_EQ(t.encode_prompt("<extra_id_12>")->size(), 13u);
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

// An objective's table sits after the merges, whose ids stay as they are.
TEST(BpeTokenizer, ObjectiveTablesFollowTheMerges) {
  auto t = BpeTokenizer::train({"the the the the cat"}, 1000);
  ASSERT_TRUE(t.ok());
  const Ids text = t->encode("the cat");
  t->set_special_tokens(special_tokens(Objective::masked_lm));
  EXPECT_EQ(t->vocab_size(), 259 + 4);
  EXPECT_EQ(t->mask(), 262);
  EXPECT_EQ(t->encode("the cat"), text);
  EXPECT_EQ(t->token_text(258), " the");
  Ids expected = t->encode("the ");
  expected.push_back(262);
  for (int32_t id : t->encode(" cat")) expected.push_back(id);
  EXPECT_EQ(*t->encode_prompt("the [MASK] cat"), expected);
  EXPECT_EQ(t->decode(expected), "the [MASK] cat");

  // make_tokenizer gives either tokenizer a table.
  const std::string path = ::testing::TempDir() + "/tokenizer_test_objective_merges_" + std::to_string(::getpid());
  ASSERT_TRUE(t->save(path).ok());
  auto bpe = make_tokenizer("bpe", path, special_tokens(Objective::span_corruption, 5));
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  EXPECT_EQ((*bpe)->vocab_size(), 259 + 2 + 5);
  EXPECT_EQ((*bpe)->token_text(263), "<extra_id_2>");
  auto byte = make_tokenizer("byte", "", special_tokens(Objective::masked_lm));
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->vocab_size(), 260);
  EXPECT_EQ((*make_tokenizer("byte"))->vocab_size(), 275);
  std::filesystem::remove(path);
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

// ---------------------------------------------------------------------------------------------------
// llm.c's tokenizer file and the token-id decoder

// A tokenizer file built byte by byte in llm.c's layout: 256 uint32 of header, then each token's length
// byte and bytes.
std::string llmc_file(uint32_t magic, uint32_t version, uint32_t n, uint32_t eot, const std::vector<std::string>& tokens) {
  std::string b(1024, '\0');
  const uint32_t header[4] = {magic, version, n, eot};
  std::memcpy(&b[0], header, sizeof header);
  for (const std::string& t : tokens) b += static_cast<char>(t.size()) + t;
  return b;
}

const std::vector<std::string> kSmall = {"a", "b", " the", "\xc3\xa9", "<|endoftext|>"};  // eot = 4, last as in GPT-2

std::string llmc_error(const std::string& bytes) {
  auto t = LlmcTokenizer::parse(bytes, "tok.bin");
  return t.ok() ? "parsed" : std::string(t.status().message());
}

TEST(LlmcTokenizer, DecodesIdsToTheFilesBytes) {
  auto t = LlmcTokenizer::parse(llmc_file(20240328, 2, 5, 4, kSmall), "tok.bin");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "llmc");
  EXPECT_EQ(t->version(), 2);
  EXPECT_EQ(t->vocab_size(), 5);
  EXPECT_EQ(t->eot(), 4);
  EXPECT_TRUE(t->is_special(4));
  EXPECT_FALSE(t->is_special(3));
  EXPECT_EQ(t->decode({4, 2, 0, 1, 3}), "<|endoftext|> theab\xc3\xa9");
  EXPECT_EQ(t->token_text(5), "<|unknown_5|>");
  EXPECT_EQ(t->token_text(-1), "<|unknown_-1|>");
  // No merges, so no text encoding: a prompt is ids or nothing.
  auto ids = t->encode_prompt(" 2, 0 1\n3 ");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (Ids{2, 0, 1, 3}));
  EXPECT_EQ(t->encode_prompt("")->size(), 0u);
  EXPECT_EQ(t->encode_prompt("2 the").status().message(),
            "llm.c's tokenizer file holds no BPE merges, so text cannot be encoded: give the prompt as token ids "
            "separated by spaces, such as \"464 2068\", not 'the'");
  EXPECT_EQ(t->encode_prompt("5").status().message(), "prompt token id 5 is outside the vocabulary of 5 ids");
  EXPECT_EQ(t->encode_prompt("-1").status().message(), "prompt token id -1 is outside the vocabulary of 5 ids");
}

TEST(LlmcTokenizer, VersionOneMeansGpt2sEndOfText) {
  std::vector<std::string> tokens(50257);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = "t" + std::to_string(i);
  auto t = LlmcTokenizer::parse(llmc_file(20240328, 1, 50257, 0, tokens), "gpt2_tokenizer.bin");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->eot(), 50256);
  EXPECT_EQ(t->decode({0, 50256}), "t0t50256");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 1, 5, 0, kSmall)),
            "tok.bin: end-of-text id 50256 (implied by version 1) is outside the vocabulary of 5 tokens");
}

TEST(LlmcTokenizer, EveryBrokenFileIsRefusedWithWhatIsWrong) {
  EXPECT_EQ(llmc_error(""), "tok.bin: truncated llm.c tokenizer file: 0 bytes, less than the 1024-byte header");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 4, {}).substr(0, 100)),
            "tok.bin: truncated llm.c tokenizer file: 100 bytes, less than the 1024-byte header");
  EXPECT_EQ(llmc_error(llmc_file(20240520, 2, 5, 4, kSmall)),
            "tok.bin: not an llm.c tokenizer file: magic 20240520, expected 20240328");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 3, 5, 4, kSmall)), "tok.bin: llm.c tokenizer version 3 is not supported (1 or 2)");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 0, 0, {})), "tok.bin: the header's vocab_size is 0");
  // An absurd count is refused from the file's size, before anything is allocated for it.
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 2000000000, 4, kSmall)),
            "tok.bin: the header's vocab_size 2000000000 does not fit the file: 26 bytes after the header hold at "
            "most 13 tokens");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 5, kSmall)), "tok.bin: end-of-text id 5 is outside the vocabulary of 5 tokens");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 4, {"a", "", "b", "c", "d", "e"})), "tok.bin: token 1 has length 0 (at byte 1026)");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 4, kSmall).substr(0, 1024 + 10)),
            "tok.bin: token 3 of 2 bytes is cut off by the end of the file");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 4, {"aaaa", "bbbb"})), "tok.bin: the file ends before token 2 of 5");
  EXPECT_EQ(llmc_error(llmc_file(20240328, 2, 5, 4, kSmall) + "xyz"), "tok.bin: 3 bytes follow the last token");
}

TEST(TokenIdDecoder, PrintsIdsAndTakesTheLastIdAsEndOfText) {
  TokenIdDecoder d(50257);
  EXPECT_EQ(d.name(), "ids");
  EXPECT_EQ(d.vocab_size(), 50257);
  EXPECT_EQ(d.eot(), 50256);
  EXPECT_TRUE(d.is_special(50256));
  EXPECT_FALSE(d.is_special(0));
  EXPECT_EQ(d.decode({464, 2068, 50256, 50300}), "464 2068 50256 <|unknown_50300|>");
  EXPECT_EQ(d.decode({}), "");
  EXPECT_EQ(*d.encode_prompt("464 2068"), (Ids{464, 2068}));
  EXPECT_EQ(d.encode_prompt("The").status().message(),
            "without a tokenizer file (data.tokenizer_path) text cannot be encoded: give the prompt as token ids "
            "separated by spaces, such as \"464 2068\", not 'The'");
}

TEST_F(BpeFile, DecodersByKindAndLlmcFilesAreNotMerges) {
  std::string p = put(llmc_file(20240328, 2, 5, 4, kSmall));
  auto llmc = make_decoder("llmc", p, 0);
  ASSERT_TRUE(llmc.ok()) << llmc.status();
  EXPECT_EQ((*llmc)->decode({2, 4}), " the<|endoftext|>");
  auto ids = make_decoder("ids", "", 7);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)->eot(), 6);
  EXPECT_EQ(make_decoder("ids", "", 0).status().message(), "a token-id decoder needs a vocabulary of 1 to 2147483647 ids, not 0");
  auto byte = make_decoder("byte", "", 0);
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->vocab_size(), 275);
  EXPECT_EQ(make_decoder("sentencepiece", "", 0).status().message(), "unknown tokenizer 'sentencepiece' (byte, bpe, llmc or ids)");
  // Given as BPE merges, llm.c's file is named for what it is.
  EXPECT_EQ(error_of(llmc_file(20240328, 2, 5, 4, kSmall)),
            ": llm.c's tokenizer file, not BPE merges: it decodes llm.c's shards (data.source = \"shards\") but holds "
            "no merges to encode text with");
}

}  // namespace
}  // namespace seqlab
