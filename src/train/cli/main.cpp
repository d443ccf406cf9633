// seqlab: dispatches on the first argument to a subcommand (src/train/cli*.{h,cpp}).
#include <absl/strings/match.h>

#include <iostream>
#include <string>
#include <vector>

#include "train/cli/commands.h"
#include "train/cli/data.h"
#include "train/loop/training_run.h"

int main(int argc, char** argv) {
  using namespace seqlab::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
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
  if (command == "plot") return plot_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (absl::EndsWith(command, ".toml") || command == "--resume") return train_command(args);
  std::cerr << "seqlab: unknown command '" << command << "' (see seqlab --help)\n";
  return kUsageError;
}
