// `seqlab logits RUN --tokens IDS --out FILE.npy`: the logits a run's model gives one sequence of token
// ids, as a .npy file, for comparing seqlab's forward with another implementation's (an export loaded in
// Hugging Face transformers: tests/hf_export_test.py). One forward over the whole sequence, as training
// computes it — not the decoding path of `sample` —, on the CPU (the reference backend) in f32 and in
// evaluation mode (no dropout).
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <iostream>

#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "tensor/npy.h"
#include "train/checkpoint/checkpoint.h"
#include "train/cli/commands.h"
#include "train/cli/util.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

constexpr char kLogitsUsage[] =
    "usage: seqlab logits RUN --tokens \"ID ID ...\" --out FILE.npy [--checkpoint FILE]\n"
    "\n"
    "Writes the logits that the model of the run directory RUN (its newest checkpoint, or FILE, with the recipe\n"
    "it holds) gives the token ids of --tokens to FILE.npy: float32, shape [T, V] for T ids and the model's\n"
    "vocabulary of V ids, row t the scores of the token that follows ids 0..t. One forward over the whole\n"
    "sequence, on the CPU in f32, in evaluation mode (no dropout): what an export (seqlab export --hf) loaded\n"
    "elsewhere must reproduce.\n"
    "\n"
    "  --tokens IDS       the token ids, separated by spaces or commas: at least one, each below the model's\n"
    "                     vocabulary size, at most as many as the positions it knows (train.seq_len for\n"
    "                     learned positions)\n"
    "  --out FILE.npy     where to write the logits (written to a temporary name, then renamed)\n"
    "  --checkpoint FILE  a checkpoint other than RUN's newest\n";

// The ids of --tokens, each checked against the vocabulary.
std::vector<int64_t> parse_tokens(const std::string& text, int64_t vocab_size) {
  std::vector<int64_t> ids;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(word, &id)) {
      throw UserError(absl::StrCat("--tokens expects token ids separated by spaces or commas, got '", word, "'"));
    }
    if (id < 0 || id >= vocab_size) {
      throw UserError(absl::StrCat("--tokens: id ", id, " is outside the model's vocabulary of ", vocab_size,
                                   " ids (0 to ", vocab_size - 1, ")"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) throw UserError("--tokens holds no token id");
  return ids;
}

void logits(const std::vector<std::string>& args) {
  Flags f(args, "logits", {"--tokens", "--out", "--checkpoint"}, {"--help", "-h"}, {}, 1);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kLogitsUsage;
    return;
  }
  if (f.positional().empty()) {
    throw UserError("expected the run directory: seqlab logits RUN --tokens IDS --out FILE.npy (see seqlab logits --help)");
  }
  if (!f.has("--tokens")) throw UserError("--tokens is required: the token ids to score (see seqlab logits --help)");
  if (!f.has("--out")) throw UserError("--out is required: the .npy file to write (see seqlab logits --help)");
  const std::string run = f.positional()[0];

  RunCheckpoint opened = open_run_checkpoint(run, f.get("--checkpoint"), {}, true);
  const Recipe& recipe = opened.recipe;
  const Checkpoint& checkpoint = opened.checkpoint;
  // Built on the host in f32, where it stays: the CPU is the reference.
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);
  const std::vector<int64_t> ids = parse_tokens(f.get("--tokens"), model->vocab_size());
  const int64_t T = static_cast<int64_t>(ids.size());
  if (model->max_context() > 0 && T > model->max_context()) {
    throw UserError(absl::StrCat("--tokens holds ", T, " ids, more than the ", model->max_context(),
                                 " positions the model knows"));
  }

  NoGradGuard no_grad;
  model->set_training(false);
  const Tensor out = model->logits(Batch(Tensor::from_indices(ids, {1, T}, DType::i64)));  // [1, T, V]
  ok_or_throw(write_npy(f.get("--out"), kernel::reshape(out, {T, out.shape()[2]})));
}

}  // namespace

int logits_command(const std::vector<std::string>& args) { return run_guarded("logits", [&] { logits(args); }); }

}  // namespace seqlab::cli
