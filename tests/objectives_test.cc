// The objectives' data: documents of a prepared stream (DocumentStream), T5's rounding, masked-LM rows
// (exact layouts on tiny documents, the split point, truncation, next-sentence pairs, the 15% and
// 80/10/10 rates, special tokens never masked, padding never scored), span-corruption rows (T5's
// lengths, exact layouts, sentinels in order, decoder inputs shifted, the noise rate), for both sources
// restore, the evaluation walk, ranks and errors; and the trainer's wiring (open_data) from a recipe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "train/cli/util.h"
#include "train/data/masked_lm.h"
#include "train/data/prepare.h"
#include "train/data/span_corruption.h"
#include "train/data/special_tokens.h"
#include "train/data/token_stream.h"
#include "train/data/tokenizer.h"
#include "train/loop/evaluation.h"
#include "train/recipe/configs.h"
#include "train/recipe/recipe.h"

namespace seqlab {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;
using Rows = std::vector<std::vector<int64_t>>;

constexpr int32_t kEot = 256;  // the byte tokenizer's end-of-text in a prepared stream (lm table)
constexpr int64_t kStreamVocab = 256 + kNumSpecialTokens;
// The byte tokenizer's ids of the masked_lm and span_corruption tables.
constexpr int32_t kPad = 256, kCls = 257, kSep = 258, kMask = 259;
constexpr int32_t kEos = 257, kSentinel0 = 258;
constexpr int64_t kIgnore = kIgnoreIndex;

std::vector<int64_t> ints(const Tensor& t) { return t.to_indices(); }

// Row `r` of a [B, T] tensor.
std::vector<int64_t> row(const Tensor& t, int64_t r) {
  const std::vector<int64_t> all = ints(t);
  const int64_t width = t.shape()[1];
  return std::vector<int64_t>(all.begin() + r * width, all.begin() + (r + 1) * width);
}

std::vector<int64_t> bytes(const std::string& s) {
  std::vector<int64_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// Rows with the original ids put back where they were masked.
std::vector<int64_t> unmasked(const Batch& b, int64_t r) {
  std::vector<int64_t> in = row(b.inputs, r);
  const std::vector<int64_t> tg = row(b.targets, r);
  for (size_t p = 0; p < in.size(); ++p) {
    if (tg[p] != kIgnore) in[p] = tg[p];
  }
  return in;
}

ByteTokenizer byte_tokenizer(Objective objective, int64_t sentinels = 0) {
  ByteTokenizer t;
  t.set_special_tokens(special_tokens(objective, sentinels));
  return t;
}

class Objectives : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("objectives_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A shard holding the stream prepare writes for `docs`: eot doc0 eot doc1 ... (byte ids).
  std::string stream_shard(const std::string& name, const std::vector<std::string>& docs) const {
    Ids ids;
    for (const std::string& d : docs) {
      ids.push_back(kEot);
      for (unsigned char c : d) ids.push_back(c);
    }
    EXPECT_TRUE(write_shard(path(name), ids).ok());
    return path(name);
  }
  static LoaderOptions options(int64_t seq_len, uint64_t seed = 7, int rank = 0, int world = 1, bool shuffle = true) {
    LoaderOptions o;
    o.seq_len = seq_len;
    o.seed = seed;
    o.rank = rank;
    o.world = world;
    o.shuffle = shuffle;
    o.vocab_size = kStreamVocab;
    return o;
  }
  // Documents of 8 to 60 letters and punctuation, deterministic.
  static std::vector<std::string> many_documents(int n) {
    std::vector<std::string> docs;
    Generator gen(99);
    for (int d = 0; d < n; ++d) {
      std::string s;
      const int len = 8 + static_cast<int>(gen.next_u64() % 53);
      for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('a' + gen.next_u64() % 26));
      s[static_cast<size_t>(len / 3)] = '.';
      s[static_cast<size_t>(len / 3 + 1)] = ' ';
      docs.push_back(s + "\n");
    }
    return docs;
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------
// Shared pieces

TEST(RoundHalfEven, AsPythonAndTensorFlowRound) {
  EXPECT_EQ(round_half_even(0.5), 0);
  EXPECT_EQ(round_half_even(1.5), 2);
  EXPECT_EQ(round_half_even(2.5), 2);
  EXPECT_EQ(round_half_even(3.5), 4);
  EXPECT_EQ(round_half_even(2.4999), 2);
  EXPECT_EQ(round_half_even(85.2), 85);
  EXPECT_EQ(round_half_even(0.0), 0);
}

TEST_F(Objectives, DocumentsAreCutAtEndOfTextAcrossShards) {
  // Shards [eot a b eot eot c d eot] [e f eot g] [h eot]: the empty document between two eot is dropped,
  // and a document runs on from one shard into the next ("ef" after the first shard's last eot, "gh").
  ASSERT_TRUE(write_shard(path("a.bin"), Ids{kEot, 'a', 'b', kEot, kEot, 'c', 'd', kEot}).ok());
  ASSERT_TRUE(write_shard(path("b.bin"), Ids{'e', 'f', kEot, 'g'}).ok());
  ASSERT_TRUE(write_shard(path("c.bin"), Ids{'h', kEot}).ok());
  auto docs = DocumentStream::open({path("a.bin"), path("b.bin"), path("c.bin")}, kStreamVocab, 256, kEot);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->num_documents(), 4);  // "ab", "cd", "ef", "gh" (across the shard boundary)
  EXPECT_EQ(docs->document(0, 100), (Ids{'a', 'b'}));
  EXPECT_EQ(docs->document(1, 100), (Ids{'c', 'd'}));
  EXPECT_EQ(docs->document(2, 1), (Ids{'e'}));
  EXPECT_EQ(docs->document(3, 100), (Ids{'g', 'h'}));
  EXPECT_EQ(docs->text_size(), 8);
  Ids packed(8);
  docs->read_text(0, 8, packed.data());
  EXPECT_EQ(packed, (Ids{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
  Ids middle(3);
  docs->read_text(3, 3, middle.data());
  EXPECT_EQ(middle, (Ids{'d', 'e', 'f'}));
  EXPECT_THROW(docs->read_text(6, 3, middle.data()), std::out_of_range);
}

TEST_F(Objectives, AStreamHoldingAnotherSpecialTokenIsRefused) {
  ASSERT_TRUE(write_shard(path("a.bin"), Ids{kEot, 'a', 257, 'b'}).ok());
  auto docs = DocumentStream::open({path("a.bin")}, kStreamVocab, 256, kEot);
  ASSERT_FALSE(docs.ok());
  EXPECT_EQ(docs.status().message(),
            path("a.bin") + ": token id 257 at position 2 is a special token (the text ids are 0 to 255, end-of-text "
                            "256); the masked_lm and span_corruption objectives read text and insert their own special "
                            "tokens");
}

// ---------------------------------------------------------------------------------------------------
// Masked LM

TEST_F(Objectives, MaskedLmSplitsNearTheMiddleAtASentenceOrLine) {
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  auto s = MaskedLmSource::open({stream_shard("a.bin", {"x y\n"})}, kEot, t, options(16), {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto split = [&](const std::string& text) {
    const std::vector<int64_t> b = bytes(text);
    return s->split_point(Ids(b.begin(), b.end()));
  };
  EXPECT_EQ(split("Hi. Yo\n"), 3);                    // after "." before " "
  EXPECT_EQ(split("ab\ncdefgh\n"), 3);                // after a line; the final "\n" is no boundary
  EXPECT_EQ(split("One. Two. Three. Four.\n"), 9);    // of 4, 9, 16 (m = 23): 9 is nearest 11.5
  EXPECT_EQ(split("abcdefgh"), 4);                    // no boundary: the middle token
  EXPECT_EQ(split("a.\nbcdefghijklmnop"), 9);         // a boundary at 3 is outside [18/4, 3·18/4]
  EXPECT_EQ(split("3.14 is pi"), 5);                  // "." followed by "1" ends no sentence
  EXPECT_EQ(split("ab"), 1);
  EXPECT_THROW(split("a"), std::invalid_argument);
}

// The header's example: "Hi. Yo\n" at seq_len 12 is [CLS] H i . [SEP] ␠ Y o \n [SEP] [PAD] [PAD], one
// text token scored.
TEST_F(Objectives, MaskedLmRowLayoutIsExact) {
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  auto s = MaskedLmSource::open({stream_shard("a.bin", {"Hi. Yo\n"})}, kEot, t, options(12), {});
  ASSERT_TRUE(s.ok()) << s.status();
  for (const Batch& b : {s->next_batch(1), s->eval_batch(0, 1)}) {
    const std::vector<int64_t> original{kCls, 'H', 'i', '.', kSep, ' ', 'Y', 'o', '\n', kSep, kPad, kPad};
    EXPECT_EQ(ints(b.segment_ids), (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0}));
    EXPECT_EQ(ints(b.lengths), std::vector<int64_t>{10});
    EXPECT_FALSE(b.sequence_targets.defined());
    EXPECT_FALSE(b.decoder_inputs.defined());
    const std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets);
    int scored = 0;
    for (size_t p = 0; p < in.size(); ++p) {
      if (tg[p] == kIgnore) {
        EXPECT_EQ(in[p], original[p]) << p;
        continue;
      }
      ++scored;
      EXPECT_EQ(tg[p], original[p]) << p;
      EXPECT_TRUE(in[p] == kMask || in[p] < 256) << in[p];
      EXPECT_TRUE(std::set<size_t>({1, 2, 3, 5, 6, 7, 8}).count(p)) << "scored position " << p;
    }
    EXPECT_EQ(scored, 1);  // round(0.15 · 7) = 1
  }
}

TEST_F(Objectives, MaskedLmShortAndLongDocuments) {
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  // A single token is [CLS] x [SEP]; with next_sentence it has no pair and no label.
  auto one = MaskedLmSource::open({stream_shard("a.bin", {"x", "yz"})}, kEot, t, options(6, 7, 0, 1, false),
                                  {0.15, true});
  ASSERT_TRUE(one.ok()) << one.status();
  Batch b = one->eval_batch(0, 1);
  EXPECT_EQ(unmasked(b, 0), (std::vector<int64_t>{kCls, 'x', kSep, kPad, kPad, kPad}));
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{kIgnore, 'x', kIgnore, kIgnore, kIgnore, kIgnore}));
  EXPECT_EQ(ints(b.lengths), std::vector<int64_t>{3});
  EXPECT_EQ(ints(b.segment_ids), (std::vector<int64_t>(6, 0)));
  EXPECT_EQ(ints(b.sequence_targets), std::vector<int64_t>{kIgnore});
  // A document longer than seq_len − 3 is cut to its first seq_len − 3 tokens, then split: the row is full.
  auto cut = MaskedLmSource::open({stream_shard("b.bin", {"abcdefghijklmnopqrstuvwxyz\n"})}, kEot, t, options(11), {});
  ASSERT_TRUE(cut.ok()) << cut.status();
  b = cut->eval_batch(0, 1);
  std::vector<int64_t> in = ints(b.inputs);
  const std::vector<int64_t> tg = ints(b.targets);
  for (size_t p = 0; p < in.size(); ++p) {
    if (tg[p] != kIgnore) in[p] = tg[p];
  }
  EXPECT_EQ(in, (std::vector<int64_t>{kCls, 'a', 'b', 'c', 'd', kSep, 'e', 'f', 'g', 'h', kSep}));
  EXPECT_EQ(ints(b.lengths), std::vector<int64_t>{11});
}

TEST_F(Objectives, MaskedLmNextSentencePairsFollowOrComeFromAnotherDocument) {
  // Each document of its own letter, so the document a segment came from is plain to see.
  std::vector<std::string> docs;
  for (int d = 0; d < 6; ++d) docs.push_back(std::string(4, static_cast<char>('a' + d)) + ". " + std::string(5, static_cast<char>('a' + d)) + "\n");
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  auto s = MaskedLmSource::open({stream_shard("a.bin", docs)}, kEot, t, options(32), {0.15, true});
  ASSERT_TRUE(s.ok()) << s.status();
  int random_b = 0, rows = 0;
  for (int step = 0; step < 50; ++step) {
    const Batch b = s->next_batch(4);
    const std::vector<int64_t> labels = ints(b.sequence_targets), lengths = ints(b.lengths);
    for (int64_t r = 0; r < 4; ++r, ++rows) {
      const std::vector<int64_t> in = unmasked(b, r), seg = row(b.segment_ids, r);
      // [CLS] aaaa. [SEP] then B: " aaaaa\n" (own) or another letter's " xxxxx\n".
      const char a = static_cast<char>(in[1]);
      EXPECT_EQ(std::vector<int64_t>(in.begin(), in.begin() + 7), (std::vector<int64_t>{kCls, a, a, a, a, '.', kSep}));
      const char bl = static_cast<char>(in[8]);
      EXPECT_EQ(std::vector<int64_t>(in.begin() + 7, in.begin() + 15),
                (std::vector<int64_t>{' ', bl, bl, bl, bl, bl, '\n', kSep}));
      EXPECT_EQ(lengths[r], 15);
      EXPECT_EQ(std::count(seg.begin(), seg.end(), 1), 8);
      ASSERT_TRUE(labels[r] == 0 || labels[r] == 1);
      EXPECT_EQ(labels[r] == 1, bl != a);
      random_b += labels[r] == 1;
    }
  }
  EXPECT_NEAR(static_cast<double>(random_b) / rows, 0.5, 0.08);
}

TEST_F(Objectives, MaskedLmRatesAndSpecialTokensNeverMasked) {
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  auto s = MaskedLmSource::open({stream_shard("a.bin", many_documents(300))}, kEot, t, options(48), {0.15, true});
  ASSERT_TRUE(s.ok()) << s.status();
  int64_t text = 0, scored = 0, as_mask = 0, kept = 0, random = 0;
  for (int step = 0; step < 150; ++step) {
    const Batch b = s->next_batch(8);
    const std::vector<int64_t> lengths = ints(b.lengths);
    for (int64_t r = 0; r < 8; ++r) {
      const std::vector<int64_t> in = row(b.inputs, r), tg = row(b.targets, r), original = unmasked(b, r);
      int64_t row_text = 0, row_scored = 0;
      for (int64_t p = 0; p < 48; ++p) {
        const bool special = original[p] >= 256;
        if (p >= lengths[r]) {  // padding: [PAD], never scored
          EXPECT_EQ(in[p], kPad);
          EXPECT_EQ(tg[p], kIgnore);
          continue;
        }
        if (special) {  // [CLS] and [SEP] stay and are never scored
          EXPECT_TRUE(in[p] == kCls || in[p] == kSep) << in[p];
          EXPECT_EQ(tg[p], kIgnore);
          continue;
        }
        ++row_text;
        if (tg[p] == kIgnore) continue;
        ++row_scored;
        if (in[p] == kMask) {
          ++as_mask;
        } else if (in[p] == tg[p]) {
          ++kept;
        } else {
          ++random;
          EXPECT_LT(in[p], 256);  // a random text token, never a special one
        }
      }
      EXPECT_EQ(row_scored, std::max<int64_t>(1, round_half_even(0.15 * static_cast<double>(row_text))));
      text += row_text;
      scored += row_scored;
    }
  }
  EXPECT_NEAR(static_cast<double>(scored) / static_cast<double>(text), 0.15, 0.01);
  const double n = static_cast<double>(scored);
  EXPECT_NEAR(as_mask / n, 0.8, 0.025);
  // A random token equals the original 1 time in 256, counted as kept.
  EXPECT_NEAR(kept / n, 0.1 + 0.1 / 256, 0.02);
  EXPECT_NEAR(random / n, 0.1 - 0.1 / 256, 0.02);
}

// ---------------------------------------------------------------------------------------------------
// Both sources: restore, the evaluation walk, ranks

using SourceMaker = std::function<std::unique_ptr<BatchSource>(const std::string& shard, const LoaderOptions& o)>;

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_EQ(ints(a.inputs), ints(b.inputs));
  for (auto field : {&Batch::targets, &Batch::lengths, &Batch::segment_ids, &Batch::sequence_targets,
                     &Batch::decoder_inputs, &Batch::decoder_targets, &Batch::decoder_lengths}) {
    ASSERT_EQ((a.*field).defined(), (b.*field).defined());
    if ((a.*field).defined()) {
      EXPECT_EQ(ints(a.*field), ints(b.*field));
    }
  }
}

// Restore continues exactly (across epochs too); eval batches are fixed and move nothing; rank r of P
// draws exactly the rows one process draws at entries r, r+P, ...
void check_source_contract(const SourceMaker& make, const std::string& shard, int64_t seq_len) {
  LoaderOptions o;
  o.seq_len = seq_len;
  o.seed = 11;
  o.vocab_size = kStreamVocab;
  std::unique_ptr<BatchSource> a = make(shard, o), b = make(shard, o);
  for (int i = 0; i < 5; ++i) a->next_batch(3);
  const LoaderState at = a->state();
  std::vector<Batch> ahead;
  for (int i = 0; i < 30; ++i) ahead.push_back(a->next_batch(3));  // past several epochs
  ASSERT_TRUE(b->restore(at).ok());
  for (const Batch& x : ahead) expect_same(x, b->next_batch(3));
  EXPECT_EQ(a->state(), b->state());
  EXPECT_FALSE(b->restore({0, 1 << 30}).ok());

  const LoaderState before = a->state();
  const Batch e1 = a->eval_batch(2, 4), e2 = make(shard, o)->eval_batch(2, 4);
  expect_same(e1, e2);
  expect_same(e1, a->eval_batch(2, 4));
  EXPECT_EQ(a->state(), before);
  // Row j of the walk is the same in any batch size: batch 2 of 4 holds rows 8..11, batch 4 of 2 rows 8, 9.
  const Batch half = a->eval_batch(4, 2);
  EXPECT_EQ(row(e1.inputs, 0), row(half.inputs, 0));
  EXPECT_EQ(row(e1.inputs, 1), row(half.inputs, 1));
  EXPECT_THROW(a->eval_batch(-1, 2), std::invalid_argument);
  EXPECT_THROW(a->next_batch(0), std::invalid_argument);

  // Two ranks: rank r's k-th row is the single process's row 2k + r, and the single process restored
  // at the global position (DataParallel::to_global: 2k) continues with rank 0's next row.
  std::unique_ptr<BatchSource> one = make(shard, o);
  const Batch all = one->next_batch(8);
  for (int r = 0; r < 2; ++r) {
    LoaderOptions ro = o;
    ro.rank = r;
    ro.world = 2;
    std::unique_ptr<BatchSource> rank = make(shard, ro);
    const Batch mine = rank->next_batch(4);
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(row(mine.inputs, k), row(all.inputs, 2 * k + r)) << "rank " << r;
    if (r == 0) {
      std::unique_ptr<BatchSource> resumed = make(shard, o);
      ASSERT_TRUE(resumed->restore({rank->state().epoch, rank->state().position * 2}).ok());
      EXPECT_EQ(row(resumed->next_batch(1).inputs, 0), row(rank->next_batch(1).inputs, 0));
    }
  }
}

TEST_F(Objectives, MaskedLmRestoresEvaluatesAndSharesAmongRanks) {
  const std::string shard = stream_shard("a.bin", many_documents(40));
  const ByteTokenizer t = byte_tokenizer(Objective::masked_lm);
  check_source_contract(
      [&](const std::string& p, const LoaderOptions& o) {
        auto s = MaskedLmSource::open({p}, kEot, t, o, {0.15, true});
        EXPECT_TRUE(s.ok()) << s.status();
        return std::unique_ptr<BatchSource>(new MaskedLmSource(*std::move(s)));
      },
      shard, 24);
}

TEST_F(Objectives, MaskedLmErrorsSayWhatIsWrong) {
  const std::string one_doc = stream_shard("a.bin", {"Hello there.\n"});
  const ByteTokenizer mlm = byte_tokenizer(Objective::masked_lm);
  auto error = [&](const Tokenizer& t, const LoaderOptions& o, const MaskedLmConfig& c) {
    auto s = MaskedLmSource::open({one_doc}, kEot, t, o, c);
    return s.ok() ? std::string("opened") : std::string(s.status().message());
  };
  EXPECT_EQ(error(ByteTokenizer(), options(16), {}), "masked_lm rows need the masked_lm vocabulary, not the lm one");
  EXPECT_EQ(error(mlm, options(4), {}), "masked_lm: seq_len 4 is below 5 ([CLS] A [SEP] B [SEP] with a token each)");
  EXPECT_EQ(error(mlm, options(16), {0, false}), "masked_lm: mask_fraction 0 must be in (0, 1]");
  EXPECT_EQ(error(mlm, options(16), {0.15, true}),
            one_doc + ": 1 document(s), fewer than the 2 that next_sentence needs (a random B comes from another "
                      "document)");
  EXPECT_EQ(error(mlm, options(16, 7, 1, 2), {}), one_doc + ": 1 document(s), fewer than the 2 that 2 ranks need (one each)");
  EXPECT_EQ(error(mlm, options(16), {1.0, false}), "opened");
}

// ---------------------------------------------------------------------------------------------------
// Span corruption

TEST(SpanCorruptionLengths, T5sLengthsAndTheWorkedExample) {
  // T5 (random_spans_helper): inputs 512, density 0.15, mean 3 -> 568 raw tokens, targets 114.
  auto t5 = span_corruption_lengths(512, {0.15, 3.0});
  ASSERT_TRUE(t5.ok()) << t5.status();
  EXPECT_EQ(t5->raw, 568);
  EXPECT_EQ(t5->noise, 85);
  EXPECT_EQ(t5->spans, 28);
  EXPECT_EQ(t5->inputs, 512);
  EXPECT_EQ(t5->targets, 114);
  auto small = span_corruption_lengths(9, {0.3, 2.0});  // span_corruption.h's example
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->raw, 9);
  EXPECT_EQ(small->noise, 3);
  EXPECT_EQ(small->spans, 2);
  EXPECT_EQ(small->inputs, 9);
  EXPECT_EQ(small->targets, 6);
  auto least = span_corruption_lengths(3, {0.15, 3.0});
  ASSERT_TRUE(least.ok());
  EXPECT_EQ(least->raw, 2);
  EXPECT_EQ(least->inputs, 3);
  EXPECT_EQ(span_corruption_lengths(2, {0.15, 3.0}).status().message(),
            "span_corruption: seq_len 2 is below 3 (a kept token, a sentinel and [EOS])");
  EXPECT_FALSE(span_corruption_lengths(64, {1.0, 3.0}).ok());
  EXPECT_FALSE(span_corruption_lengths(64, {0.15, 0.5}).ok());
}

// L is the largest raw length whose input fits: inputs(L) ≤ T < inputs(L + 1). In T5's settings (density
// up to 0.4, or 0.5 with spans of 1.5 and more) the input fills T exactly; denser noise may leave it one short.
TEST(SpanCorruptionLengths, TheLargestRawLengthThatFitsFillsTheInput) {
  for (double density : {0.05, 0.15, 0.3, 0.4, 0.5, 0.7, 0.9}) {
    for (double mean : {1.0, 1.5, 2.0, 3.0, 5.0}) {
      const bool t5 = density <= 0.4 || (density <= 0.5 && mean >= 1.5);
      for (int64_t t = 3; t <= 1200; ++t) {
        const SpanCorruptionConfig c{density, mean};
        const SpanLengths l = *span_corruption_lengths(t, c);
        ASSERT_LE(l.inputs, t);
        ASSERT_GT(span_lengths(l.raw + 1, c).inputs, t) << density << " " << mean << " " << t;
        ASSERT_GE(l.inputs, t5 ? t : t - 1) << "density " << density << ", mean " << mean << ", seq_len " << t;
        ASSERT_EQ(l.targets, l.noise + l.spans + 1);
        ASSERT_LE(l.spans, std::min(l.noise, l.raw - l.noise));
      }
    }
  }
}

// The raw tokens a span-corruption row stands for: the inputs with each sentinel replaced by the noise
// that follows it in the decoder's targets.
std::vector<int64_t> uncorrupted(const std::vector<int64_t>& in, const std::vector<int64_t>& dec_tg) {
  std::vector<int64_t> raw;
  for (int64_t id : in) {
    if (id == kEos) break;
    if (id < kSentinel0) {
      raw.push_back(id);
      continue;
    }
    auto it = std::find(dec_tg.begin(), dec_tg.end(), id);
    EXPECT_NE(it, dec_tg.end()) << "sentinel " << id << " missing from the targets";
    for (++it; it != dec_tg.end() && *it < 256; ++it) raw.push_back(*it);
  }
  return raw;
}

TEST_F(Objectives, SpanCorruptionRowLayoutIsExact) {
  // Two documents packed without a separator: the first row's 9 raw tokens are "abcdefghi".
  const ByteTokenizer t = byte_tokenizer(Objective::span_corruption, 2);
  auto s = SpanCorruptionSource::open({stream_shard("a.bin", {"abcd", "efghijklmnopqr"})}, kEot, t,
                                      options(9, 7, 0, 1, false), {0.3, 2.0});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_rows(), 2);
  for (int64_t index = 0; index < 2; ++index) {
    const Batch b = s->eval_batch(index, 1);
    const std::vector<int64_t> in = ints(b.inputs), dec_in = ints(b.decoder_inputs), dec_tg = ints(b.decoder_targets);
    EXPECT_FALSE(b.targets.defined());
    EXPECT_EQ(ints(b.lengths), std::vector<int64_t>{9});
    EXPECT_EQ(ints(b.decoder_lengths), std::vector<int64_t>{6});
    ASSERT_EQ(in.size(), 9u);
    ASSERT_EQ(dec_tg.size(), 6u);
    EXPECT_EQ(uncorrupted(in, dec_tg), bytes(index == 0 ? "abcdefghi" : "jklmnopqr"));
    // Non-noise first, then alternating: a text token opens the input; two sentinels, in order; [EOS] last.
    EXPECT_LT(in[0], 256);
    std::vector<int64_t> sentinels;
    for (int64_t id : in) {
      if (id >= kSentinel0) sentinels.push_back(id);
    }
    EXPECT_EQ(sentinels, (std::vector<int64_t>{kSentinel0, kSentinel0 + 1}));
    EXPECT_EQ(in.back(), kEos);
    EXPECT_EQ(dec_tg.front(), kSentinel0);
    EXPECT_EQ(std::count(dec_tg.begin(), dec_tg.end(), kSentinel0 + 1), 1);
    EXPECT_EQ(dec_tg.back(), kEos);
    // The decoder reads [PAD], then its targets shifted right by one.
    std::vector<int64_t> shifted{kPad};
    shifted.insert(shifted.end(), dec_tg.begin(), dec_tg.end() - 1);
    EXPECT_EQ(dec_in, shifted);
  }
}

TEST_F(Objectives, SpanCorruptionNoiseRateSentinelsInOrderAndPadding) {
  const SpanCorruptionConfig c{0.15, 3.0};
  const SpanLengths l = *span_corruption_lengths(64, c);
  const ByteTokenizer t = byte_tokenizer(Objective::span_corruption, l.spans);
  auto s = SpanCorruptionSource::open({stream_shard("a.bin", many_documents(300))}, kEot, t, options(64), c);
  ASSERT_TRUE(s.ok()) << s.status();
  // Every row holds n noise tokens in s spans; the spans' lengths are drawn, so each span's mean length
  // over many rows is n / s (and each kept span's (L − n) / s): every way to cut them is equally likely.
  EXPECT_EQ(l.raw, 70);
  EXPECT_EQ(l.noise, 10);  // round(10.5): halves go to the even number, as T5's
  EXPECT_EQ(l.spans, 3);
  std::vector<double> noise_length(static_cast<size_t>(l.spans), 0), kept_length(static_cast<size_t>(l.spans), 0);
  int64_t rows = 0, first_kept = 0;
  for (int step = 0; step < 100; ++step) {
    const Batch b = s->next_batch(8);
    for (int64_t r = 0; r < 8; ++r, ++rows) {
      const std::vector<int64_t> in = row(b.inputs, r), dec_tg = row(b.decoder_targets, r);
      ASSERT_EQ(static_cast<int64_t>(uncorrupted(in, dec_tg).size()), l.raw);
      EXPECT_EQ(ints(b.lengths)[r], 64);
      int32_t expected = kSentinel0;
      int64_t run = 0, noise = 0;
      for (size_t p = 0; p < dec_tg.size(); ++p) {
        if (dec_tg[p] >= kSentinel0 || dec_tg[p] == kEos) {
          if (p > 0) {
            EXPECT_GT(run, 0);  // every noise span non-empty
            noise_length[static_cast<size_t>(expected - kSentinel0 - 1)] += static_cast<double>(run);
          }
          if (dec_tg[p] == kEos) break;
          EXPECT_EQ(dec_tg[p], expected++);  // sentinels in order
          run = 0;
        } else {
          EXPECT_LT(dec_tg[p], 256);  // noise is text, never a special token
          ++run;
          ++noise;
        }
      }
      EXPECT_EQ(expected, kSentinel0 + l.spans);
      EXPECT_EQ(noise, l.noise);
      int64_t span = 0;
      run = 0;
      for (int64_t id : in) {
        if (id == kEos) {
          EXPECT_EQ(run, 0);  // the last span is noise: the input ends with its sentinel, then [EOS]
          break;
        }
        if (id < 256) {
          ++run;
          continue;
        }
        EXPECT_GT(run, 0);  // kept spans are non-empty too: never two sentinels in a row
        kept_length[static_cast<size_t>(span++)] += static_cast<double>(run);
        run = 0;
      }
      first_kept += in[0] < 256;
    }
  }
  EXPECT_EQ(first_kept, rows);  // a row opens with kept text, as T5's
  for (int64_t i = 0; i < l.spans; ++i) {
    EXPECT_NEAR(noise_length[i] / static_cast<double>(rows), 10.0 / 3, 0.25) << "noise span " << i;
    EXPECT_NEAR(kept_length[i] / static_cast<double>(rows), 60.0 / 3, 1.5) << "kept span " << i;
  }

  // Where the input cannot fill seq_len exactly (density 0.9: spans capped by the kept tokens), the rest
  // is [PAD] past lengths.
  const SpanCorruptionConfig dense{0.9, 1.0};
  int64_t short_len = 0;
  for (int64_t len = 3; len < 40 && short_len == 0; ++len) {
    if (span_corruption_lengths(len, dense)->inputs < len) short_len = len;
  }
  ASSERT_GT(short_len, 0);
  const SpanLengths dl = *span_corruption_lengths(short_len, dense);
  const ByteTokenizer td = byte_tokenizer(Objective::span_corruption, dl.spans);
  auto d = SpanCorruptionSource::open({stream_shard("b.bin", many_documents(50))}, kEot, td, options(short_len), dense);
  ASSERT_TRUE(d.ok()) << d.status();
  const Batch b = d->eval_batch(0, 2);
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<int64_t> in = row(b.inputs, r);
    EXPECT_EQ(ints(b.lengths)[r], dl.inputs);
    EXPECT_EQ(in[dl.inputs - 1], kEos);
    for (int64_t p = dl.inputs; p < short_len; ++p) EXPECT_EQ(in[p], kPad);
  }
}

TEST_F(Objectives, SpanCorruptionRestoresEvaluatesAndSharesAmongRanks) {
  const std::string shard = stream_shard("a.bin", many_documents(30));
  const SpanCorruptionConfig c{0.3, 2.0};
  const ByteTokenizer t = byte_tokenizer(Objective::span_corruption, span_corruption_lengths(20, c)->spans);
  check_source_contract(
      [&](const std::string& p, const LoaderOptions& o) {
        auto s = SpanCorruptionSource::open({p}, kEot, t, o, c);
        EXPECT_TRUE(s.ok()) << s.status();
        return std::unique_ptr<BatchSource>(new SpanCorruptionSource(*std::move(s)));
      },
      shard, 20);
}

TEST_F(Objectives, SpanCorruptionErrorsSayWhatIsWrong) {
  const std::string shard = stream_shard("a.bin", {"abcdefghijklmnopqrstuvwxyz"});
  auto error = [&](const Tokenizer& t, const LoaderOptions& o, const SpanCorruptionConfig& c) {
    auto s = SpanCorruptionSource::open({shard}, kEot, t, o, c);
    return s.ok() ? std::string("opened") : std::string(s.status().message());
  };
  const ByteTokenizer one = byte_tokenizer(Objective::span_corruption, 1);
  EXPECT_EQ(error(byte_tokenizer(Objective::masked_lm), options(9), {0.3, 2.0}),
            "span_corruption rows need the span_corruption vocabulary, not the masked_lm one");
  EXPECT_EQ(error(one, options(9), {0.3, 2.0}),
            "span_corruption: rows of seq_len 9 hold 2 noise spans, more than the vocabulary's 1 sentinels");
  EXPECT_EQ(error(one, options(2), {0.3, 2.0}), "span_corruption: seq_len 2 is below 3 (a kept token, a sentinel and [EOS])");
  EXPECT_EQ(error(one, options(8), {0.3, 2.0}), "opened");  // 8 raw tokens: 2 noise in 1 span
  EXPECT_EQ(error(one, options(8, 7, 3, 4), {0.3, 2.0}),
            shard + ": 26 text tokens make 3 row(s) of 8 raw tokens, fewer than the 4 rank(s)");
}

// ---------------------------------------------------------------------------------------------------
// The trainer's wiring: a recipe's data.objective through open_data

class ObjectiveRecipes : public Objectives {
 protected:
  Recipe recipe(const std::string& objective, const std::vector<std::string>& more = {}) const {
    std::ofstream(path("corpus.txt")) << [] {
      std::string text;
      for (const std::string& d : many_documents(120)) text += d + "\n";
      return text;
    }();
    // The model kind each objective trains (the recipe ties them).
    const std::string model = objective == "masked_lm"         ? "[model]\narch = \"encoder\"\nsegments = 2\n"
                              : objective == "span_corruption" ? "[model]\narch = \"encoder_decoder\"\n"
                                                               : "";
    const std::string toml = model + "[data]\npath = \"" + path("corpus.txt") + "\"\nformat = \"text\"\nval_fraction = 0.25\n" +
                             "cache_dir = \"" + path("cache") + "\"\nobjective = \"" + objective + "\"\n" +
                             "[train]\nseq_len = 32\nbatch_size = 4\n[log]\neval_batches = 3\n";
    std::ofstream(path("r.toml")) << toml;
    absl::StatusOr<Recipe> r = load_recipe(path("r.toml"), more);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
};

TEST_F(ObjectiveRecipes, OpenDataMakesTheObjectivesRowsAndVocabulary) {
  {
    const Recipe r = recipe("masked_lm", {"data.next_sentence=true", "eval.seq_len=16,32"});
    const cli::Data d = cli::open_data(r);
    EXPECT_EQ(d.vocab_size, 260);
    EXPECT_EQ(d.tokenizer->vocab_size(), 260);
    EXPECT_EQ(d.tokenizer->token_text(259), "[MASK]");
    EXPECT_TRUE(d.sample_prompt.empty());  // nothing to sample
    EXPECT_EQ(d.eval_batches, 3);
    const Batch b = d.train->next_batch(4);
    EXPECT_EQ(b.inputs.shape(), (Shape{4, 32}));
    EXPECT_TRUE(b.segment_ids.defined() && b.sequence_targets.defined() && b.lengths.defined());
    ASSERT_EQ(d.eval_lengths.size(), 2u);
    EXPECT_EQ(d.eval_lengths[0].val->eval_batch(0, 2).inputs.shape(), (Shape{2, 16}));
    EXPECT_EQ(d.eval_lengths[1].val, nullptr);  // train.seq_len's own evaluation
    EXPECT_EQ(d.description.rfind("masked_lm rows from ", 0), 0u) << d.description;
    // The recipe a checkpoint holds (resolved) rebuilds the same tokenizer for `seqlab sample`.
    auto again = load_recipe_text(resolved_recipe_toml(r), "again.toml");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(objective_special_tokens(*again), special_tokens(Objective::masked_lm));
  }
  {
    const Recipe r = recipe("span_corruption");
    const cli::Data d = cli::open_data(r);
    const SpanLengths l = *span_corruption_lengths(32, span_corruption_config(r));
    EXPECT_EQ(d.vocab_size, 256 + 2 + l.spans);
    EXPECT_EQ(objective_special_tokens(r).sentinels, l.spans);
    const Batch b = d.val->eval_batch(0, 4);
    EXPECT_EQ(b.inputs.shape(), (Shape{4, 32}));
    EXPECT_EQ(b.decoder_targets.shape(), (Shape{4, l.targets}));
  }
  {
    const Recipe r = recipe("lm");  // unchanged: the lm vocabulary, windows of the stream, a sample prompt
    const cli::Data d = cli::open_data(r);
    EXPECT_EQ(d.vocab_size, 275);
    EXPECT_EQ(d.sample_prompt, (std::vector<int32_t>{256}));
    EXPECT_FALSE(d.train->next_batch(2).lengths.defined());
  }
}

TEST_F(ObjectiveRecipes, LlmcShardsCannotTakeTheObjectivesTokens) {
  const std::string folder = path("llmc");
  fs::create_directories(folder);
  ASSERT_TRUE(write_shard(folder + "/x_train_000000.bin", Ids(100, 7)).ok());
  ASSERT_TRUE(write_shard(folder + "/x_val_000000.bin", Ids(100, 7)).ok());
  Recipe r = recipe("masked_lm", {"data.source=shards", "data.path=" + folder});
  try {
    cli::open_data(r);
    FAIL() << "opened llm.c's shards for masked_lm";
  } catch (const cli::UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              folder + ": data.objective = \"masked_lm\" adds its special tokens to a byte or BPE vocabulary; llm.c's "
                       "shards come with the ids tokenizer: prepare the text with seqlab (data.source = \"text\", or "
                       "`seqlab prepare`)");
  }
}

}  // namespace
}  // namespace seqlab
