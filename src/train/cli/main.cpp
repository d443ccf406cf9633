// seqlab: dispatches on the first argument to a subcommand (src/train/cli/*.{h,cpp}).
//
// Every subcommand reports its errors itself (run_guarded: one line, exit 2 for the user's mistakes, 1 for
// seqlab's). Two nets below catch what could still escape: a try around the dispatch, and a terminate
// handler for an exception that cannot propagate (thrown inside an OpenMP region or a noexcept function),
// which would otherwise abort with SIGABRT. Both print one line and exit non-zero; neither dumps a stack.
#include <absl/strings/match.h>

#include <iostream>
#include <string>
#include <vector>

#include "train/cli/commands.h"
#include "train/cli/data.h"
#include "train/cli/util.h"
#include "train/loop/training_run.h"

namespace {

int dispatch(const std::vector<std::string>& args);

}  // namespace

int main(int argc, char** argv) {
  seqlab::cli::install_terminate_handler();
  try {
    return dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (...) {
    std::cerr << "seqlab: internal error: " << seqlab::cli::describe_current_exception() << "\n";
    return 1;
  }
}

namespace {

int dispatch(const std::vector<std::string>& args) {
  using namespace seqlab::cli;
  if (args.empty()) {
    std::cerr << usage_text();
    return kUsageError;
  }
  const std::string& command = args[0];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << usage_text();
    return 0;
  }
  if (command == "--version") {
    std::cout << version_text();
    return 0;
  }
  if (command == "op") return op_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "tokenizer") return tokenizer_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "prepare") return prepare_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "recipe") return recipe_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "sample") return sample_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "eval") return eval_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "export") return export_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "logits") return logits_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "plot") return plot_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "sweep") return sweep_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (absl::EndsWith(command, ".toml") || command == "--resume") return train_command(args);
  std::cerr << "seqlab: unknown command '" << command << "' (see seqlab --help)\n";
  return kUsageError;
}

}  // namespace
