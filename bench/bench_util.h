// A plain timer for benchmarks: warm-up runs, then the median of timed runs. Two candidates are
// timed in alternation (A B A B ...) so that drift of a shared machine hits both alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace seqlab::bench {

// Where and in what dtype a benchmark runs: --device cpu|cuda, --dtype f32|bf16.
struct Placement {
  Device device = cpu_device();
  DType dtype = DType::f32;
};

// Parses flags of the form `--name VALUE`: integers ≥ 0 into the named slots, and --device and --dtype
// into `placement`. Calls `usage(why)` (which must not return) for an unknown flag, a missing or bad
// value, or --device cuda where no GPU is usable.
inline void parse_flags(int argc, char** argv, std::initializer_list<std::pair<const char*, int64_t*>> integers,
                        Placement& placement, void (*usage)(const std::string& why)) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--device") {
      if (value == "cpu")
        placement.device = cpu_device();
      else if (value == "cuda")
        placement.device = cuda_device(0);
      else
        usage("--device must be cpu or cuda, not " + value);
      continue;
    }
    if (flag == "--dtype") {
      if (value == "f32")
        placement.dtype = DType::f32;
      else if (value == "bf16")
        placement.dtype = DType::bf16;
      else
        usage("--dtype must be f32 or bf16, not " + value);
      continue;
    }
    int64_t* slot = nullptr;
    for (const auto& [name, dst] : integers) {
      if (flag == name) slot = dst;
    }
    if (slot == nullptr) usage("unknown flag " + flag);
    char* end = nullptr;
    *slot = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || *slot < 0) usage("bad value for " + flag + ": " + value);
  }
  if (placement.device.is_cuda() && !cuda_available()) {
    usage("--device cuda: no usable GPU here (or a build without the CUDA backend; seqlab --version says which)");
  }
}

// The positional integer arguments of a benchmark (`name [a] [b] ...`): argv[i] for the i-th of
// `defaults` where given, else its default; each must be a whole number ≥ 1, and there may be no more
// of them than defaults. Otherwise prints "NAME: why" and the usage line to stderr and exits with 2.
inline std::vector<int64_t> positional_counts(int argc, char** argv, std::vector<int64_t> defaults,
                                              const char* usage_line) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s\nusage: %s\n", why.c_str(), usage_line);
    std::exit(2);
  };
  if (argc - 1 > static_cast<int>(defaults.size())) {
    fail(std::string("too many arguments: ") + argv[defaults.size() + 1]);
  }
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long long v = std::strtoll(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v < 1) fail(std::string("not a whole number >= 1: ") + argv[i]);
    defaults[static_cast<size_t>(i - 1)] = v;
  }
  return defaults;
}

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

// A benchmark's main: run() with the parsed flags; a failure inside the library (a missing kernel, device
// memory exhausted) ends the program with one line on stderr, "NAME: what", and exit status 1.
template <class Flags>
int run_or_report(const char* name, const Flags& flags, int (*run)(const Flags&)) {
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace seqlab::bench
