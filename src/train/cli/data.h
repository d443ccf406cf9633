// The data subcommands of `seqlab` (src/train/cli/data.cpp); like every subcommand they report a user
// error as one line on stderr and exit code 2. And the tokenizer of a run, which `sample` and `export` read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/data/tokenizer.h"
#include "train/recipe/recipe.h"

namespace seqlab::cli {

// `seqlab tokenizer train|encode ...` with the arguments after "tokenizer".
int tokenizer_command(const std::vector<std::string>& args);
// `seqlab prepare ...` with the arguments after "prepare".
int prepare_command(const std::vector<std::string>& args);

// Whether the run's data is text (data.source "text" or "shards"), whose tokenizer run_tokenizer opens;
// a synthetic task has none.
bool run_has_text(const Recipe& r);
// The decoder of a run's text data: its recipe's tokenizer, or that of its shard folder (meta.json's, or
// for llm.c's shards data.tokenizer_path's, else token ids), with data.objective's special tokens.
// UserError when the files it needs are missing or damaged, or when the run trains on a synthetic task.
std::unique_ptr<TokenDecoder> run_tokenizer(const Recipe& r);

}  // namespace seqlab::cli
