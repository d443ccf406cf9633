// GLA forward + backward on the CPU at growing T (B = 1, H = 4, dk = dv = 64, f32): the chunkwise
// form (chunk 64, sub-chunk 16) against the recurrent form and against causal softmax attention
// (the `attention` op) at the same shapes, in one run. Each candidate runs the differentiable op
// and one backward from random cotangents of all its outputs (gradients of q, k, v and the gates).
// Prints median seconds, ratios against the chunkwise form, the allocator's peak bytes above what
// was live before the call, and checks that the chunkwise time at the longest T is at most 9× the
// time at the shortest (linear in T: 8×), timing those two alternately. Usage: gla_bench [runs] [max_T]
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "bench/bench_util.h"
#include "layers/attention/attention.h"
#include "layers/scan/gla.h"
#include "tensor/device.h"

using namespace seqlab;

namespace {

struct Inputs {
  Tensor q, k, v, g;
};

Inputs make_inputs(int64_t T, Generator& gen) {
  const int64_t B = 1, H = 4, D = 64;
  // log-gates in [−0.3, −0.01]: typical of a sigmoid-parameterised gate with a temperature
  return {Tensor::randn({B, T, H, D}, gen), Tensor::randn({B, T, H, D}, gen), Tensor::randn({B, T, H, D}, gen),
          Tensor::rand({B, T, H, D}, gen, DType::f32, -0.3, -0.01)};
}

// One forward and backward of GLA in the given form.
void gla_step(const Inputs& in, GlaForm form, Generator& gen) {
  Tensor q = set_requires_grad(in.q.detach()), k = set_requires_grad(in.k.detach()),
         v = set_requires_grad(in.v.detach()), g = set_requires_grad(in.g.detach());
  GlaOutput out = gla(q, k, v, g, Tensor(), Tensor(), {form, 64, 16, 0.0});
  backward({out.o, out.final_state},
           {Tensor::randn(out.o.shape(), gen), Tensor::randn(out.final_state.shape(), gen)});
}

void attention_step(const Inputs& in, Generator& gen) {
  Tensor q = set_requires_grad(in.q.detach()), k = set_requires_grad(in.k.detach()),
         v = set_requires_grad(in.v.detach());
  Tensor o = attention(q, k, v, {true, 0.0, 64});
  backward({o}, {Tensor::randn(o.shape(), gen)});
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
  const std::vector<int64_t> args = bench::positional_counts(argc, argv, {3, 8192}, "gla_bench [runs] [max_T]");
  const int runs = static_cast<int>(args[0]);
  const int64_t max_T = args[1];
  std::printf("# GLA forward+backward, B=1 H=4 dk=dv=64 f32, median of %d runs; ratio = time / chunkwise time;\n"
              "# peak = allocator peak above live bytes during one call\n",
              runs);
  std::printf("%6s  %12s %9s  %12s %9s %7s  %12s %9s %7s\n", "T", "chunkwise s", "peak MiB", "recurrent s",
              "peak MiB", "ratio", "attention s", "peak MiB", "ratio");
  Generator gen(0);
  std::vector<std::pair<int64_t, double>> chunk_times;  // (T, chunkwise seconds)
  for (int64_t T = 1024; T <= max_T; T *= 2) {
    const Inputs in = make_inputs(T, gen);
    const Measure c = measure([&] { gla_step(in, GlaForm::chunkwise, gen); }, runs);
    const Measure r = measure([&] { gla_step(in, GlaForm::recurrent, gen); }, runs);
    const Measure a = measure([&] { attention_step(in, gen); }, runs);
    std::printf("%6ld  %12.4f %9.1f  %12.4f %9.1f %7.2f  %12.4f %9.1f %7.2f\n", static_cast<long>(T), c.seconds,
                c.peak_mib, r.seconds, r.peak_mib, r.seconds / c.seconds, a.seconds, a.peak_mib,
                a.seconds / c.seconds);
    std::fflush(stdout);
    chunk_times.emplace_back(T, c.seconds);
  }
  if (chunk_times.size() >= 2) {
    // The scaling check times the shortest and the longest T alternately (A B A B ...), so that
    // drift of a shared machine hits both alike, rather than reusing the table's separate runs.
    const int64_t t0 = chunk_times.front().first, t1 = chunk_times.back().first;
    Generator gen2(1);
    const Inputs a = make_inputs(t0, gen2), b = make_inputs(t1, gen2);
    const bench::PairTiming pt = bench::time_pair([&] { gla_step(a, GlaForm::chunkwise, gen2); },
                                                  [&] { gla_step(b, GlaForm::chunkwise, gen2); }, 1, runs);
    const double ratio = pt.b_seconds / pt.a_seconds, bound = 9.0 * static_cast<double>(t1 / t0) / 8.0;
    std::printf("chunkwise T=%ld / T=%ld, alternated: %.4f s / %.4f s = %.2fx (linear: %ldx; bound %.1fx) %s\n",
                static_cast<long>(t1), static_cast<long>(t0), pt.b_seconds, pt.a_seconds, ratio,
                static_cast<long>(t1 / t0), bound, ratio <= bound ? "OK" : "FAIL");
    return ratio <= bound ? 0 : 1;
  }
  return 0;
}
