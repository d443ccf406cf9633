// `seqlab plot RUN`: the loss curves of a run as a PNG, drawn by gnuplot (Debian's gnuplot-nox).
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/util.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kPlotUsage[] =
    "usage: seqlab plot RUN [--out FILE]\n"
    "\n"
    "Draws the training loss (every logged step) and the validation loss (every evaluation) of the run\n"
    "directory RUN from its metrics.jsonl, with the validation accuracy on a second axis for synthetic\n"
    "tasks, into RUN/loss.png (or FILE). Needs gnuplot (Debian: gnuplot-nox; ./train installs it).\n";

void plot(const std::vector<std::string>& args) {
  Flags f(args, "plot", {"--out"}, {"--help", "-h"}, {}, 1);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kPlotUsage;
    return;
  }
  if (f.positional().empty()) throw UserError("expected the run directory: seqlab plot RUN (see seqlab plot --help)");
  const fs::path run = f.positional()[0];
  const fs::path metrics = run / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) throw UserError(metrics.string() + ": cannot be read (is " + run.string() + " a run directory?)");
  const fs::path out = f.get("--out", (run / "loss.png").string());
  // Checked before gnuplot runs: it would report a missing folder in its own words over several lines,
  // and a folder given as the file would look like a plot written.
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw UserError("--out " + out.string() + " is a folder: give the name of the PNG file to write");
  const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, ec)) {
    throw UserError("--out " + out.string() + ": the folder " + folder.string() + " does not exist");
  }

  // Two data files for gnuplot: step loss, and step val_loss [val_acc].
  // Everything goes to temporary names beside the output; the PNG is renamed into place when whole.
  const fs::path train_file = out.string() + ".train.tmp", val_file = out.string() + ".val.tmp";
  std::ofstream train_data(train_file), val_data(val_file);
  std::string line;
  int64_t train_points = 0, val_points = 0;
  bool accuracy = false;
  while (std::getline(in, line)) {
    auto step = metrics_field(line, "step"), loss = metrics_field(line, "loss"), val = metrics_field(line, "val_loss");
    auto acc = metrics_field(line, "val_acc");
    if (!step) continue;
    if (loss) {
      train_data << *step << " " << *loss << "\n";
      ++train_points;
    }
    if (val) {
      val_data << *step << " " << *val << " " << acc.value_or(0.0) << "\n";
      accuracy = accuracy || acc.has_value();
      ++val_points;
    }
  }
  train_data.close();
  val_data.close();
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove(train_file, ec);
    fs::remove(val_file, ec);
  };
  if (train_points == 0) {
    cleanup();
    throw UserError(metrics.string() + ": no logged steps to plot yet");
  }
  std::string script = absl::StrCat(
      "set terminal pngcairo size 900,540 enhanced font 'sans,10'\n"
      "set output ",
      gnuplot_quote(out.string() + ".tmp"),
      "\n"
      "set title ",
      gnuplot_quote(absl::StrCat("seqlab run ", fs::absolute(run).filename().string())),
      " noenhanced\n"
      "set xlabel 'step'\nset ylabel 'loss (nats per token)'\nset grid\nset key top right\n");
  std::string plots = absl::StrCat("plot ", gnuplot_quote(train_file.string()),
                                   " using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'train loss'");
  if (val_points > 0) {
    absl::StrAppend(&plots, ", ", gnuplot_quote(val_file.string()),
                    " using 1:2 with linespoints pt 7 ps 0.8 lw 2 lc rgb '#d62728' title 'val loss'");
  }
  if (accuracy) {
    absl::StrAppend(&script, "set y2label 'val accuracy'\nset y2range [0:1]\nset y2tics\nset ytics nomirror\n");
    absl::StrAppend(&plots, ", ", gnuplot_quote(val_file.string()),
                    " using 1:3 axes x1y2 with linespoints pt 5 ps 0.8 lc rgb '#2ca02c' title 'val accuracy'");
  }
  script += plots + "\n";
  try {
    run_gnuplot(script, out.string());
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  std::cout << absl::StrFormat("%s: %d training and %d validation points\n", out.string(), train_points, val_points);
}

}  // namespace

int plot_command(const std::vector<std::string>& args) { return run_guarded("plot", [&] { plot(args); }); }

}  // namespace seqlab::cli
