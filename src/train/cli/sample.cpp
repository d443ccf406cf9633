// `seqlab sample RUN`: text from a run's newest checkpoint (or a chosen one), decoded with the KV cache.
#include <absl/strings/str_format.h>

#include <algorithm>
#include <iostream>

#include "train/cli/commands.h"
#include "train/cli/data.h"
#include "train/cli/util.h"
#include "train/data/prepare.h"
#include "train/checkpoint/checkpoint.h"
#include "train/loop/sampling.h"
#include "train/recipe/configs.h"
#include "train/data/tokenizer.h"

namespace seqlab::cli {
namespace {

constexpr char kSampleUsage[] =
    "usage: seqlab sample RUN [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                         [--checkpoint FILE]\n"
    "\n"
    "Continues TEXT with the model of the run directory RUN (its newest checkpoint and the recipe it holds) and\n"
    "prints the prompt and the continuation. The prompt follows an end-of-text token, as every document\n"
    "of the training data does; special tokens other than end-of-text are never drawn.\n"
    "An encoder (BERT, data.objective = \"masked_lm\") fills every [MASK] of TEXT in one pass instead:\n"
    "  seqlab sample runs/bert_small --prompt \"The [MASK] sat\"\n"
    "An encoder-decoder (T5, \"span_corruption\") reads TEXT once and writes the span of each sentinel, printing\n"
    "TEXT with the spans in place, then the decoder's output:\n"
    "  seqlab sample runs/t5_small --prompt \"The <extra_id_0> sat on the <extra_id_1>\"\n"
    "\n"
    "  --prompt TEXT      text to continue (default: none, a document from its start); for llm.c's shards,\n"
    "                     whose tokenizer file holds no merges, token ids (\"464 2068\")\n"
    "  --tokens N         tokens to generate (default 256)\n"
    "  --temperature T    softmax temperature; 0: greedy, always the most likely token (default 0.8)\n"
    "  --top-k K          draw only among the K most likely tokens; 0: no limit (default 0)\n"
    "  --top-p P          draw only among the most likely tokens whose probabilities sum to P, in (0, 1]\n"
    "                     (default 1: no limit)\n"
    "  --seed S           the random draws (default 0): the same seed gives the same text\n"
    "  --checkpoint FILE  a checkpoint other than RUN's newest\n";

// An encoder's or an encoder-decoder's sample. BERT (masked_lm): the row [CLS] prompt [SEP] with every
// [MASK] filled in one pass, printed without [CLS] and [SEP]. T5 (span_corruption): the encoder reads
// prompt [EOS] once; the decoder, from [PAD], writes each sentinel's span until [EOS]; printed as the
// prompt with every sentinel replaced by its span, then the decoder's output as it came.
void sample_encoder_run(const Recipe& recipe, const Checkpoint& checkpoint, const TokenDecoder& decoder,
                        LanguageModel& model, const std::string& prompt_text, SamplingOptions o, Generator& gen) {
  const auto* tokenizer = dynamic_cast<const Tokenizer*>(&decoder);
  if (tokenizer == nullptr) throw UserError("the run's tokenizer cannot encode a prompt");
  const std::vector<int32_t> text = value_or_throw(tokenizer->encode_prompt(prompt_text));
  try {
    if (recipe.model.arch == "encoder") {
      std::vector<int32_t> row = {tokenizer->cls()};
      row.insert(row.end(), text.begin(), text.end());
      row.push_back(tokenizer->sep());
      if (std::count(row.begin(), row.end(), tokenizer->mask()) == 0) {
        throw UserError("an encoder fills masks: the prompt holds no [MASK] (e.g. --prompt \"The [MASK] sat\")");
      }
      if (static_cast<int64_t>(row.size()) > model.max_context()) {
        throw UserError(absl::StrFormat("the prompt's %d tokens with [CLS] and [SEP] exceed the model's %d positions",
                                        row.size(), model.max_context()));
      }
      o.suppressed = non_text_ids(*tokenizer, model.vocab_size());  // a mask is filled with text
      const std::vector<int32_t> filled = fill_masks(model, row, tokenizer->mask(), {}, o, gen);
      std::cout << tokenizer->decode(std::vector<int32_t>(filled.begin() + 1, filled.end() - 1)) << "\n";
      return;
    }
    std::vector<int32_t> source = text;
    source.push_back(tokenizer->eos());
    if (static_cast<int64_t>(source.size()) > model.max_context()) {
      throw UserError(absl::StrFormat("the prompt's %d tokens with [EOS] exceed the model's %d positions", source.size(),
                                      model.max_context()));
    }
    // The decoder writes text, sentinels and [EOS]; never [PAD] (its start token) or ids past the vocabulary.
    o.suppressed = {tokenizer->pad()};
    for (int64_t id = tokenizer->vocab_size(); id < model.vocab_size(); ++id) o.suppressed.push_back(static_cast<int32_t>(id));
    o.stop_token = tokenizer->eos();
    const std::vector<int32_t> out = generate_from_source(model, source, tokenizer->pad(), o, gen);
    // The prompt with each sentinel replaced by the span the decoder wrote after it.
    std::vector<int32_t> filled;
    for (const int32_t id : text) {
      bool replaced = false;
      for (int i = 0; i < tokenizer->num_sentinels() && !replaced; ++i) {
        if (id != tokenizer->sentinel(i)) continue;
        auto at = std::find(out.begin(), out.end(), id);
        if (at == out.end()) break;
        for (++at; at != out.end() && *at != tokenizer->eos() && !tokenizer->is_special(*at); ++at) filled.push_back(*at);
        replaced = true;
      }
      if (!replaced) filled.push_back(id);
    }
    std::cout << tokenizer->decode(filled) << "\n" << "(decoder: " << tokenizer->decode(out) << ")\n";
  } catch (const NonFiniteLogits& e) {
    throw UserError(checkpoint.file + ": " + e.what());
  }
}

void sample(const std::vector<std::string>& args) {
  Flags f(args, "sample", {"--prompt", "--tokens", "--temperature", "--top-k", "--top-p", "--seed", "--checkpoint"},
          {"--help", "-h"}, {}, 1);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kSampleUsage;
    return;
  }
  if (f.positional().empty()) throw UserError("expected the run directory: seqlab sample RUN (see seqlab sample --help)");
  const std::string run = f.positional()[0];
  SamplingOptions o;
  o.tokens = f.number<int64_t>("--tokens", 256, 1);
  o.temperature = f.number<double>("--temperature", 0.8);
  o.top_k = f.number<int64_t>("--top-k", 0, 0);
  o.top_p = f.number<double>("--top-p", 1.0);
  if (o.temperature < 0) throw UserError("--temperature must be ≥ 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw UserError("--top-p must be in (0, 1]");
  Generator gen(f.number<uint64_t>("--seed", 0));

  // The recipe the checkpoint holds, checked against RUN/recipe.toml.
  RunCheckpoint opened = open_run_checkpoint(run, f.get("--checkpoint"), {}, true);
  const Recipe& recipe = opened.recipe;
  const Checkpoint& checkpoint = opened.checkpoint;
  if (!run_has_text(recipe)) {
    throw UserError("the run trains on the synthetic task " + recipe.data.source + ", which has no text to sample");
  }
  std::unique_ptr<TokenDecoder> tokenizer = run_tokenizer(recipe);
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);
  if (recipe.model.arch != "decoder") {
    sample_encoder_run(recipe, checkpoint, *tokenizer, *model, f.get("--prompt"), o, gen);
    return;
  }
  const std::vector<int32_t> prompt = value_or_throw(sample_prompt_ids(*tokenizer, f.get("--prompt")));
  o.suppressed = non_text_ids(*tokenizer, model->vocab_size());

  std::vector<int32_t> generated;
  try {
    generated = generate(*model, prompt, o, gen);
  } catch (const NonFiniteLogits& e) {
    throw UserError(checkpoint.file + ": " + e.what());
  }
  std::cout << decode_sample(*tokenizer, prompt, generated) << "\n";
}

}  // namespace

int sample_command(const std::vector<std::string>& args) { return run_guarded("sample", [&] { sample(args); }); }

}  // namespace seqlab::cli
