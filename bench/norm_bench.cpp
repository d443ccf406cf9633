// Layer norm and RMS norm, forward (plain and fused with the residual add) and backward (with the
// residual's gradient added, as a pre-norm block calls it), f32 and bf16, on the rows of a step of
// gpt_small / gla_small by default ([B·T, d] = [2048, 256]). Reports the median time of each and the
// bandwidth it reaches (bytes read + written); the bf16 line's ratio is its time against f32's,
// measured alternately in the same run.
// Usage: norm_bench [--rows N] [--cols C] [--runs R]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t rows = 2048, cols = 256, runs = 21;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "norm_bench: %s\nusage: norm_bench [--rows N] [--cols C] [--runs R]\n", why.c_str());
  std::exit(2);
}

struct Inputs {
  Tensor x, r, w, b, dy, ds;
  Inputs(int64_t n, int64_t c, DType dtype, Generator& gen)
      : x(Tensor::randn({n, c}, gen, dtype)),
        r(Tensor::randn({n, c}, gen, dtype)),
        w(Tensor::randn({c}, gen, dtype)),
        b(Tensor::randn({c}, gen, dtype)),
        dy(Tensor::randn({n, c}, gen, dtype)),
        ds(Tensor::randn({n, c}, gen, dtype)) {}
};

int run(const Flags& f) {
  Generator gen(0);
  Inputs a(f.rows, f.cols, DType::f32, gen), h(f.rows, f.cols, DType::bf16, gen);
  const double elems = static_cast<double>(f.rows * f.cols);
  std::printf("# [%ld, %ld] rows, median of %ld alternating runs (f32, bf16); GB/s = bytes read + written / time\n",
              static_cast<long>(f.rows), static_cast<long>(f.cols), static_cast<long>(f.runs));
  std::printf("%-26s %10s %8s %10s %8s %10s\n", "kernel", "f32 us", "GB/s", "bf16 us", "GB/s", "bf16/f32");
  // `tensors` = the [N, C] tensors each call reads or writes (the bandwidth's numerator, 4 or 2 bytes each).
  auto report = [&](const char* name, int tensors, const std::function<void(Inputs&)>& fn) {
    const bench::PairTiming t = bench::time_pair([&] { fn(a); }, [&] { fn(h); }, 3, static_cast<int>(f.runs));
    std::printf("%-26s %10.1f %8.2f %10.1f %8.2f %10.2f\n", name, t.a_seconds * 1e6,
                tensors * 4 * elems / t.a_seconds * 1e-9, t.b_seconds * 1e6, tensors * 2 * elems / t.b_seconds * 1e-9,
                t.b_seconds / t.a_seconds);
  };
  report("layer_norm", 2, [](Inputs& in) { kernel::layer_norm(in.x, in.w, in.b, 1e-5); });
  report("add_layer_norm", 4, [](Inputs& in) { kernel::add_layer_norm(in.x, in.r, in.w, in.b, 1e-5); });
  report("layer_norm backward+ds", 4, [](Inputs& in) {
    const kernel::NormOutput st = kernel::layer_norm(in.x, in.w, in.b, 1e-5);
    kernel::layer_norm_backward(in.dy, in.x, in.w, st.mean, st.rstd, true, true, true, in.ds);
  });
  report("layer_norm backward dx", 4, [](Inputs& in) {
    const kernel::NormOutput st = kernel::layer_norm(in.x, in.w, in.b, 1e-5);
    kernel::layer_norm_backward(in.dy, in.x, in.w, st.mean, st.rstd, true, false, false, in.ds);
  });
  report("layer_norm backward dw", 4, [](Inputs& in) {
    const kernel::NormOutput st = kernel::layer_norm(in.x, in.w, in.b, 1e-5);
    kernel::layer_norm_backward(in.dy, in.x, in.w, st.mean, st.rstd, false, true, true);
  });
  report("rms_norm", 2, [](Inputs& in) { kernel::rms_norm(in.x, in.w, 1e-5); });
  report("rms_norm backward+ds", 4, [](Inputs& in) {
    const kernel::NormOutput st = kernel::rms_norm(in.x, in.w, 1e-5);
    kernel::rms_norm_backward(in.dy, in.x, in.w, st.rstd, true, true, in.ds);
  });
  std::printf("# the backward lines include their forward (for the statistics): subtract the forward line\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  bench::Placement placement;
  bench::parse_flags(argc, argv, {{"--rows", &f.rows}, {"--cols", &f.cols}, {"--runs", &f.runs}}, placement, usage);
  if (f.rows < 1 || f.cols < 1 || f.runs < 1) usage("--rows, --cols and --runs must be at least 1");
  return bench::run_or_report("norm_bench", f, run);
}
