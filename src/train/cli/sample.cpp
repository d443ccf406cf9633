// `seqlab sample RUN`: text from a run's newest checkpoint (or a chosen one), decoded with the KV cache.
#include <absl/strings/str_format.h>

#include <iostream>

#include "train/cli/commands.h"
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

// The decoder of the run's data: its recipe's tokenizer, or that of its shard folder (meta.json's, or
// for llm.c's shards data.tokenizer_path's, else token ids), with data.objective's special tokens.
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
  throw UserError("the run trains on the synthetic task " + r.data.source + ", which has no text to sample");
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
  std::unique_ptr<TokenDecoder> tokenizer = run_tokenizer(recipe);
  const std::vector<int32_t> prompt = value_or_throw(sample_prompt_ids(*tokenizer, f.get("--prompt")));
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);
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
