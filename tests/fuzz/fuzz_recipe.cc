// Recipes (train/recipe/recipe.h) as `./train RECIPE --set ...` loads them: the input is a TOML file,
// optionally followed by a line "--- set ---" and one `--set` override per line. A recipe that loads
// maps to the layers' configs without a crash, and its resolved form (what a run folder keeps for
// --resume) loads again to the same resolved form.
#include "fuzz_util.h"
#include "train/recipe/configs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<absl::string_view> parts = fuzz::split_parts(input, "\n--- set ---\n");
  std::vector<std::string> overrides;
  if (parts.size() > 1) {
    for (absl::string_view line : fuzz::split_parts(parts[1], "\n")) overrides.emplace_back(line);
  }
  const std::string path = fuzz::write_scratch("recipe.toml", parts[0]);
  absl::StatusOr<Recipe> recipe = load_recipe(path, overrides);
  if (!recipe.ok()) return 0;

  // The mappings the trainer applies next (their own errors are answers too).
  (void)model_config(*recipe, 300);
  (void)validate(optim_config(*recipe));
  (void)trainer_options(*recipe);
  (void)loader_options(*recipe);
  const LrSchedule schedule = lr_schedule(*recipe);
  if (validate(schedule).ok()) (void)schedule.lr_at(schedule.steps);
  if (recipe->data.source != "text" && recipe->data.source != "shards") (void)validate(synthetic_config(*recipe));

  // The resolved recipe, loaded from a file of the same name elsewhere, resolves to the same text
  // (past its first line, which names the file it came from).
  const std::string resolved = resolved_recipe_toml(*recipe);
  std::filesystem::create_directories(fuzz::scratch_dir() / "resolved");
  const std::string copy = fuzz::write_scratch("resolved/recipe.toml", resolved);
  absl::StatusOr<Recipe> again = load_recipe(copy);
  FUZZ_CHECK(again.ok(), again.status().ToString() + "\n" + resolved);
  const std::string resolved_again = resolved_recipe_toml(*again);
  FUZZ_CHECK(resolved.substr(resolved.find('\n')) == resolved_again.substr(resolved_again.find('\n')),
             "the resolved recipe resolves differently:\n" + resolved + "\n" + resolved_again);
  return 0;
}
