// Forward + backward time of the fused causal attention op (src/layers/attention/attention.h) at its kernel-level
// entry points, the counterpart of bench/peers/torch_attention.py (the project's PyTorch peer: SDPA on a
// GPU, the materialised form on the CPU): same flags, same FLOP count, one line in the peer's format, so
// that bench/gpu_vs_torch.sh can quote the ratio.
//
// One repetition is kernel::attention_forward (o, lse) then kernel::attention_backward (dq, dk, dv from a
// fixed random dO and a zero dlse, made once outside the timing), on q, k, v of [B, T, H, d] (the op's
// layout; the peer's [B, H, T, d] is the same work); o is in the inputs' dtype, lse in f32 for bf16. On
// CUDA every repetition ends with a device synchronisation, so the time is the kernels' and not their
// launch. Median of --reps after 3 warm-ups. --dtype bf16 on the CPU runs the kernels on bf16 (bf16 GEMMs into f32
// sums, on the CPU's bf16 instructions through oneDNN where it has them; SEQLAB_CPU_BF16_GEMM=widened for f32 sgemm).
// FLOPs: 4·B·H·T²·d for the forward over the causal half (Q Kᵀ and P V), ×3.5 for forward + backward.
// The forward alone is timed too (fwd_ms, the same way), so the backward's share is the difference.
// On the CPU it then times a 1024 × 1024 × 1024 GEMM of the same dtype through kernel::matmul (what
// gemm_bench calls seqlab's rate) and prints its rate (gemm_GFLOP/s) and attention's rate over it
// (of_gemm), from the same run: the share of the GEMM rate the attention kernels reach.
//
// Usage: attention_bench [--B 4] [--H 8] [--T 1024] [--d 64] [--block 64] [--device cpu|cuda] [--dtype f32|bf16]
//                        [--reps 10] [--threads 0]
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "bench/bench_util.h"
#include "layers/attention/attention.h"
#include "tensor/device.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t B = 4, H = 8, T = 1024, d = 64, block = 64, reps = 10, threads = 0;
  bench::Placement on;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "attention_bench: %s\nusage: attention_bench [--B N] [--H N] [--T N] [--d N] [--block N] [--device cpu|cuda] "
               "[--dtype f32|bf16] [--reps N] [--threads N]\n",
               why.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  bench::parse_flags(
      argc, argv,
      {{"--B", &f.B},
       {"--H", &f.H},
       {"--T", &f.T},
       {"--d", &f.d},
       {"--block", &f.block},
       {"--reps", &f.reps},
       {"--threads", &f.threads}},
      f.on, usage);
  if (f.B < 1 || f.H < 1 || f.T < 1 || f.d < 1 || f.block < 1 || f.reps < 1) {
    usage("--B, --H, --T, --d, --block and --reps must be ≥ 1");
  }
  return f;
}

// The benchmark; throws on a failure inside the library (a missing kernel, device memory exhausted).
int bench_main(const Flags& f) {
  if (f.threads > 0) {
    omp_set_num_threads(static_cast<int>(f.threads));
    openblas_set_num_threads(static_cast<int>(f.threads));
  }
  // Standard normal q, k, v and dO, drawn in f32 on the host, then moved and converted.
  Generator gen(0);
  auto input = [&](const Shape& shape) {
    return kernel::to_dtype(kernel::to_device(Tensor::randn(shape, gen), f.on.device), f.on.dtype);
  };
  const Shape shape{f.B, f.T, f.H, f.d};
  const Tensor q = input(shape), k = input(shape), v = input(shape), dout = input(shape);
  const Tensor dlse = Tensor::zeros({f.B, f.T, f.H}, accumulate_dtype(f.on.dtype), f.on.device);  // lse is f32 for bf16
  AttentionOptions opts;
  opts.causal = true;
  opts.block = f.block;

  auto sync = [&] {
    if (f.on.device.is_cuda()) cuda_backend()->synchronize(f.on.device.index);
  };
  auto rep = [&] {
    const AttentionOutput out = kernel::attention_forward(q, k, v, opts);
    kernel::attention_backward(dout, dlse, q, k, v, out.o, out.lse, opts, true, true, true);
    sync();
  };
  auto forward_only = [&] {
    const AttentionOutput out = kernel::attention_forward(q, k, v, opts);
    sync();
  };
  sync();
  const double seconds = bench::time_median(rep, 3, static_cast<int>(f.reps));
  const double forward_seconds = bench::time_median(forward_only, 3, static_cast<int>(f.reps));

  const double ms = 1000.0 * seconds;
  // Forward: Q Kᵀ and P V over the causal half, 2 · (2·B·H·T·T·d) / 2; backward ≈ 2.5× the forward.
  const double flops = 3.5 * 2.0 * static_cast<double>(f.B * f.H) * static_cast<double>(f.T) *
                       static_cast<double>(f.T) * static_cast<double>(f.d);
  std::printf("seqlab device=%s dtype=%s B=%ld H=%ld T=%ld d=%ld fwd+bwd_ms=%.2f TFLOP/s=%.3f fwd_ms=%.3f",
              f.on.device.is_cuda() ? "cuda" : "cpu", dtype_name(f.on.dtype), static_cast<long>(f.B),
              static_cast<long>(f.H), static_cast<long>(f.T), static_cast<long>(f.d), ms, flops / ms / 1e9,
              1000.0 * forward_seconds);
  if (f.on.device.is_cpu()) {
    constexpr int64_t n = 1024;
    const Tensor a = input({n, n}), b = input({n, n});
    const double gemm_seconds = bench::time_median([&] { const Tensor c = kernel::matmul(a, b); }, 2,
                                                   static_cast<int>(f.reps));
    const double gemm_gflops = 2.0 * n * n * n / gemm_seconds * 1e-9;
    std::printf(" gemm_GFLOP/s=%.1f of_gemm=%.3f", gemm_gflops, flops / seconds * 1e-9 / gemm_gflops);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return seqlab::bench::run_or_report("attention_bench", parse(argc, argv), &bench_main);
}
