// llm.c's tokenizer file (gpt2_tokenizer.bin; train/data/tokenizer.h, LlmcTokenizer), as
// `data.tokenizer_path` names one for a folder of llm.c shards: the input is the file. A file that loads
// decodes every id of its vocabulary (and one past it) to that token's bytes, and a prompt of ids,
// here the input's first bytes read as text, is parsed or refused with an error.
#include "fuzz_util.h"
#include "train/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string path = fuzz::write_scratch("gpt2_tokenizer.bin", input);
  absl::StatusOr<LlmcTokenizer> loaded = LlmcTokenizer::load(path);
  absl::StatusOr<LlmcTokenizer> parsed = LlmcTokenizer::parse(input, path);
  FUZZ_CHECK(loaded.ok() == parsed.ok(), "load and parse disagree: " + loaded.status().ToString() + " / " +
                                             parsed.status().ToString());
  if (!loaded.ok()) return 0;
  const LlmcTokenizer& t = *loaded;
  FUZZ_CHECK(t.vocab_size() > 0 && t.eot() >= 0 && t.eot() < t.vocab_size(), "eot " + std::to_string(t.eot()));
  std::vector<int32_t> ids;
  std::string joined;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    ids.push_back(id);
    joined += t.token_text(id);
  }
  FUZZ_CHECK(t.decode(ids) == joined, "decode differs from the tokens' texts one after another");
  FUZZ_CHECK(!t.token_text(t.vocab_size()).empty(), "an id past the vocabulary decodes to nothing");
  absl::StatusOr<std::vector<int32_t>> prompt = t.encode_prompt(input.substr(0, 64));
  if (prompt.ok()) {
    for (int32_t id : *prompt) FUZZ_CHECK(id >= 0 && id < t.vocab_size(), "prompt id " + std::to_string(id));
  }
  return 0;
}
