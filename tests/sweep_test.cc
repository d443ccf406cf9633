// Sweeps (src/train/sweep/sweep.h): reading a sweep file and its refusals, the grid's expansion (order,
// folder names, the --set overrides with their quoting), a point's outcome read from its run folder, the
// best-over-lr selection of the results table with a failed point, and results.csv read back.
#include "train/sweep/sweep.h"

#include <absl/strings/numbers.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace seqlab {
namespace {

namespace fs = std::filesystem;

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/seqlab_sweep_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string put(const std::string& name, const std::string& text) {
    const std::string path = (fs::path(dir_) / name).string();
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }
  std::string error_of(const std::string& text) {
    absl::StatusOr<Sweep> s = load_sweep(put("s.toml", text));
    return s.ok() ? "" : std::string(s.status().message());
  }
  std::string dir_;
};

const char kSweep[] =
    "name = \"cmp\"\n"
    "recipe = \"recipes/base.toml\"\n"
    "metric = \"val_acc\"\n"
    "best_over = [\"optim.lr\"]\n"
    "rows = \"model.mixer\"\n"
    "[grid]\n"
    "\"model.mixer\" = [\"attention\", \"gla\"]\n"
    "\"model.d_model\" = [32, 64]\n"
    "\"optim.lr\" = [1e-3, 0.003]\n"
    "[set]\n"
    "\"train.steps\" = 5\n"
    "\"data.task\" = \"mqar\"\n";

TEST_F(SweepTest, ReadsTheFileAndExpandsTheGrid) {
  absl::StatusOr<Sweep> s = load_sweep(put("sweeps/cmp.toml", kSweep));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "cmp");
  EXPECT_EQ(s->recipe, (fs::path(dir_) / "sweeps/recipes/base.toml").string());  // relative to the file
  EXPECT_TRUE(s->higher_is_better);
  ASSERT_EQ(s->axes.size(), 3u);  // in key order
  EXPECT_EQ(s->axes[0].key, "model.d_model");
  EXPECT_EQ(s->axes[1].key, "model.mixer");
  EXPECT_EQ(s->axes[1].values, (std::vector<std::string>{"\"attention\"", "\"gla\""}));
  EXPECT_EQ(s->axes[2].values, (std::vector<std::string>{"0.001", "0.003"}));
  const std::vector<SweepPoint> points = expand_grid(*s);
  ASSERT_EQ(points.size(), 8u);
  EXPECT_EQ(points[0].name, "d_model=32,mixer=attention,lr=0.001");
  EXPECT_EQ(points[1].name, "d_model=32,mixer=attention,lr=0.003");  // the last axis varies fastest
  EXPECT_EQ(points[7].name, "d_model=64,mixer=gla,lr=0.003");
  EXPECT_EQ(points[5].overrides, (std::vector<std::string>{"data.task=\"mqar\"", "train.steps=5", "model.d_model=64",
                                                           "model.mixer=\"attention\"", "optim.lr=0.003"}));
}

TEST_F(SweepTest, RefusesWhatItCannotRun) {
  EXPECT_EQ(error_of("recipe = \"r.toml\"\n"), dir_ + "/s.toml: no [grid]: list at least one recipe key with its values");
  EXPECT_EQ(error_of("[grid]\n\"optim.lr\" = [1]\n"),
            dir_ + "/s.toml: no recipe: name the base recipe, e.g. recipe = \"../gpt_small.toml\"");
  EXPECT_EQ(error_of("recipe = \"r.toml\"\n[grid]\n\"optim.lr\" = []\n"),
            dir_ + "/s.toml: grid.optim.lr must be a non-empty list of values, e.g. [1e-3, 3e-3]");
  EXPECT_EQ(error_of("recipe = \"r.toml\"\nbest_over = [\"optim.lr\"]\n[grid]\n\"model.mixer\" = [\"gla\"]\n"),
            dir_ + "/s.toml: best_over names optim.lr, which is not an axis of [grid]");
  EXPECT_NE(error_of("recipe = \"r.toml\"\njobs = 2\n[grid]\n\"optim.lr\" = [1]\n").find("unknown or mistyped key 'jobs'"),
            std::string::npos);
  EXPECT_NE(error_of("recipe = \"r.toml\n").find("TOML syntax error"), std::string::npos);
  EXPECT_EQ(load_sweep(dir_ + "/none.toml").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SweepTest, ReadsAPointsOutcomeFromItsRunFolder) {
  const std::string run = dir_ + "/p";
  put("p/metrics.jsonl",
      "{\"step\": 1, \"loss\": 3.0, \"elapsed_s\": 0.5}\n"
      "{\"step\": 2, \"loss\": 2.5, \"elapsed_s\": 1.0, \"val_loss\": 2.75, \"val_acc\": 0.25}\n"
      "{\"step\": 4, \"loss\": 2.0, \"elapsed_s\": 2.5, \"val_loss\": 2.125, \"val_acc\": 0.5}\n");
  put("p.log", "seqlab: base: 12345 parameters; 2000 train tokens; run directory p\n");
  PointOutcome o = read_outcome(run, "val_acc", 4);
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(*o.metric, 0.5);
  EXPECT_EQ(o.params, 12345);
  EXPECT_EQ(o.wall_s, 2.5);
  // Not at its last step yet: unfinished; with a runner's note: failed, for that reason.
  o = read_outcome(run, "val_acc", 10);
  EXPECT_FALSE(o.finished);
  EXPECT_EQ(o.last_step, 4);
  put("p.failed", "seqlab train: out of patience\n");
  EXPECT_EQ(read_outcome(run, "val_acc", 10).failure, "seqlab train: out of patience");
}

// A metric at another evaluation length (eval.seq_len): val_acc@1024 is its own field, apart from val_acc
// (train.seq_len's) and from a longer length's whose name starts the same; higher is better for it too.
// The eval lengths themselves reach every point as a list in [set].
TEST_F(SweepTest, SelectsAMetricAtAnEvaluationLength) {
  absl::StatusOr<Sweep> s = load_sweep(put("len.toml",
                                           "recipe = \"r.toml\"\nmetric = \"val_acc@1024\"\n[grid]\n"
                                           "\"model.mixer\" = [\"gla\"]\n[set]\n\"eval.seq_len\" = [256, 1024, 10240]\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->metric, "val_acc@1024");
  EXPECT_TRUE(s->higher_is_better);
  EXPECT_EQ(expand_grid(*s)[0].overrides,
            (std::vector<std::string>{"eval.seq_len=[256, 1024, 10240]", "model.mixer=\"gla\""}));
  const std::string run = dir_ + "/p";
  put("p/metrics.jsonl",
      "{\"step\": 2, \"loss\": 2.5, \"elapsed_s\": 1.0, \"val_loss\": 2.75, \"val_acc\": 0.75, "
      "\"val_loss@1024\": 3.5, \"val_acc@1024\": 0.25, \"val_acc@10240\": 0.125}\n");
  EXPECT_EQ(*read_outcome(run, "val_acc@1024", 2).metric, 0.25);
  EXPECT_EQ(*read_outcome(run, "val_acc@10240", 2).metric, 0.125);
  EXPECT_EQ(*read_outcome(run, "val_acc", 2).metric, 0.75);
  EXPECT_EQ(*read_outcome(run, "val_loss@1024", 2).metric, 3.5);
  EXPECT_FALSE(read_outcome(run, "val_acc@512", 2).metric.has_value());  // not evaluated at 512
  EXPECT_FALSE(read_outcome(run, "val_acc@512", 2).finished);
  // A list of lists is no recipe value.
  EXPECT_EQ(error_of("recipe = \"r.toml\"\n[grid]\n\"eval.seq_len\" = [[1, [2]]]\n"),
            dir_ + "/s.toml: grid.eval.seq_len: values must be strings, numbers, booleans or lists of them");
}

TEST_F(SweepTest, TheTableTakesTheBestOverLrAndNamesFailures) {
  Sweep s = *load_sweep(put("sweeps/cmp.toml", kSweep));
  std::vector<PointResult> results;
  // val_acc by point: attention 0.9 / 0.95 at lr 1e-3 / 3e-3 (d 32), gla 0.6 / 0.4 (d 32), d 64 finished for
  // attention at lr 1e-3 only, gla d 64 failed at both learning rates.
  const std::map<std::string, double> acc = {{"d_model=32,mixer=attention,lr=0.001", 0.9},
                                             {"d_model=32,mixer=attention,lr=0.003", 0.95},
                                             {"d_model=32,mixer=gla,lr=0.001", 0.6},
                                             {"d_model=32,mixer=gla,lr=0.003", 0.4},
                                             {"d_model=64,mixer=attention,lr=0.001", 1.0}};
  for (const SweepPoint& p : expand_grid(s)) {
    PointResult r;
    r.point = p;
    r.tokens = 640;
    r.state_size = 512;
    auto it = acc.find(p.name);
    if (it != acc.end()) {
      r.outcome.finished = true;
      r.outcome.metric = it->second;
      r.outcome.params = 1000;
      r.flops = 3.84e6;
    } else if (p.name.find("gla") != std::string::npos) {
      r.outcome.failure = "seqlab train: a reason, with a comma";
    }
    results.push_back(r);
  }
  const std::string table = results_table(s, results);
  EXPECT_NE(table.find("| model.mixer | d_model = 32 | d_model = 64 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| attention | 0.95 (lr=0.003) | 1 (lr=0.001) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| gla | 0.6 (lr=0.001) | failed |"), std::string::npos) << table;
  EXPECT_NE(table.find("- d_model=64,mixer=gla,lr=0.001: seqlab train: a reason, with a comma"), std::string::npos);

  // results.csv: a header and one row a point, read back field by field.
  std::istringstream csv(results_csv(s, results));
  std::string header, row;
  std::getline(csv, header);
  EXPECT_EQ(header,
            "point,model.d_model,model.mixer,optim.lr,status,params,tokens,train_flops,state_size,wall_s,val_acc");
  std::vector<std::string> rows;
  while (std::getline(csv, row)) rows.push_back(row);
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[1], "\"d_model=32,mixer=attention,lr=0.003\",32,attention,0.003,ok,1000,640,3.84e+06,512,0.0,0.95");
  EXPECT_EQ(rows[6], "\"d_model=64,mixer=gla,lr=0.001\",64,gla,0.001,failed,0,640,0,512,0.0,");
  EXPECT_EQ(rows[3], "\"d_model=32,mixer=gla,lr=0.003\",32,gla,0.003,ok,1000,640,3.84e+06,512,0.0,0.4");
}

// The power law of each row over training FLOPs: metric = 5·C^−0.1 exactly at three widths is recovered.
TEST_F(SweepTest, PowerLawFitsOverTrainingFlops) {
  absl::StatusOr<Sweep> s = load_sweep(put("p.toml",
                                           "recipe = \"r.toml\"\nrows = \"model.mixer\"\n[grid]\n"
                                           "\"model.mixer\" = [\"gla\"]\n\"model.d_model\" = [32, 64, 128]\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<PointResult> results;
  double flops = 1e9;
  for (const SweepPoint& p : expand_grid(*s)) {
    PointResult r;
    r.point = p;
    r.flops = flops;
    r.outcome.finished = true;
    r.outcome.metric = 5 * std::pow(flops, -0.1);
    flops *= 4;
    results.push_back(r);
  }
  const std::vector<PowerLaw> fits = power_law_fits(best_table(*s, results));
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(fits[0].row, "\"gla\"");
  EXPECT_NEAR(fits[0].a, 5, 1e-9);
  EXPECT_NEAR(fits[0].b, -0.1, 1e-12);
  EXPECT_EQ(fits[0].points, 3);
  EXPECT_NE(results_table(*s, results).find("- gla: a = 5, b = -0.1 (3 cells)"), std::string::npos)
      << results_table(*s, results);
}

// A point is its recipe: every grid and [set] number reaches the point's --set exactly (the shortest text
// that reads back to the same double, beyond 6 digits), floats stay floats, and inf and nan are TOML's.
TEST_F(SweepTest, ValuesReachThePointExactly) {
  absl::StatusOr<Sweep> s = load_sweep(put("x.toml",
                                           "recipe = \"r.toml\"\n[grid]\n"
                                           "\"optim.lr\" = [0.00012345678, 0.00012345679, 1e30, 1.0]\n"
                                           "[set]\n\"optim.beta2\" = 0.9999999\n\"optim.eps\" = 2.2250738585072014e-308\n"
                                           "\"model.norm_eps\" = inf\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->axes[0].values, (std::vector<std::string>{"0.00012345678", "0.00012345679", "1e+30", "1.0"}));
  EXPECT_EQ(s->fixed, (std::vector<std::string>{"model.norm_eps=inf", "optim.beta2=0.9999999",
                                                "optim.eps=2.2250738585072014e-308"}));
  const std::vector<SweepPoint> points = expand_grid(*s);
  ASSERT_EQ(points.size(), 4u);
  // Values equal to 6 digits are two points in two folders.
  EXPECT_EQ(points[0].name, "lr=0.00012345678");
  EXPECT_EQ(points[1].name, "lr=0.00012345679");
  EXPECT_EQ(points[0].overrides.back(), "optim.lr=0.00012345678");
  for (const std::string& v : s->axes[0].values) {
    double x;
    ASSERT_TRUE(absl::SimpleAtod(v, &x)) << v;
    EXPECT_EQ(v.find_first_of(".e") == std::string::npos, false) << v << " would read as an integer";
  }
}

// Folder names are unique for their values: values that clean up alike get a hash of the exact values,
// and so does a name too long for a file name; other names stay as they were.
TEST_F(SweepTest, EveryPointHasAFolderOfItsOwn) {
  absl::StatusOr<Sweep> s = load_sweep(put("x.toml",
                                           "recipe = \"r.toml\"\n[grid]\n"
                                           "\"log.sample_prompt\" = [\"a b\", \"a_b\", \"a/b\", \"ab\", \"" +
                                               std::string(300, 'x') + "\", \"" + std::string(299, 'x') + "y\"]\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<SweepPoint> points = expand_grid(*s);
  ASSERT_EQ(points.size(), 6u);
  std::set<std::string> names;
  for (const SweepPoint& p : points) {
    names.insert(p.name);
    EXPECT_LE(p.name.size(), kMaxPointName) << p.name;
  }
  EXPECT_EQ(names.size(), 6u);
  EXPECT_EQ(points[0].name, "sample_prompt=a_b,hash=" + point_hash({"\"a b\""}));
  EXPECT_EQ(points[1].name, "sample_prompt=a_b,hash=" + point_hash({"\"a_b\""}));
  EXPECT_NE(points[0].name, points[1].name);
  EXPECT_EQ(points[3].name, "sample_prompt=ab");  // unique as it is
  EXPECT_EQ(points[4].name.substr(0, 20), "sample_prompt=xxxxxx");
}

// A metric logged as null (not finite) finishes the point but is never a cell's best, whatever the order
// of the points; a cell with nothing else says "not finite"; the CSV leaves the metric empty.
TEST_F(SweepTest, ANonFiniteMetricIsNeverTheBest) {
  const std::string run = dir_ + "/p";
  put("p/metrics.jsonl", "{\"step\": 2, \"loss\": null, \"elapsed_s\": 1.0, \"val_loss\": null}\n");
  PointOutcome o = read_outcome(run, "val_loss", 2);
  EXPECT_TRUE(o.finished);
  ASSERT_TRUE(o.metric.has_value());
  EXPECT_TRUE(std::isnan(*o.metric));
  EXPECT_FALSE(o.usable());
  EXPECT_EQ(point_status(o), "not_finite");
  // What runs wrote before null: -nan and inf read as not finite too.
  put("p/metrics.jsonl", "{\"step\": 2, \"loss\": -nan, \"elapsed_s\": 1.0, \"val_loss\": inf}\n");
  EXPECT_EQ(point_status(read_outcome(run, "val_loss", 2)), "not_finite");

  absl::StatusOr<Sweep> s = load_sweep(put("x.toml",
                                           "recipe = \"r.toml\"\nbest_over = [\"optim.lr\"]\n[grid]\n"
                                           "\"model.mixer\" = [\"gla\", \"attention\"]\n\"optim.lr\" = [1, 2, 3]\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<PointResult> results;
  for (const SweepPoint& p : expand_grid(*s)) {
    PointResult r;
    r.point = p;
    r.flops = 1e9;
    r.outcome.finished = true;
    // gla: NaN, 2.5, NaN (the NaN first and last); attention: NaN at every lr.
    const bool finite = p.name == "mixer=gla,lr=2";
    r.outcome.metric = finite ? 2.5 : std::nan("");
    results.push_back(r);
  }
  const SweepTable t = best_table(*s, results);
  ASSERT_NE(t.cells[0].best, nullptr);
  EXPECT_EQ(t.cells[0].best->point.name, "mixer=gla,lr=2");
  EXPECT_EQ(t.cells[1].best, nullptr);
  EXPECT_TRUE(t.cells[1].not_finite);
  const std::string table = results_table(*s, results);
  EXPECT_NE(table.find("| gla | 2.5 (lr=2) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| attention | not finite |"), std::string::npos) << table;
  EXPECT_NE(table.find("- mixer=attention,lr=1\n"), std::string::npos) << table;
  EXPECT_TRUE(power_law_fits(t).empty() || power_law_fits(t)[0].points == 1);
  const std::string csv = results_csv(*s, results);
  EXPECT_NE(csv.find("\"mixer=attention,lr=1\",attention,1,not_finite,0,0,1e+09,0,0.0,\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",ok,0,0,1e+09,0,0.0,2.5\n"), std::string::npos) << csv;
}

// A point stopped by the sweep (RUN.stopped) is "stopped", not failed, and results.md says it resumes.
TEST_F(SweepTest, AStoppedPointIsNotAFailure) {
  const std::string run = dir_ + "/p";
  put("p/metrics.jsonl", "{\"step\": 1, \"loss\": 3.0, \"elapsed_s\": 0.5}\n");
  put("p.stopped", "stopped by the sweep's Terminated after step 1 (a checkpoint saved)\n");
  PointOutcome o = read_outcome(run, "val_loss", 4);
  EXPECT_EQ(point_status(o), "stopped");
  EXPECT_EQ(o.stopped, "stopped by the sweep's Terminated after step 1 (a checkpoint saved)");
  Sweep s = *load_sweep(put("x.toml", "recipe = \"r.toml\"\n[grid]\n\"optim.lr\" = [1]\n"));
  PointResult r;
  r.point = expand_grid(s)[0];
  r.outcome = o;
  const std::string table = results_table(s, {r});
  EXPECT_NE(table.find("Stopped points (the next run of the sweep resumes them):\n- lr=1: stopped by"),
            std::string::npos) << table;
  EXPECT_EQ(table.find("Failed points"), std::string::npos) << table;
}

// Fair comparisons: results.md lists the settings every point shares, and flags a key other than the
// grid's (or the per-launch ones) whose value differs between points, with each value and where it is.
TEST_F(SweepTest, ResultsListTheSharedSettingsAndFlagConfounds) {
  Sweep s = *load_sweep(put("x.toml", "recipe = \"r.toml\"\n[grid]\n\"model.mixer\" = [\"attention\", \"gla\"]\n"));
  std::vector<PointResult> results;
  for (const SweepPoint& p : expand_grid(s)) {
    PointResult r;
    r.point = p;
    const bool gla = p.name == "mixer=gla";
    r.settings = {{"model.mixer", gla ? "\"gla\"" : "\"attention\""},
                  {"model.norm", "\"rmsnorm\""},
                  {"model.n_layers", "4"},
                  {"parallel.threads", gla ? "1" : "2"},  // per launch: never a confound
                  {"optim.warmup_steps", gla ? "10" : "30"}};
    results.push_back(r);
  }
  std::vector<Confound> c = confounds(s, results);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].key, "optim.warmup_steps");
  EXPECT_EQ(c[0].values, (std::vector<std::pair<std::string, std::string>>{{"30", "mixer=attention"}, {"10", "mixer=gla"}}));
  std::string table = results_table(s, results);
  EXPECT_NE(table.find("Every point's block and training settings (resolved), besides the grid's keys: "
                       "model.n_layers = 4, model.norm = \"rmsnorm\"\n"),
            std::string::npos) << table;
  EXPECT_NE(table.find("**Not a fair comparison**: the points differ in more than the grid's keys:\n"
                       "- optim.warmup_steps: 30 (mixer=attention), 10 (mixer=gla)\n"),
            std::string::npos) << table;
  // Equal but for the grid's keys: nothing flagged.
  results[1].settings[4].second = "30";
  EXPECT_TRUE(confounds(s, results).empty());
  table = results_table(s, results);
  EXPECT_EQ(table.find("Not a fair comparison"), std::string::npos) << table;
  EXPECT_NE(table.find("optim.warmup_steps = 30"), std::string::npos) << table;
}

}  // namespace
}  // namespace seqlab
