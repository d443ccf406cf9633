// Training throughput of seqlab's GPT (the decoder with attention blocks) on the CPU or a GPU, the counterpart of bench/peers/torch_gpt.py
// (the project's PyTorch peer, bench/peers/torch_gpt.py): same flags, same model (learned
// positions, LayerNorm, GELU(tanh) MLP of 4·d, tied embeddings, biases), same AdamW settings as
// torch.optim.AdamW(lr=1e-3, weight_decay=0.1) — betas (0.9, 0.999), eps 1e-8, decay on every
// parameter — on one fixed random batch, 3 warm-up steps, then --steps timed steps. Prints one
// line in the peer's format, with the same flops_per_token, so that bench/gpt_vs_torch.sh and
// bench/gpu_vs_torch.sh can quote the ratio of the two (and the latter the MFU, from model_TFLOP/s).
//
// --device cuda trains on the first GPU; --dtype bf16 converts the weights with model.to(device, bf16)
// as train.dtype = "bf16" does, the optimizer keeping f32 master weights and state (on the CPU each
// kernel computes bf16 in f32 and rounds its outputs once: the reference, src/tensor/dispatch.h).
// The clock starts and stops after a device synchronisation; the loss is read once, at the end, so
// the host queues steps ahead of the GPU as PyTorch's loop does.
//
// --profile 1 (CPU only) then trains --steps more steps under the step profile (src/tensor/profile.h) and
// prints its table: ms/step by category (GEMM, attention, norms, elementwise, optimizer, copies, bf16
// stand-ins, loss, framework) and the slots that take the most; the timed line above it is unprofiled.
//
// Usage: gpt_train_bench [--d 256] [--layers 4] [--heads 4] [--T 256] [--B 8] [--vocab 256]
//                        [--steps 20] [--threads 0] [--device cpu|cuda] [--dtype f32|bf16] [--profile 0|1]
//        (--threads 0: the OpenMP / OpenBLAS default)
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "layers/model/decoder.h"
#include "tensor/device.h"
#include "tensor/kernels.h"
#include "tensor/profile.h"
#include "train/optim/optim.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t d = 256, layers = 4, heads = 4, T = 256, B = 8, vocab = 256, steps = 20, threads = 0, profile = 0;
  bench::Placement on;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gpt_train_bench: %s\nusage: gpt_train_bench [--d N] [--layers N] [--heads N] [--T N] [--B N] "
               "[--vocab N] [--steps N] [--threads N] [--device cpu|cuda] [--dtype f32|bf16] [--profile 0|1]\n",
               why.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  bench::parse_flags(argc, argv,
                     {{"--d", &f.d},
                      {"--layers", &f.layers},
                      {"--heads", &f.heads},
                      {"--T", &f.T},
                      {"--B", &f.B},
                      {"--vocab", &f.vocab},
                      {"--steps", &f.steps},
                      {"--threads", &f.threads},
                      {"--profile", &f.profile}},
                     f.on, usage);
  if (f.steps < 1) usage("--steps must be at least 1");
  if (f.profile > 1) usage("--profile is 0 or 1");
  if (f.profile && f.on.device.is_cuda()) usage("--profile times CPU kernels only: use it with --device cpu");
  return f;
}

// The tensor of rows data[:, first : first + T] of a [B, T + 1] token table, as i64 [B, T] on `device`.
Tensor columns(const std::vector<int64_t>& data, int64_t B, int64_t T, int64_t first, Device device) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) out.push_back(data[static_cast<size_t>(b * (T + 1) + first + t)]);
  }
  return kernel::to_device(Tensor::from_indices(out, {B, T}, DType::i64), device);
}

// The benchmark; throws on a failure inside the library (a missing kernel, device memory exhausted).
int bench_main(const Flags& f) {
  if (f.threads > 0) {
    omp_set_num_threads(static_cast<int>(f.threads));
    openblas_set_num_threads(static_cast<int>(f.threads));
  }

  // The model the trainer builds for recipes/gpt_small.toml (with these sizes): a GPT-2.
  const ModelConfig cfg = gpt2_config(f.vocab, f.d, f.layers, f.heads, f.T);
  Generator gen(0);
  Decoder model(cfg, gen);
  if (f.on.device.is_cuda() || f.on.dtype != DType::f32) model.to(f.on.device, f.on.dtype);  // before the optimizer

  OptimConfig oc;
  oc.name = "adamw";
  oc.lr = 1e-3;
  oc.beta1 = 0.9;
  oc.beta2 = 0.999;
  oc.eps = 1e-8;
  oc.weight_decay = 0.1;
  oc.decay_biases = oc.decay_norms = oc.decay_embeddings = true;
  Optimizer opt(oc, model.parameters());

  std::vector<int64_t> data(static_cast<size_t>(f.B * (f.T + 1)));
  for (int64_t& t : data) t = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(f.vocab));
  const Tensor inputs = columns(data, f.B, f.T, 0, f.on.device), targets = columns(data, f.B, f.T, 1, f.on.device);

  auto sync = [&] {
    if (f.on.device.is_cuda()) cuda_backend()->synchronize(f.on.device.index);
  };
  Tensor last;
  auto step = [&] {
    Tensor l = model.loss({inputs, targets});
    opt.zero_grad();
    backward(l);
    opt.step(oc.lr);
    last = l.detach();
  };
  for (int i = 0; i < 3; ++i) step();
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < f.steps; ++i) step();
  sync();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double loss = last.item();

  const int64_t n = model.num_parameters();
  // Weights (forward + backward) plus causal attention scores and mixing: the peer's formula.
  const double flops_per_token = 6.0 * static_cast<double>(n) + 6.0 * static_cast<double>(f.layers * f.T * f.d);
  const double tps = static_cast<double>(f.steps * f.B * f.T) / dt;
  std::printf("seqlab device=%s dtype=%s params=%ld tokens/s=%.0f step_ms=%.1f model_TFLOP/s=%.3f loss=%.3f\n",
              f.on.device.is_cuda() ? "cuda" : "cpu", dtype_name(f.on.dtype), static_cast<long>(n), tps,
              1000.0 * dt / static_cast<double>(f.steps), tps * flops_per_token / 1e12, loss);
  if (f.profile) {
    profile::start();
    const double wall = bench::seconds_of([&] {
      for (int64_t i = 0; i < f.steps; ++i) step();
    });
    profile::stop();
    std::printf("%s", profile::table(profile::snapshot(), wall, f.steps).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return seqlab::bench::run_or_report("gpt_train_bench", parse(argc, argv), &bench_main);
}
