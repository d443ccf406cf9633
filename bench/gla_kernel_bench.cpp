// Forward + backward time of the fused GLA op (src/layers/scan/gla.h) at its kernel-level entry points,
// the counterpart of bench/peers/torch_gla.py (a chunkwise GLA in PyTorch, and flash-linear-attention's
// chunk_gla where it is installed) and of bench/peers/torch_attention.py (SDPA) at the same shapes: same
// flags, one line in the peers' format, so that bench/gpu_vs_torch.sh can quote the ratios.
//
// One repetition is kernel::gla_forward (o, final state from a zero initial state) then
// kernel::gla_backward (dq, dk, dv, dg from a fixed random dO and no gradient of the final state), on
// q, k, g [B, T, H, d] and v [B, T, H, d]; log-gates drawn in [−0.3, −0.01] (a sigmoid gate with a
// temperature, as in bench/gla_bench.cpp). On CUDA every repetition ends with a device synchronisation.
// Median of --reps after 3 warm-ups. --form chunkwise|recurrent picks GlaOptions::form (the CUDA kernels
// run one algorithm for both). --dtype bf16 on the CPU runs the kernels' bf16 path (rows widened per head,
// GEMMs on bf16 operands, layers/variant_rows.h); SEQLAB_CPU_BF16_GEMM=widened puts those GEMMs on sgemm.
//
// Usage: gla_kernel_bench [--B 4] [--H 8] [--T 1024] [--d 64] [--device cpu|cuda] [--dtype f32|bf16]
//                         [--reps 10] [--threads 0] [--recurrent 0|1]
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "layers/scan/gla.h"
#include "tensor/device.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t B = 4, H = 8, T = 1024, d = 64, reps = 10, threads = 0, recurrent = 0;
  bench::Placement on;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gla_kernel_bench: %s\nusage: gla_kernel_bench [--B N] [--H N] [--T N] [--d N] [--device cpu|cuda] "
               "[--dtype f32|bf16] [--reps N] [--threads N] [--recurrent 0|1]\n",
               why.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  bench::parse_flags(argc, argv,
                     {{"--B", &f.B},
                      {"--H", &f.H},
                      {"--T", &f.T},
                      {"--d", &f.d},
                      {"--reps", &f.reps},
                      {"--threads", &f.threads},
                      {"--recurrent", &f.recurrent}},
                     f.on, usage);
  if (f.B < 1 || f.H < 1 || f.T < 1 || f.d < 1 || f.reps < 1) usage("--B, --H, --T, --d and --reps must be ≥ 1");
  if (f.recurrent > 1) usage("--recurrent is 0 or 1");
  return f;
}

// The benchmark; throws on a failure inside the library (a missing kernel, device memory exhausted).
int bench_main(const Flags& f) {
  if (f.threads > 0) {
    omp_set_num_threads(static_cast<int>(f.threads));
    openblas_set_num_threads(static_cast<int>(f.threads));
  }
  Generator gen(0);
  auto place = [&](const Tensor& host) {
    return kernel::to_dtype(kernel::to_device(host, f.on.device), f.on.dtype);
  };
  const Shape shape{f.B, f.T, f.H, f.d};
  const Tensor q = place(Tensor::randn(shape, gen)), k = place(Tensor::randn(shape, gen)),
               v = place(Tensor::randn(shape, gen)), dout = place(Tensor::randn(shape, gen)),
               g = place(Tensor::rand(shape, gen, DType::f32, -0.3, -0.01));
  GlaOptions opts;
  opts.form = f.recurrent ? GlaForm::recurrent : GlaForm::chunkwise;
  const std::vector<bool> need{true, true, true, true, false, false};

  auto sync = [&] {
    if (f.on.device.is_cuda()) cuda_backend()->synchronize(f.on.device.index);
  };
  auto rep = [&] {
    const GlaOutput out = kernel::gla_forward(q, k, v, g, Tensor(), Tensor(), opts);
    kernel::gla_backward(dout, Tensor(), q, k, v, g, Tensor(), Tensor(), opts, need);
    sync();
  };
  sync();
  const double ms = 1000.0 * bench::time_median(rep, 3, static_cast<int>(f.reps));
  const double tokens = static_cast<double>(f.B * f.T);
  std::printf("seqlab gla device=%s dtype=%s form=%s B=%ld H=%ld T=%ld d=%ld fwd+bwd_ms=%.3f tokens/s=%.0f\n",
              f.on.device.is_cuda() ? "cuda" : "cpu", dtype_name(f.on.dtype), gla_form_name(opts.form),
              static_cast<long>(f.B), static_cast<long>(f.H), static_cast<long>(f.T), static_cast<long>(f.d), ms,
              tokens / ms * 1000.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return seqlab::bench::run_or_report("gla_kernel_bench", parse(argc, argv), &bench_main);
}
