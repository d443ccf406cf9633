// `seqlab --help` and `seqlab --version`. The version names the backends this binary was built
// with, so a bug report says which BLAS, how many threads and which CUDA toolkit produced a number.
#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <omp.h>

#include "build_info.h"
#include "tensor/device.h"
#include "tensor/kernels.h"
#include "train/cli/commands.h"

namespace seqlab::cli {

std::string usage_text() {
  return "usage: seqlab COMMAND [ARGS]\n"
         "\n"
         "commands:\n"
         "  op NAME --in DIR --out DIR [--attr key=value]... [--dtype f32|f64]\n"
         "                      run one registered op on DIR/<input>.npy files (seqlab op --help)\n"
         "  op --list           the registered ops, one JSON object per line\n"
         "  tokenizer train --vocab N --out FILE [--input PATH] [--format F]\n"
         "                      learn byte-level BPE merges (seqlab tokenizer --help)\n"
         "  tokenizer encode [--tokenizer FILE] --text TEXT   show how a text is tokenized\n"
         "  prepare --out DIR [--input PATH] [--tokenizer byte|bpe] [--val-fraction F]\n"
         "                      text, fortune or JSONL files -> llm.c token shards (seqlab prepare --help)\n"
         "  recipe check FILE [--set section.key=value]...\n"
         "                      validate a recipe and print it resolved (every key, final values)\n"
         "  recipe --doc        every recipe key with its type, default and meaning (docs/recipes.md)\n"
         "  RECIPE.toml [--set section.key=value]... [--out DIR]\n"
         "                      train: prepares the data, then logs metrics.jsonl, samples.txt and checkpoints\n"
         "                      in the run directory (default runs/<recipe name>); Ctrl-C saves and stops\n"
         "  RECIPE.toml --profile N [...]   also time every CPU kernel of N steps (from the second) and print\n"
         "                      ms/step by category (GEMM, attention, norms, ..., framework) and the top\n"
         "                      kernels; written to RUN/profile.json too (docs/training.md)\n"
         "  RECIPE.toml --nproc N [...]   the same with N data-parallel rank processes (train.batch_size\n"
         "                      is the global batch; docs/distributed.md); with --resume RUN too;\n"
         "                      --set parallel.sp=P: groups of P ranks share each sequence (sequence parallelism)\n"
         "  ... --nproc N --nnodes K --node-rank I --rendezvous DIR|redis://HOST:PORT/JOB\n"
         "                      machine I of K, each with N ranks, meeting through a shared folder or Redis\n"
         "  --resume RUN [--checkpoint FILE] [--set section.key=value]...\n"
         "                      continue a run from its newest checkpoint (or FILE, an older one of RUN:\n"
         "                      later ones are renamed *.abandoned), with the recipe it saved\n"
         "  RECIPE.toml --resume RUN   continue RUN with the given recipe instead\n"
         "  sample RUN [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
         "                      generate text from a run's newest checkpoint (seqlab sample --help)\n"
         "  eval RUN [--set eval.seq_len=[L,...]] [--checkpoint FILE]\n"
         "                      score a run's checkpoint on its validation data, also at other lengths\n"
         "                      than it trained at (seqlab eval --help)\n"
         "  export --hf RUN OUT [--checkpoint FILE] [--force]\n"
         "                      a run's model as a Hugging Face transformers folder: config.json and\n"
         "                      model.safetensors (GPT2LMHeadModel); an OUT holding files is replaced only\n"
         "                      with --force; a model transformers has no class for is refused (seqlab export --help)\n"
         "  logits RUN --tokens \"ID ...\" --out FILE.npy [--checkpoint FILE]\n"
         "                      the logits of a run's model for the given ids, f32 [T, V] (seqlab logits --help)\n"
         "  plot RUN [--out FILE]  draw the loss curves of a run into RUN/loss.png\n"
         "  sweep SWEEP.toml [--jobs N] [--out DIR] [--dry-run] [--rerun-changed]   every point of a grid\n"
         "                      of runs, then results.csv and a table of the best per cell (seqlab sweep --help)\n"
         "  sweep --report DIR  the results of a sweep folder again, from its finished runs\n"
         "  --version           version, git commit and the compiled backends\n"
         "  --help              this text\n"
         "\n"
         "Sweep files that rerun published comparisons at CPU scale: recipes/sweeps/ (docs/scaling.md).\n";
}

namespace {

std::string blas_line() {
  // OpenBLAS names its version, the kernel core picked at run time and the thread cap.
  const std::string config = kernel::cpu_blas_config();
  if (config.empty()) return absl::StrCat("CPU BLAS: ", SEQLAB_BLAS);
  return absl::StrCat("CPU BLAS: ", config, " (", SEQLAB_BLAS, ")");
}

std::string cuda_line() {
#if SEQLAB_BUILT_WITH_CUDA
  std::string line = absl::StrCat("CUDA: toolkit ", SEQLAB_CUDA_TOOLKIT, ", architectures ", SEQLAB_CUDA_ARCHS);
  // The backend registers itself when the library loads; it describes the runtime, arch and NCCL.
  DeviceBackend* backend = cuda_backend();
  if (!backend) return absl::StrCat(line, "; backend not registered");
  std::string gpus = backend->available() ? absl::StrCat(backend->device_count(), " GPU(s) usable") : "no usable GPU";
  return absl::StrCat(line, "; ", backend->describe(), "; ", gpus);
#else
  return "CUDA: not built";
#endif
}

}  // namespace

std::string version_text() {
  return absl::StrCat("seqlab ", SEQLAB_VERSION, " (git ", SEQLAB_GIT_COMMIT, ")\n", blas_line(), "\n",
                      "CPU bf16: ", kernel::cpu_bf16_gemm_config(), "\n", "CPU AVX-512 loops: ",
                      kernel::cpu_avx512() ? "on (softmax rows; GELU, SiLU, sigmoid; bf16 rounding)"
                                           : "off (the CPU lacks AVX512F, or SEQLAB_CPU_AVX512=off)",
                      "\n",
                      "OpenMP: ", omp_get_max_threads(), " threads (OpenMP ", _OPENMP, ")\n", cuda_line(), "\n");
}

}  // namespace seqlab::cli
