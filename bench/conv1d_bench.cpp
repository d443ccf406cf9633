// The fused causal_conv1d op (src/layers/ssm/conv1d.h) against the peer it replaced: the same convolution
// composed of primitive autograd ops (concat of the state, a shifted narrow, mul and add per tap, then silu),
// which is what ShortConv computed before the op. Forward and backward with SiLU (DeltaNet's use), timed in
// alternation in one run; the default shape is delta_net_small's convolution (B 8, T 256, C 3·256, W 4).
// Usage: conv1d_bench [--batch B] [--seq T] [--channels C] [--width W] [--runs N] [--device cpu|cuda]
//                     [--dtype f32|bf16]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/ops.h"
#include "bench/bench_util.h"
#include "layers/ssm/conv1d.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t batch = 8, seq = 256, channels = 768, width = 4, runs = 9;
  bench::Placement placement;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "conv1d_bench: %s\nusage: conv1d_bench [--batch B] [--seq T] [--channels C] [--width W] [--runs N] "
               "[--device cpu|cuda] [--dtype f32|bf16]\n",
               why.c_str());
  std::exit(2);
}

// y = silu(Σ_j w_j ⊙ x_{t−j}) from the primitives, zeros before x_0 (ShortConv before the op).
Tensor composed(const Tensor& x, const Tensor& w) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = w.size(0);
  const Tensor padded = W > 1 ? concat({Tensor::zeros({B, W - 1, C}, x.dtype(), x.device()), x}, 1) : x;
  Tensor y;
  for (int64_t j = 0; j < W; ++j) {
    Tensor term = mul(narrow(padded, 1, W - 1 - j, T), reshape(narrow(w, 0, j, 1), {C}));
    y = j == 0 ? term : add(y, term);
  }
  return silu(y);
}

int run(const Flags& f) {
  const DType dt = f.placement.dtype;
  const Device dev = f.placement.device;
  Generator gen(0);
  Tensor x = set_requires_grad(kernel::to_device(Tensor::randn({f.batch, f.seq, f.channels}, gen, dt), dev));
  Tensor w = set_requires_grad(kernel::to_device(Tensor::randn({f.width, f.channels}, gen, dt, 0.5), dev));
  const Tensor dy = kernel::to_device(Tensor::randn({f.batch, f.seq, f.channels}, gen, dt), dev);
  auto sync = [&] {
    if (dev.is_cuda()) kernel::to_device(kernel::narrow(grad_of(w), 0, 0, 1), cpu_device());  // waits for the GPU
  };
  auto fused = [&] {
    clear_grad(x);
    clear_grad(w);
    backward({causal_conv1d(x, w, Tensor(), Tensor(), true).y}, {dy});
    sync();
  };
  auto peer = [&] {
    clear_grad(x);
    clear_grad(w);
    backward({composed(x, w)}, {dy});
    sync();
  };
  const bench::PairTiming t = bench::time_pair(fused, peer, 2, static_cast<int>(f.runs));
  std::printf("# causal_conv1d forward+backward with SiLU, x [%ld, %ld, %ld], W %ld, %s on %s; median of %ld "
              "alternating runs\n",
              static_cast<long>(f.batch), static_cast<long>(f.seq), static_cast<long>(f.channels),
              static_cast<long>(f.width), dtype_name(dt), dev.str().c_str(), static_cast<long>(f.runs));
  std::printf("fused op %8.3f ms   composed primitives %8.3f ms   speed-up %.2fx\n", t.a_seconds * 1e3,
              t.b_seconds * 1e3, t.b_seconds / t.a_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  bench::parse_flags(argc, argv,
                     {{"--batch", &f.batch},
                      {"--seq", &f.seq},
                      {"--channels", &f.channels},
                      {"--width", &f.width},
                      {"--runs", &f.runs}},
                     f.placement, usage);
  if (f.runs == 0) usage("--runs must be at least 1");
  return bench::run_or_report("conv1d_bench", f, run);
}
