// The data subcommands of `seqlab` (src/train/cli/data.cpp); like every subcommand they report a user
// error as one line on stderr and exit code 2.
#pragma once

#include <string>
#include <vector>

namespace seqlab::cli {

// `seqlab tokenizer train|encode ...` with the arguments after "tokenizer".
int tokenizer_command(const std::vector<std::string>& args);
// `seqlab prepare ...` with the arguments after "prepare".
int prepare_command(const std::vector<std::string>& args);

}  // namespace seqlab::cli
