// `seqlab recipe --doc` prints the reference of every recipe key (docs/recipes.md is its output);
// `seqlab recipe check FILE [--set section.key=value]...` validates a recipe and prints it resolved;
// FILE may be a checkpoint (ckpt_*.safetensors), whose run's recipe is printed.
// A bad recipe is reported as load_recipe words it: one line starting with the file or the --set.
#include <iostream>
#include <string>
#include <vector>

#include <absl/strings/match.h>

#include "train/checkpoint/checkpoint.h"
#include "train/cli/commands.h"
#include "train/recipe/recipe.h"

namespace seqlab::cli {
namespace {

constexpr char kRecipeUsage[] =
    "usage: seqlab recipe check FILE [--set section.key=value]...\n"
    "       seqlab recipe --doc\n"
    "\n"
    "  check FILE   validate the recipe (and the overrides) and print it resolved: every key with its\n"
    "               final value; exit code 2 and one line on stderr when something is wrong. FILE may be a\n"
    "               checkpoint (ckpt_*.safetensors): the recipe its run trained with (to restore a run's\n"
    "               recipe.toml: seqlab recipe check RUN/ckpt_N.safetensors > RUN/recipe.toml)\n"
    "  --doc        every key of every section with its type, default and meaning (docs/recipes.md)\n";

int usage_error(const std::string& message) {
  std::cerr << "seqlab recipe: " << message << " (see seqlab recipe --help)\n";
  return kUsageError;
}

int check_command(const std::vector<std::string>& args) {
  std::string file;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--set") {
      if (i + 1 >= args.size()) return usage_error("--set needs section.key=value");
      overrides.push_back(args[++i]);
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else if (arg.rfind("-", 0) == 0) {
      return usage_error("unknown flag '" + arg + "'");
    } else if (!file.empty()) {
      return usage_error("unexpected argument '" + arg + "' (the recipe is already " + file + ")");
    } else {
      file = arg;
    }
  }
  if (file.empty()) return usage_error("check needs a recipe file");
  absl::StatusOr<Recipe> recipe;
  if (absl::EndsWith(file, ".safetensors")) {
    // A checkpoint's recipe, named as its run was: what puts back a run folder's lost recipe.toml.
    try {
      const Checkpoint c = read_checkpoint_metadata(file);
      recipe = load_recipe_text(c.recipe_toml, file, overrides);
      if (recipe.ok() && !resolved_recipe_name(c.recipe_toml).empty()) recipe->name = resolved_recipe_name(c.recipe_toml);
    } catch (const UserError& e) {
      std::cerr << "seqlab recipe: " << e.what() << "\n";
      return kUsageError;
    }
  } else {
    recipe = load_recipe(file, overrides);
  }
  if (!recipe.ok()) {
    std::cerr << recipe.status().message() << "\n";
    return kUsageError;
  }
  std::cout << resolved_recipe_toml(*recipe);
  return 0;
}

}  // namespace

int recipe_command(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << kRecipeUsage;
    return kUsageError;
  }
  const std::string& sub = args[0];
  if (sub == "--help" || sub == "-h") {
    std::cout << kRecipeUsage;
    return 0;
  }
  if (sub == "--doc") {
    if (args.size() > 1) return usage_error("--doc takes no arguments");
    std::cout << recipe_reference_markdown();
    return 0;
  }
  if (sub == "check") return check_command(std::vector<std::string>(args.begin() + 1, args.end()));
  return usage_error("unknown subcommand '" + sub + "'");
}

}  // namespace seqlab::cli
