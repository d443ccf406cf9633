// Mamba-2's SSD forward + backward on the CPU at growing T (B = 1, H = 8 heads of P = 64, one group of
// N = 64, f32: mamba2_small's layer shape): the chunkwise form (chunk 64) against the recurrent form, in
// one run. Each candidate runs the differentiable op and one backward from random cotangents of both outputs
// (gradients of x, Δ, A, B, C, D). Prints median seconds, the recurrent/chunkwise ratio, the allocator's
// peak bytes above what was live before the call, and checks that the chunkwise time at the longest T is at
// most 9× the time at the shortest (linear in T: 8×), timing those two alternately.
// Usage: ssd_bench [runs] [max_T]
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "bench/bench_util.h"
#include "layers/ssm/ssd.h"
#include "tensor/device.h"

using namespace seqlab;

namespace {

constexpr int64_t kB = 1, kH = 8, kP = 64, kG = 1, kN = 64;

struct Inputs {
  Tensor x, dt, A, Bm, Cm, D;
};

// Δ in [1e-3, 0.1] and A in [−16, −1]: the mixer's initial ranges.
Inputs make_inputs(int64_t T, Generator& gen) {
  return {Tensor::randn({kB, T, kH, kP}, gen),         Tensor::rand({kB, T, kH}, gen, DType::f32, 1e-3, 0.1),
          Tensor::rand({kH}, gen, DType::f32, -16, -1), Tensor::randn({kB, T, kG, kN}, gen),
          Tensor::randn({kB, T, kG, kN}, gen),          Tensor::ones({kH})};
}

void ssd_step(const Inputs& in, SsdForm form, Generator& gen) {
  std::vector<Tensor> v;
  for (const Tensor& t : {in.x, in.dt, in.A, in.Bm, in.Cm, in.D}) v.push_back(set_requires_grad(t.detach()));
  SsdOutput out = ssd(v[0], v[1], v[2], v[3], v[4], v[5], Tensor(), {form, 64});
  backward({out.y, out.final_state}, {Tensor::randn(out.y.shape(), gen), Tensor::randn(out.final_state.shape(), gen)});
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

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> args = bench::positional_counts(argc, argv, {3, 8192}, "ssd_bench [runs] [max_T]");
  const int runs = static_cast<int>(args[0]);
  const int64_t max_T = args[1];
  std::printf("# SSD forward+backward, B=%ld H=%ld P=%ld G=%ld N=%ld f32, median of %d runs; ratio = time / chunkwise "
              "time;\n# peak = allocator peak above live bytes during one call\n",
              static_cast<long>(kB), static_cast<long>(kH), static_cast<long>(kP), static_cast<long>(kG),
              static_cast<long>(kN), runs);
  std::printf("%6s  %12s %9s  %12s %9s %7s\n", "T", "chunkwise s", "peak MiB", "recurrent s", "peak MiB", "ratio");
  Generator gen(0);
  std::vector<std::pair<int64_t, double>> chunk_times;  // (T, chunkwise seconds)
  for (int64_t T = 1024; T <= max_T; T *= 2) {
    const Inputs in = make_inputs(T, gen);
    const Measure c = measure([&] { ssd_step(in, SsdForm::chunkwise, gen); }, runs);
    const Measure r = measure([&] { ssd_step(in, SsdForm::recurrent, gen); }, runs);
    std::printf("%6ld  %12.4f %9.1f  %12.4f %9.1f %7.2f\n", static_cast<long>(T), c.seconds, c.peak_mib, r.seconds,
                r.peak_mib, r.seconds / c.seconds);
    std::fflush(stdout);
    chunk_times.emplace_back(T, c.seconds);
  }
  if (chunk_times.size() >= 2) {
    // The scaling check times the shortest and the longest T alternately (A B A B ...), so that drift of a
    // shared machine hits both alike, rather than reusing the table's separate runs.
    const int64_t t0 = chunk_times.front().first, t1 = chunk_times.back().first;
    Generator gen2(1);
    const Inputs a = make_inputs(t0, gen2), b = make_inputs(t1, gen2);
    const bench::PairTiming pt = bench::time_pair([&] { ssd_step(a, SsdForm::chunkwise, gen2); },
                                                  [&] { ssd_step(b, SsdForm::chunkwise, gen2); }, 1, runs);
    const double ratio = pt.b_seconds / pt.a_seconds, bound = 9.0 * static_cast<double>(t1 / t0) / 8.0;
    std::printf("chunkwise T=%ld / T=%ld, alternated: %.4f s / %.4f s = %.2fx (linear: %ldx; bound %.1fx) %s\n",
                static_cast<long>(t1), static_cast<long>(t0), pt.b_seconds, pt.a_seconds, ratio,
                static_cast<long>(t1 / t0), bound, ratio <= bound ? "OK" : "FAIL");
    return ratio <= bound ? 0 : 1;
  }
  return 0;
}
