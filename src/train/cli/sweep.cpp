// `seqlab sweep SWEEP.toml`: runs every point of a sweep (src/train/sweep/sweep.h) as an ordinary training
// run in its own folder, `--jobs N` at a time, skipping the points that finished earlier and resuming the
// ones that stopped with a checkpoint; then writes results.csv and results.md into the sweep's folder.
// Each point is a child process of this same program (`seqlab RECIPE --set ... --out FOLDER`), its output in
// FOLDER.log; a point that fails is recorded in FOLDER.failed with its reason, and the sweep goes on.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "layers/model/decoder.h"
#include "train/cli/commands.h"
#include "train/checkpoint/run_folder.h"
#include "train/cli/util.h"
#include "train/loop/evaluation.h"
#include "train/loop/progress.h"
#include "train/recipe/blocks.h"
#include "train/recipe/configs.h"
#include "train/recipe/edit_distance.h"
#include "train/recipe/recipe.h"
#include "train/sweep/sweep.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kSweepUsage[] =
    "usage: seqlab sweep SWEEP.toml [--jobs N] [--out DIR] [--dry-run] [--rerun-changed]\n"
    "       seqlab sweep --report DIR\n"
    "\n"
    "Runs every point of the grid of SWEEP.toml (a base recipe, [grid] of recipe keys and their values,\n"
    "[set] for every point, the metric, best_over; docs/scaling.md) as an ordinary run in DIR/<point>/\n"
    "(DIR: runs/<sweep name>), --jobs N at a time (each with cores/N threads), skipping points that\n"
    "finished earlier and resuming those that stopped with a checkpoint — a point's folder is reused only\n"
    "when the recipe it trained is the one the sweep gives it now (else the sweep stops before running\n"
    "anything, naming the point and the key); a failing point is recorded (DIR/<point>.failed) and the\n"
    "sweep goes on. Ctrl-C or SIGTERM stops the running points at once, each saving a checkpoint\n"
    "(recorded as stopped: run the sweep again to resume them). Then writes DIR/results.csv,\n"
    "DIR/results.md (the metric per cell, the best over best_over of the points whose metric is finite;\n"
    "power-law fits over training FLOPs) and the plots (the metric against the column axis and against\n"
    "FLOPs), and prints the table. Exit 0 when every point finished.\n"
    "  --dry-run         print the points, their sizes and an estimated time; run nothing\n"
    "  --rerun-changed   retrain the points whose folder holds a run of another recipe (the sweep file\n"
    "                    changed since); their old folders are moved to DIR/replaced/\n"
    "  --report          write results.csv and results.md again from the finished runs of DIR\n";

volatile sig_atomic_t g_interrupted = 0;  // the signal that stops the sweep (SIGINT, SIGTERM), 0 while none
volatile sig_atomic_t g_signals = 0;      // how many such signals came: a second one kills the points
void on_interrupt(int signal) {
  g_interrupted = signal;
  g_signals = g_signals + 1;
}
std::string signal_name(int signal) { return signal == SIGINT ? "SIGINT (Ctrl-C)" : signal == SIGTERM ? "SIGTERM" : strsignal(signal); }



// What each point needs to run and to be reported.
struct Planned {
  PointResult result;
  std::string dir;
  int64_t steps = 0;
  double mixing_flops = 0;   // per token, beyond 6 per weight
  std::string recipe_error;  // the point's recipe does not load, or training would refuse it: it fails
                             // without running
  std::optional<Recipe> recipe;  // as loaded (when it loads)
  std::streamoff log_start = 0;  // where the running attempt's output starts in DIR.log
};

// A fair comparison holds everything but its axes fixed. The block settings that load_recipe resolves
// from the mixers when a recipe leaves them "auto" (convention_keys: norm, FFN, positions, biases) would
// follow a grid over the mixers — GPT-2's block for attention, RMSNorm/SwiGLU for the recurrences —, so
// that the rows compared two blocks, not two mixers. Where such a key is not an axis and would resolve
// differently across the points, every point takes the base recipe's resolution (the base with [set]):
// the returned overrides, said in `note`.
std::vector<std::string> convention_pins(const Sweep& sweep, const std::vector<SweepPoint>& grid, std::string* note) {
  absl::StatusOr<Recipe> base = load_recipe(sweep.recipe, sweep.fixed);
  if (!base.ok()) return {};
  std::map<std::string, std::set<std::string>> seen;
  for (const SweepPoint& p : grid) {
    absl::StatusOr<Recipe> r = load_recipe(sweep.recipe, p.overrides);
    if (!r.ok()) continue;
    for (const auto& [key, value] : recipe_values(*r)) {
      if (std::find(convention_keys().begin(), convention_keys().end(), key) != convention_keys().end()) seen[key].insert(value);
    }
  }
  std::vector<std::string> pins, said;
  for (const auto& [name, value] : recipe_values(*base)) {
    const std::string key = name;  // a structured binding cannot be captured (C++17)
    const bool axis = std::any_of(sweep.axes.begin(), sweep.axes.end(), [&](const SweepAxis& a) { return a.key == key; });
    if (axis || seen[key].size() < 2) continue;
    pins.push_back(key + "=" + value);
    said.push_back(key + " = " + value);
  }
  if (!pins.empty() && note != nullptr) {
    *note = absl::StrCat("fair comparison: ", absl::StrJoin(said, ", "),
                         " for every point — the base recipe's resolution of keys it leaves \"auto\", which would "
                         "otherwise follow the grid's mixers (name them in [set] or [grid] to choose)");
  }
  return pins;
}

std::vector<Planned> plan(const Sweep& sweep, const fs::path& out, std::string* note = nullptr) {
  std::vector<Planned> points;
  std::vector<SweepPoint> grid = expand_grid(sweep);
  const std::vector<std::string> pins = convention_pins(sweep, grid, note);
  for (SweepPoint& p : grid) {
    p.overrides.insert(p.overrides.begin() + static_cast<std::ptrdiff_t>(sweep.fixed.size()), pins.begin(), pins.end());
  }
  for (const SweepPoint& p : grid) {
    Planned q;
    q.result.point = p;
    q.dir = (out / p.name).string();
    absl::StatusOr<Recipe> r = load_recipe(sweep.recipe, p.overrides);
    if (!r.ok()) {
      q.recipe_error = std::string(r.status().message());
    } else {
      q.recipe = *r;
      q.result.settings = recipe_values(*r);
      q.steps = r->train.steps;
      q.result.tokens = r->train.steps * r->train.grad_accum * r->train.batch_size * r->train.seq_len;
      absl::StatusOr<ModelConfig> cfg = model_config(*r, planned_vocab_size(*r));
      if (cfg.ok()) {
        try {
          q.result.outcome.params = model_parameter_count(*cfg);
          q.mixing_flops = model_mixing_flops_per_token(*cfg, r->train.seq_len);
          // 6 FLOPs per weight a token passes through (an MoE block's top_k experts, not all E).
          const double active = q.result.outcome.params - (model_parameter_count(*cfg) - model_active_parameter_count(*cfg));
          q.result.flops = (6 * active + q.mixing_flops) * static_cast<double>(q.result.tokens);
          q.result.state_size = model_state_size(*cfg, r->train.seq_len);
          // What training would refuse before allocating (its memory check, on the CPU the point would
          // run on), refused here: the dry run says so, and the sweep does not start it.
          Device device = cpu_device();
          try {
            device = training_device(*r);
          } catch (const UserError& e) {
            q.recipe_error = e.what();
          }
          const absl::Status fits = check_memory(*r, r->model.vocab_size > 0 ? r->model.vocab_size : 256,
                                                 available_memory(device), true,
                                                 device.is_cpu() ? "the host" : device.str());
          if (q.recipe_error.empty() && !fits.ok()) q.recipe_error = std::string(fits.message());
        } catch (const std::invalid_argument& e) {
          q.recipe_error = e.what();
        }
      } else {
        q.recipe_error = std::string(cfg.status().message());
      }
    }
    points.push_back(std::move(q));
  }
  return points;
}

// The point's outcome from its folder; its parameter count (and so its FLOPs) from the run when it logged one
// (the recipe's count assumes the byte tokenizer's 256 tokens where model.vocab_size is 0).
void refresh(const Sweep& sweep, Planned& q) {
  const double planned_params = q.result.outcome.params;
  q.result.outcome = read_outcome(q.dir, sweep.metric, q.steps);
  if (q.result.outcome.finished) {
    // A failure or a stop recorded by an earlier attempt does not outlive the run that finished after it.
    std::error_code ec;
    fs::remove(q.dir + ".failed", ec);
    fs::remove(q.dir + ".stopped", ec);
  }
  if (q.result.outcome.params == 0) q.result.outcome.params = planned_params;
  q.result.flops = (6 * q.result.outcome.params + q.mixing_flops) * static_cast<double>(q.result.tokens);
  if (!q.recipe_error.empty()) q.result.outcome.failure = q.recipe_error;
}

void write_results(const Sweep& sweep, const fs::path& out, const std::vector<Planned>& points) {
  std::vector<PointResult> results;
  for (const Planned& q : points) results.push_back(q.result);
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path tmp = out / (name + ".tmp");
    std::ofstream(tmp) << text;
    fs::rename(tmp, out / name);
  };
  write("results.csv", results_csv(sweep, results));
  write("results.md", results_table(sweep, results));
}

// The plots of a sweep's results (gnuplot; skipped with a note where it is missing):
//   <metric>_vs_<column>.png  the table's cells, one line per row, when the column axis holds numbers;
//   <metric>_vs_flops.png     every row's cells against their training FLOPs, log-log, with the row's fitted
//                             power law (power_law_fits) as a line;
//   <metric>_vs_state_size.png  every row's cells against their decoding state per sequence.
// Returns the files written.
std::vector<std::string> write_plots(const Sweep& sweep, const fs::path& out, const std::vector<PointResult>& results) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::cout << "plots skipped: gnuplot is not installed (Debian: gnuplot-nox; ./train installs it)\n";
    return {};
  }
  const SweepTable t = best_table(sweep, results);
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  // Each key title is noenhanced: mixer names hold underscores, which gnuplot's enhanced text would set as
  // subscripts (linear_attention as linear·attention); the terminal stays enhanced for the 10^{%L} ticks.
  auto row_name = [&](size_t r) { return t.row_axis >= 0 ? display_value(t.rows[r]) : sweep.metric; };
  auto data_file = [&](const std::string& tag, size_t r) { return (out / absl::StrCat(".", tag, r, ".dat")).string(); };
  std::vector<std::string> written, temporary;
  auto draw = [&](const std::string& name, const std::string& body) {
    const std::string png = (out / name).string();
    const std::string script = absl::StrCat("set terminal pngcairo size 900,540 enhanced font 'sans,10'\nset output ",
                                            gnuplot_quote(png + ".tmp"), "\nset grid\nset key outside right\n", body);
    run_gnuplot(script, png);
    written.push_back(png);
  };
  // 1. Against the column axis.
  bool numeric = t.column_axis >= 0;
  std::vector<double> xs;
  for (const std::string& c : t.columns) {
    double x;
    numeric = numeric && absl::SimpleAtod(display_value(c), &x);
    xs.push_back(numeric ? x : 0);
  }
  if (numeric) {
    std::string plots;
    for (size_t r = 0; r < t.rows.size(); ++r) {
      std::ofstream d(data_file("c", r));
      int n = 0;
      for (size_t c = 0; c < t.columns.size(); ++c) {
        const SweepCell& cell = t.cells[r * t.columns.size() + c];
        if (cell.best != nullptr) d << xs[c] << " " << *cell.best->outcome.metric << "\n", ++n;
      }
      temporary.push_back(data_file("c", r));
      if (n == 0) continue;
      absl::StrAppend(&plots, plots.empty() ? "plot " : ", ", gnuplot_quote(data_file("c", r)),
                      " using 1:2 with linespoints pt 7 lw 2 lc rgb '", colors[r % 8], "' title ",
                      gnuplot_quote(row_name(r)), " noenhanced");
    }
    const std::string key = sweep.axes[t.column_axis].key;
    if (!plots.empty()) {
      draw(absl::StrCat(sweep.metric, "_vs_", key.substr(key.rfind('.') + 1), ".png"),
           absl::StrCat("set title ", gnuplot_quote(sweep.name + ": " + sweep.metric + ", the best per cell"),
                        " noenhanced\nset xlabel ", gnuplot_quote(key), " noenhanced\nset ylabel ",
                        gnuplot_quote(sweep.metric), " noenhanced\nset logscale x 2\n", plots, "\n"));
    }
  }
  // 2. Against training FLOPs, with the fits.
  std::string plots;
  const std::vector<PowerLaw> fits = power_law_fits(t);
  double lowest = 0, highest = 0;  // of the metric plotted: the y range, so that close rows stay apart
  for (size_t r = 0; r < t.rows.size(); ++r) {
    std::ofstream d(data_file("f", r));
    int n = 0;
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const SweepCell& cell = t.cells[r * t.columns.size() + c];
      if (cell.best != nullptr && cell.best->flops > 0 && *cell.best->outcome.metric > 0) {
        const double m = *cell.best->outcome.metric;
        d << cell.best->flops << " " << m << "\n";
        lowest = lowest == 0 ? m : std::min(lowest, m);
        highest = std::max(highest, m);
        ++n;
      }
    }
    temporary.push_back(data_file("f", r));
    if (n == 0) continue;
    absl::StrAppend(&plots, plots.empty() ? "plot " : ", ", gnuplot_quote(data_file("f", r)),
                    " using 1:2 with points pt 7 ps 1.2 lc rgb '", colors[r % 8], "' title ",
                      gnuplot_quote(row_name(r)), " noenhanced");
    for (const PowerLaw& f : fits) {
      if (f.row != t.rows[r]) continue;
      absl::StrAppend(&plots, ", ", absl::StrFormat("%.10g*x**(%.10g)", f.a, f.b), " with lines lw 1.5 dt 2 lc rgb '",
                      colors[r % 8], "' title ",
                      gnuplot_quote(absl::StrFormat("%s fit: b = %.3g", row_name(r), f.b)), " noenhanced");
    }
  }
  if (!plots.empty()) {
    draw(absl::StrCat(sweep.metric, "_vs_flops.png"),
         absl::StrCat("set title ", gnuplot_quote(sweep.name + ": " + sweep.metric + " against training FLOPs"),
                      " noenhanced\nset xlabel 'training FLOPs'\nset ylabel ", gnuplot_quote(sweep.metric),
                      " noenhanced\nset logscale xy\nset format x '10^{%L}'\n",
                      // A log y axis autoscales to whole decades, which flattens rows a few percent apart:
                      // the range of the points, 5% beyond each end, with tics of plain numbers
                      // (tics from the low end, each a factor above the last: six across the range)
                      absl::StrFormat("set yrange [%.6g:%.6g]\nset format y '%%.3g'\nset ytics %.6g, %.6g\n",
                                      lowest / 1.05, highest * 1.05, lowest / 1.05,
                                      std::pow(highest * 1.05 / (lowest / 1.05), 1.0 / 6)),
                      plots, "\n"));
  }
  // 3. Against the decoding state per sequence (Zoology's axis: what a recurrence keeps against what
  // attention's cache grows to), log x.
  plots.clear();
  for (size_t r = 0; r < t.rows.size(); ++r) {
    std::ofstream d(data_file("s", r));
    int n = 0;
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const SweepCell& cell = t.cells[r * t.columns.size() + c];
      if (cell.best != nullptr && cell.best->state_size > 0) d << cell.best->state_size << " " << *cell.best->outcome.metric << "\n", ++n;
    }
    temporary.push_back(data_file("s", r));
    if (n == 0) continue;
    absl::StrAppend(&plots, plots.empty() ? "plot " : ", ", gnuplot_quote(data_file("s", r)),
                    " using 1:2 with linespoints pt 7 lw 2 lc rgb '", colors[r % 8], "' title ",
                      gnuplot_quote(row_name(r)), " noenhanced");
  }
  if (!plots.empty()) {
    draw(absl::StrCat(sweep.metric, "_vs_state_size.png"),
         absl::StrCat("set title ", gnuplot_quote(sweep.name + ": " + sweep.metric + " against the decoding state"),
                      " noenhanced\nset xlabel 'state per sequence (elements, all layers; attention: its KV cache at "
                      "train.seq_len)' noenhanced\nset ylabel ",
                      gnuplot_quote(sweep.metric), " noenhanced\nset logscale x 2\n", plots, "\n"));
  }
  std::error_code ec;
  for (const std::string& f : temporary) fs::remove(f, ec);
  return written;
}

// Why the run in a point's folder is not the point the sweep plans ("" when it is, or when the folder
// holds no run yet): its resolved recipe (RUN/recipe.toml, written when the run started) against the
// plan's, but for the keys set per launch.
std::string changed_point(const Planned& q) {
  const fs::path file = fs::path(q.dir) / "recipe.toml";
  std::error_code ec;
  if (!q.recipe || !fs::exists(file, ec)) return "";
  absl::StatusOr<Recipe> ran = load_recipe(file.string());
  if (!ran.ok()) return absl::StrCat(file.string(), " does not load (", ran.status().message(), ")");
  const std::vector<RecipeDifference> d = recipe_differences(*ran, *q.recipe, per_launch_keys());
  if (d.empty()) return "";
  std::string text = absl::StrFormat("%s was trained with %s = %s, the sweep now gives %s", q.dir, d[0].key, d[0].a, d[0].b);
  if (d.size() > 1) absl::StrAppend(&text, absl::StrFormat(" (and %d more key%s)", d.size() - 1, d.size() > 2 ? "s" : ""));
  return text;
}

// The points whose folder holds a run of another recipe: refused (one line naming the first, the key and
// both values) unless `rerun`, which moves each such folder (and its log and markers) to DIR/replaced/
// so that the point trains anew; what was there is kept, never deleted.
void settle_changed_points(std::vector<Planned>& points, const fs::path& out, bool rerun, bool report) {
  std::vector<std::pair<Planned*, std::string>> changed;
  for (Planned& q : points) {
    std::string why = changed_point(q);
    if (!why.empty()) changed.emplace_back(&q, std::move(why));
  }
  if (changed.empty()) return;
  const std::string more =
      changed.size() > 1 ? absl::StrFormat("; %d points differ so", changed.size()) : std::string();
  if (report) {
    throw UserError(absl::StrCat(changed[0].second, more,
                                 ": the sweep file changed since they ran; run the sweep with --rerun-changed to "
                                 "retrain them"));
  }
  if (!rerun) {
    throw UserError(absl::StrCat(changed[0].second, more,
                                 ": retrain such points with --rerun-changed (their folders move to ",
                                 (out / "replaced").string(), "/) or sweep into a new --out DIR"));
  }
  const fs::path aside = out / "replaced";
  std::error_code ec;
  fs::create_directories(aside, ec);
  if (ec) throw UserError("cannot create " + aside.string() + ": " + ec.message());
  for (const auto& [q, why] : changed) {
    const std::string name = fs::path(q->dir).filename().string();
    for (const std::string suffix : {"", ".log", ".failed", ".stopped"}) {
      const fs::path from = q->dir + suffix, to = aside / (name + suffix);
      if (!fs::exists(from, ec)) continue;
      fs::remove_all(to, ec);
      fs::rename(from, to, ec);
      if (ec) throw UserError("cannot move " + from.string() + " to " + to.string() + ": " + ec.message());
    }
    std::cout << "rerun: " << why << "; the old run moved to " << (aside / name).string() << "\n";
  }
}

// The sweep's metric is one the points' runs log (reported_metrics), checked before any point runs.
void check_metric(const Sweep& sweep, const std::vector<Planned>& points) {
  for (const Planned& q : points) {
    if (!q.recipe) continue;
    const std::vector<std::string> known = reported_metrics(*q.recipe);
    if (std::find(known.begin(), known.end(), sweep.metric) != known.end()) continue;
    const std::string near = nearest(sweep.metric, known);
    throw UserError(absl::StrCat(sweep.file, ": metric = \"", sweep.metric, "\" is not logged by the runs of point ",
                                 q.result.point.name, near.empty() ? "" : " (did you mean \"" + near + "\"?)",
                                 "; they log ", absl::StrJoin(known, ", ")));
  }
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("ckpt_", 0) == 0) return true;
  }
  return false;
}

// Why a point's attempt failed: the last error line its process wrote into the log after `from` (where
// the attempt's output starts: the log gathers every attempt) — "seqlab COMMAND: ...", the form every
// refusal and error takes; notices and the start line are "seqlab: ..." — else its last line, with the
// exit status; never empty.
std::string failure_reason(const std::string& log, std::streamoff from, int status) {
  std::ifstream in(log);
  in.seekg(from);
  std::string line, reason, last;
  while (std::getline(in, line)) {
    if (line.rfind("seqlab ", 0) == 0 && line.find(": ") != std::string::npos) reason = line;
    if (!line.empty()) last = line;
  }
  if (!reason.empty()) return reason;
  const std::string exit = WIFSIGNALED(status) ? absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")")
                                               : absl::StrCat("exit ", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return last.empty() ? exit : absl::StrCat(exit, "; its last line: ", last);
}

// Starts one point: `seqlab RECIPE --set ... --out DIR`, or `seqlab --resume DIR` when it stopped with a
// checkpoint (its recipe is the plan's: settle_changed_points saw to it); its output appended to DIR.log.
// The point runs in a process group of its own, so that a Ctrl-C at the terminal reaches the sweep alone,
// which stops each point once (SIGTERM: it saves a checkpoint); and it gets SIGTERM when the sweep dies,
// even by SIGKILL (the parent-death signal), so no point trains on as an orphan.
pid_t launch(Planned& q, const Sweep& sweep, int threads) {
  std::vector<std::string> argv{"/proc/self/exe"};
  std::error_code ec;
  const auto size = fs::file_size(q.dir + ".log", ec);
  q.log_start = ec ? 0 : static_cast<std::streamoff>(size);
  const bool resume = has_checkpoint(q.dir);
  if (resume) {
    argv.insert(argv.end(), {"--resume", q.dir});
  } else {
    fs::remove_all(q.dir, ec);  // an attempt that wrote no checkpoint: nothing to keep
    argv.push_back(sweep.recipe);
    for (const std::string& o : q.result.point.overrides) argv.insert(argv.end(), {"--set", o});
  }
  bool threads_set = false;
  for (const std::string& o : q.result.point.overrides) threads_set = threads_set || o.rfind("parallel.threads=", 0) == 0;
  if (!threads_set) argv.insert(argv.end(), {"--set", absl::StrCat("parallel.threads=", threads)});
  argv.insert(argv.end(), {"--set", "log.progress=\"plain\""});
  if (!resume) argv.insert(argv.end(), {"--out", q.dir});
  std::fflush(nullptr);
  const pid_t sweep_pid = ::getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("sweep: fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != sweep_pid) _exit(128 + SIGTERM);  // the sweep died before the line above
    signal(SIGINT, SIG_DFL);  // the sweep's handlers are not the point's (exec resets them anyway)
    signal(SIGTERM, SIG_DFL);
    const int fd = ::open((q.dir + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever of the two runs first, the group exists before any signal
  return pid;
}

std::string describe(const Sweep& sweep, const Planned& q) {
  const PointOutcome& o = q.result.outcome;
  if (o.usable()) return absl::StrFormat("%s %.4g (%.0f s)", sweep.metric, *o.metric, o.wall_s);
  if (o.finished) return absl::StrFormat("%s not finite (%.0f s)", sweep.metric, o.wall_s);
  if (!o.stopped.empty()) return "STOPPED: " + o.stopped;
  return "FAILED: " + o.failure;
}

// The confounds of the plan (keys besides the grid's that differ between points), one line each; "" when
// the comparison is fair.
std::string unfair_text(const Sweep& sweep, const std::vector<Planned>& points) {
  std::vector<PointResult> results;
  for (const Planned& q : points) results.push_back(q.result);
  std::string text;
  for (const Confound& c : confounds(sweep, results)) {
    std::vector<std::string> values;
    for (const auto& [v, at] : c.values) values.push_back(v + " (" + at + ")");
    text += "NOT A FAIR COMPARISON: " + c.key + " differs between points besides the grid's keys: " +
            absl::StrJoin(values, ", ") + "\n";
  }
  return text;
}

int run_sweep(const Sweep& sweep, const fs::path& out, int jobs, bool dry_run, bool rerun_changed) {
  std::string pinned;
  std::vector<Planned> points = plan(sweep, out, &pinned);
  check_metric(sweep, points);
  if (!pinned.empty()) std::cout << pinned << "\n";
  const int cores = omp_get_num_procs();
  const int threads = std::max(1, cores / jobs);
  if (dry_run) {
    double flops = 0;
    std::cout << absl::StrFormat("sweep %s: %d points of %s, into %s\n", sweep.name, points.size(), sweep.recipe,
                                 out.string());
    for (Planned& q : points) {
      std::cout << "  " << q.result.point.name << ": ";
      if (!q.recipe_error.empty()) {
        std::cout << "REFUSED (training would refuse it): " << q.recipe_error << "\n";
        continue;
      }
      const std::string changed = changed_point(q);
      const double planned_params = q.result.outcome.params;
      q.result.outcome = read_outcome(q.dir, sweep.metric, q.steps);  // reads only: a dry run changes nothing
      if (q.result.outcome.params == 0) q.result.outcome.params = planned_params;
      if (changed.empty() && q.result.outcome.finished) {
        std::cout << "finished earlier, " << describe(sweep, q) << "\n";
        continue;
      }
      flops += q.result.flops;
      std::cout << absl::StrFormat("%.3gM parameters, %d tokens, %.3g training FLOPs%s\n", q.result.outcome.params / 1e6,
                                   q.result.tokens, q.result.flops,
                                   changed.empty() ? "" : " (CHANGED: " + changed + "; needs --rerun-changed)");
    }
    std::cout << unfair_text(sweep, points);
    const double peak = measured_peak_flops(cpu_device(), DType::f32);
    std::cout << absl::StrFormat(
        "estimated %.1f min on this machine's CPU for the points left (at 40%% of its measured %.0f GFLOP/s, %d job(s) "
        "of %d thread(s))\n",
        flops / (0.4 * peak) / 60.0, peak / 1e9, jobs, threads);
    return 0;
  }
  std::error_code ec;
  // One sweep at a time in a folder (the lock of a run folder, on the sweep's): a second would start the
  // same points, each refused by its run's lock and recorded as failed.
  const RunLock lock = RunLock::acquire(out.string(), true);
  settle_changed_points(points, out, rerun_changed, false);
  ok_or_throw(write_file_atomically((out / "sweep_file").string(), fs::absolute(sweep.file).string() + "\n"));
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const size_t n = points.size();
  size_t done = 0, next = 0;
  std::map<pid_t, size_t> running;
  bool stopping = false;  // the running points were sent SIGTERM
  bool killing = false;   // and then SIGKILL, after a second signal
  auto report = [&](size_t i, const std::string& what) {
    ++done;
    std::cout << absl::StrFormat("[%d/%d] %s: %s\n", done, n, points[i].result.point.name, what) << std::flush;
  };
  std::cout << absl::StrFormat("sweep %s: %d points, %d at a time (%d thread(s) each), into %s\n", sweep.name, n, jobs,
                               threads, out.string())
            << unfair_text(sweep, points);
  while (next < n || !running.empty()) {
    while (!g_interrupted && next < n && running.size() < static_cast<size_t>(jobs)) {
      Planned& q = points[next];
      refresh(sweep, q);
      if (!q.recipe_error.empty()) {
        report(next++, "FAILED: " + q.recipe_error);
      } else if (q.result.outcome.finished) {
        report(next, "finished earlier, " + describe(sweep, q));
        ++next;
      } else {
        fs::remove(q.dir + ".failed", ec);
        fs::remove(q.dir + ".stopped", ec);
        running[launch(q, sweep, threads)] = next++;
      }
    }
    if (g_interrupted && !stopping) {
      // Stop every running point now (each saves a checkpoint of the step it is on), not when it ends.
      for (const auto& [pid, i] : running) ::kill(pid, SIGTERM);
      stopping = true;
    }
    if (g_signals >= 2 && !killing) {
      // A second Ctrl-C, as for one run: end the points at once (they resume from their last checkpoint).
      for (const auto& [pid, i] : running) ::kill(pid, SIGKILL);
      killing = true;
    }
    if (running.empty()) {
      if (g_interrupted) break;
      continue;
    }
    // Polled, so that a signal arriving just before a blocking wait cannot leave the points running.
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) {
      ::usleep(50 * 1000);
      continue;
    }
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    Planned& q = points[it->second];
    running.erase(it);
    refresh(sweep, q);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0 && q.result.outcome.finished)) {
      const bool by_signal = (WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGTERM ||
                                                    WEXITSTATUS(status) == 128 + SIGINT)) ||
                             (WIFSIGNALED(status) && (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGINT ||
                                                      (killing && WTERMSIG(status) == SIGKILL)));
      if (stopping && by_signal) {
        const std::string why = absl::StrFormat(
            "stopped by %s to the sweep after step %d%s", signal_name(g_interrupted), q.result.outcome.last_step,
            WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                ? " (killed at a second signal: it resumes from its last checkpoint, if any)"
                : has_checkpoint(q.dir) ? " (a checkpoint saved)" : " (before its first checkpoint: it starts again)");
        ok_or_throw(write_file_atomically(q.dir + ".stopped", why + "\n"));
      } else {
        ok_or_throw(write_file_atomically(q.dir + ".failed", failure_reason(q.dir + ".log", q.log_start, status) + "\n"));
      }
      refresh(sweep, q);
    }
    report(static_cast<size_t>(&q - points.data()), describe(sweep, q));
  }
  for (Planned& q : points) refresh(sweep, q);
  write_results(sweep, out, points);
  std::vector<PointResult> results;
  for (const Planned& q : points) results.push_back(q.result);
  const std::vector<std::string> plots = write_plots(sweep, out, results);
  std::cout << "\n" << results_table(sweep, results) << "\nresults: " << (out / "results.csv").string() << ", "
            << (out / "results.md").string() << (plots.empty() ? "" : ", " + absl::StrJoin(plots, ", ")) << "\n";
  size_t unfinished = 0;
  for (const Planned& q : points) unfinished += q.result.outcome.finished ? 0 : 1;
  if (g_interrupted) {
    std::cout << absl::StrFormat("sweep stopped by %s: run it again to finish the %d points left\n",
                                 signal_name(g_interrupted), unfinished);
    return 128 + g_interrupted;
  }
  if (unfinished > 0) {
    std::cerr << absl::StrFormat("seqlab sweep: %d of %d points did not finish (their reasons are in results.md)\n",
                                 unfinished, n);
    return 1;
  }
  return 0;
}

}  // namespace

int sweep_command(const std::vector<std::string>& args) {
  int code = 0;
  const int guarded = run_guarded("sweep", [&] {
    Flags f(args, "sweep", {"--jobs", "--out", "--report"}, {"--dry-run", "--rerun-changed", "--help", "-h"}, {}, 1);
    if (f.has("--help") || f.has("-h")) {
      std::cout << kSweepUsage;
      return;
    }
    if (f.has("--report")) {
      const fs::path dir = f.get("--report");
      std::ifstream in(dir / "sweep_file");
      std::string file;
      if (!std::getline(in, file)) {
        throw UserError(dir.string() + " is not a sweep folder (no sweep_file: run seqlab sweep SWEEP.toml first)");
      }
      const Sweep sweep = value_or_throw(load_sweep(file));
      const RunLock lock = RunLock::acquire(dir.string(), true);  // a sweep folder: not while a sweep writes there
      std::vector<Planned> points = plan(sweep, dir);
      settle_changed_points(points, dir, false, true);
      for (Planned& q : points) refresh(sweep, q);
      write_results(sweep, dir, points);
      std::vector<PointResult> results;
      for (const Planned& q : points) results.push_back(q.result);
      const std::vector<std::string> plots = write_plots(sweep, dir, results);
      std::cout << results_table(sweep, results) << (plots.empty() ? "" : "plots: " + absl::StrJoin(plots, ", ") + "\n");
      return;
    }
    if (f.positional().empty()) throw UserError("expected a sweep file: seqlab sweep SWEEP.toml (see seqlab sweep --help)");
    const Sweep sweep = value_or_throw(load_sweep(f.positional()[0]));
    std::error_code ec;
    if (!fs::is_regular_file(sweep.recipe, ec)) {
      throw UserError(sweep.file + ": its recipe " + sweep.recipe + " does not exist (recipe = is relative to the sweep file)");
    }
    const int jobs = f.number<int>("--jobs", 1, 1);
    const fs::path out = f.has("--out") ? fs::path(f.get("--out")) : fs::path("runs") / sweep.name;
    code = run_sweep(sweep, out, jobs, f.has("--dry-run"), f.has("--rerun-changed"));
  });
  return guarded != 0 ? guarded : code;
}

}  // namespace seqlab::cli
