// The training run. Every step is Trainer::step (trainer.h: grad_accum micro-batches forward and
// backward, gradient scaling and clipping, one optimiser step at the schedule's learning rate). Around
// it, at their intervals: a metrics line (metrics.jsonl), evaluation on held-out batches, a text sample
// (samples.txt), a checkpoint. SIGINT and SIGTERM end the run after the current step with a checkpoint.
#include "train/loop/training_run.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>
#include <absl/strings/str_split.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "dist/communicator.h"
#include "layers/model/moe.h"
#include "layers/sequence_parallel.h"
#include "tensor/kernels.h"
#include "tensor/profile.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/run_folder.h"
#include "train/common/atomic_file.h"
#include "train/common/errors.h"
#include "train/common/flags.h"
#include "train/common/json.h"
#include "train/data/loader.h"
#include "train/data/documents.h"
#include "train/data/prepare.h"
#include "train/data/synthetic.h"
#include "train/data/tokenizer.h"
#include "train/launch/data_parallel.h"
#include "train/launch/launcher.h"
#include "train/loop/evaluation.h"
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

// ---- sampling ----

// The text of one sample: the recipe's prompt (after end-of-text, as documents start) continued.
// A model whose logits are not finite (weights finite but huge, on a run that skips non-finite steps)
// has no sample: the text says so instead of the NUL bytes it used to draw, and the run goes on.
std::string sample_text(LanguageModel& model, const Data& data, const RecipeLog& log, uint64_t seed) {
  SamplingOptions o;
  o.tokens = log.sample_tokens;
  o.temperature = log.sample_temperature;
  o.suppressed = non_text_ids(*data.tokenizer, model.vocab_size());
  Generator gen(seed);
  try {
    return decode_sample(*data.tokenizer, data.sample_prompt, generate(model, data.sample_prompt, o, gen));
  } catch (const NonFiniteLogits& e) {
    return std::string("(no sample: ") + e.what() + ")";
  }
}

std::string one_line(const std::string& text, size_t max_chars) {
  std::string flat = absl::StrReplaceAll(text, {{"\n", " ⏎ "}, {"\t", " "}});
  return flat.size() > max_chars ? flat.substr(0, max_chars) + " …" : flat;
}

// ---- the run folder's logs ----

// An append-only log of the run folder (metrics.jsonl, samples.txt): every write flushed, and a write
// that fails (the disk full, the folder gone) an error naming the file and the reason. A kill leaves
// at most a last line without its newline, which a resume drops (truncate_logs_after).
class LogFile {
 public:
  LogFile() = default;
  LogFile(const fs::path& path, bool append) : path_(path.string()), f_(std::fopen(path_.c_str(), append ? "ab" : "wb")) {
    if (!f_) throw UserError(absl::StrCat(path_, ": cannot open for writing (", std::strerror(errno), ")"));
  }
  void write(const std::string& text) {
    if (std::fwrite(text.data(), 1, text.size(), f_.get()) != text.size() || std::fflush(f_.get()) != 0) {
      throw UserError(absl::StrCat(path_, ": write failed (", std::strerror(errno), ")"));
    }
  }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> f_;
};

// ---- the command ----

struct Invocation {
  Recipe recipe;
  fs::path run_dir;
  bool resume = false;
  std::string checkpoint;  // --checkpoint FILE (with --resume): instead of the newest
  int nproc = 1;           // --nproc N: N data-parallel rank processes (on each machine)
  int nnodes = 1;          // --nnodes K: machines of the job
  int node_rank = 0;       // --node-rank I: this machine's place among them
  std::string rendezvous;  // --rendezvous DIR: the folder the machines share (with --nnodes)
  int64_t profile_steps = 0;  // --profile N: N steps under the step profile (StepProfile below)
  std::optional<LaunchedRank> launched;  // set in a rank process started by the launcher
  std::optional<RunLock> lock;           // held by the launcher (or the single process), not by its ranks
  // --resume of a run with a checkpoint: the checkpoint (its tensors kept where this process restores
  // them), the recipe it holds and the run's identity (open_run_checkpoint).
  std::optional<RunCheckpoint> resumed;
};

// The keys a recipe given with --resume (`RECIPE --resume RUN`, as the sweep resumes a point) may set
// differently from the run's checkpoint: how long the run goes on and where, how it logs, evaluates and
// checkpoints; none changes what a step computes. Any other key must resolve as the checkpoint's does.
bool may_change_on_resume(const std::string& key) {
  for (const char* prefix : {"parallel.", "log.", "eval.", "checkpoint."}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return key == "train.steps" || key == "train.device";
}

// Reads the command line and takes the run folder's lock: for a fresh run once the recipe names the
// folder, for --resume before the folder's recipe is read (another process may be writing it).
Invocation parse_invocation(const std::vector<std::string>& args) {
  Flags f(args, "",
          {"--set", "--out", "--resume", "--checkpoint", "--nproc", "--nnodes", "--node-rank", "--rendezvous",
           "--profile"},
          {}, {"--set"}, 1);
  const std::vector<std::string> sets = f.all("--set");
  Invocation inv;
  inv.resume = f.has("--resume");
  if (f.positional().empty() && !inv.resume) throw UserError("expected a recipe (RECIPE.toml) or --resume RUN_DIR");
  if (inv.resume && f.has("--out")) throw UserError("--out and --resume both name the run directory: give one");
  if (f.has("--checkpoint") && !inv.resume) {
    throw UserError("--checkpoint FILE goes with --resume RUN_DIR: the checkpoint of RUN_DIR to continue from");
  }
  inv.checkpoint = f.get("--checkpoint");
  inv.profile_steps = f.number<int64_t>("--profile", 0, 1);
  inv.nproc = f.number<int>("--nproc", 1);
  if (inv.nproc < 1) throw UserError("--nproc expects a number of processes, 1 or more, got '" + f.get("--nproc") + "'");
  inv.nnodes = f.number<int>("--nnodes", 1);
  if (inv.nnodes < 1) throw UserError("--nnodes expects a number of machines, 1 or more, got '" + f.get("--nnodes") + "'");
  if (inv.nnodes == 1 && (f.has("--node-rank") || f.has("--rendezvous"))) {
    throw UserError("--node-rank and --rendezvous go with --nnodes K, a job on K ≥ 2 machines");
  }
  inv.node_rank = f.number<int>("--node-rank", 0);
  if (inv.node_rank < 0 || inv.node_rank >= inv.nnodes) {
    throw UserError(absl::StrFormat("--node-rank %s is not a machine of --nnodes %d (0 to %d)", f.get("--node-rank"),
                                    inv.nnodes, inv.nnodes - 1));
  }
  inv.rendezvous = f.get("--rendezvous");
  if (inv.nnodes > 1 && inv.rendezvous.empty()) {
    throw UserError("--nnodes needs --rendezvous DIR: a folder every machine of the job shares, fresh for each job");
  }
  open_rendezvous(inv.rendezvous, false);  // the address's form, before any work
  inv.launched = launched_rank();
  if (inv.launched && inv.launched->world != inv.nproc * inv.nnodes) {
    throw UserError(absl::StrFormat("this rank was started for %d ranks (SEQLAB_WORLD_SIZE) but --nproc %d × --nnodes %d is %d",
                                    inv.launched->world, inv.nproc, inv.nnodes, inv.nproc * inv.nnodes));
  }
  // Across machines the launcher of machine 0 holds the run folder's lock: the others write nothing there.
  const bool lock = !inv.launched && inv.node_rank == 0;
  if (inv.resume) {
    inv.run_dir = f.get("--resume");
    const std::string run = inv.run_dir.string();
    std::error_code ec;
    if (!fs::is_directory(inv.run_dir, ec)) throw UserError(run + ": no such run directory");
    if (lock) inv.lock.emplace(RunLock::acquire(run));
    // The recipe a run continues with is the one its checkpoint holds (a launcher of several ranks reads
    // only the metadata: the ranks restore the tensors).
    const bool restores = inv.launched || inv.nproc * inv.nnodes == 1;
    const bool given = !f.positional().empty();
    inv.resumed = open_run_checkpoint(run, inv.checkpoint, given ? std::vector<std::string>{} : sets, restores,
                                      /*check_recipe_file=*/!given);
    inv.recipe = inv.resumed->recipe;
    if (given) {
      // `RECIPE --resume RUN`: the given recipe, if it is the run's but for the keys a resume may change.
      const std::string file = f.positional()[0];
      Recipe recipe = value_or_throw(load_recipe(file, sets));
      std::vector<RecipeDifference> d;
      for (RecipeDifference& x : recipe_differences(inv.resumed->recipe, recipe)) {
        if (!may_change_on_resume(x.key)) d.push_back(std::move(x));
      }
      if (!d.empty()) {
        throw UserError(absl::StrCat(
            file, sets.empty() ? "" : " with its --set", " is not the recipe of the run in ", run, ": ", d[0].key,
            " = ", d[0].b, " there, ", d[0].a, " in its checkpoint ", inv.resumed->checkpoint.file,
            d.size() > 1 ? absl::StrCat(" (and ", d.size() - 1, " other key", d.size() > 2 ? "s" : "", ")") : "",
            "; a recipe given with --resume may change only train.steps, train.device, parallel.*, log.*, eval.* "
            "and checkpoint.*: resume with --resume ", run, " alone to continue with the run's recipe (--set "
            "changes a key of it)"));
      }
      recipe.name = inv.resumed->recipe.name;  // the run's name, whatever the file is called
      inv.recipe = std::move(recipe);
    }
  } else {
    inv.recipe = value_or_throw(load_recipe(f.positional()[0], sets));
  }
  if (!inv.resume) {
    inv.run_dir = f.get("--out", inv.recipe.run_dir());
    if (lock) inv.lock.emplace(RunLock::acquire(inv.run_dir.string()));
  }
  return inv;
}

// A fresh run never writes over an earlier run's checkpoints (checked under the folder's lock).
void refuse_earlier_run(const fs::path& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (e.path().extension() == ".safetensors") {
      throw UserError(absl::StrCat(run_dir.string(), " already holds checkpoints of an earlier run: continue it with --resume ",
                                   run_dir.string(), ", or train into another folder with --out DIR"));
    }
  }
}

// "the loss is nan", "the gradient of blocks.0.mlp.fc.weight is not finite (the first such tensor)".
std::string nonfinite_text(const StepResult& result) {
  // NaN prints as "nan" whatever its sign bit ("-nan" says nothing more).
  auto value = [](double x) { return std::isnan(x) ? std::string("nan") : absl::StrFormat("%g", x); };
  std::vector<std::string> parts;
  if (!std::isfinite(result.loss)) parts.push_back("the loss is " + value(result.loss));
  if (!result.nonfinite_gradient.empty()) {
    parts.push_back("the gradient of " + result.nonfinite_gradient + " is not finite (the first such tensor)");
  }
  if (parts.empty()) parts.push_back("the gradient norm is " + value(result.grad_norm));
  return absl::StrJoin(parts, " and ");
}

// For tests of data parallelism: when SEQLAB_TEST_WEIGHTS_DIR is set, each rank writes its final weights
// (every parameter's bytes in the model's order) to DIR/rank<R>.bin, so a test can compare the ranks'
// weights bit for bit.
// This rank's part of a batch under sequence parallelism: its two zig-zag chunks of every row's inputs and
// targets (sequence_parallel.h). Only whole token windows are split: a batch with lengths, segments or
// loss weights is refused (no such batch reaches here: the recipe refuses parallel.sp with the rows of
// data.objective = "masked_lm" or "span_corruption").
Batch sequence_local_batch(const Batch& b, const SequenceGroup& g) {
  if (b.lengths.defined() || b.segment_ids.defined() || b.loss_weights.defined() || b.decoder_inputs.defined() ||
      b.sequence_targets.defined()) {
    throw UserError("parallel.sp: sequence parallelism splits batches of whole token windows; this data gives "
                    "lengths, segments, loss weights, decoder inputs or sequence targets");
  }
  return Batch(sequence_take_local(b.inputs, g), sequence_take_local(b.targets, g));
}

void write_test_weights(LanguageModel& model, int rank) {
  const char* dir = std::getenv("SEQLAB_TEST_WEIGHTS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::string bytes;
  for (const Parameter& p : model.parameters()) {
    const Tensor host = kernel::contiguous(kernel::to_device(*p.tensor, cpu_device()));
    bytes.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  ok_or_throw(write_file_atomically((fs::path(dir) / absl::StrCat("rank", rank, ".bin")).string(), bytes));
}

int run_training(Invocation& inv, const std::vector<std::string>& args);

// `--profile N`: the CPU kernel time of N steps (tensor/profile.h), from the second step this process
// trains (its first warms the allocator's caches), taken over each step alone so that evaluation,
// sampling and checkpoints between steps stay out. Rank 0 prints the table and writes it as JSON to
// RUN/profile.json when the N steps are done, or when the run ends before that.
class StepProfile {
 public:
  StepProfile(int64_t steps, int64_t first_step) : wanted_(steps), first_(first_step + 1) {}
  void before(int64_t step) {
    if (wanted_ > 0 && step >= first_ && done_ < wanted_) profile::start();
  }
  // After step `step`, which took `seconds`: its kernels join the totals.
  void after(double seconds) {
    if (!profile::enabled()) return;
    profile::stop();
    for (const profile::SlotTotals& t : profile::snapshot().slots) {
      profile::SlotTotals& sum = totals_[t.name];
      sum.name = t.name;
      sum.category = t.category;
      sum.calls += t.calls;
      sum.seconds += t.seconds;
      sum.nested_gemm_seconds += t.nested_gemm_seconds;
    }
    wall_ += seconds;
    ++done_;
  }
  // The report, once: when the N steps are done, or at the end of the run (`end`) with what it got.
  void report(bool end, bool writer, Progress& progress, const fs::path& run_dir) {
    if (wanted_ == 0 || reported_ || (done_ < wanted_ && !end)) return;
    reported_ = true;
    if (!writer) return;
    if (done_ == 0) {
      progress.line("--profile: no step was profiled (the first step this process trains is left out)");
      return;
    }
    profile::Snapshot s;
    for (const auto& [name, t] : totals_) s.slots.push_back(t);
    std::stable_sort(s.slots.begin(), s.slots.end(),
                     [](const profile::SlotTotals& a, const profile::SlotTotals& b) { return a.seconds > b.seconds; });
    std::string text = profile::table(s, wall_, done_);
    if (done_ < wanted_) text += absl::StrFormat("  (%d of the %d steps asked for: the run ended)\n", done_, wanted_);
    const std::string file = (run_dir / "profile.json").string();
    ok_or_throw(write_file_atomically(file, profile::json(s, wall_, done_)));
    text += "  written to " + file;
    for (absl::string_view line : absl::StrSplit(text, '\n')) progress.line(std::string(line));
  }

 private:
  int64_t wanted_, first_;
  int64_t done_ = 0;
  double wall_ = 0;
  bool reported_ = false;
  std::map<std::string, profile::SlotTotals> totals_;
};

// A run refused or failed before it wrote anything leaves no folder behind: the folder its lock created is
// removed again when it holds nothing but the lock (RunLock::remove_if_unused); one that existed before, or
// holds anything, stays as it is.
int train(const std::vector<std::string>& args) {
  Invocation inv = parse_invocation(args);
  int code = 0;
  try {
    code = run_training(inv, args);
  } catch (...) {
    if (inv.lock) inv.lock->remove_if_unused();
    throw;
  }
  if (code != 0 && inv.lock) inv.lock->remove_if_unused();
  return code;
}

int run_training(Invocation& inv, const std::vector<std::string>& args) {
  const Recipe& r = inv.recipe;
  const std::string run = inv.run_dir.string();
  const int world = inv.nproc * inv.nnodes;
  const std::string ranks_str = inv.nnodes > 1 ? absl::StrFormat("%d ranks (--nproc %d × --nnodes %d)", world,
                                                                 inv.nproc, inv.nnodes)
                                               : absl::StrFormat("--nproc %d rank%s", world, world > 1 ? "s" : "");
  // The grid: world = dp × sp; ranks r·sp … r·sp + sp − 1 share the rows of data-parallel rank r.
  const int sp = static_cast<int>(r.parallel.sp);
  if (world % sp != 0) {
    throw UserError(absl::StrFormat("parallel.sp = %d needs a job of a multiple of %d ranks (groups of %d share each "
                                    "sequence), and this one has %s",
                                    sp, sp, sp, ranks_str));
  }
  const int dp_size = world / sp;
  if (dp_size > 1 && r.train.batch_size % dp_size != 0) {
    throw UserError(absl::StrFormat("train.batch_size = %d does not split across %s: each %s takes "
                                    "an equal share of the global batch; give a batch size divisible by %d",
                                    r.train.batch_size,
                                    sp > 1 ? absl::StrFormat("%d data-parallel groups (%s, parallel.sp = %d)", dp_size,
                                                             ranks_str, sp)
                                           : ranks_str,
                                    sp > 1 ? "group" : "rank", dp_size));
  }
  if (world > 1 && r.data.source != "text" && r.data.source != "shards") {
    throw UserError(absl::StrFormat("--nproc %d: data parallelism reads token shards (data.source = \"text\" or "
                                    "\"shards\"); the synthetic task \"%s\" runs in one process",
                                    world, r.data.source));
  }
  // One writer per run folder: parse_invocation took the lock (the launcher's, for a job of several
  // ranks) before anything is written into the folder and before the slow work, so a second process on
  // it is refused at once; inv holds it until this function returns.
  if (!inv.launched && inv.node_rank == 0) {
    for (const std::string& name : remove_leftover_temporaries(run)) {
      std::cerr << "seqlab: removed " << (inv.run_dir / name).string()
                << ", left behind by a process that ended while writing it\n";
    }
    if (!inv.resume) refuse_earlier_run(inv.run_dir);
  }
  Device wanted_device = training_device(r);
  if (world > 1 && !inv.launched) {
    // The launcher: GPU ranks take one device each; the data is prepared once, here, before the ranks
    // open it (they would otherwise all prepare the same cache at once).
    if (!wanted_device.is_cpu() && cuda_backend()->device_count() < inv.nproc) {
      throw UserError(absl::StrFormat("--nproc %d: train.device = \"%s\" takes one GPU per rank, and %d are usable",
                                      inv.nproc, r.train.device, cuda_backend()->device_count()));
    }
    open_data(r);
    if (is_redis_rendezvous(inv.rendezvous)) open_rendezvous(inv.rendezvous);  // the server answers
    return launch_ranks(args, {inv.nproc, inv.nnodes, inv.node_rank, inv.rendezvous}, run);
  }
  const int rank = inv.launched ? inv.launched->rank : 0;
  const int dp_rank = rank / sp, sp_rank = rank % sp;
  const bool writer = rank == 0;  // rank 0 alone writes into the run folder and evaluates
  if (!wanted_device.is_cpu()) wanted_device = cuda_device(rank % inv.nproc);  // this machine's GPU of the rank
  if (r.parallel.threads > 0) {
    omp_set_num_threads(static_cast<int>(r.parallel.threads));
  } else if (inv.launched) {
    // The machine's cores shared among its ranks (--nproc N: cores / N each), not all of them per rank.
    omp_set_num_threads(std::max(1, omp_get_num_procs() / inv.nproc));
  }

  Data data = open_data(r, dp_rank, dp_size);
  // Sizes before allocation: everything a step holds, on the device it will run on (build_model
  // checks the host, where the weights are drawn).
  ok_or_throw(check_memory(r, data.vocab_size, available_memory(wanted_device), true,
                           wanted_device.is_cpu() ? "the host" : wanted_device.str()));
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(r, data.vocab_size));
  const Device device = place_model(*model, r, wanted_device);  // before the optimiser
  if (device.is_cpu() && training_dtype(r) == DType::bf16 && !kernel::cpu_bf16_gemm_native()) {
    std::cerr << "seqlab: train.dtype = \"bf16\" on this CPU widens its GEMMs to f32 ("
              << kernel::cpu_bf16_gemm_config() << "): a reference for the GPU's rounding, slower than f32\n";
  }
  const OptimConfig oc = optim_config(r);
  ok_or_throw(validate(oc));
  Optimizer opt(oc, model->parameters());
  Trainer trainer(*model, opt, lr_schedule(r), trainer_options(r));
  // Data parallelism: the ranks meet through the launcher's rendezvous folder; gradients and the loss
  // are averaged over them inside every step.
  // Sequence parallelism: the sp ranks of a group share each sequence of their rows, through a
  // communicator of their own; gradients and the loss are still averaged over every rank (each rank's
  // loss is the mean over its tokens, and every rank holds as many: docs/distributed.md).
  std::unique_ptr<dist::Communicator> comm, sp_comm;
  std::optional<DataParallel> dp;
  std::optional<SequenceGroup> sp_group;
  if (inv.launched) {
    const auto store = open_rendezvous(inv.launched->rendezvous);
    comm = dist::make_communicator(device, store, rank, world);
    // Every rank connected before any can leave (a run already complete returns at once): a rank that
    // exits while another is still in the rendezvous fails that rendezvous.
    comm->barrier();
    if (sp > 1) {
      sp_comm = dist::make_communicator(device, dist::prefixed_store(store, absl::StrCat("sp", dp_rank)), sp_rank, sp);
      sp_group.emplace(*sp_comm);
    }
    dp.emplace(*comm, kGradientBucketElements, dp_size);
    trainer.set_gradient_hook([&](const std::vector<Parameter>& params) { dp->average_gradients(params); });
    if (r.parallel.overlap) {
      trainer.set_last_backward_hooks([&](const std::vector<Parameter>& params) { dp->start_overlap(params); },
                                      [&] { dp->finish_overlap(); });
    }
    trainer.set_loss_hook([&](double loss) { return dp->average(loss); });
    trainer.set_metrics_hook([&](double value) { return dp->average(value); });
  }

  int64_t start = 0;
  SkippedUpdates skipped;
  if (inv.resume) {
    Checkpoint c = std::move(inv.resumed->checkpoint);  // its tensors are freed at the end of this block
    restore_weights(c, *model);
    ok_or_throw(opt.load_state(c.contents.tensors));
    ok_or_throw(data.train->restore(dp ? value_or_throw(dp->to_rank(c.loader)) : c.loader));
    start = c.step;
    skipped = c.skipped;
    if (start > r.train.steps) {
      throw UserError(absl::StrFormat("%s: its checkpoint is at step %d, past train.steps = %d", c.file, start,
                                      r.train.steps));
    }
    if (!inv.checkpoint.empty() && writer) {
      for (const std::string& moved : set_aside_checkpoints_after(run, start)) {
        std::cerr << "seqlab: set aside " << moved << ": a later step than the checkpoint resumed from\n";
      }
    }
  }
  LogFile metrics;
  LogFile samples;
  const bool sampling = writer && r.log.sample_every > 0 && data.tokenizer != nullptr && !data.sample_prompt.empty();
  // The run's identity: given when it starts, kept by its resumes (run.json, every checkpoint).
  const RunIdentity identity = inv.resumed ? inv.resumed->identity : new_run_identity();
  if (writer) {
    if (inv.resumed && inv.resumed->new_identity) {
      std::cerr << "seqlab: " << run << ": its checkpoints were written before runs had an identity; it is run "
                << identity.id << " from now on (" << (inv.run_dir / "run.json").string() << ")\n";
    }
    write_run_identity(run, identity);
    ok_or_throw(write_resolved_recipe(r, run));
    if (start > 0) truncate_logs_after(run, start);
    metrics = LogFile(inv.run_dir / "metrics.jsonl", start > 0);
    if (sampling) samples = LogFile(inv.run_dir / "samples.txt", start > 0);
  }
  // A line of metrics.jsonl: rank 0's alone.
  auto log_metrics = [&](const std::string& text) {
    if (writer) metrics.write(text);
  };

  const bool bar = writer && (r.log.progress == "bar" || (r.log.progress == "auto" && ::isatty(STDOUT_FILENO)));
  // 6 FLOPs per weight a token passes through: an MoE block's experts count top_k times, not E times.
  const ModelConfig model_cfg = value_or_throw(model_config(r, data.vocab_size));
  const double inactive = model_parameter_count(model_cfg) - model_active_parameter_count(model_cfg);
  const double flops_per_token = 6.0 * (static_cast<double>(model->num_parameters()) - inactive) +
                                 model->mixing_flops_per_token(r.train.seq_len);
  const DType dtype = training_dtype(r);
  // MFU against the job's peak: every rank's device measured as this one (the ranks' devices are alike).
  auto job_peak = [device, dtype, world] { return world * measured_peak_flops(device, dtype); };
  Progress progress(bar, r.log.every, r.train.steps, flops_per_token, job_peak(), job_peak);
  if (writer) {
    // What the sweeps compare runs by (docs/scaling.md): size, training FLOPs per token (the MFU's count)
    // and the decoding state per sequence at train.seq_len.
    const double state = model_state_size(model_cfg, r.train.seq_len);
    ok_or_throw(write_file_atomically(
        (inv.run_dir / "model.json").string(),
        absl::StrFormat("{\"arch\": \"%s\", \"parameters\": %d, \"active_parameters\": %s, \"flops_per_token\": %s, "
                        "\"state_size\": %s, \"seq_len\": %d, \"dtype\": \"%s\"}\n",
                        r.model.arch, model->num_parameters(),
                        json_number("%.0f", static_cast<double>(model->num_parameters()) - inactive),
                        json_number("%.6g", flops_per_token), json_number("%.0f", state), r.train.seq_len, dtype_name(dtype))));
  }
  progress.line(absl::StrFormat("seqlab: %s: %d parameters; %s; run directory %s%s%s; %s on %s%s", r.name,
                                model->num_parameters(), data.description, run,
                                world == 1 ? ""
                                : sp > 1   ? absl::StrFormat("; %d ranks: %d data-parallel × %d sequence-parallel", world,
                                                             dp_size, sp)
                                           : absl::StrFormat("; %d data-parallel ranks", world),
                                start > 0 ? absl::StrFormat(" (resumed at step %d)", start) : "", dtype_name(dtype),
                                device.str(), r.train.dtype == "auto" ? " (train.dtype = \"auto\")" : ""));
  if (start == r.train.steps) {
    progress.line(absl::StrFormat("the run is already complete (train.steps = %d)", r.train.steps));
    return 0;
  }

  // The metrics of a skipped update: the run's count of them, and what was not finite.
  auto skipped_line = [&](int64_t done, const StepResult& result) {
    return absl::StrFormat("{\"step\": %d, \"skipped\": %d, \"nonfinite\": %s, \"lr\": %s, \"elapsed_s\": %s",
                           done, skipped.total,
                           json_quote(result.nonfinite_gradient.empty() ? "loss" : result.nonfinite_gradient),
                           json_number("%.6g", result.lr), json_number("%.1f", progress.elapsed_s()));
  };
  // Rank 0 alone saves; the loader position is saved for all ranks together (DataParallel::to_global),
  // so the run resumes on any world size.
  // With several ranks, the dropout stream that checkpoints hold is the base the ranks derive theirs from
  // (below), the same on every rank, so a resume on any world size continues it.
  std::optional<Generator> dropout_base;
  if (dp) {
    dropout_base.emplace();
    dropout_base->set_state(model->dropout_generator().state());
  }
  auto save = [&](int64_t step) {
    if (!writer) return;
    if (dropout_base) model->dropout_generator().set_state(dropout_base->state());
    save_checkpoint(run, step, *model, opt, dp ? dp->to_global(data.train->state()) : data.train->state(), r,
                    r.checkpoint.keep, skipped, identity);
  };
  StopSignals signals(r.checkpoint.save_on_signal);
  model->set_training(true);
  const int64_t tokens_per_step = r.train.grad_accum * r.train.batch_size * r.train.seq_len;
  int64_t tokens_since_log = 0;
  double seconds_since_log = 0;
  Evaluation last_eval;
  StepProfile step_profile(inv.profile_steps, start);
  for (int64_t step = start; step < r.train.steps; ++step) {
    step_profile.before(step);
    const auto t0 = std::chrono::steady_clock::now();
    const LoaderState loader_before = data.train->state();
    const std::string dropout_before = dropout_base ? dropout_base->state() : model->dropout_generator().state();
    if (dropout_base) {
      // Every rank draws this step's dropout from its own stream, seeded from one draw of the shared
      // base generator and the rank: ranks that drew alike would drop the same units of different rows.
      const uint64_t key = dropout_base->next_u64() ^ (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL);
      model->dropout_generator().set_state(Generator(key).state());
    }
    // Each data-parallel rank draws its share of the global batch (train.batch_size / dp rows); under
    // sequence parallelism each rank of its group keeps its two chunks of every row, and the step's
    // forward and backward run in the group.
    const StepResult result = [&] {
      SequenceParallelScope in_group(sp_group ? &*sp_group : nullptr);  // the step only: rank 0 evaluates alone
      // The MoE blocks route the whole batch of all ranks together (moe.h; sp = 1 with MoE).
      MoeRoutingScope routing(dp && sp == 1 ? &dp->comm() : nullptr);
      return trainer.step(step, [&] {
        Batch b = data.train->next_batch(r.train.batch_size / dp_size);
        return sp_group ? sequence_local_batch(b, *sp_group) : b;
      });
    }();
    const double loss = result.loss, lr = result.lr, norm = result.grad_norm;
    const int64_t done = step + 1;
    tokens_since_log += tokens_per_step;
    const double step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds_since_log += step_seconds;
    step_profile.after(step_seconds);
    step_profile.report(false, writer, progress, inv.run_dir);

    if (!result.applied) {
      // Not applied: the weights and the optimizer are those of step `step`.
      ++skipped.total;
      ++skipped.in_a_row;
      const bool skip = r.train.on_nonfinite == "skip" && skipped.in_a_row < r.train.max_skipped;
      if (!skip) {
        int64_t at = done;  // skip: the skipped updates changed nothing, the weights are the last good ones
        if (r.train.on_nonfinite == "skip") log_metrics(skipped_line(done, result) + "}\n");
        if (r.train.on_nonfinite == "stop") {
          // The state before this step, exactly: a checkpoint of step `step` that resumes bit for bit.
          ok_or_throw(data.train->restore(loader_before));
          if (dropout_base) {
            dropout_base->set_state(dropout_before);
          } else {
            model->dropout_generator().set_state(dropout_before);
          }
          --skipped.total;
          --skipped.in_a_row;
          at = step;
        }
        std::string kept = (inv.run_dir / checkpoint_name(at)).string() + " holds the weights from before " +
                           (at == step ? "this step" : "the skipped steps");
        try {
          if (!fs::exists(inv.run_dir / checkpoint_name(at))) save(at);
        } catch (const UserError& e) {
          kept = e.what();  // weights already not finite, or the disk: said, and the older checkpoints kept
        }
        progress.finish();
        if (writer) std::cerr << absl::StrFormat(
            "seqlab train: step %d: %s; stopped without applying it (train.on_nonfinite = \"%s\"%s): %s; "
            "continue with --resume %s (a smaller optim.lr, or optim.grad_clip, may help)\n",
            done, nonfinite_text(result), r.train.on_nonfinite,
            r.train.on_nonfinite == "skip" ? absl::StrFormat(", %d skipped in a row", skipped.in_a_row) : "", kept,
            run);
        return kNonFiniteExit;
      }
      progress.line(absl::StrFormat("step %d: %s; update skipped (%d in a row, %d in all)", done,
                                    nonfinite_text(result), skipped.in_a_row, skipped.total));
    } else {
      skipped.in_a_row = 0;
      std::string detail;  // the MoE blocks' figures, after the loss
      for (const auto& [name, value] : result.metrics) {
        if (name == "aux_loss") detail += absl::StrFormat("%saux %.4f", detail.empty() ? "" : "  ", value);
        if (name == "moe_dropped") detail += absl::StrFormat("%sdropped %.1f%%", detail.empty() ? "" : "  ", 100 * value);
      }
      progress.step(done, loss, lr, tokens_per_step, detail);
      if (step == start) progress.raise_peak(job_peak());  // once more, now warm
    }
    const bool last = done == r.train.steps;
    const bool eval_now = done % r.log.eval_every == 0 || last;
    // What the step logs. An error here (evaluation, sampling, the disk) must not lose the trained
    // step: a checkpoint of it is saved before the error ends the run.
    std::string line;
    bool line_written = false;
    try {
      if (!result.applied) {
        line = skipped_line(done, result);
      } else if (done % r.log.every == 0 || eval_now) {
        // Every number through json_number: NaN or infinity is null, never "nan" (not JSON).
        line = absl::StrFormat(
            "{\"step\": %d, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"tokens_per_s\": %s, \"mfu\": %s, "
            "\"elapsed_s\": %s, \"tokens\": %d, \"train_flops\": %s",
            done, json_number("%.6f", loss), json_number("%.6g", lr), json_number("%.4f", norm),
            json_number("%.1f", static_cast<double>(tokens_since_log) / seconds_since_log),
            json_number("%.4f", progress.mfu()), json_number("%.1f", progress.elapsed_s()), done * tokens_per_step,
            json_number("%.6g", static_cast<double>(done * tokens_per_step) * flops_per_token));
        for (const auto& [name, value] : result.metrics) {
          line += absl::StrFormat(", \"%s\": %s", name, json_number("%.6g", value));
        }
        tokens_since_log = 0;
        seconds_since_log = 0;
      }
      if (eval_now && writer) {
        if (line.empty()) line = absl::StrFormat("{\"step\": %d", done);
        // At train.seq_len, then the same fields at each eval.seq_len, named NAME@L.
        const EvalReport report = evaluate_all(*model, data, r, device);
        last_eval = report.main;
        line += report.json;
        for (const std::string& shown : report.shown) progress.line(absl::StrFormat("step %d: %s", done, shown));
      }
      if (!line.empty()) {
        line_written = true;
        log_metrics(line + "}\n");
      }
      if (sampling && (done % r.log.sample_every == 0 || last)) {
        const std::string text = sample_text(*model, data, r.log, static_cast<uint64_t>(r.train.seed) + done);
        samples.write(absl::StrFormat("### step %d (temperature %g)\n%s\n\n", done, r.log.sample_temperature, text));
        progress.line(absl::StrFormat("step %d sample: %s", done, one_line(text, 160)));
      }
    } catch (const std::exception& e) {
      progress.finish();
      try {
        if (!line.empty() && !line_written) log_metrics(line + "}\n");  // the step's training fields
        save(done);
        if (writer) std::cerr << "seqlab: step " << done << " was trained: " << (inv.run_dir / checkpoint_name(done)).string()
                  << " saved before the error below\n";
      } catch (const std::exception& also) {
        std::cerr << "seqlab: after step " << done << ", no checkpoint could be saved either (" << also.what() << ")\n";
      }
      throw;
    }
    // The ranks stop after the same step: any rank's signal stops them all.
    const int stop_signal = dp ? dp->agreed_stop_signal(signals.received()) : signals.received();
    const bool stopping = stop_signal != 0;
    if ((r.checkpoint.every > 0 && done % r.checkpoint.every == 0) || last || stopping) save(done);
    if (stopping) {
      progress.line(absl::StrFormat("%s: stopped after step %d, checkpoint %s saved; continue with --resume %s",
                                    strsignal(stop_signal), done, checkpoint_name(done), run));
      return 128 + stop_signal;
    }
  }
  if (dp) write_test_weights(*model, rank);
  step_profile.report(true, writer, progress, inv.run_dir);
  progress.finish();
  std::string summary = absl::StrFormat("done: %d steps in %s; val_loss %.4f", r.train.steps,
                                        format_duration(progress.elapsed_s()), last_eval.loss);
  if (last_eval.accuracy) summary += absl::StrFormat(", accuracy %.2f%%", 100.0 * *last_eval.accuracy);
  if (skipped.total > 0) summary += absl::StrFormat(", %d updates skipped (not finite)", skipped.total);
  progress.line(summary + absl::StrFormat("; metrics, samples and checkpoints in %s", run));
  return 0;
}

}  // namespace

int train_command(const std::vector<std::string>& args) {
  int code = 0;
  std::string comm_failure;
  int guarded = run_guarded("train", [&] {
    try {
      code = train(args);
    } catch (const dist::CommError& e) {
      comm_failure = e.what();  // "rank R of N: OP failed: ...": a peer died or timed out
    }
  });
  if (!comm_failure.empty()) {
    std::cerr << "seqlab train: " << comm_failure << "\n";
    return kPeerFailedExit;
  }
  return guarded != 0 ? guarded : code;
}

}  // namespace seqlab::cli
