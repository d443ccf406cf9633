// `seqlab RECIPE.toml` and `seqlab --resume RUN`: the step loop for language models — prepare the
// data, build the model, train with the recipe's optimiser and schedule, log, evaluate, sample,
// checkpoint, resume (checkpoint/checkpoint.h describes the run directory it fills). Each step is
// Trainer::step (trainer.h); this file is the bookkeeping around it.
#pragma once

#include <string>
#include <vector>

namespace seqlab::cli {

// The exit code of a run stopped by a step whose loss or gradient norm is not finite
// (train.on_nonfinite = "stop", or max_skipped updates in a row skipped with "skip").
constexpr int kNonFiniteExit = 3;

// `args` are everything after `seqlab`: [RECIPE.toml] [--set section.key=value]... [--out DIR]
// [--resume RUN_DIR [--checkpoint FILE]] (a recipe, a run to resume, or both). Exit codes: 0 done;
// 2 a user error (a bad recipe, file or flag; the run folder in use by another process; a disk that
// refuses a checkpoint); 3 stopped on a non-finite step; 128 + N stopped by signal N (a checkpoint saved).
int train_command(const std::vector<std::string>& args);

}  // namespace seqlab::cli
