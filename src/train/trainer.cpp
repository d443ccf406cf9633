// The training loop. One run directory holds recipe.toml (the resolved recipe), metrics.jsonl (one
// JSON object per logged step: step, loss, lr, grad_norm, tokens_per_s; plus val_loss, val_ppl and
// val_bpb on evaluation steps) and checkpoints (ckpt_NNNNNNN.safetensors: weights under their dotted
// names, optimiser state under optim.*, the loader position and step in the metadata).
#include "train/trainer.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "autograd/variable.h"
#include "layers/gpt.h"
#include "tensor/kernels.h"
#include "train/cli.h"
#include "train/loader.h"
#include "train/optim.h"
#include "train/prepare.h"
#include "train/recipe.h"
#include "train/safetensors.h"
#include "train/schedule.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

template <class T>
T value_or_throw(absl::StatusOr<T> v) {
  if (!v.ok()) throw UserError(std::string(v.status().message()));
  return std::move(*v);
}

void ok_or_throw(const absl::Status& s) {
  if (!s.ok()) throw UserError(std::string(s.message()));
}

GptConfig gpt_config(const Recipe& r, int64_t vocab_size) {
  const RecipeModel& m = r.model;
  if (m.positions == "rope") throw UserError(r.source_path + ": model.positions = \"rope\" is not supported by gpt yet");
  if (!m.tie_embeddings) throw UserError(r.source_path + ": model.tie_embeddings = false is not supported by gpt yet");
  if (m.dropout > 0) throw UserError(r.source_path + ": model.dropout > 0 is not supported by gpt yet");
  GptConfig c;
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : vocab_size;
  c.d_model = m.d_model;
  c.n_layers = m.n_layers;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.resolved_n_kv_heads();
  c.d_ff = m.resolved_d_ff();
  c.max_seq_len = r.train.seq_len;
  c.learned_positions = m.positions == "learned";
  c.norm = m.norm == "rmsnorm" ? NormKind::rms_norm : NormKind::layer_norm;
  c.norm_eps = m.norm_eps;
  c.swiglu = m.mlp == "swiglu";
  c.bias = m.bias;
  c.init_std = m.init_std;
  return c;
}

OptimConfig optim_config(const RecipeOptim& o) {
  OptimConfig c;
  c.name = o.name;
  c.lr = o.lr;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.weight_decay = o.weight_decay;
  c.momentum = o.momentum;
  c.nesterov = o.nesterov;
  c.grad_clip = o.grad_clip;
  c.decay_biases = o.decay_biases;
  c.decay_norms = o.decay_norms;
  c.decay_embeddings = o.decay_embeddings;
  return c;
}

std::string checkpoint_name(int64_t step) { return absl::StrFormat("ckpt_%07d.safetensors", step); }

// Checkpoints in the run directory, oldest first.
std::vector<fs::path> checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (absl::StartsWith(n, "ckpt_") && absl::EndsWith(n, ".safetensors")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void save_checkpoint(const fs::path& dir, int64_t step, Gpt& model, const Optimizer& opt, const LoaderState& loader,
                     int64_t keep) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Parameter& p : model.parameters()) tensors.emplace_back(p.name, p.tensor->detach());
  for (auto& entry : opt.state_tensors()) tensors.push_back(entry);
  std::map<std::string, std::string> meta = {{"step", std::to_string(step)},
                                             {"loader_epoch", std::to_string(loader.epoch)},
                                             {"loader_position", std::to_string(loader.position)}};
  ok_or_throw(write_safetensors((dir / checkpoint_name(step)).string(), tensors, meta));
  std::vector<fs::path> all = checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove(all[i]);
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& file) {
  int64_t v;
  auto it = meta.find(key);
  if (it == meta.end() || !absl::SimpleAtoi(it->second, &v)) {
    throw UserError(file + ": checkpoint metadata lacks a valid '" + key + "'");
  }
  return v;
}

// Restores weights, optimiser and loader from the newest checkpoint; returns the step it was taken at.
int64_t load_checkpoint(const fs::path& run, Gpt& model, Optimizer& opt, BatchSource& loader) {
  std::vector<fs::path> all = checkpoints(run);
  if (all.empty()) throw UserError("--resume " + run.string() + ": no checkpoint in that folder");
  const std::string file = all.back().string();
  SafetensorsContents c = value_or_throw(read_safetensors(file));
  for (const Parameter& p : model.parameters()) {
    auto it = c.tensors.find(p.name);
    if (it == c.tensors.end()) throw UserError(file + ": no weight named " + p.name);
    if (it->second.shape() != p.tensor->shape() || it->second.dtype() != p.tensor->dtype()) {
      throw UserError(file + ": " + p.name + " is " + shape_str(it->second.shape()) + ", the model expects " +
                      shape_str(p.tensor->shape()));
    }
    kernel::copy_(*p.tensor, it->second);
  }
  ok_or_throw(opt.load_state(c.tensors));
  LoaderState s{meta_int(c.metadata, "loader_epoch", file), meta_int(c.metadata, "loader_position", file)};
  ok_or_throw(loader.restore(s));
  return meta_int(c.metadata, "step", file);
}

// On resume: drops the metrics logged after the checkpoint, which the resumed run logs again.
void keep_metrics_up_to(const fs::path& file, int64_t step) {
  std::ifstream in(file);
  std::string kept, line;
  while (std::getline(in, line)) {
    int64_t s = -1;
    size_t at = line.find("\"step\": ");
    if (at != std::string::npos) absl::SimpleAtoi(line.substr(at + 8, line.find(',', at) - at - 8), &s);
    if (s >= 0 && s <= step) kept += line + "\n";
  }
  fs::path tmp = file;
  tmp += ".tmp";
  std::ofstream(tmp, std::ios::trunc) << kept;
  fs::rename(tmp, file);
}

double evaluate(Gpt& model, const BatchSource& val, int64_t batches, int64_t batch_size) {
  NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = val.eval_batch(i, batch_size);
    total += model.loss(b.inputs, b.targets).item();
  }
  return total / static_cast<double>(batches);
}

int run(const std::string& recipe_path, const std::vector<std::string>& args) {
  std::vector<std::string> overrides;
  std::string out_dir, resume;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() {
      if (i + 1 >= args.size()) throw UserError(a + " needs a value");
      return args[++i];
    };
    if (a == "--set") {
      overrides.push_back(value());
    } else if (absl::StartsWith(a, "--set=")) {
      overrides.push_back(a.substr(6));
    } else if (a == "--out") {
      out_dir = value();
    } else if (a == "--resume") {
      resume = value();
    } else {
      throw UserError("unknown argument '" + a + "' (expected --set, --out or --resume)");
    }
  }
  Recipe r = value_or_throw(load_recipe(recipe_path, overrides));
  if (r.model.arch != "gpt") throw UserError(recipe_path + ": model.arch = \"" + r.model.arch + "\" is not trainable yet");
  if (r.data.source != "text" && r.data.source != "shards") {
    throw UserError(recipe_path + ": data.source = \"" + r.data.source + "\" is not supported by the trainer yet");
  }
  if (r.train.device == "cuda") throw UserError(recipe_path + ": train.device = \"cuda\" is not supported by the trainer yet");
  if (r.parallel.threads > 0) omp_set_num_threads(static_cast<int>(r.parallel.threads));
  fs::path run = !resume.empty() ? fs::path(resume) : fs::path(out_dir.empty() ? r.run_dir() : out_dir);

  // Data: prepared shards (cached by content) or a folder of shards.
  std::string data_dir = r.data.path;
  int64_t vocab = 0;
  if (r.data.source == "text") {
    PrepareOptions p;
    p.source.path = r.data.path;
    p.source.format = value_or_throw(parse_doc_format(r.data.format));
    p.source.json_field = r.data.jsonl_field;
    p.tokenizer = r.data.tokenizer;
    p.tokenizer_path = r.data.tokenizer_path;
    p.val_fraction = r.data.val_fraction;
    p.seed = static_cast<uint64_t>(r.train.seed);
    DatasetInfo info = value_or_throw(prepare_cached(p, r.data.cache_dir));
    data_dir = info.dir;
    vocab = info.vocab_size;
  } else {
    vocab = value_or_throw(read_dataset_info(data_dir)).vocab_size;
  }
  LoaderOptions lo;
  lo.seq_len = r.train.seq_len;
  lo.seed = static_cast<uint64_t>(r.train.seed);
  TokenLoader train = value_or_throw(TokenLoader::open_split(data_dir, "train", lo));
  lo.shuffle = false;
  TokenLoader val = value_or_throw(TokenLoader::open_split(data_dir, "val", lo));
  const int64_t eval_batches = std::min(r.log.eval_batches, val.eval_batches(r.train.batch_size));
  if (eval_batches < 1) throw UserError(data_dir + ": the val split holds less than one batch");

  Generator gen(static_cast<uint64_t>(r.train.seed));
  Gpt model(gpt_config(r, vocab), gen);
  OptimConfig oc = optim_config(r.optim);
  ok_or_throw(validate(oc));
  Optimizer opt(oc, model.parameters());
  LrSchedule schedule{value_or_throw(parse_schedule_kind(r.optim.schedule)), r.optim.lr, r.optim.warmup_steps,
                      r.train.steps, r.optim.min_lr_ratio};

  int64_t start = 0;
  fs::create_directories(run);
  if (!resume.empty()) start = load_checkpoint(run, model, opt, train);
  ok_or_throw(write_resolved_recipe(r, run.string()));
  if (start > 0) keep_metrics_up_to(run / "metrics.jsonl", start);
  std::ofstream metrics(run / "metrics.jsonl", start > 0 ? std::ios::app : std::ios::trunc);
  std::cout << absl::StrFormat("seqlab: %s, %d parameters, %d train tokens, run directory %s%s\n", r.name,
                               model.num_parameters(), train.num_tokens(), run.string(),
                               start > 0 ? absl::StrFormat(" (resumed at step %d)", start) : "");

  const bool bytes = r.data.tokenizer == "byte";
  auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_since = 0;
  for (int64_t step = start; step < r.train.steps; ++step) {
    double loss_sum = 0;
    for (int64_t micro = 0; micro < r.train.grad_accum; ++micro) {
      Batch b = train.next_batch(r.train.batch_size);
      Tensor loss = model.loss(b.inputs, b.targets);
      loss.backward();
      loss_sum += loss.item();
      tokens_since += b.inputs.numel();
    }
    std::vector<Parameter> params = model.parameters();
    if (r.train.grad_accum > 1) scale_grads(params, 1.0 / static_cast<double>(r.train.grad_accum));
    double norm = r.optim.grad_clip > 0 ? clip_grad_norm(params, r.optim.grad_clip) : 0.0;
    const double lr = schedule.lr_at(step);
    opt.step(lr);
    opt.zero_grad();
    const double loss = loss_sum / static_cast<double>(r.train.grad_accum);
    if (!std::isfinite(loss)) throw UserError(absl::StrFormat("training diverged: loss %g at step %d", loss, step + 1));

    const int64_t done = step + 1;
    const bool log_now = done % r.log.every == 0 || done == r.train.steps;
    const bool eval_now = done % r.log.eval_every == 0 || done == r.train.steps;
    if (log_now || eval_now) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string line = absl::StrFormat("{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.4f, "
                                         "\"tokens_per_s\": %.1f",
                                         done, loss, lr, norm, static_cast<double>(tokens_since) / secs);
      std::string shown = absl::StrFormat("step %d/%d  loss %.4f  lr %.2e  %.0f tok/s", done, r.train.steps, loss,
                                          lr, static_cast<double>(tokens_since) / secs);
      if (eval_now) {
        double v = evaluate(model, val, eval_batches, r.train.batch_size);
        line += absl::StrFormat(", \"val_loss\": %.6f, \"val_ppl\": %.4f", v, std::exp(v));
        if (bytes) line += absl::StrFormat(", \"val_bpb\": %.5f", v / std::log(2.0));
        shown += absl::StrFormat("  val_loss %.4f", v);
      }
      metrics << line << "}\n" << std::flush;
      std::cout << shown << "\n" << std::flush;
      t0 = std::chrono::steady_clock::now();
      tokens_since = 0;
    }
    if ((r.checkpoint.every > 0 && done % r.checkpoint.every == 0) || done == r.train.steps) {
      save_checkpoint(run, done, model, opt, train.state(), r.checkpoint.keep);
    }
  }
  return 0;
}

}  // namespace

int train_command(const std::string& recipe_path, const std::vector<std::string>& args) {
  try {
    return run(recipe_path, args);
  } catch (const UserError& e) {
    std::cerr << "seqlab: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    std::cerr << "seqlab: " << e.what() << "\n";
    return kUsageError;
  }
}

}  // namespace seqlab::cli
