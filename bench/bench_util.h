// A plain timer for benchmarks: warm-up runs, then the median of timed runs. Two candidates are
// timed in alternation (A B A B ...) so that drift of a shared machine hits both alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace seqlab::bench {

inline double seconds_of(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median of `runs` timed calls after `warmup` untimed ones.
inline double time_median(const std::function<void()>& fn, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) t.push_back(seconds_of(fn));
  return median(t);
}

struct PairTiming {
  double a_seconds, b_seconds;  // medians
};

inline PairTiming time_pair(const std::function<void()>& a, const std::function<void()>& b, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) {
    a();
    b();
  }
  std::vector<double> ta, tb;
  for (int i = 0; i < runs; ++i) {
    ta.push_back(seconds_of(a));
    tb.push_back(seconds_of(b));
  }
  return {median(ta), median(tb)};
}

}  // namespace seqlab::bench
