// `seqlab RECIPE.toml`: the step loop for language models on token shards — prepare data, build the
// model, train with the recipe's optimiser and schedule, log metrics, evaluate, checkpoint, resume.
#pragma once

#include <string>
#include <vector>

namespace seqlab::cli {

// Arguments after the recipe path: [--set section.key=value]... [--out DIR] [--resume RUN_DIR].
int train_command(const std::string& recipe_path, const std::vector<std::string>& args);

}  // namespace seqlab::cli
