// Training throughput of seqlab's Gpt on the CPU, the counterpart of bench/torch_gpt.py (the
// project's PyTorch peer, /work/shared/bench/torch_gpt.py): same flags, same model (learned
// positions, LayerNorm, GELU(tanh) MLP of 4·d, tied embeddings, biases), same AdamW settings as
// torch.optim.AdamW(lr=1e-3, weight_decay=0.1) — betas (0.9, 0.999), eps 1e-8, decay on every
// parameter — on one fixed random batch, 3 warm-up steps, then --steps timed steps. Prints one
// line in the peer's format, with the same flops_per_token, so that bench/gpt_vs_torch.sh can
// quote the ratio of the two.
//
// Usage: gpt_train_bench [--d 256] [--layers 4] [--heads 4] [--T 256] [--B 8] [--vocab 256]
//                        [--steps 20] [--threads 0]      (0: the OpenMP / OpenBLAS default)
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "layers/gpt.h"
#include "train/optim.h"

using namespace seqlab;

namespace {

struct Flags {
  int64_t d = 256, layers = 4, heads = 4, T = 256, B = 8, vocab = 256, steps = 20, threads = 0;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "gpt_train_bench: %s\nusage: gpt_train_bench [--d N] [--layers N] [--heads N] [--T N] [--B N] "
               "[--vocab N] [--steps N] [--threads N]\n",
               why);
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  const std::pair<const char*, int64_t*> names[] = {{"--d", &f.d},         {"--layers", &f.layers},
                                                    {"--heads", &f.heads}, {"--T", &f.T},
                                                    {"--B", &f.B},         {"--vocab", &f.vocab},
                                                    {"--steps", &f.steps}, {"--threads", &f.threads}};
  for (int i = 1; i < argc; ++i) {
    int64_t* slot = nullptr;
    for (const auto& [name, dst] : names) {
      if (std::strcmp(argv[i], name) == 0) slot = dst;
    }
    if (slot == nullptr) usage((std::string("unknown flag ") + argv[i]).c_str());
    if (i + 1 >= argc) usage((std::string(argv[i]) + " needs a value").c_str());
    char* end = nullptr;
    *slot = std::strtoll(argv[++i], &end, 10);
    if (*end != '\0' || *slot < 0) usage((std::string("bad value for ") + argv[i - 1]).c_str());
  }
  if (f.steps < 1) usage("--steps must be at least 1");
  return f;
}

// The tensor of rows data[:, first : first + T] of a [B, T + 1] token table, as i64 [B, T].
Tensor columns(const std::vector<int64_t>& data, int64_t B, int64_t T, int64_t first) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) out.push_back(data[static_cast<size_t>(b * (T + 1) + first + t)]);
  }
  return Tensor::from_indices(out, {B, T}, DType::i64);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  if (f.threads > 0) {
    omp_set_num_threads(static_cast<int>(f.threads));
    openblas_set_num_threads(static_cast<int>(f.threads));
  }

  // The GptConfig that the trainer builds for recipes/gpt_small.toml (with these sizes).
  GptConfig cfg;
  cfg.vocab_size = f.vocab;
  cfg.d_model = f.d;
  cfg.n_layers = f.layers;
  cfg.n_heads = f.heads;
  cfg.max_seq_len = f.T;
  cfg.positions = PositionKind::learned;
  cfg.norm = NormKind::layer_norm;
  cfg.norm_eps = 1e-5;
  cfg.bias = true;
  cfg.init_std = 0.02;
  Generator gen(0);
  Gpt model(cfg, gen);

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
  const Tensor inputs = columns(data, f.B, f.T, 0), targets = columns(data, f.B, f.T, 1);

  double loss = 0;
  auto step = [&] {
    Tensor l = model.loss(inputs, targets);
    opt.zero_grad();
    l.backward();
    opt.step(oc.lr);
    loss = l.item();
  };
  for (int i = 0; i < 3; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < f.steps; ++i) step();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int64_t n = model.num_parameters();
  // Weights (forward + backward) plus causal attention scores and mixing: the peer's formula.
  const double flops_per_token = 6.0 * static_cast<double>(n) + 6.0 * static_cast<double>(f.layers * f.T * f.d);
  const double tps = static_cast<double>(f.steps * f.B * f.T) / dt;
  std::printf("seqlab device=cpu dtype=f32 params=%ld tokens/s=%.0f step_ms=%.1f model_TFLOP/s=%.3f loss=%.3f\n",
              static_cast<long>(n), tps, 1000.0 * dt / static_cast<double>(f.steps), tps * flops_per_token / 1e12,
              loss);
  return 0;
}
