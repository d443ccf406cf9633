// A run directory and what it holds between processes:
//   recipe.toml                 the resolved recipe (every key, final values)
//   metrics.jsonl               one JSON object per logged step
//   samples.txt                 text generated during training, one block per sampling step
//   ckpt_NNNNNNN.safetensors    checkpoints: the weights under their dotted names, the optimiser state
//                               under optim.*, and in the metadata the step, the loader position, the
//                               dropout generator, the vocabulary size and the resolved recipe
//   loss.png                    `seqlab plot RUN`
// A checkpoint is written under a temporary name, flushed and renamed, so a run killed at any moment
// leaves only whole checkpoints; the last `checkpoint.keep` are kept.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/model/language_model.h"
#include "train/data/loader.h"
#include "train/optim/optim.h"
#include "train/recipe/recipe.h"
#include "train/checkpoint/safetensors.h"

namespace seqlab::cli {

// The metadata 'format' of the checkpoints written now, and of those written before the models were
// built from blocks (read too: their GPT weights are renamed by current_tensor_name).
constexpr const char* kCheckpointFormat = "seqlab-checkpoint 2";
constexpr const char* kCheckpointFormatBeforeBlocks = "seqlab-checkpoint 1";
// The name a tensor of a format-1 checkpoint has now: blocks.{i}.ln1 → blocks.{i}.norm1, .attn →
// .mixer, .ln2 → .norm2, ln_f → norm_f (also inside optimizer state names); others unchanged.
std::string current_tensor_name(const std::string& name);

// "ckpt_0000042.safetensors" for step 42.
std::string checkpoint_name(int64_t step);
// The newest checkpoint of `run_dir`; UserError when there is none.
std::string newest_checkpoint(const std::string& run_dir);

void save_checkpoint(const std::string& run_dir, int64_t step, LanguageModel& model, const Optimizer& optimizer,
                     const LoaderState& loader, const Recipe& recipe, int64_t keep);

// A checkpoint read and checked: its metadata parsed; weights and optimiser state still in `contents`.
struct Checkpoint {
  std::string file;
  SafetensorsContents contents;
  int64_t step = 0;
  int64_t vocab_size = 0;
  LoaderState loader;
  std::string dropout_rng;  // Generator::state() of the model's dropout generator
  std::string recipe_toml;
};
// UserError for a missing, truncated or corrupted file, or metadata that is not seqlab's. A format-1
// checkpoint's tensors are renamed to the current names.
Checkpoint read_checkpoint(const std::string& file);
// Copies the checkpoint's weights and dropout generator into `model`; UserError naming a missing or
// misshapen weight.
void restore_weights(const Checkpoint& checkpoint, LanguageModel& model);

// RUN/recipe.toml loaded with `overrides` applied (what `--resume RUN` and `seqlab sample RUN` use).
Recipe load_run_recipe(const std::string& run_dir, const std::vector<std::string>& overrides = {});

// On resume: drops the lines of metrics.jsonl (and samples.txt) logged after `step`, which the resumed
// run logs again; a half-written last line of a killed run goes too. Rewritten atomically.
void truncate_logs_after(const std::string& run_dir, int64_t step);

}  // namespace seqlab::cli
