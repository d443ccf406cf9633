// The training run. Every step is Trainer::step (trainer.h: grad_accum micro-batches forward and
// backward, gradient scaling and clipping, one optimiser step at the schedule's learning rate). Around
// it, at their intervals: a metrics line (metrics.jsonl), evaluation on held-out batches, a text sample
// (samples.txt), a checkpoint. SIGINT and SIGTERM end the run after the current step with a checkpoint.
#include "train/loop/training_run.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "train/cli/util.h"
#include "train/checkpoint/checkpoint.h"
#include "train/data/loader.h"
#include "train/data/prepare.h"
#include "train/data/synthetic.h"
#include "train/data/tokenizer.h"
#include "train/loop/progress.h"
#include "train/loop/sampling.h"
#include "train/loop/trainer.h"
#include "train/optim/optim.h"
#include "train/optim/schedule.h"
#include "train/recipe/configs.h"
#include "train/recipe/recipe.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

// ---- signals: the handler only records the signal; the loop checkpoints between steps ----

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal) {
  g_stop_signal = signal;
  std::signal(signal, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// Installs the handler for SIGINT and SIGTERM while alive; restores the previous ones after.
class StopSignals {
 public:
  explicit StopSignals(bool enabled) : enabled_(enabled) {
    g_stop_signal = 0;
    if (!enabled_) return;
    previous_int_ = std::signal(SIGINT, record_stop_signal);
    previous_term_ = std::signal(SIGTERM, record_stop_signal);
  }
  ~StopSignals() {
    if (!enabled_) return;
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }
  int received() const { return g_stop_signal; }

 private:
  bool enabled_;
  void (*previous_int_)(int) = SIG_DFL;
  void (*previous_term_)(int) = SIG_DFL;
};

// ---- data: a prepared corpus or a synthetic task ----

struct Data {
  std::unique_ptr<BatchSource> train;
  std::unique_ptr<BatchSource> val;  // for synthetic tasks, the train source's own evaluation stream
  int64_t vocab_size = 0;
  int64_t eval_batches = 0;
  std::unique_ptr<TokenDecoder> tokenizer;  // text data only: decodes samples
  std::vector<int32_t> sample_prompt;       // end-of-text, then log.sample_prompt's ids
  bool synthetic = false;
  std::string description;
};

Data open_data(const Recipe& r) {
  Data d;
  if (r.data.source != "text" && r.data.source != "shards") {
    const SyntheticConfig c = synthetic_config(r);
    if (absl::Status s = validate(c); !s.ok()) throw UserError(absl::StrCat(r.source_path, ": data: ", s.message()));
    auto source = std::make_unique<SyntheticSource>(
        value_or_throw(SyntheticSource::create(c, static_cast<uint64_t>(r.train.seed))));
    d.val = std::make_unique<SyntheticSource>(*source);
    d.train = std::move(source);
    d.vocab_size = c.vocab_size;
    d.eval_batches = r.log.eval_batches;
    d.synthetic = true;
    d.description = absl::StrCat("synthetic task ", r.data.source);
    return d;
  }
  std::string dir = r.data.path;
  DatasetInfo info;
  if (r.data.source == "text") {
    info = value_or_throw(prepare_cached(prepare_options(r), r.data.cache_dir));
    dir = info.dir;
  } else {
    info = value_or_throw(open_shard_folder(dir, r.data.vocab_size, r.data.tokenizer_path));
  }
  d.vocab_size = info.vocab_size;
  d.tokenizer = value_or_throw(open_decoder(info));
  absl::StatusOr<std::vector<int32_t>> prompt = sample_prompt_ids(*d.tokenizer, r.log.sample_prompt);
  if (!prompt.ok()) throw UserError(absl::StrCat(r.source_path, ": log.sample_prompt: ", prompt.status().message()));
  d.sample_prompt = std::move(*prompt);
  LoaderOptions lo = loader_options(r);
  lo.vocab_size = info.vocab_size;  // every id of every shard is checked against it as the shards open
  auto train = std::make_unique<TokenLoader>(value_or_throw(TokenLoader::open_split(dir, "train", lo)));
  lo.shuffle = false;
  auto val = std::make_unique<TokenLoader>(value_or_throw(TokenLoader::open_split(dir, "val", lo)));
  d.eval_batches = std::min(r.log.eval_batches, val->eval_batches(r.train.batch_size));
  if (d.eval_batches < 1) {
    throw UserError(absl::StrFormat("%s: the val split holds fewer than %d sequences of %d tokens (one batch)", dir,
                                    r.train.batch_size, r.train.seq_len + 1));
  }
  d.description = absl::StrFormat("%d train tokens in %s", train->num_tokens(), dir);
  if (info.source_format == "llm.c") {
    absl::StrAppend(&d.description, absl::StrFormat(
        " (llm.c shards: vocabulary %d, samples %s)", info.vocab_size,
        info.tokenizer == "ids" ? std::string("as token ids") : "decoded by " + info.tokenizer_path));
  }
  d.train = std::move(train);
  d.val = std::move(val);
  return d;
}

// ---- the device ----

// train.device: "cpu"; "cuda" (an error without a usable GPU); "auto": the first GPU if one is usable.
Device training_device(const Recipe& r) {
  if (r.train.device == "cpu") return cpu_device();
  if (cuda_available()) return cuda_device(0);
  if (r.train.device == "cuda") {
    throw UserError(r.source_path + ": train.device = \"cuda\" but no GPU is usable here (no CUDA device, or a " +
                    "build without the CUDA backend: ./train --version says which); use \"auto\" or \"cpu\"");
  }
  return cpu_device();
}

// Moves the model to `wanted` in the training dtype and checks, with one forward and backward on a
// tiny batch in evaluation mode (no dropout draws, gradients cleared after), that every kernel it
// needs exists there. Where one does not: an error for train.device = "cuda", the CPU for "auto"
// (said on stderr).
Device place_model(LanguageModel& model, const Recipe& r, Device wanted) {
  const DType dtype = training_dtype(r);
  model.to(wanted, dtype);
  if (wanted == cpu_device()) return wanted;
  try {
    model.set_training(false);
    const int64_t T = std::min<int64_t>(8, r.train.seq_len);
    Tensor ids = Tensor::zeros({1, T}, DType::i64, wanted);
    backward(model.loss({ids, ids}));
    model.zero_grad();
    model.set_training(true);
    return wanted;
  } catch (const std::runtime_error& e) {
    if (r.train.device == "cuda") {
      throw UserError(r.source_path + ": train.device = \"cuda\": this model cannot run on the GPU yet (" + e.what() + ")");
    }
    std::cerr << "seqlab: training on the CPU: the model cannot run on " << wanted.str() << " yet (" << e.what()
              << ")\n";
    model.to(cpu_device(), dtype);
    model.zero_grad();
    model.set_training(true);
    return cpu_device();
  }
}

// ---- evaluation and sampling ----

struct Evaluation {
  double loss = 0;
  std::optional<double> accuracy;  // synthetic tasks
};

Evaluation evaluate(LanguageModel& model, const Data& data, int64_t batch_size, Device device) {
  NoGradGuard no_grad;
  model.set_training(false);
  double total = 0;
  AccuracyCount count;
  for (int64_t i = 0; i < data.eval_batches; ++i) {
    Batch b = data.val->eval_batch(i, batch_size).to(device);
    Tensor logits = model.logits(b);
    total += model.loss_from_logits(b, logits).item();
    if (data.synthetic) {
      AccuracyCount c = count_correct(logits, ignore_past_lengths(b.scored_targets(), b.scored_lengths()));
      count.correct += c.correct;
      count.scored += c.scored;
    }
  }
  model.set_training(true);
  Evaluation e;
  e.loss = total / static_cast<double>(data.eval_batches);
  if (data.synthetic) e.accuracy = count.fraction();
  return e;
}

// The text of one sample: the recipe's prompt (after end-of-text, as documents start) continued.
std::string sample_text(LanguageModel& model, const Data& data, const RecipeLog& log, uint64_t seed) {
  SamplingOptions o;
  o.tokens = log.sample_tokens;
  o.temperature = log.sample_temperature;
  o.suppressed = non_text_ids(*data.tokenizer, model.vocab_size());
  Generator gen(seed);
  return decode_sample(*data.tokenizer, data.sample_prompt, generate(model, data.sample_prompt, o, gen));
}

std::string one_line(const std::string& text, size_t max_chars) {
  std::string flat = absl::StrReplaceAll(text, {{"\n", " ⏎ "}, {"\t", " "}});
  return flat.size() > max_chars ? flat.substr(0, max_chars) + " …" : flat;
}

// ---- the command ----

struct Invocation {
  Recipe recipe;
  fs::path run_dir;
  bool resume = false;
};

Invocation parse_invocation(const std::vector<std::string>& args) {
  Flags f(args, "", {"--set", "--out", "--resume"}, {}, {"--set"}, 1);
  const std::vector<std::string> sets = f.all("--set");
  Invocation inv;
  inv.resume = f.has("--resume");
  if (f.positional().empty() && !inv.resume) throw UserError("expected a recipe (RECIPE.toml) or --resume RUN_DIR");
  if (inv.resume && f.has("--out")) throw UserError("--out and --resume both name the run directory: give one");
  if (!f.positional().empty()) {
    inv.recipe = value_or_throw(load_recipe(f.positional()[0], sets));
  } else {
    inv.recipe = load_run_recipe(f.get("--resume"), sets);
  }
  inv.run_dir = inv.resume ? fs::path(f.get("--resume")) : fs::path(f.get("--out", inv.recipe.run_dir()));
  if (!inv.resume) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(inv.run_dir, ec)) {
      if (e.path().extension() == ".safetensors") {
        throw UserError(absl::StrCat(inv.run_dir.string(), " already holds checkpoints of an earlier run: continue it with --resume ",
                                     inv.run_dir.string(), ", or train into another folder with --out DIR"));
      }
    }
  }
  return inv;
}

int train(const std::vector<std::string>& args) {
  Invocation inv = parse_invocation(args);
  const Recipe& r = inv.recipe;
  const Device wanted_device = training_device(r);
  if (r.parallel.threads > 0) omp_set_num_threads(static_cast<int>(r.parallel.threads));
  const std::string run = inv.run_dir.string();

  Data data = open_data(r);
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(r, data.vocab_size));
  const Device device = place_model(*model, r, wanted_device);  // before the optimiser
  if (device.is_cpu() && training_dtype(r) == DType::bf16) {
    std::cerr << "seqlab: train.dtype = \"bf16\" on the CPU is emulated in f32 (a reference for the GPU's "
                 "rounding), slower than f32\n";
  }
  const OptimConfig oc = optim_config(r);
  ok_or_throw(validate(oc));
  Optimizer opt(oc, model->parameters());
  Trainer trainer(*model, opt, lr_schedule(r), trainer_options(r));

  int64_t start = 0;
  if (inv.resume) {
    Checkpoint c = read_checkpoint(newest_checkpoint(run));
    restore_weights(c, *model);
    ok_or_throw(opt.load_state(c.contents.tensors));
    ok_or_throw(data.train->restore(c.loader));
    start = c.step;
    if (start > r.train.steps) {
      throw UserError(absl::StrFormat("%s: its checkpoint is at step %d, past train.steps = %d", c.file, start,
                                      r.train.steps));
    }
  }
  fs::create_directories(inv.run_dir);
  ok_or_throw(write_resolved_recipe(r, run));
  if (start > 0) truncate_logs_after(run, start);
  std::ofstream metrics(inv.run_dir / "metrics.jsonl", start > 0 ? std::ios::app : std::ios::trunc);
  std::ofstream samples;
  const bool sampling = r.log.sample_every > 0 && data.tokenizer != nullptr;
  if (sampling) samples.open(inv.run_dir / "samples.txt", start > 0 ? std::ios::app : std::ios::trunc);

  const bool bar = r.log.progress == "bar" || (r.log.progress == "auto" && ::isatty(STDOUT_FILENO));
  const double flops_per_token = 6.0 * static_cast<double>(model->num_parameters()) +
                                 model->mixing_flops_per_token(r.train.seq_len);
  Progress progress(bar, r.log.every, r.train.steps, flops_per_token, measured_peak_flops(device, training_dtype(r)));
  progress.line(absl::StrFormat("seqlab: %s: %d parameters; %s; run directory %s%s", r.name,
                                model->num_parameters(), data.description, run,
                                start > 0 ? absl::StrFormat(" (resumed at step %d)", start) : ""));
  if (start == r.train.steps) {
    progress.line(absl::StrFormat("the run is already complete (train.steps = %d)", r.train.steps));
    return 0;
  }

  StopSignals signals(r.checkpoint.save_on_signal);
  model->set_training(true);
  const int64_t tokens_per_step = r.train.grad_accum * r.train.batch_size * r.train.seq_len;
  int64_t tokens_since_log = 0;
  double seconds_since_log = 0;
  Evaluation last_eval;
  for (int64_t step = start; step < r.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult result = trainer.step(step, [&] { return data.train->next_batch(r.train.batch_size); });
    const double loss = result.loss, lr = result.lr, norm = result.grad_norm;
    if (!std::isfinite(loss)) throw UserError(absl::StrFormat("training diverged: loss %g at step %d", loss, step + 1));

    const int64_t done = step + 1;
    tokens_since_log += tokens_per_step;
    seconds_since_log += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.step(done, loss, lr, tokens_per_step);
    if (step == start) progress.raise_peak(measured_peak_flops(device, training_dtype(r)));  // once more, now warm
    const bool last = done == r.train.steps;
    const bool eval_now = done % r.log.eval_every == 0 || last;
    if (done % r.log.every == 0 || eval_now) {
      std::string line = absl::StrFormat(
          "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.4f, \"tokens_per_s\": %.1f, \"mfu\": %.4f, "
          "\"elapsed_s\": %.1f",
          done, loss, lr, norm, static_cast<double>(tokens_since_log) / seconds_since_log, progress.mfu(),
          progress.elapsed_s());
      tokens_since_log = 0;
      seconds_since_log = 0;
      if (eval_now) {
        last_eval = evaluate(*model, data, r.train.batch_size, device);
        const double v = last_eval.loss;
        line += absl::StrFormat(", \"val_loss\": %.6f, \"val_ppl\": %.4f", v, std::exp(v));
        std::string shown = absl::StrFormat("step %d: val_loss %.4f  val_ppl %.2f", done, v, std::exp(v));
        if (data.tokenizer && data.tokenizer->name() == "byte") {
          line += absl::StrFormat(", \"val_bpb\": %.5f", v / std::log(2.0));
          shown += absl::StrFormat("  bits/byte %.4f", v / std::log(2.0));
        }
        if (last_eval.accuracy) {
          line += absl::StrFormat(", \"val_acc\": %.5f", *last_eval.accuracy);
          shown += absl::StrFormat("  accuracy %.2f%%", 100.0 * *last_eval.accuracy);
        }
        progress.line(shown);
      }
      metrics << line << "}\n" << std::flush;
    }
    if (sampling && (done % r.log.sample_every == 0 || last)) {
      const std::string text = sample_text(*model, data, r.log, static_cast<uint64_t>(r.train.seed) + done);
      samples << absl::StrFormat("### step %d (temperature %g)\n%s\n\n", done, r.log.sample_temperature, text)
              << std::flush;
      progress.line(absl::StrFormat("step %d sample: %s", done, one_line(text, 160)));
    }
    const bool stopping = signals.received() != 0;
    if ((r.checkpoint.every > 0 && done % r.checkpoint.every == 0) || last || stopping) {
      save_checkpoint(run, done, *model, opt, data.train->state(), r, r.checkpoint.keep);
    }
    if (stopping) {
      progress.line(absl::StrFormat("%s: stopped after step %d, checkpoint %s saved; continue with --resume %s",
                                    strsignal(signals.received()), done, checkpoint_name(done), run));
      return 128 + signals.received();
    }
  }
  progress.finish();
  std::string summary = absl::StrFormat("done: %d steps in %s; val_loss %.4f", r.train.steps,
                                        format_duration(progress.elapsed_s()), last_eval.loss);
  if (last_eval.accuracy) summary += absl::StrFormat(", accuracy %.2f%%", 100.0 * *last_eval.accuracy);
  progress.line(summary + absl::StrFormat("; metrics, samples and checkpoints in %s", run));
  return 0;
}

}  // namespace

int train_command(const std::vector<std::string>& args) {
  int code = 0;
  int guarded = run_guarded("train", [&] { code = train(args); });
  return guarded != 0 ? guarded : code;
}

}  // namespace seqlab::cli
