// The step profile (profile.h): per-slot totals of the outermost CPU kernel calls.
#include "tensor/profile.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace seqlab::profile {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Totals {
  const char* name = nullptr;
  const char* declared_in = nullptr;
  int64_t calls = 0;
  double seconds = 0, nested_gemm_seconds = 0;
};

// One outermost frame is open at a time (a call is outermost when no frame is open anywhere), so the
// fields of the open frame need no lock but nested_gemm, which worker threads add to. The profile assumes
// one thread making top-level slot calls (the step's): a call another thread makes while a frame is open
// (a data-parallel communicator's thread beside the backward) counts as nested in it, and a step call made
// while such a thread holds the frame is left out.
struct State {
  std::mutex mu;
  // Keyed by the slot's name pointer (one per slot, and the conversions' literals): no string is built
  // while timing. Guarded by mu.
  std::unordered_map<const char*, Totals> slots;
  std::atomic<int> depth{0};            // frames open in the process (outermost, nested, conversions)
  double outer_standin_seconds = 0;     // the open outermost call's own bf16 conversions (its thread only)
  double outer_nested_gemm = 0;         // guarded by mu
};
State& state() {
  static State s;
  return s;
}
thread_local int t_depth = 0;     // frames open on this thread
thread_local bool t_outer = false;  // this thread holds the open outermost frame

void add(State& s, const char* name, const char* declared_in, double seconds, double nested_gemm) {
  std::lock_guard<std::mutex> lock(s.mu);
  Totals& t = s.slots[name];
  t.name = name;
  t.declared_in = declared_in;
  ++t.calls;
  t.seconds += seconds;
  t.nested_gemm_seconds += nested_gemm;
}

}  // namespace

void start() {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.slots.clear();
  }
  g_enabled.store(true, std::memory_order_relaxed);
}

void stop() { g_enabled.store(false, std::memory_order_relaxed); }

double Snapshot::kernel_seconds() const {
  double sum = 0;
  for (const SlotTotals& t : slots) sum += t.seconds;
  return sum;
}

Snapshot snapshot() {
  State& s = state();
  Snapshot out;
  std::lock_guard<std::mutex> lock(s.mu);
  // Two entries of one name (a slot name pointer and an equal literal elsewhere) are merged.
  std::map<std::string, SlotTotals> merged;
  for (const auto& [key, t] : s.slots) {
    SlotTotals& m = merged[t.name];
    m.name = t.name;
    m.category = category_of(t.name, t.declared_in);
    m.calls += t.calls;
    m.seconds += t.seconds;
    m.nested_gemm_seconds += t.nested_gemm_seconds;
  }
  for (auto& [name, t] : merged) out.slots.push_back(std::move(t));
  std::stable_sort(out.slots.begin(), out.slots.end(),
                   [](const SlotTotals& a, const SlotTotals& b) { return a.seconds > b.seconds; });
  return out;
}

std::string category_of(const std::string& slot, const std::string& declared_in) {
  auto one_of = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return slot == n; });
  };
  if (one_of({"gemm_kernel", "linear_kernel"})) return "gemm";
  if (one_of({"bf16 widen", "bf16 round"})) return "bf16 stand-ins";
  if (declared_in.find("tensor/slots/optim.h") != std::string::npos) return "optimizer";
  if (declared_in.find("tensor/slots/") != std::string::npos) return "attention/variant";
  if (slot.find("norm_") != std::string::npos) return "norm";
  if (one_of({"unary_kernel", "unary_backward_kernel", "binary_kernel", "scalar_kernel", "where_kernel",
              "sum_rows_kernel", "max_rows_kernel", "scatter_rows_kernel", "cumsum_kernel"})) {
    return "elementwise";
  }
  if (one_of({"copy_kernel", "fill_kernel"})) return "memory";
  if (slot.rfind("cross_entropy", 0) == 0 || slot.rfind("softmax", 0) == 0 || slot.rfind("embedding", 0) == 0) {
    return "loss/softmax/embedding";
  }
  return "other";
}

const std::vector<std::string>& categories() {
  static const std::vector<std::string> all = {"gemm",   "attention/variant", "norm",
                                               "elementwise", "optimizer", "memory",
                                               "bf16 stand-ins", "loss/softmax/embedding", "other",
                                               "framework"};
  return all;
}

namespace {

struct CategoryRow {
  std::string name;
  double seconds = 0;
};

// Per category, in categories()' order; "framework" = wall − kernels (never below 0).
std::vector<CategoryRow> category_rows(const Snapshot& s, double wall_seconds) {
  std::vector<CategoryRow> rows;
  for (const std::string& c : categories()) rows.push_back({c, 0.0});
  for (const SlotTotals& t : s.slots) {
    for (CategoryRow& r : rows) {
      if (r.name == t.category) r.seconds += t.seconds;
    }
  }
  rows.back().seconds = std::max(0.0, wall_seconds - s.kernel_seconds());
  return rows;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace

std::string table(const Snapshot& s, double wall_seconds, int64_t steps, int top) {
  const double per = 1000.0 / static_cast<double>(std::max<int64_t>(1, steps));
  const double wall = wall_seconds > 0 ? wall_seconds : 1e-300;
  std::string out = format("profile of %lld step%s: %.1f ms/step wall, %.1f ms/step in kernels\n",
                           static_cast<long long>(steps), steps == 1 ? "" : "s", wall_seconds * per,
                           s.kernel_seconds() * per);
  out += format("  %-24s %10s %7s\n", "category", "ms/step", "share");
  for (const CategoryRow& r : category_rows(s, wall_seconds)) {
    out += format("  %-24s %10.2f %6.1f%%\n", r.name.c_str(), r.seconds * per, 100.0 * r.seconds / wall);
  }
  out += format("  %-34s %-22s %10s %10s %7s %12s\n", "slot", "category", "calls/step", "ms/step", "share",
                "nested gemm");
  int shown = 0;
  for (const SlotTotals& t : s.slots) {
    if (shown++ == top) break;
    const std::string nested = t.nested_gemm_seconds > 0 ? format("%.2f", t.nested_gemm_seconds * per) : "";
    out += format("  %-34s %-22s %10.1f %10.2f %6.1f%% %12s\n", t.name.c_str(), t.category.c_str(),
                  static_cast<double>(t.calls) / static_cast<double>(std::max<int64_t>(1, steps)), t.seconds * per,
                  100.0 * t.seconds / wall, nested.c_str());
  }
  return out;
}

std::string json(const Snapshot& s, double wall_seconds, int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  const double per = 1000.0 / n;
  const double wall = wall_seconds > 0 ? wall_seconds : 1e-300;
  std::string out = format("{\"steps\": %lld, \"wall_ms_per_step\": %.4f, \"kernel_ms_per_step\": %.4f, \"categories\": [",
                           static_cast<long long>(steps), wall_seconds * per, s.kernel_seconds() * per);
  bool first = true;
  for (const CategoryRow& r : category_rows(s, wall_seconds)) {
    out += format("%s{\"name\": \"%s\", \"ms_per_step\": %.4f, \"share\": %.5f}", first ? "" : ", ", r.name.c_str(),
                  r.seconds * per, r.seconds / wall);
    first = false;
  }
  out += "], \"slots\": [";
  first = true;
  for (const SlotTotals& t : s.slots) {
    out += format("%s{\"name\": \"%s\", \"category\": \"%s\", \"calls_per_step\": %.3f, \"ms_per_step\": %.4f, "
                  "\"share\": %.5f, \"nested_gemm_ms_per_step\": %.4f}",
                  first ? "" : ", ", t.name.c_str(), t.category.c_str(), static_cast<double>(t.calls) / n,
                  t.seconds * per, t.seconds / wall, t.nested_gemm_seconds * per);
    first = false;
  }
  return out + "]}\n";
}

// ---- the timers ----

const char* const kWiden = "bf16 widen";
const char* const kRound = "bf16 round";

SlotCall::SlotCall(const char* name, const char* declared_in) : name_(name), declared_in_(declared_in) {
  State& s = state();
  const int before = s.depth.fetch_add(1, std::memory_order_acq_rel);
  ++t_depth;
  if (before == 0) {
    kind_ = Kind::outer;
    t_outer = true;
    s.outer_standin_seconds = 0;
    std::lock_guard<std::mutex> lock(s.mu);
    s.outer_nested_gemm = 0;
  } else {
    kind_ = std::strcmp(name, "gemm_kernel") == 0 ? Kind::nested_gemm : Kind::nested;
  }
  if (kind_ != Kind::nested) t0_ = Clock::now();
}

SlotCall::~SlotCall() {
  State& s = state();
  if (kind_ == Kind::outer) {
    const double dt = seconds_between(t0_, Clock::now()) - s.outer_standin_seconds;
    double nested;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      nested = s.outer_nested_gemm;
    }
    add(s, name_, declared_in_, std::max(0.0, dt), nested);
    t_outer = false;
  } else if (kind_ == Kind::nested_gemm) {
    const double dt = seconds_between(t0_, Clock::now());
    std::lock_guard<std::mutex> lock(s.mu);
    s.outer_nested_gemm += dt;
  }
  --t_depth;
  s.depth.fetch_sub(1, std::memory_order_acq_rel);
}

StandinConversion::StandinConversion(bool round) : round_(round) {
  State& s = state();
  // Its own when it serves the outermost call open on this thread, or a call that opened no frame.
  recorded_ = (t_outer && t_depth == 1) || s.depth.load(std::memory_order_acquire) == 0;
  s.depth.fetch_add(1, std::memory_order_acq_rel);
  ++t_depth;
  t0_ = Clock::now();
}

StandinConversion::~StandinConversion() {
  State& s = state();
  if (recorded_) {
    const double dt = seconds_between(t0_, Clock::now());
    if (t_outer) s.outer_standin_seconds += dt;
    add(s, round_ ? kRound : kWiden, "tensor/dispatch.h", dt, 0.0);
  }
  --t_depth;
  s.depth.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace seqlab::profile
