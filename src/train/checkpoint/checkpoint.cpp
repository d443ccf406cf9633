#include "train/checkpoint/checkpoint.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tensor/kernels.h"
#include "train/cli/util.h"

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
    if (absl::StartsWith(n, "ckpt_") && absl::EndsWith(n, ".safetensors")) out.push_back(e.path());
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

// Rewrites `file` keeping the lines `keep(line)` accepts; temporary name, then rename.
template <class Keep>
void filter_lines(const fs::path& file, Keep keep) {
  std::ifstream in(file);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: a line cut short by a kill
    if (keep(line)) kept += line + "\n";
  }
  fs::path tmp = file;
  tmp += ".tmp";
  std::ofstream(tmp, std::ios::trunc) << kept;
  fs::rename(tmp, file);
}

}  // namespace

std::string checkpoint_name(int64_t step) { return absl::StrFormat("ckpt_%07d.safetensors", step); }

std::string newest_checkpoint(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw UserError(run_dir + ": no such run directory");
  std::vector<fs::path> all = checkpoints(run_dir);
  if (all.empty()) throw UserError(run_dir + ": no checkpoint (ckpt_*.safetensors) in that folder");
  return all.back().string();
}

void save_checkpoint(const std::string& run_dir, int64_t step, LanguageModel& model, const Optimizer& optimizer,
                     const LoaderState& loader, const Recipe& recipe, int64_t keep) {
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
                                             {"recipe", resolved_recipe_toml(recipe)}};
  ok_or_throw(write_safetensors((fs::path(run_dir) / checkpoint_name(step)).string(), tensors, meta));
  std::vector<fs::path> all = checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove(all[i]);
}

Checkpoint read_checkpoint(const std::string& file) {
  Checkpoint c;
  c.file = file;
  c.contents = value_or_throw(read_safetensors(file));
  const auto& meta = c.contents.metadata;
  const std::string format = meta_text(meta, "format");
  if (format != kCheckpointFormat && format != kCheckpointFormatBeforeBlocks) {
    throw UserError(file + ": not a seqlab checkpoint (metadata 'format' is \"" + format + "\", not \"" +
                    kCheckpointFormat + "\" or \"" + kCheckpointFormatBeforeBlocks + "\")");
  }
  if (format == kCheckpointFormatBeforeBlocks) {
    std::map<std::string, Tensor> renamed;
    for (auto& [name, t] : c.contents.tensors) renamed.emplace(current_tensor_name(name), std::move(t));
    c.contents.tensors = std::move(renamed);
  }
  c.step = meta_int(meta, "step", file);
  c.vocab_size = meta_int(meta, "vocab_size", file);
  c.loader = {meta_int(meta, "loader_epoch", file), meta_int(meta, "loader_position", file)};
  c.dropout_rng = meta_text(meta, "dropout_rng");
  c.recipe_toml = meta_text(meta, "recipe");
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
  return value_or_throw(load_recipe(file.string(), overrides));
}

void truncate_logs_after(const std::string& run_dir, int64_t step) {
  filter_lines(fs::path(run_dir) / "metrics.jsonl", [&](const std::string& line) {
    int64_t s = -1;
    size_t at = line.find("\"step\": ");
    if (at != std::string::npos) absl::SimpleAtoi(line.substr(at + 8, line.find(',', at) - at - 8), &s);
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
