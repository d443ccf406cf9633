#include "train/checkpoint/checkpoint.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tensor/kernels.h"
#include "tensor/slots/optim.h"
#include "train/checkpoint/crc32c.h"
#include "train/checkpoint/run_folder.h"
#include "train/common/atomic_file.h"
#include "train/common/errors.h"
#include "train/common/stamps.h"
#include "train/data/documents.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

// Checkpoints in the run directory, oldest first (the zero-padded step sorts by name).
std::vector<fs::path> checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    std::error_code not_file;
    if (absl::StartsWith(n, "ckpt_") && absl::EndsWith(n, ".safetensors") && e.is_regular_file(not_file)) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& file) {
  int64_t v;
  auto it = meta.find(key);
  if (it == meta.end() || !absl::SimpleAtoi(it->second, &v) || v < 0) {
    throw UserError(file + ": not a seqlab checkpoint (its metadata lacks a valid '" + key + "')");
  }
  return v;
}

std::string meta_text(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  return it == meta.end() ? std::string() : it->second;
}

// Rewrites `file` keeping the lines `keep(line)` accepts (write_file_atomically).
template <class Keep>
void filter_lines(const fs::path& file, Keep keep) {
  std::ifstream in(file);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: a line cut short by a kill
    if (keep(line)) kept += line + "\n";
  }
  ok_or_throw(write_file_atomically(file.string(), kept));
}

// The step of a checkpoint's file name, or -1 for another name.
int64_t checkpoint_step(const fs::path& file) {
  const std::string n = file.filename().string();
  int64_t step = -1;
  if (!absl::StartsWith(n, "ckpt_") || !absl::EndsWith(n, ".safetensors") ||
      !absl::SimpleAtoi(n.substr(5, n.size() - 5 - 12), &step)) {
    return -1;
  }
  return step;
}

// ---- checksums ----

constexpr const char* kMetadataCrcKey = "crc32c";     // over every other metadata entry
constexpr const char* kTensorCrcPrefix = "crc32c.";  // + a tensor's name

bool is_checksum_key(const std::string& key) { return key == kMetadataCrcKey || absl::StartsWith(key, kTensorCrcPrefix); }

// CRC32C of the metadata entries that are not checksums, in key order, each as KEY NUL VALUE NUL.
uint32_t metadata_crc(const std::map<std::string, std::string>& meta) {
  uint32_t crc = 0;
  const char nul = '\0';
  for (const auto& [key, value] : meta) {
    if (is_checksum_key(key)) continue;
    crc = crc32c(key.data(), key.size(), crc);
    crc = crc32c(&nul, 1, crc);
    crc = crc32c(value.data(), value.size(), crc);
    crc = crc32c(&nul, 1, crc);
  }
  return crc;
}

std::string hex32(uint32_t v) { return absl::StrFormat("%08x", v); }

// "" when the checksums stored in `meta` agree with the metadata and with `crcs` (every tensor of
// the file by name), else what does not.
std::string checksum_problem(const std::map<std::string, std::string>& meta,
                             const std::map<std::string, uint32_t>& crcs) {
  auto stored = [&](const std::string& key, uint32_t* out) {
    auto it = meta.find(key);
    return it != meta.end() && it->second.size() == 8 && absl::SimpleHexAtoi(it->second, out);
  };
  uint32_t want = 0;
  if (!stored(kMetadataCrcKey, &want)) return "its metadata lacks the checksum 'crc32c' that format 3 requires";
  if (const uint32_t got = metadata_crc(meta); got != want) {
    return absl::StrFormat("its metadata fails its CRC32C check (stored %08x, computed %08x)", want, got);
  }
  for (const auto& [name, got] : crcs) {
    if (!stored(kTensorCrcPrefix + name, &want)) return "tensor \"" + name + "\" has no checksum";
    if (got != want) {
      return absl::StrFormat("tensor \"%s\" fails its CRC32C check (stored %08x, computed %08x)", name, want, got);
    }
  }
  for (const auto& [key, value] : meta) {
    if (!absl::StartsWith(key, kTensorCrcPrefix)) continue;
    const std::string name = key.substr(std::string(kTensorCrcPrefix).size());
    if (!crcs.count(name)) return "tensor \"" + name + "\" is missing (the metadata holds its checksum)";
  }
  return "";
}

// The formats read, as the message of a file of another format lists them.
bool known_format(const std::string& format) {
  return format == kCheckpointFormat || format == kCheckpointFormatBeforeChecksums ||
         format == kCheckpointFormatBeforeBlocks;
}

std::string unknown_format_message(const std::string& file, const std::string& format) {
  return file + ": not a seqlab checkpoint (metadata 'format' is \"" + format + "\", not \"" + kCheckpointFormat +
         "\", \"" + kCheckpointFormatBeforeChecksums + "\" or \"" + kCheckpointFormatBeforeBlocks + "\")";
}

// What to do about a damaged checkpoint: the newest older one beside it that passes its checks.
std::string older_intact_hint(const std::string& file) {
  const fs::path path(file);
  const int64_t step = checkpoint_step(path);
  if (step < 0) return "";
  std::vector<fs::path> all = checkpoints(path.parent_path().empty() ? fs::path(".") : path.parent_path());
  bool any_older = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (checkpoint_step(*it) >= step) continue;
    any_older = true;
    if (checkpoint_damage(it->string()).empty()) {
      return absl::StrCat("; the newest older checkpoint that passes its checks is ", it->string(),
                          " (use it with --checkpoint ", it->string(), ")");
    }
  }
  return any_older ? "; no older checkpoint beside it passes its checks" : "; there is no older checkpoint beside it";
}

}  // namespace

std::string checkpoint_damage(const std::string& file) {
  absl::StatusOr<SafetensorsChecksums> c = read_safetensors_checksums(file);
  if (!c.ok()) return std::string(c.status().message());
  const std::string format = meta_text(c->metadata, "format");
  if (!known_format(format)) return unknown_format_message(file, format);
  if (format != kCheckpointFormat) return "";  // no checksums to check
  const std::string problem = checksum_problem(c->metadata, c->crc32c);
  return problem.empty() ? "" : file + ": damaged: " + problem;
}

std::vector<std::string> set_aside_checkpoints_after(const std::string& run_dir, int64_t step) {
  std::vector<std::string> moved;
  for (const fs::path& p : checkpoints(run_dir)) {
    if (checkpoint_step(p) <= step) continue;
    fs::path to = p;
    to += ".abandoned";
    std::error_code ec;
    fs::rename(p, to, ec);
    if (ec) throw UserError(absl::StrCat(p.string(), ": cannot rename it to ", to.string(), " (", ec.message(), ")"));
    moved.push_back(to.string());
  }
  return moved;
}

std::string checkpoint_name(int64_t step) { return absl::StrFormat("ckpt_%07d.safetensors", step); }

std::string newest_checkpoint(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw UserError(run_dir + ": no such run directory");
  std::vector<fs::path> all = checkpoints(run_dir);
  if (all.empty()) throw UserError(run_dir + ": no checkpoint (ckpt_*.safetensors) in that folder");
  return all.back().string();
}

void save_checkpoint(const std::string& run_dir, int64_t step, LanguageModel& model, const Optimizer& optimizer,
                     const LoaderState& loader, const Recipe& recipe, int64_t keep, const SkippedUpdates& skipped,
                     const RunIdentity& identity) {
  // Weights are saved in f32 whatever train.dtype is: a bf16 parameter's f32 master stands for it.
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::map<std::string, Tensor> masters = optimizer.master_weights();
  for (const Parameter& p : model.parameters()) {
    auto master = masters.find(p.name);
    tensors.emplace_back(p.name, master != masters.end() ? master->second : p.tensor->detach());
  }
  for (auto& entry : optimizer.state_tensors()) tensors.push_back(entry);
  std::map<std::string, std::string> meta = {{"format", kCheckpointFormat},
                                             {"step", std::to_string(step)},
                                             {"vocab_size", std::to_string(model.vocab_size())},
                                             {"loader_epoch", std::to_string(loader.epoch)},
                                             {"loader_position", std::to_string(loader.position)},
                                             {"dropout_rng", model.dropout_generator().state()},
                                             {"recipe", resolved_recipe_toml(recipe)},
                                             {"skipped_updates", std::to_string(skipped.total)},
                                             {"skipped_in_a_row", std::to_string(skipped.in_a_row)}};
  if (!identity.empty()) {
    meta["run_id"] = identity.id;
    meta["run_started"] = identity.started;
  }
  const std::vector<fs::path> before = checkpoints(run_dir);
  const std::string file = (fs::path(run_dir) / checkpoint_name(step)).string();
  const std::string kept = before.empty() ? std::string("")
                                          : absl::StrCat("; the checkpoints saved before are kept (the newest: ",
                                                         before.back().string(), ")");
  std::map<std::string, uint32_t> crcs;
  const size_t weights = model.parameters().size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const Tensor host = kernel::contiguous(kernel::to_device(t, cpu_device()));
    // A checkpoint never holds weights that are not finite: nothing could continue from them.
    if (i < weights && !std::isfinite(kernel::squared_norm(host))) {
      throw UserError(absl::StrCat("the checkpoint of step ", step, " was not saved: the weight ", name,
                                   " holds values that are not finite (NaN or inf)", kept));
    }
    crcs[name] = crc32c(host.raw_data(), host.nbytes());
    meta[kTensorCrcPrefix + name] = hex32(crcs[name]);
  }
  meta[kMetadataCrcKey] = hex32(metadata_crc(meta));

  if (absl::Status s = write_safetensors(file, tensors, meta); !s.ok()) {
    throw UserError(absl::StrCat("the checkpoint of step ", step, " was not saved: ", s.message(), kept));
  }
  // Read back from the file system, so that rotation never deletes the last checkpoint that passed
  // its checks for one that does not.
  absl::StatusOr<SafetensorsChecksums> back = read_safetensors_checksums(file);
  if (!back.ok() || back->metadata != meta || back->crc32c != crcs) {
    std::error_code ec;
    fs::remove(file, ec);
    throw UserError(absl::StrCat(file, ": the checkpoint reads back differently from what was written (",
                                 back.ok() ? checksum_problem(back->metadata, back->crc32c) : back.status().message(),
                                 "), so it was deleted", kept));
  }
  std::vector<fs::path> all = checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove(all[i]);
}

namespace {

// The checks of a checkpoint's metadata against its tensors' CRC32C (`crcs`, by name), then its fields
// into `c`. Shared by read_checkpoint and read_checkpoint_metadata.
void check_and_parse_metadata(Checkpoint& c, const std::map<std::string, std::string>& meta,
                              const std::map<std::string, uint32_t>& crcs) {
  const std::string& file = c.file;
  const std::string format = meta_text(meta, "format");
  if (!known_format(format)) throw UserError(unknown_format_message(file, format));
  if (format == kCheckpointFormat) {
    const std::string problem = checksum_problem(meta, crcs);
    if (!problem.empty()) throw UserError(file + ": damaged: " + problem + older_intact_hint(file));
  } else {
    static bool said = false;  // once per process
    if (!said) {
      std::cerr << "seqlab: " << file << ": a checkpoint of format \"" << format
                << "\" holds no checksums; read without verification\n";
      said = true;
    }
  }
  c.step = meta_int(meta, "step", file);
  c.vocab_size = meta_int(meta, "vocab_size", file);
  c.loader = {meta_int(meta, "loader_epoch", file), meta_int(meta, "loader_position", file)};
  c.dropout_rng = meta_text(meta, "dropout_rng");
  c.recipe_toml = meta_text(meta, "recipe");
  if (meta.count("skipped_updates")) {
    c.skipped = {meta_int(meta, "skipped_updates", file), meta_int(meta, "skipped_in_a_row", file)};
  }
  c.run = {meta_text(meta, "run_id"), meta_text(meta, "run_started")};
}

// A file that is there but does not parse is damaged (truncated, overwritten): the message says which
// older checkpoint beside it passes its checks.
[[noreturn]] void throw_unreadable(const std::string& file, const absl::Status& status) {
  throw UserError(absl::StrCat(status.message(), absl::IsInvalidArgument(status) ? older_intact_hint(file) : ""));
}

}  // namespace

Checkpoint read_checkpoint(const std::string& file) {
  Checkpoint c;
  c.file = file;
  absl::StatusOr<SafetensorsContents> contents = read_safetensors(file);
  if (!contents.ok()) throw_unreadable(file, contents.status());
  c.contents = *std::move(contents);
  std::map<std::string, uint32_t> crcs;
  if (meta_text(c.contents.metadata, "format") == kCheckpointFormat) {
    for (const auto& [name, t] : c.contents.tensors) crcs[name] = crc32c(t.raw_data(), t.nbytes());
  }
  check_and_parse_metadata(c, c.contents.metadata, crcs);
  if (meta_text(c.contents.metadata, "format") == kCheckpointFormatBeforeBlocks) {
    std::map<std::string, Tensor> renamed;
    for (auto& [name, t] : c.contents.tensors) renamed.emplace(current_tensor_name(name), std::move(t));
    c.contents.tensors = std::move(renamed);
  }
  return c;
}

Checkpoint read_checkpoint_metadata(const std::string& file) {
  Checkpoint c;
  c.file = file;
  absl::StatusOr<SafetensorsChecksums> sums = read_safetensors_checksums(file);
  if (!sums.ok()) throw_unreadable(file, sums.status());
  check_and_parse_metadata(c, sums->metadata, sums->crc32c);
  c.contents.metadata = sums->metadata;
  return c;
}

std::string current_tensor_name(const std::string& name) {
  // The GPT's blocks named their parts ln1, attn, ln2 and its final norm ln_f; every block of the
  // decoder names them norm1, mixer, norm2 and norm_f (optimizer state: "optim.<kind>.<weight>").
  static const std::map<std::string, std::string> kRenamed = {
      {"ln1", "norm1"}, {"attn", "mixer"}, {"ln2", "norm2"}, {"ln_f", "norm_f"}};
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  for (std::string& part : parts) {
    auto it = kRenamed.find(part);
    if (it != kRenamed.end()) part = it->second;
  }
  return absl::StrJoin(parts, ".");
}

void restore_weights(const Checkpoint& checkpoint, LanguageModel& model) {
  for (const Parameter& p : model.parameters()) {
    auto it = checkpoint.contents.tensors.find(p.name);
    if (it == checkpoint.contents.tensors.end()) throw UserError(checkpoint.file + ": no weight named " + p.name);
    // A bf16 model (mixed precision) takes the f32 weights that checkpoints hold, rounded.
    const bool dtype_ok = it->second.dtype() == p.tensor->dtype() ||
                          (p.tensor->dtype() == DType::bf16 && it->second.dtype() == DType::f32);
    if (it->second.shape() != p.tensor->shape() || !dtype_ok) {
      throw UserError(checkpoint.file + ": " + p.name + " is " + shape_str(it->second.shape()) + " " +
                      dtype_name(it->second.dtype()) + ", the recipe's model has " + shape_str(p.tensor->shape()) +
                      " " + dtype_name(p.tensor->dtype()));
    }
    if (!std::isfinite(kernel::squared_norm(it->second))) {
      throw UserError(checkpoint.file + ": the weight " + p.name + " holds values that are not finite (NaN or inf)");
    }
    kernel::copy_(*p.tensor, it->second);
  }
  if (!checkpoint.dropout_rng.empty()) {
    try {
      model.dropout_generator().set_state(checkpoint.dropout_rng);
    } catch (const std::invalid_argument& e) {
      throw UserError(checkpoint.file + ": its dropout generator state is corrupt (" + e.what() + ")");
    }
  }
}

Recipe load_run_recipe(const std::string& run_dir, const std::vector<std::string>& overrides) {
  const fs::path file = fs::path(run_dir) / "recipe.toml";
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw UserError(run_dir + ": no such run directory");
  if (!fs::exists(file, ec)) throw UserError(run_dir + ": not a run directory (it holds no recipe.toml)");
  Recipe r = value_or_throw(load_recipe(file.string(), overrides));
  std::ifstream in(file);
  std::string first_line;
  std::getline(in, first_line);
  if (std::string name = resolved_recipe_name(first_line + "\n"); !name.empty()) r.name = name;
  return r;
}

// ---- the run's identity ----

namespace {

constexpr const char* kRunIdentityFile = "run.json";

bool is_run_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// "run 3f2a... (started 2026-11-27T16:06:29Z)"
std::string describe_run(const RunIdentity& r) {
  return absl::StrCat("run ", r.id, r.started.empty() ? "" : " (started " + r.started + ")");
}

// How a run folder's recipe.toml is put back from a checkpoint.
std::string restore_hint(const std::string& checkpoint, const std::string& recipe_file) {
  return absl::StrCat("restore ", recipe_file, " with `seqlab recipe check ", checkpoint, " > ", recipe_file, "`");
}

}  // namespace

RunIdentity new_run_identity() {
  return {random_hex128(), utc_timestamp()};
}

std::optional<RunIdentity> read_run_identity(const std::string& run_dir) {
  const std::string file = (fs::path(run_dir) / kRunIdentityFile).string();
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(file, ec)) return std::nullopt;
    throw UserError(file + ": cannot be read (" + std::strerror(errno) + ")");
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto damaged = [&](const std::string& what) {
    return UserError(absl::StrCat(file, ": damaged (", what, "): it holds the run's identity; remove it to take the ",
                                  "identity its checkpoints record"));
  };
  absl::StatusOr<std::map<std::string, JsonValue>> obj = parse_json_object(text);
  if (!obj.ok()) throw damaged(std::string(obj.status().message()));
  auto id = obj->find("run_id");
  auto started = obj->find("started");
  if (id == obj->end() || !id->second.is_string || !is_run_id(id->second.text)) {
    throw damaged("\"run_id\" must be 32 lowercase hex digits");
  }
  if (started == obj->end() || !started->second.is_string) throw damaged("\"started\" must be a string");
  return RunIdentity{id->second.text, started->second.text};
}

void write_run_identity(const std::string& run_dir, const RunIdentity& identity) {
  ok_or_throw(write_file_atomically((fs::path(run_dir) / kRunIdentityFile).string(),
                                    absl::StrCat("{\"run_id\": ", json_quote(identity.id), ", \"started\": ",
                                                 json_quote(identity.started), "}\n")));
}

std::string checkpoint_flag_file(const std::string& file) {
  std::error_code ec;
  if (!fs::is_directory(file, ec)) return file;
  std::vector<std::string> names;
  for (const fs::path& p : checkpoints(file)) names.push_back(p.string());
  throw UserError(absl::StrCat("--checkpoint expects a checkpoint file, ", file, " is a folder; ",
                               names.empty() ? "it holds no checkpoint (ckpt_*.safetensors)"
                                             : "its checkpoints: " + absl::StrJoin(names, ", ")));
}

RunCheckpoint open_run_checkpoint(const std::string& run_dir, const std::string& checkpoint_file,
                                  const std::vector<std::string>& overrides, bool tensors, bool check_recipe_file) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw UserError(run_dir + ": no such run directory");
  const std::string recipe_file = (fs::path(run_dir) / "recipe.toml").string();
  const bool has_recipe_file = fs::exists(recipe_file, ec);
  if (checkpoint_file.empty() && checkpoints(run_dir).empty() && !has_recipe_file) {
    throw UserError(run_dir + ": not a run directory (it holds no recipe.toml)");
  }
  const std::string file = checkpoint_file.empty() ? newest_checkpoint(run_dir) : checkpoint_flag_file(checkpoint_file);
  RunCheckpoint out;
  out.checkpoint = tensors ? read_checkpoint(file) : read_checkpoint_metadata(file);
  const Checkpoint& c = out.checkpoint;

  // The run's identity: run.json's, else (the file lost, or a run from before identities) that of its
  // newest checkpoint; the checkpoint must not be another run's.
  std::optional<RunIdentity> folder = read_run_identity(run_dir);
  std::string folder_source = (fs::path(run_dir) / kRunIdentityFile).string();
  if (!folder && !c.run.empty()) {
    const std::vector<fs::path> own = checkpoints(run_dir);
    if (!own.empty() && !fs::equivalent(own.back(), file, ec)) {
      const RunIdentity newest = read_checkpoint_metadata(own.back().string()).run;
      if (!newest.empty()) folder = newest, folder_source = own.back().string();
    }
  }
  if (folder && !c.run.empty() && folder->id != c.run.id) {
    throw UserError(absl::StrCat(checkpoint_file.empty() ? "" : "--checkpoint ", file, " belongs to another run: it is ",
                                 describe_run(c.run), ", ", run_dir, " is ", describe_run(*folder), " (",
                                 folder_source, "); use a checkpoint of ", run_dir));
  }
  if (folder) {
    out.identity = *folder;
  } else if (!c.run.empty()) {
    out.identity = c.run;
  } else {
    out.identity = new_run_identity();
    out.new_identity = true;
  }

  // The recipe: the checkpoint's, which the run trained with. RUN/recipe.toml must say the same.
  if (c.recipe_toml.empty()) {
    // No checkpoint seqlab wrote lacks it; a file that does is not a run's.
    throw UserError(file + ": not a seqlab checkpoint (its metadata holds no recipe)");
  }
  out.recipe = value_or_throw(load_recipe_text(c.recipe_toml, file, overrides));
  if (std::string name = resolved_recipe_name(c.recipe_toml); !name.empty()) out.recipe.name = name;
  out.recipe.source_path = recipe_file;
  if (!check_recipe_file) return out;
  if (!has_recipe_file) {
    throw UserError(absl::StrCat(recipe_file, " is missing: it records the run's recipe, which its checkpoint ", file,
                                 " holds; ", restore_hint(file, recipe_file), ", then run again"));
  }
  absl::StatusOr<Recipe> recorded = load_recipe(recipe_file, overrides);
  if (!recorded.ok()) {
    throw UserError(absl::StrCat(recipe_file, " is damaged (", recorded.status().message(), "); its checkpoint ",
                                 file, " holds the run's recipe: ", restore_hint(file, recipe_file), ", then run again"));
  }
  const std::vector<RecipeDifference> d = recipe_differences(out.recipe, *recorded);
  if (!d.empty()) {
    throw UserError(absl::StrCat(
        recipe_file, " differs from the recipe of the run's checkpoint ", file, ": ", d[0].key, " = ", d[0].b,
        " in recipe.toml, ", d[0].a, " in the checkpoint",
        d.size() > 1 ? absl::StrCat(" (and ", d.size() - 1, " other key", d.size() > 2 ? "s" : "", ")") : "",
        "; the checkpoint's recipe is what the run trained with: to change ", d[0].key, " give --set ", d[0].key, "=",
        d[0].b, ", or ", restore_hint(file, recipe_file)));
  }
  return out;
}

void truncate_logs_after(const std::string& run_dir, int64_t step) {
  filter_lines(fs::path(run_dir) / "metrics.jsonl", [&](const std::string& line) {
    int64_t s = -1;
    size_t at = line.find("\"step\": ");
    if (at != std::string::npos && !absl::SimpleAtoi(line.substr(at + 8, line.find(',', at) - at - 8), &s)) s = -1;
    return s >= 0 && s <= step;
  });
  bool keeping = true;  // samples.txt: blocks headed "### step N ..."
  filter_lines(fs::path(run_dir) / "samples.txt", [&](const std::string& line) {
    int64_t s;
    if (absl::StartsWith(line, "### step ") &&
        absl::SimpleAtoi(line.substr(9, line.find(' ', 9) == std::string::npos ? std::string::npos
                                                                                 : line.find(' ', 9) - 9),
                         &s)) {
      keeping = s <= step;
    }
    return keeping;
  });
}

}  // namespace seqlab::cli
