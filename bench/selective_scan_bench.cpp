// The Mamba selective scan, forward + backward on the CPU at growing T with B·D·N fixed (B = 1, D = 512
// channels, N = 16: one mamba_small layer's scan at batch 1, f32), in the chunked form (chunk 64), against the
// PyTorch peer bench/peers/torch_selective_scan.py (mamba_ssm's reference algorithm: every step's decay and
// input as [B, T, D, N] tensors, a Python loop over T, autograd's backward) at the same shapes in the same
// run. Each repetition runs the differentiable op with D skip, z gate and delta_bias, and one backward of
// every input from a random dy. Prints median seconds, the allocator's peak bytes above what was live
// before the call against the B·T·D·N·4 bytes of all T states, the peer's time and ratio, and checks that
// the time at the longest T is at most 9× the time at the shortest (linear in T: 8×), timing those two
// alternately.
//
// Usage: selective_scan_bench [runs] [max_T]; the peer runs where TORCH_PYTHON names a python with torch
// (e.g. build/pyenv/bin/python3 of scripts/python_env.sh), with the same number of threads as OpenMP uses;
// SEQLAB_ROOT names the repository (default: the current folder).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "bench/bench_util.h"
#include "layers/ssm/selective_scan.h"
#include "tensor/device.h"
#include "tensor/parallel.h"

using namespace seqlab;

namespace {

constexpr int64_t kB = 1, kD = 512, kN = 16;

struct Inputs {
  Tensor u, delta, A, B, C, D, z, bias;
};

// As the peer draws them: delta in [−4, −2] (Δ ≈ 0.02 … 0.13, the mixer's initial range), A = −(1 … N).
Inputs make_inputs(int64_t T, Generator& gen) {
  std::vector<double> a(static_cast<size_t>(kD * kN));
  for (int64_t d = 0; d < kD; ++d) {
    for (int64_t n = 0; n < kN; ++n) a[static_cast<size_t>(d * kN + n)] = -static_cast<double>(n + 1);
  }
  return {Tensor::randn({kB, T, kD}, gen),         Tensor::rand({kB, T, kD}, gen, DType::f32, -4.0, -2.0),
          Tensor::from_vector(a, {kD, kN}),        Tensor::randn({kB, T, kN}, gen),
          Tensor::randn({kB, T, kN}, gen),         Tensor::ones({kD}),
          Tensor::randn({kB, T, kD}, gen),         Tensor::zeros({kD})};
}

void scan_step(const Inputs& in, Generator& gen) {
  std::vector<Tensor> x;
  for (const Tensor* t : {&in.u, &in.delta, &in.A, &in.B, &in.C, &in.D, &in.z}) x.push_back(set_requires_grad(t->detach()));
  SelectiveScanOutput out =
      selective_scan(x[0], x[1], x[2], x[3], x[4], x[5], x[6], in.bias, Tensor(), {SelectiveScanForm::chunked, 64, true});
  backward({out.y}, {Tensor::randn(out.y.shape(), gen)});
}

struct Measure {
  double seconds;
  double peak_mib;  // allocator peak above what was live before, during one call
};

Measure measure(const std::function<void()>& fn, int runs) {
  Allocator& alloc = cpu_allocator();
  const int64_t live = alloc.stats().live_bytes;
  alloc.reset_peak();
  fn();  // warm-up, and the call whose peak is reported
  const double peak = static_cast<double>(alloc.stats().peak_bytes - live) / (1024.0 * 1024.0);
  return {bench::time_median(fn, 0, runs), peak};
}

// The peer's median seconds at T, or a negative number when it is not run or fails.
double peer_seconds(int64_t T, int runs, int threads, const std::string& root) {
  const char* python = std::getenv("TORCH_PYTHON");
  if (python == nullptr || *python == '\0') return -1;
  const std::string cmd = std::string(python) + " " + root + "/bench/peers/torch_selective_scan.py --B " +
                          std::to_string(kB) + " --T " + std::to_string(T) + " --D " + std::to_string(kD) + " --N " +
                          std::to_string(kN) + " --runs " + std::to_string(runs) + " --threads " +
                          std::to_string(threads);
  // Idle OpenMP threads sleep rather than spin, as scripts/setup.sh sets for seqlab itself: on a shared
  // machine spinning threads steal the cores the busy ones need.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char line[512];
  double seconds = -1;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    double s = 0;
    if (std::sscanf(line, "seconds=%lf", &s) == 1) seconds = s;
  }
  return pclose(p) == 0 ? seconds : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> args =
      bench::positional_counts(argc, argv, {3, 8192}, "selective_scan_bench [runs] [max_T]");
  const int runs = static_cast<int>(args[0]);
  const int64_t max_T = args[1];
  const char* root_env = std::getenv("SEQLAB_ROOT");
  const std::string root = root_env != nullptr ? root_env : ".";
  int threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = static_cast<int>(cpu::omp_threads());
  }
  std::printf("# selective scan forward+backward (chunked, chunk 64), B=%ld D=%ld N=%ld f32, %d threads, median of %d"
              " runs;\n# peak = allocator peak above live bytes during one call; all states = B·T·D·N·4 bytes;\n"
              "# torch = bench/peers/torch_selective_scan.py (TORCH_PYTHON), ratio = torch / seqlab\n",
              static_cast<long>(kB), static_cast<long>(kD), static_cast<long>(kN), threads, runs);
  std::printf("%6s  %10s %9s %14s  %10s %7s\n", "T", "seqlab s", "peak MiB", "all states MiB", "torch s", "ratio");
  Generator gen(0);
  std::vector<std::pair<int64_t, double>> times;
  for (int64_t T = 1024; T <= max_T; T *= 2) {
    const Inputs in = make_inputs(T, gen);
    const Measure m = measure([&] { scan_step(in, gen); }, runs);
    const double all_states = static_cast<double>(kB * T * kD * kN * 4) / (1024.0 * 1024.0);
    const double peer = peer_seconds(T, runs, threads, root);
    if (peer > 0) {
      std::printf("%6ld  %10.4f %9.1f %14.1f  %10.4f %7.2f\n", static_cast<long>(T), m.seconds, m.peak_mib, all_states,
                  peer, peer / m.seconds);
    } else {
      std::printf("%6ld  %10.4f %9.1f %14.1f  %10s %7s\n", static_cast<long>(T), m.seconds, m.peak_mib, all_states, "-",
                  "-");
    }
    std::fflush(stdout);
    times.emplace_back(T, m.seconds);
  }
  if (times.size() >= 2) {
    // The scaling check times the shortest and the longest T alternately (A B A B ...), so that drift of a
    // shared machine hits both alike.
    const int64_t t0 = times.front().first, t1 = times.back().first;
    Generator gen2(1);
    const Inputs a = make_inputs(t0, gen2), b = make_inputs(t1, gen2);
    const bench::PairTiming pt = bench::time_pair([&] { scan_step(a, gen2); }, [&] { scan_step(b, gen2); }, 1, runs);
    const double ratio = pt.b_seconds / pt.a_seconds, bound = 9.0 * static_cast<double>(t1 / t0) / 8.0;
    std::printf("chunked T=%ld / T=%ld, alternated: %.4f s / %.4f s = %.2fx (linear: %ldx; bound %.1fx) %s\n",
                static_cast<long>(t1), static_cast<long>(t0), pt.b_seconds, pt.a_seconds, ratio,
                static_cast<long>(t1 / t0), bound, ratio <= bound ? "OK" : "FAIL");
    return ratio <= bound ? 0 : 1;
  }
  return 0;
}
