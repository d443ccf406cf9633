#include "train/checkpoint/checkpoint.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "layers/model/gpt.h"
#include "layers/model/recurrent_lm.h"
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

std::unique_ptr<LanguageModel> build_model(const Recipe& r, int64_t vocab_size) {
  const RecipeModel& m = r.model;
  const std::string& file = r.source_path;
  const int64_t vocab = m.vocab_size > 0 ? m.vocab_size : vocab_size;
  if (vocab < vocab_size) {
    throw UserError(absl::StrFormat("%s: model.vocab_size = %d is smaller than the data's vocabulary (%d ids)", file,
                                    m.vocab_size, vocab_size));
  }
  // Its own stream, apart from the initialisation's (which draws from the raw seed).
  const uint64_t dropout_seed = static_cast<uint64_t>(r.train.seed) ^ 0x9e3779b97f4a7c15ULL;
  Generator init(static_cast<uint64_t>(r.train.seed));
  try {
    if (m.mixer != "attention") {
      RecurrentLmConfig c;
      c.vocab_size = vocab;
      c.n_layers = m.n_layers;
      c.d_ff = m.d_ff;
      c.mixer = parse_mixer_kind(m.mixer);
      c.mixer_config.d_model = m.d_model;
      c.mixer_config.n_heads = m.n_heads;
      c.mixer_config.chunk = m.chunk_size;
      c.mixer_config.gate_rank = m.gate_rank;
      c.mixer_config.gate_temperature = m.gate_temperature;
      c.mixer_config.conv_size = m.conv_size;
      c.mixer_config.feature_map = m.feature_map;
      c.mixer_config.feature_count = m.feature_count;
      c.mixer_config.norm_eps = m.norm_eps;
      c.mixer_config.init_std = m.init_std;
      c.dropout = m.dropout;
      c.dropout_seed = dropout_seed;
      return std::make_unique<RecurrentLm>(c, init);
    }
    if (!m.tie_embeddings) throw UserError(file + ": model.tie_embeddings = false is not supported by gpt yet");
    GptConfig c;
    c.vocab_size = vocab;
    c.d_model = m.d_model;
    c.n_layers = m.n_layers;
    c.n_heads = m.n_heads;
    c.n_kv_heads = m.resolved_n_kv_heads();
    c.d_ff = m.resolved_d_ff();
    c.max_seq_len = r.train.seq_len;
    c.positions = m.positions == "rope"   ? PositionKind::rope
                  : m.positions == "none" ? PositionKind::none
                                          : PositionKind::learned;
    c.rope_base = m.rope_base;
    c.dropout = m.dropout;
    c.dropout_seed = dropout_seed;
    c.norm = m.norm == "rmsnorm" ? NormKind::rms_norm : NormKind::layer_norm;
    c.norm_eps = m.norm_eps;
    c.swiglu = m.mlp == "swiglu";
    c.bias = m.bias;
    c.init_std = m.init_std;
    return std::make_unique<Gpt>(c, init);
  } catch (const std::invalid_argument& e) {
    throw UserError(file + ": " + e.what());
  }
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
                     const LoaderState& loader, const Recipe& recipe, int64_t keep) {
  // Weights are saved in f32 whatever train.dtype is: a bf16 parameter's f32 master stands for it.
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::map<std::string, Tensor> masters = optimizer.master_weights();
  for (const Parameter& p : model.parameters()) {
    auto master = masters.find(p.name);
    tensors.emplace_back(p.name, master != masters.end() ? master->second : p.tensor->detach());
  }
  for (auto& entry : optimizer.state_tensors()) tensors.push_back(entry);
  std::map<std::string, std::string> meta = {{"format", "seqlab-checkpoint 1"},
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
  if (meta_text(meta, "format") != "seqlab-checkpoint 1") {
    throw UserError(file + ": not a seqlab checkpoint (metadata 'format' is not \"seqlab-checkpoint 1\")");
  }
  c.step = meta_int(meta, "step", file);
  c.vocab_size = meta_int(meta, "vocab_size", file);
  c.loader = {meta_int(meta, "loader_epoch", file), meta_int(meta, "loader_position", file)};
  c.dropout_rng = meta_text(meta, "dropout_rng");
  c.recipe_toml = meta_text(meta, "recipe");
  return c;
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
