// Sweeps: the file, the grid, a point's outcome and the results (sweep.h).
#include "train/sweep/sweep.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "train/common/json.h"
#include "train/recipe/recipe.h"

namespace seqlab {

namespace fs = std::filesystem;

namespace {

absl::Status bad(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(file + ": " + what);
}

// A TOML value as the literal a --set override takes (strings quoted, numbers as TOML writes them).
std::optional<std::string> literal_of(const toml::node& node) {
  if (node.is_string()) {
    const std::string text = *node.value<std::string>();
    std::string out = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  if (node.is_integer()) return std::to_string(*node.value<int64_t>());
  if (node.is_floating_point()) return toml_number(*node.value<double>());
  if (node.is_boolean()) return *node.value<bool>() ? "true" : "false";
  // A list of such values (eval.seq_len = [256, 1024]), flat: recipe keys hold no nested lists.
  if (const toml::array* a = node.as_array()) {
    std::vector<std::string> items;
    for (const toml::node& n : *a) {
      if (n.is_array() || n.is_table()) return std::nullopt;
      std::optional<std::string> item = literal_of(n);
      if (!item) return std::nullopt;
      items.push_back(*item);
    }
    return "[" + absl::StrJoin(items, ", ") + "]";
  }
  return std::nullopt;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The short name of an axis in folder names: its last component ("optim.lr" → "lr").
std::string short_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

}  // namespace

absl::StatusOr<Sweep> load_sweep(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return absl::NotFoundError("sweep file not found: " + path);
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.source().begin.line, ":", e.source().begin.column,
                                                   ": TOML syntax error: ", std::string(e.description())));
  }
  Sweep s;
  s.file = path;
  s.name = fs::path(path).stem().string();
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "name" && v.is_string()) {
      s.name = *v.value<std::string>();
    } else if (key == "recipe" && v.is_string()) {
      s.recipe = (fs::path(path).parent_path() / *v.value<std::string>()).lexically_normal().string();
    } else if (key == "metric" && v.is_string()) {
      s.metric = *v.value<std::string>();
    } else if ((key == "rows" || key == "columns") && v.is_string()) {
      (key == "rows" ? s.rows : s.columns) = *v.value<std::string>();
    } else if (key == "best_over" && v.is_array()) {
      for (const toml::node& n : *v.as_array()) {
        if (!n.is_string()) return bad(path, "best_over must list recipe keys (strings)");
        s.best_over.push_back(*n.value<std::string>());
      }
    } else if (key == "grid" && v.is_table()) {
      for (const auto& [gk, gv] : *v.as_table()) {
        SweepAxis axis{std::string(gk.str()), {}};
        if (!gv.is_array() || gv.as_array()->empty()) {
          return bad(path, "grid." + axis.key + " must be a non-empty list of values, e.g. [1e-3, 3e-3]");
        }
        for (const toml::node& n : *gv.as_array()) {
          std::optional<std::string> lit = literal_of(n);
          if (!lit) return bad(path, "grid." + axis.key + ": values must be strings, numbers, booleans or lists of them");
          axis.values.push_back(*lit);
        }
        s.axes.push_back(std::move(axis));
      }
    } else if (key == "set" && v.is_table()) {
      for (const auto& [sk, sv] : *v.as_table()) {
        std::optional<std::string> lit = literal_of(sv);
        if (!lit) {
          return bad(path, "set." + std::string(sk.str()) + ": a value must be a string, number, boolean or a list of them");
        }
        s.fixed.push_back(std::string(sk.str()) + "=" + *lit);
      }
    } else {
      return bad(path, "unknown or mistyped key '" + key +
                           "' (a sweep file has name, recipe, metric, best_over, rows, columns and the tables [grid] "
                           "and [set])");
    }
  }
  if (s.recipe.empty()) return bad(path, "no recipe: name the base recipe, e.g. recipe = \"../gpt_small.toml\"");
  if (s.axes.empty()) return bad(path, "no [grid]: list at least one recipe key with its values");
  if (s.name.empty() || s.name.find('/') != std::string::npos) return bad(path, "name must be a folder name");
  auto is_axis = [&](const std::string& k) {
    return std::any_of(s.axes.begin(), s.axes.end(), [&](const SweepAxis& a) { return a.key == k; });
  };
  for (const std::string& b : s.best_over) {
    if (!is_axis(b)) return bad(path, "best_over names " + b + ", which is not an axis of [grid]");
  }
  for (const std::string* k : {&s.rows, &s.columns}) {
    if (!k->empty() && !is_axis(*k)) return bad(path, (k == &s.rows ? "rows" : "columns") + std::string(" names ") + *k + ", which is not an axis of [grid]");
  }
  s.higher_is_better = s.metric.find("acc") != std::string::npos;
  return s;
}

std::string display_value(const std::string& literal) {
  if (literal.size() >= 2 && literal.front() == '"' && literal.back() == '"') return literal.substr(1, literal.size() - 2);
  return literal;
}

std::vector<SweepPoint> expand_grid(const Sweep& sweep) {
  std::vector<SweepPoint> points(1);
  for (const SweepAxis& axis : sweep.axes) {
    std::vector<SweepPoint> next;
    for (const SweepPoint& p : points) {
      for (const std::string& v : axis.values) {
        SweepPoint q = p;
        q.values.push_back(v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  // Short keys name the folders unless two axes share one (then the whole key).
  std::map<std::string, int> uses;
  for (const SweepAxis& a : sweep.axes) ++uses[short_key(a.key)];
  std::map<std::string, int> names;  // how many points each cleaned name would serve
  for (SweepPoint& p : points) {
    std::vector<std::string> parts;
    p.overrides = sweep.fixed;
    for (size_t i = 0; i < sweep.axes.size(); ++i) {
      const std::string& key = sweep.axes[i].key;
      const std::string k = uses[short_key(key)] > 1 ? key : short_key(key);
      std::string v = display_value(p.values[i]);
      for (char& ch : v) {
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '+' || ch == '_')) ch = '_';
      }
      parts.push_back(k + "=" + v);
      p.overrides.push_back(key + "=" + p.values[i]);
    }
    p.name = absl::StrJoin(parts, ",");
    ++names[p.name];
  }
  // A folder is one point's: where cleaning made two names alike ("a b" and "a_b"), or a name is too long
  // for a file name with its ".failed" beside it, the name is cut and a hash of the exact values added.
  for (SweepPoint& p : points) {
    if (names[p.name] == 1 && p.name.size() <= kMaxPointName) continue;
    const std::string tag = ",hash=" + point_hash(p.values);
    if (p.name.size() + tag.size() > kMaxPointName) p.name.resize(kMaxPointName - tag.size());
    p.name += tag;
  }
  return points;
}

std::string point_hash(const std::vector<std::string>& values) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the literals, each ended by a NUL
  for (const std::string& v : values) {
    for (char c : v) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    h = (h ^ 0) * 0x100000001b3ULL;
  }
  return absl::StrFormat("%016x", h);
}

namespace {
// The number a metrics line logs under `key`: NaN for null (a value that was not finite) and for the
// nan/inf that runs before null wrote; nullopt when the line has no such field.
std::optional<double> logged_number(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\": ";
  const size_t at = line.find(tag);
  if (at == std::string::npos) return std::nullopt;
  if (line.compare(at + tag.size(), 4, "null") == 0) return std::nan("");
  if (std::optional<double> v = cli::metrics_field(line, key)) return std::isfinite(*v) ? *v : std::nan("");
  return std::nullopt;
}

std::string first_line_of(const std::string& file) {
  std::string text = slurp(file);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}
}  // namespace

bool PointOutcome::usable() const { return finished && metric && std::isfinite(*metric); }

PointOutcome read_outcome(const std::string& run_dir, const std::string& metric, int64_t steps) {
  PointOutcome o;
  std::ifstream metrics(fs::path(run_dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) {
    const std::optional<double> step = cli::metrics_field(line, "step");
    if (!step) continue;
    o.last_step = static_cast<int64_t>(*step);
    if (std::optional<double> e = cli::metrics_field(line, "elapsed_s")) o.wall_s = *e;
    if (o.last_step == steps) {
      if (std::optional<double> m = logged_number(line, metric)) o.metric = m;
    }
  }
  o.finished = o.last_step == steps && o.metric.has_value();
  const std::string log = slurp(run_dir + ".log");
  // The start line: "seqlab: NAME: 3295488 parameters; ..."
  const size_t at = log.find(" parameters;");
  if (at != std::string::npos) {
    size_t begin = log.rfind(' ', at - 1);
    double n;
    if (begin != std::string::npos && absl::SimpleAtod(log.substr(begin + 1, at - begin - 1), &n)) o.params = n;
  }
  if (!o.finished) {
    o.failure = first_line_of(run_dir + ".failed");
    o.stopped = first_line_of(run_dir + ".stopped");
  }
  return o;
}

std::string point_status(const PointOutcome& o) {
  if (o.finished) return o.usable() ? "ok" : "not_finite";
  if (!o.failure.empty()) return "failed";
  return o.stopped.empty() ? "unfinished" : "stopped";
}

namespace {
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
}  // namespace

std::string results_csv(const Sweep& sweep, const std::vector<PointResult>& results) {
  std::vector<std::string> header{"point"};
  for (const SweepAxis& a : sweep.axes) header.push_back(a.key);
  for (const char* h : {"status", "params", "tokens", "train_flops", "state_size", "wall_s"}) header.emplace_back(h);
  header.push_back(sweep.metric);
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const PointResult& r : results) {
    std::vector<std::string> row{csv_field(r.point.name)};
    for (const std::string& v : r.point.values) row.push_back(csv_field(display_value(v)));
    row.push_back(point_status(r.outcome));
    row.push_back(absl::StrFormat("%.0f", r.outcome.params));
    row.push_back(std::to_string(r.tokens));
    row.push_back(absl::StrFormat("%.4g", r.flops));
    row.push_back(absl::StrFormat("%.0f", r.state_size));
    row.push_back(absl::StrFormat("%.1f", r.outcome.wall_s));
    // Exact (the shortest text that reads back to the logged double); empty when missing or not finite.
    row.push_back(r.outcome.usable() ? toml_number(*r.outcome.metric) : "");
    out += absl::StrJoin(row, ",") + "\n";
  }
  return out;
}

SweepTable best_table(const Sweep& sweep, const std::vector<PointResult>& results) {
  // The table's axes: rows and columns when the file names them, else the first two (in key order) that
  // best_over does not name.
  auto index_of = [&](const std::string& key) {
    for (size_t i = 0; i < sweep.axes.size(); ++i) {
      if (sweep.axes[i].key == key) return static_cast<int>(i);
    }
    return -1;
  };
  std::vector<int> shown;
  for (const std::string* k : {&sweep.rows, &sweep.columns}) {
    if (!k->empty()) shown.push_back(index_of(*k));
  }
  for (size_t i = 0; i < sweep.axes.size() && shown.size() < 2; ++i) {
    const bool free = std::find(sweep.best_over.begin(), sweep.best_over.end(), sweep.axes[i].key) == sweep.best_over.end();
    if (free && std::find(shown.begin(), shown.end(), static_cast<int>(i)) == shown.end()) shown.push_back(static_cast<int>(i));
  }
  SweepTable t;
  t.row_axis = shown.size() > 0 ? shown[0] : -1;
  t.column_axis = shown.size() > 1 ? shown[1] : -1;
  t.rows = t.row_axis >= 0 ? sweep.axes[t.row_axis].values : std::vector<std::string>{""};
  t.columns = t.column_axis >= 0 ? sweep.axes[t.column_axis].values : std::vector<std::string>{""};
  for (const std::string& row : t.rows) {
    for (const std::string& col : t.columns) {
      SweepCell cell{row, col};
      for (const PointResult& r : results) {
        if (t.row_axis >= 0 && r.point.values[t.row_axis] != row) continue;
        if (t.column_axis >= 0 && r.point.values[t.column_axis] != col) continue;
        if (!r.outcome.finished) {
          cell.failed = cell.failed || !r.outcome.failure.empty();
          continue;
        }
        if (!r.outcome.usable()) {  // NaN compares false both ways: never let it near the comparison
          cell.not_finite = true;
          continue;
        }
        const double m = *r.outcome.metric;
        const double b = cell.best ? *cell.best->outcome.metric : 0;
        if (cell.best == nullptr || (sweep.higher_is_better ? m > b : m < b)) cell.best = &r;
      }
      t.cells.push_back(cell);
    }
  }
  return t;
}

const std::vector<std::string>& per_launch_keys() {
  static const std::vector<std::string> keys = {"parallel.threads", "log.progress", "log.out_dir"};
  return keys;
}

std::vector<Confound> confounds(const Sweep& sweep, const std::vector<PointResult>& results) {
  std::vector<Confound> out;
  const PointResult* first = nullptr;
  for (const PointResult& r : results) {
    if (!r.settings.empty()) {
      first = &r;
      break;
    }
  }
  if (first == nullptr) return out;
  auto varied = [&](const std::string& key) {
    if (std::find(per_launch_keys().begin(), per_launch_keys().end(), key) != per_launch_keys().end()) return true;
    return std::any_of(sweep.axes.begin(), sweep.axes.end(), [&](const SweepAxis& a) { return a.key == key; });
  };
  for (size_t k = 0; k < first->settings.size(); ++k) {
    const std::string& key = first->settings[k].first;
    if (varied(key)) continue;
    Confound c{key, {}};
    for (const PointResult& r : results) {
      if (r.settings.size() != first->settings.size()) continue;
      const std::string& v = r.settings[k].second;
      if (std::none_of(c.values.begin(), c.values.end(), [&](const auto& seen) { return seen.first == v; })) {
        c.values.emplace_back(v, r.point.name);
      }
    }
    if (c.values.size() > 1) out.push_back(std::move(c));
  }
  return out;
}

std::vector<PowerLaw> power_law_fits(const SweepTable& table) {
  std::vector<PowerLaw> fits;
  for (const std::string& row : table.rows) {
    std::vector<std::pair<double, double>> xy;  // (log C, log metric)
    for (const SweepCell& c : table.cells) {
      if (c.row != row || c.best == nullptr || c.best->flops <= 0 || *c.best->outcome.metric <= 0) continue;
      xy.emplace_back(std::log(c.best->flops), std::log(*c.best->outcome.metric));
    }
    const double n = static_cast<double>(xy.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [x, y] : xy) {
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    const double denom = n * sxx - sx * sx;
    if (xy.size() < 2 || !(std::fabs(denom) > 1e-12 * std::max(1.0, n * sxx))) continue;
    const double b = (n * sxy - sx * sy) / denom;
    fits.push_back({row, std::exp((sy - b * sx) / n), b, static_cast<int>(xy.size())});
  }
  return fits;
}

std::string results_table(const Sweep& sweep, const std::vector<PointResult>& results) {
  const SweepTable t = best_table(sweep, results);
  auto text_of = [&](const SweepCell& c) {
    if (c.best == nullptr) return std::string(c.failed ? "failed" : c.not_finite ? "not finite" : "—");
    std::vector<std::string> at;  // where the best sits on the other axes
    for (size_t i = 0; i < sweep.axes.size(); ++i) {
      if (static_cast<int>(i) == t.row_axis || static_cast<int>(i) == t.column_axis || sweep.axes[i].values.size() < 2) continue;
      at.push_back(short_key(sweep.axes[i].key) + "=" + display_value(c.best->point.values[i]));
    }
    std::string text = absl::StrFormat("%.4g", *c.best->outcome.metric);
    if (!at.empty()) text += " (" + absl::StrJoin(at, ", ") + ")";
    return text;
  };
  std::string out =
      absl::StrFormat("%s, %s (%s is better)", sweep.name, sweep.metric, sweep.higher_is_better ? "higher" : "lower");
  if (!sweep.best_over.empty()) out += ", the best over " + absl::StrJoin(sweep.best_over, ", ");
  out += "\n\n";
  std::string head = "| " + (t.row_axis >= 0 ? sweep.axes[t.row_axis].key : std::string("")) + " |", rule = "|---|";
  for (const std::string& c : t.columns) {
    head += " " + (t.column_axis >= 0 ? short_key(sweep.axes[t.column_axis].key) + " = " + display_value(c) : sweep.metric) + " |";
    rule += "---|";
  }
  out += head + "\n" + rule + "\n";
  for (size_t r = 0; r < t.rows.size(); ++r) {
    out += "| " + display_value(t.rows[r]) + " |";
    for (size_t c = 0; c < t.columns.size(); ++c) out += " " + text_of(t.cells[r * t.columns.size() + c]) + " |";
    out += "\n";
  }
  const std::vector<PowerLaw> fits = power_law_fits(t);
  if (!fits.empty()) {
    out += "\nFits of " + sweep.metric + " = a·C^b, C the training FLOPs, over each row's cells:\n";
    for (const PowerLaw& f : fits) {
      out += absl::StrFormat("- %s: a = %.4g, b = %.4g (%d cells)\n", display_value(f.row), f.a, f.b, f.points);
    }
  }
  // What every point shares: the block settings a reader needs to know what was compared, as resolved
  // ("auto" pinned by the sweep where it would follow the grid), and anything else that differs between
  // points besides the grid's keys, flagged.
  const PointResult* loaded = nullptr;
  for (const PointResult& r : results) {
    if (!r.settings.empty()) {
      loaded = &r;
      break;
    }
  }
  if (loaded != nullptr) {
    const std::vector<Confound> unfair = confounds(sweep, results);
    std::vector<std::string> shared;
    for (const std::string& key : kBlockSettingKeys) {
      const bool axis = std::any_of(sweep.axes.begin(), sweep.axes.end(), [&](const SweepAxis& a) { return a.key == key; });
      const bool differs = std::any_of(unfair.begin(), unfair.end(), [&](const Confound& c) { return c.key == key; });
      if (axis || differs) continue;
      for (const auto& [k, v] : loaded->settings) {
        if (k == key) shared.push_back(key + " = " + v);
      }
    }
    out += "\nEvery point's block and training settings (resolved), besides the grid's keys: " +
           absl::StrJoin(shared, ", ") + "\n";
    if (!unfair.empty()) {
      out += "\n**Not a fair comparison**: the points differ in more than the grid's keys:\n";
      for (const Confound& c : unfair) {
        std::vector<std::string> values;
        for (const auto& [v, at] : c.values) values.push_back(v + " (" + at + ")");
        out += "- " + c.key + ": " + absl::StrJoin(values, ", ") + "\n";
      }
    }
  }
  // The points that give no number, each with its own reason.
  std::string failures, not_finite, stopped;
  for (const PointResult& r : results) {
    const std::string status = point_status(r.outcome);
    if (status == "failed") failures += "- " + r.point.name + ": " + r.outcome.failure + "\n";
    if (status == "stopped") stopped += "- " + r.point.name + ": " + r.outcome.stopped + "\n";
    if (status == "not_finite") not_finite += "- " + r.point.name + "\n";
  }
  if (!failures.empty()) out += "\nFailed points:\n" + failures;
  if (!not_finite.empty()) out += "\nPoints that finished with " + sweep.metric + " not finite (never a best):\n" + not_finite;
  if (!stopped.empty()) out += "\nStopped points (the next run of the sweep resumes them):\n" + stopped;
  return out;
}

}  // namespace seqlab
