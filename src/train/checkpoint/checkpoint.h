// A run directory and what it holds between processes:
//   .lock                       held by the process that trains into the folder (run_folder.h)
//   run.json                    the run's identity: {"run_id": 32 hex digits, "started": UTC time}
//   recipe.toml                 the resolved recipe (every key, final values)
//   metrics.jsonl               one JSON object per logged step
//   samples.txt                 text generated during training, one block per sampling step
//   ckpt_NNNNNNN.safetensors    checkpoints: the weights under their dotted names, the optimiser state
//                               under optim.*, and in the metadata the step, the loader position, the
//                               dropout generator, the vocabulary size, the resolved recipe, the
//                               skipped-update counts, the run's identity and the checksums
//   loss.png                    `seqlab plot RUN`
// A checkpoint is written under a temporary name, flushed, fsynced and renamed, so a run killed at any
// moment leaves only whole checkpoints; the last `checkpoint.keep` are kept.
//
// Checksums (format 3): the metadata holds "crc32c.NAME" for every tensor NAME — the CRC32C (crc32c.h)
// of its bytes as stored, 8 hex digits — and "crc32c", the CRC32C of every other metadata entry in key
// order, each as KEY NUL VALUE NUL. Reading checks them all (and that every tensor has one), so a
// flipped bit anywhere in the data or in the metadata refuses the checkpoint, naming the tensor; a new
// checkpoint is read back from disk and checked before older ones are rotated away, so rotation never
// deletes the newest checkpoint that passed its checks. Formats 1 and 2 predate checksums: they are
// read without verification, which is said once on stderr.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/model/language_model.h"
#include "train/data/loader.h"
#include "train/optim/optim.h"
#include "train/recipe/recipe.h"
#include "train/checkpoint/safetensors.h"

namespace seqlab::cli {

// The metadata 'format' of the checkpoints written now; of those written before checksums (read
// unverified); and of those written before the models were built from blocks (read unverified, their
// GPT weights renamed by current_tensor_name).
constexpr const char* kCheckpointFormat = "seqlab-checkpoint 3";
constexpr const char* kCheckpointFormatBeforeChecksums = "seqlab-checkpoint 2";
constexpr const char* kCheckpointFormatBeforeBlocks = "seqlab-checkpoint 1";
// The name a tensor of a format-1 checkpoint has now: blocks.{i}.ln1 → blocks.{i}.norm1, .attn →
// .mixer, .ln2 → .norm2, ln_f → norm_f (also inside optimizer state names); others unchanged.
std::string current_tensor_name(const std::string& name);

// "ckpt_0000042.safetensors" for step 42.
std::string checkpoint_name(int64_t step);
// The newest checkpoint of `run_dir`; UserError when there is none.
std::string newest_checkpoint(const std::string& run_dir);

// The run's count of updates skipped for non-finite values (train.on_nonfinite = "skip"): all of
// them, and those in a row up to the checkpoint's step (the run stops at train.max_skipped in a row).
struct SkippedUpdates {
  int64_t total = 0;
  int64_t in_a_row = 0;
};

// Who a run is, so that nothing of another run is taken for its own: a random 128-bit id (32 hex digits)
// and the time it started (UTC, 2026-11-27T16:06:29Z), given when a fresh run starts, kept in RUN/run.json
// and in the metadata of every checkpoint (run_id, run_started: under the metadata's CRC32C). Checkpoints
// written before identities have none; a run resumed from one is given one then.
struct RunIdentity {
  std::string id, started;
  bool empty() const { return id.empty(); }
};
// A fresh identity: 16 bytes of std::random_device, and now.
RunIdentity new_run_identity();
// RUN/run.json: nullopt when the file is missing; UserError naming it when it is damaged.
std::optional<RunIdentity> read_run_identity(const std::string& run_dir);
// Writes RUN/run.json atomically (write_file_atomically); UserError when that fails.
void write_run_identity(const std::string& run_dir, const RunIdentity& identity);

// Writes RUN/ckpt_<step>.safetensors (atomically), reads it back and checks its checksums, then
// deletes all but the newest `keep` checkpoints. UserError when it cannot be written or reads back
// differently: the message names the file and the reason, nothing is rotated away, and no temporary
// or partial file is left.
void save_checkpoint(const std::string& run_dir, int64_t step, LanguageModel& model, const Optimizer& optimizer,
                     const LoaderState& loader, const Recipe& recipe, int64_t keep, const SkippedUpdates& skipped = {},
                     const RunIdentity& identity = {});

// A checkpoint read and checked: its metadata parsed; weights and optimiser state still in `contents`.
struct Checkpoint {
  std::string file;
  SafetensorsContents contents;
  int64_t step = 0;
  int64_t vocab_size = 0;
  LoaderState loader;
  std::string dropout_rng;  // Generator::state() of the model's dropout generator
  std::string recipe_toml;
  SkippedUpdates skipped;
  RunIdentity run;  // empty for a checkpoint written before identities
};
// UserError for a missing, truncated or corrupted file, a failed checksum, or metadata that is not
// seqlab's. A damaged checkpoint's message names the file and what failed, and the newest older
// checkpoint beside it that passes its checks (which --checkpoint FILE can use). A format-1
// checkpoint's tensors are renamed to the current names.
Checkpoint read_checkpoint(const std::string& file);
// The same checks without keeping the tensors (read in pieces: no more memory than 1 MiB): the metadata
// of a checkpoint that passes its checks; `contents` stays empty.
Checkpoint read_checkpoint_metadata(const std::string& file);
// "" when the checkpoint on disk passes every check (read in pieces, without loading its tensors),
// else what is wrong with it.
std::string checkpoint_damage(const std::string& file);
// Checkpoints of `run_dir` for steps after `step` (of a future that a resume from an older checkpoint
// abandons) are renamed to NAME.abandoned, so that neither resume nor rotation takes them for the
// run's newest; returns their new names.
std::vector<std::string> set_aside_checkpoints_after(const std::string& run_dir, int64_t step);
// Copies the checkpoint's weights and dropout generator into `model`; UserError naming a missing or
// misshapen weight.
void restore_weights(const Checkpoint& checkpoint, LanguageModel& model);

// RUN/recipe.toml loaded with `overrides` applied; its name is the run's (resolved_recipe_name), not the
// file's stem. For a run that has no checkpoint yet; a run with one is opened by open_run_checkpoint.
Recipe load_run_recipe(const std::string& run_dir, const std::vector<std::string>& overrides = {});

// A run folder opened to continue its training or use its model (`--resume RUN`, `eval RUN`, `sample RUN`).
// The checkpoint is RUN's newest or `checkpoint_file` (--checkpoint), read and checked; the recipe is the
// one the checkpoint holds — what the run trained with — with `overrides` (--set) applied, named as the
// run was. RUN/recipe.toml must agree with it (both taken with the overrides): when it is missing,
// damaged or differs, a UserError says which (for a difference, the first key and both values) and how
// to go on; nothing is changed silently. The checkpoint must belong to RUN: its run id, when it has one,
// must be RUN's (run.json's, else that of RUN's newest checkpoint), else a UserError names both.
// `tensors`: keep the checkpoint's tensors (to restore them), else only its metadata.
struct RunCheckpoint {
  Checkpoint checkpoint;
  Recipe recipe;
  RunIdentity identity;       // the run's; for a run from before identities, a new one
  bool new_identity = false;  // given now: the run had none
};
// `check_recipe_file` false skips the comparison with RUN/recipe.toml: for `RECIPE --resume RUN`, whose
// given recipe is compared with the checkpoint's instead (and replaces recipe.toml).
RunCheckpoint open_run_checkpoint(const std::string& run_dir, const std::string& checkpoint_file,
                                  const std::vector<std::string>& overrides, bool tensors,
                                  bool check_recipe_file = true);

// The checkpoint `--checkpoint FILE` names: FILE itself, or a UserError when FILE is a folder (listing
// the checkpoints in it).
std::string checkpoint_flag_file(const std::string& file);

// On resume: drops the lines of metrics.jsonl (and samples.txt) logged after `step`, which the resumed
// run logs again; a half-written last line of a killed run goes too. Rewritten atomically
// (write_file_atomically); UserError when that fails, the old files left as they were.
void truncate_logs_after(const std::string& run_dir, int64_t step);

}  // namespace seqlab::cli
