// The optimizer's part of a CPU training step, per-tensor kernels (the peer: one adamw_step_kernel,
// sum_squares_kernel, scale_inplace_kernel call per parameter, as Optimizer::step, squared_norm and
// scale_grads ran before the multi-tensor kernels) against the multi-tensor kernels (one call and one
// parallel region for all parameters: tensor/slots/optim.h), on the parameters of gpt_train_bench's GPT
// (recipes/gpt_small.toml's sizes by default), f32 or bf16 with f32 masters. Alternating runs, medians.
//
// Usage: optim_step_bench [--d 256] [--layers 4] [--heads 4] [--T 256] [--vocab 256] [--runs 15]
//                         [--dtype f32|bf16]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "layers/model/decoder.h"
#include "tensor/kernels.h"
#include "tensor/slots/optim.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t d = 256, layers = 4, heads = 4, T = 256, vocab = 256, runs = 15;
  bench::Placement on;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "optim_step_bench: %s\nusage: optim_step_bench [--d N] [--layers N] [--heads N] [--T N] [--vocab N] "
               "[--runs N] [--dtype f32|bf16]\n",
               why.c_str());
  std::exit(2);
}

int bench_main(const Flags& f) {
  if (f.on.device.is_cuda()) usage("the multi-tensor kernels are CPU kernels: use --device cpu");
  if (f.runs < 1) usage("--runs must be at least 1");
  Generator gen(0);
  Decoder model(gpt2_config(f.vocab, f.d, f.layers, f.heads, f.T), gen);
  if (f.on.dtype != DType::f32) model.to(cpu_device(), f.on.dtype);
  std::vector<kernel::AdamWTensors> entries;
  std::vector<Tensor> grads;
  int64_t elements = 0;
  for (const Parameter& p : model.parameters()) {
    const Tensor& t = *p.tensor;
    kernel::AdamWTensors e;
    e.step = {1e-3, 0.1, 0.9, 0.95, 1e-8, 0.1, 0.05};
    e.p = t;
    e.g = kernel::to_dtype(Tensor::randn(t.shape(), gen, DType::f32, 1e-3), t.dtype());
    e.m = Tensor::zeros(t.shape());
    e.v = Tensor::zeros(t.shape());
    if (t.dtype() == DType::bf16) e.w = kernel::to_dtype(t, DType::f32);
    entries.push_back(e);
    grads.push_back(e.g);
    elements += t.numel();
  }
  const Device cpu = cpu_device();
  Tensor sums = Tensor::empty({static_cast<int64_t>(grads.size())}, DType::f64);
  const int runs = static_cast<int>(f.runs);
  const bench::PairTiming adamw = bench::time_pair(
      [&] {
        for (const auto& e : entries) kernel::adamw_step_kernel(cpu, e.step, e.p, e.g, e.m, e.v, e.w);
      },
      [&] { kernel::adamw_multi_step_kernel(cpu, entries); }, 2, runs);
  const bench::PairTiming norm = bench::time_pair(
      [&] {
        for (size_t i = 0; i < grads.size(); ++i) {
          kernel::sum_squares_kernel(cpu, grads[i], kernel::narrow(sums, 0, static_cast<int64_t>(i), 1));
        }
      },
      [&] { kernel::sum_squares_multi_kernel(cpu, grads, sums); }, 2, runs);
  // Scaling by 1 leaves the gradients as they are from run to run.
  const bench::PairTiming scale = bench::time_pair(
      [&] {
        for (const Tensor& g : grads) kernel::scale_inplace_kernel(cpu, g, 1.0);
      },
      [&] { kernel::scale_inplace_multi_kernel(cpu, grads, 1.0); }, 2, runs);
  std::printf("%zu parameter tensors, %ld elements, %s; median ms, per tensor vs multi-tensor:\n", entries.size(),
              static_cast<long>(elements), dtype_name(f.on.dtype));
  auto row = [](const char* name, const bench::PairTiming& t) {
    std::printf("  %-22s %8.3f %8.3f   speed-up %.2fx\n", name, 1e3 * t.a_seconds, 1e3 * t.b_seconds,
                t.a_seconds / t.b_seconds);
  };
  row("adamw step", adamw);
  row("sum of squares (norm)", norm);
  row("scale (clip)", scale);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  bench::parse_flags(argc, argv,
                     {{"--d", &f.d},
                      {"--layers", &f.layers},
                      {"--heads", &f.heads},
                      {"--T", &f.T},
                      {"--vocab", &f.vocab},
                      {"--runs", &f.runs}},
                     f.on, usage);
  return seqlab::bench::run_or_report("optim_step_bench", f, &bench_main);
}
