// Tokenizer files (train/data/tokenizer.h), as `data.tokenizer = "bpe"` loads them: the input is a BPE
// merges file, optionally followed by a line "--- text ---" and a text. The text (else the file's own
// bytes) is encoded with the loaded merges, and with merges trained on it, and must decode back to
// itself through regular ids only; as a prompt of the masked_lm and span_corruption vocabularies (whose
// special tokens' texts become their ids) it must decode back to itself too.
#include "fuzz_util.h"
#include "train/data/tokenizer.h"

namespace {

void check_round_trip(const seqlab::Tokenizer& tokenizer, absl::string_view text) {
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer.eot(), "encode produced id " + std::to_string(id) + " outside the merges");
  }
  FUZZ_CHECK(tokenizer.decode(ids) == text, "decode(encode(text)) differs from the text");
}

// A prompt's special-token texts become their ids, and every id decodes to its text: the round trip holds
// whatever the text holds, "[MASK]" and "<extra_id_0>" included.
void check_prompt_round_trip(seqlab::Tokenizer& tokenizer, absl::string_view text) {
  using namespace seqlab;
  for (const SpecialTokens& table : {special_tokens(Objective::masked_lm), special_tokens(Objective::span_corruption, 3)}) {
    tokenizer.set_special_tokens(table);
    const absl::StatusOr<std::vector<int32_t>> ids = tokenizer.encode_prompt(text);
    FUZZ_CHECK(ids.ok(), ids.status().ToString());
    for (int32_t id : *ids) {
      FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size(), "encode_prompt produced id " + std::to_string(id));
    }
    FUZZ_CHECK(tokenizer.decode(*ids) == text, "decode(encode_prompt(text)) differs from the text");
  }
  tokenizer.set_special_tokens(special_tokens(Objective::lm));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<absl::string_view> parts = fuzz::split_parts(input, "\n--- text ---\n");
  const absl::string_view text = parts.size() > 1 ? parts[1] : input;

  const std::string path = fuzz::write_scratch("merges.txt", parts[0]);
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = make_tokenizer("bpe", path);
  if (loaded.ok()) {
    check_round_trip(**loaded, text);
    // What loads saves to a file that loads to the same merges.
    const auto& bpe = static_cast<const BpeTokenizer&>(**loaded);
    const std::string copy = (fuzz::scratch_dir() / "copy.txt").string();
    absl::Status saved = bpe.save(copy);
    FUZZ_CHECK(saved.ok(), saved.ToString());
    absl::StatusOr<BpeTokenizer> back = BpeTokenizer::load(copy);
    FUZZ_CHECK(back.ok() && back->merges() == bpe.merges(), "the saved merges load differently");
  }
  // Training on the text's paragraphs (what `seqlab data` does with a corpus), a small vocabulary.
  std::vector<std::string> documents;
  for (absl::string_view doc : fuzz::split_parts(text, "\n\n")) documents.emplace_back(doc);
  absl::StatusOr<BpeTokenizer> trained = BpeTokenizer::train(documents, 256 + kNumSpecialTokens + 48);
  FUZZ_CHECK(trained.ok(), trained.status().ToString());
  check_round_trip(*trained, text);
  check_prompt_round_trip(*trained, text);
  return 0;
}
