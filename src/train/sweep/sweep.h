// Sweeps (docs/scaling.md): a sweep file names a base recipe, a grid of recipe keys and the metric to
// report; every point of the grid is an ordinary run in its own folder, and the results gather into a CSV
// and a markdown table that takes, for each cell, the best run over the axes named in best_over (the best
// learning rate, as the papers do). This file is the sweep's logic, free of processes: reading the file,
// expanding the grid, naming the points, reading a point's outcome from its run folder and writing the
// results. The command (src/train/cli/sweep.cpp) runs the points.
//
//   name = "mqar"                        # optional: the sweep's folder runs/<name> (default: the file's stem)
//   recipe = "../mqar_small.toml"        # the base recipe, relative to this file
//   metric = "val_acc"                   # a field of the run's final evaluation: val_loss, val_acc, ...,
//                                        # val_acc@1024 (at an eval.seq_len length)
//   best_over = ["optim.lr"]             # axes each table cell takes its best over (optional)
//   rows = "model.mixer"                 # the table's rows and columns (optional: the first axes, in
//   columns = "model.d_model"            # key order, that best_over does not name)
//   [grid]                               # one list of values per recipe key; the points are every
//   "model.mixer" = ["attention", "gla"] # combination, the axes in the order of their keys
//   "optim.lr" = [1e-3, 3e-3]
//   [set]                                # overrides every point shares (optional)
//   "train.steps" = 300
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace seqlab {

struct SweepAxis {
  std::string key;                  // "model.mixer"
  std::vector<std::string> values;  // TOML literals: "\"gla\"", "0.001", "64", "[256, 1024]"
};

struct Sweep {
  std::string file;                 // the sweep file
  std::string name;                 // its folder's name under the output folder
  std::string recipe;               // the base recipe's path (relative to the working folder)
  std::string metric = "val_loss";  // lower is better, unless higher_is_better
  bool higher_is_better = false;    // metrics named *acc* or *accuracy*
  std::vector<std::string> best_over;
  std::string rows, columns;        // the table's axes ("": the first ones best_over does not name)
  std::vector<SweepAxis> axes;      // in the order of their keys
  std::vector<std::string> fixed;   // "key=literal" overrides of every point
};

// Reads and checks a sweep file: InvalidArgument naming the file and what is wrong (an unknown top-level
// key, a grid value that is not a list or is empty, best_over naming no axis, no grid at all); NotFound for
// a missing file. The keys' values are checked when each point's recipe loads (point_recipe_errors).
absl::StatusOr<Sweep> load_sweep(const std::string& path);

struct SweepPoint {
  std::vector<std::string> values;     // one literal per axis
  std::string name;                    // its folder: "mixer=gla,lr=0.001"
  std::vector<std::string> overrides;  // the --set arguments: fixed ones, then the point's
};

// Every combination of the axes' values, the first axis varying slowest. Each point's folder name is its
// own: "key=value" parts with the values cleaned to [A-Za-z0-9.+_-]; where cleaning makes two names alike,
// or a name is longer than kMaxPointName bytes, the name (cut to fit) ends in ",hash=" and point_hash.
std::vector<SweepPoint> expand_grid(const Sweep& sweep);
constexpr size_t kMaxPointName = 200;  // a file name holds 255 bytes; "NAME.failed", "NAME.log" fit beside
// 16 hex digits of a 64-bit FNV-1a hash of a point's exact literals.
std::string point_hash(const std::vector<std::string>& values);

// A value as a folder name and a table shows it: strings unquoted, numbers as written.
std::string display_value(const std::string& literal);

// What a point's run folder says (nothing of it is trusted beyond the metrics it logged).
struct PointOutcome {
  bool finished = false;  // its metrics.jsonl logged the last step and, there, the metric
  // The metric at the last step: a number, or NaN where the run logged it as not finite (null); such a
  // point finished but is never a cell's best nor a point of a fit.
  std::optional<double> metric;
  double params = 0;    // from the run's start line ("N parameters"), 0 when unknown
  double wall_s = 0;    // elapsed_s of its last logged step
  int64_t last_step = 0;
  std::string failure;  // RUN.failed: the reason recorded by the runner when the last attempt failed
  std::string stopped;  // RUN.stopped: the sweep was stopped (a signal) while the point ran; it resumes
  bool usable() const;  // finished with a finite metric
};
// Reads RUN/metrics.jsonl, RUN.log (the start line), RUN.failed and RUN.stopped; `steps` is the point's
// train.steps.
PointOutcome read_outcome(const std::string& run_dir, const std::string& metric, int64_t steps);
// "ok", "not_finite" (finished, the metric not finite), "failed", "stopped" or "unfinished".
std::string point_status(const PointOutcome& outcome);

struct PointResult {
  SweepPoint point;
  PointOutcome outcome;
  // Every recipe key of the point with its resolved value (recipe_values), to show the block settings and
  // find keys other than the grid's that differ between points; empty when its recipe does not load.
  std::vector<std::pair<std::string, std::string>> settings;
  int64_t tokens = 0;   // trained: steps × batch_size × seq_len × grad_accum
  double flops = 0;     // training FLOPs: tokens × (6·params + mixing FLOPs per token)
  double state_size = 0;  // decoding state per sequence at train.seq_len (MixerSpec::state_size, summed)
};

// The table: for each (row value, column value) of the table's axes, the best finished point with a finite
// metric over the other axes (null when none), whether a point of the cell failed, and whether one
// finished with a metric that is not finite.
struct SweepCell {
  std::string row, column;  // literals
  const PointResult* best = nullptr;
  bool failed = false;
  bool not_finite = false;
};
struct SweepTable {
  int row_axis = -1, column_axis = -1;  // indices into Sweep::axes; -1: none (one row, or one column)
  std::vector<std::string> rows, columns;
  std::vector<SweepCell> cells;  // row-major
};
SweepTable best_table(const Sweep& sweep, const std::vector<PointResult>& results);

// metric ≈ a · C^b with C the training FLOPs, fitted by least squares of log metric on log C over the cells
// of one row that finished (at least two, of different FLOPs, positive metric).
struct PowerLaw {
  std::string row;  // literal
  double a = 0, b = 0;
  int points = 0;
};
std::vector<PowerLaw> power_law_fits(const SweepTable& table);

// The settings results.md lists for every sweep (those the grid does not vary): what a reader needs to
// know what the rows were compared at.
inline const std::vector<std::string> kBlockSettingKeys = {
    "model.arch", "model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads", "model.d_ff", "model.mlp",
    "model.norm", "model.norm_placement", "model.positions", "model.bias", "model.tie_embeddings", "model.dropout", "model.init_std",
    "optim.name", "optim.lr", "optim.weight_decay", "optim.schedule", "optim.warmup_steps", "train.steps",
    "train.batch_size", "train.seq_len", "train.seed"};

// Keys the sweep sets per launch, which may differ between points and attempts without making another run
// (threads from --jobs, plain progress lines, the point's folder).
const std::vector<std::string>& per_launch_keys();

// Keys other than the grid's (and per_launch_keys) whose resolved values differ between the points that
// loaded: a comparison that is not fair. Each with its values, in the order met, and the first point
// holding each ("optim.warmup_steps": {("30", "d_model=32,lr=0.001"), ("10", ...)}).
struct Confound {
  std::string key;
  std::vector<std::pair<std::string, std::string>> values;  // (value, first point with it)
};
std::vector<Confound> confounds(const Sweep& sweep, const std::vector<PointResult>& results);

// results.csv: a header, then one row a point: its name, every axis's value, status (ok / failed /
// unfinished), params, tokens, training FLOPs, state size, wall seconds and the metric (empty when none).
std::string results_csv(const Sweep& sweep, const std::vector<PointResult>& results);
// results.md: the metric per cell of the table's two axes (rows, columns; one column when the grid has one
// axis besides best_over's), each cell the best over the other axes' points that finished (where those
// sit, in brackets), "failed" or "—" where no point finished; the power-law fits of each row over training
// FLOPs; the block settings every point shares (kBlockSettingKeys that the grid does not vary) and any
// confounds, flagged; then the failed points with their reasons.
std::string results_table(const Sweep& sweep, const std::vector<PointResult>& results);

}  // namespace seqlab
