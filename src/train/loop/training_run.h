// `seqlab RECIPE.toml` and `seqlab --resume RUN`: the step loop for language models — prepare the
// data, build the model, train with the recipe's optimiser and schedule, log, evaluate, sample,
// checkpoint, resume (checkpoint/checkpoint.h describes the run directory it fills). Each step is
// Trainer::step (trainer.h); this file is the bookkeeping around it.
#pragma once

#include <string>
#include <vector>

namespace seqlab::cli {

// `args` are everything after `seqlab`: [RECIPE.toml] [--set section.key=value]... [--out DIR]
// [--resume RUN_DIR] (a recipe, a run to resume, or both).
int train_command(const std::vector<std::string>& args);

}  // namespace seqlab::cli
