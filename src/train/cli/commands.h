// The `seqlab` command line: main.cpp dispatches on the first argument to the subcommands declared
// here. Every subcommand reports a user error as one line on stderr and exit code 2 (kUsageError).
#pragma once

#include <string>
#include <vector>

#include "train/common/errors.h"  // UserError, kUsageError

namespace seqlab::cli {

// `seqlab --help`: the subcommands, the implemented ones and the planned ones.
std::string usage_text();
// `seqlab --version`: version, git commit and the backends compiled in (BLAS, OpenMP, CUDA).
std::string version_text();

// `seqlab op ...` with the arguments after "op": runs one registered op on .npy files.
int op_command(const std::vector<std::string>& args);
// `seqlab recipe ...` with the arguments after "recipe": `check FILE [--set k=v]...` and `--doc`.
int recipe_command(const std::vector<std::string>& args);
// `seqlab sample RUN ...` with the arguments after "sample": text from a run's checkpoint.
int sample_command(const std::vector<std::string>& args);
// `seqlab eval RUN ...` with the arguments after "eval": a run's checkpoint scored on its held-out data,
// at train.seq_len and at every eval.seq_len (--set can give others).
int eval_command(const std::vector<std::string>& args);
// `seqlab export --hf RUN OUT ...` with the arguments after "export": a run's model as a Hugging Face
// transformers folder (config.json, model.safetensors).
int export_command(const std::vector<std::string>& args);
// `seqlab logits RUN ...` with the arguments after "logits": the logits of given token ids as a .npy file.
int logits_command(const std::vector<std::string>& args);
// `seqlab plot RUN ...` with the arguments after "plot": the loss curves as a PNG.
int plot_command(const std::vector<std::string>& args);
// `seqlab sweep SWEEP.toml ...` with the arguments after "sweep": every point of a grid of runs, and the
// results table.
int sweep_command(const std::vector<std::string>& args);

}  // namespace seqlab::cli
