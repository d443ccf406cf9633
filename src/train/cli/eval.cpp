// `seqlab eval RUN`: a run's checkpoint scored on the run's held-out data as its training evaluations
// score it (train/loop/evaluation.h), at train.seq_len and at any other lengths given now — so a model
// trained at one length is measured at others without retraining.
#include <absl/strings/str_format.h>

#include <iostream>

#include "train/checkpoint/checkpoint.h"
#include "train/cli/commands.h"
#include "train/cli/util.h"
#include "train/loop/evaluation.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

constexpr char kEvalUsage[] =
    "usage: seqlab eval RUN [--set section.key=value]... [--checkpoint FILE]\n"
    "\n"
    "Scores the model of the run directory RUN (its newest checkpoint, or FILE, with the recipe it holds) on the run's\n"
    "validation data, as the run's own evaluations do: val_loss and val_ppl (val_bpb for byte-level text,\n"
    "val_acc for a synthetic task) at train.seq_len, and the same fields named NAME@L at every length L of\n"
    "eval.seq_len. Prints a line per length, then the fields as one JSON line (metrics.jsonl's format, with\n"
    "the checkpoint's step). Writes nothing; a run still training may be scored meanwhile.\n"
    "\n"
    "  --set eval.seq_len=[L,...]   the lengths to score at (default: the recipe's); learned positions stop at\n"
    "                               train.seq_len, RoPE, no positions and the recurrences run at any length\n"
    "  --set log.eval_batches=N     how many batches per length (default: the recipe's)\n"
    "  --set train.device=cpu       where to run (default: the recipe's, \"auto\" a GPU where one is usable)\n"
    "                               (other keys may be set too; model keys must match the checkpoint)\n"
    "  --checkpoint FILE            a checkpoint other than RUN's newest\n";

void eval(const std::vector<std::string>& args) {
  Flags f(args, "eval", {"--set", "--checkpoint"}, {"--help", "-h"}, {"--set"}, 1);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kEvalUsage;
    return;
  }
  if (f.positional().empty()) throw UserError("expected the run directory: seqlab eval RUN (see seqlab eval --help)");
  const std::string run = f.positional()[0];
  // The recipe the checkpoint holds (checked against RUN/recipe.toml), with the --set overrides.
  RunCheckpoint opened = open_run_checkpoint(run, f.get("--checkpoint"), f.all("--set"), true);
  const Recipe& recipe = opened.recipe;
  const Checkpoint& checkpoint = opened.checkpoint;
  const Data data = open_data(recipe);
  if (data.vocab_size != checkpoint.vocab_size) {
    throw UserError(absl::StrFormat("%s: the checkpoint's vocabulary has %d tokens, the run's data %d", checkpoint.file,
                                    checkpoint.vocab_size, data.vocab_size));
  }
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);
  const Device device = training_device(recipe);
  model->to(device, training_dtype(recipe));

  const EvalReport report = evaluate_all(*model, data, recipe, device);
  for (const std::string& shown : report.shown) {
    std::cout << absl::StrFormat("step %d: %s\n", checkpoint.step, shown);
  }
  std::cout << absl::StrFormat("{\"step\": %d%s}\n", checkpoint.step, report.json);
}

}  // namespace

int eval_command(const std::vector<std::string>& args) { return run_guarded("eval", [&] { eval(args); }); }

}  // namespace seqlab::cli
