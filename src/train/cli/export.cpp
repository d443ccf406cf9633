// `seqlab export --hf RUN OUT`: a run's model as a Hugging Face transformers folder (train/export/hf_export.h).
//
// The folder appears whole or not at all: config.json and model.safetensors are written into OUT.tmp.PID
// beside OUT, flushed, and the folder is then renamed to OUT. An OUT that already holds files is refused
// unless --force; then the new folder and the old one are swapped in one step (renameat2 with
// RENAME_EXCHANGE, where the file system has it; else two renames, between which OUT is briefly absent)
// and the old one is deleted. --force never deletes a folder that holds subfolders or a run's files, so
// a mistyped OUT (a run, the runs/ folder, a home directory) is refused instead of deleted. A temporary
// folder left by an export that was killed (its process gone) is deleted by the next export to the same OUT.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/run_folder.h"
#include "train/common/atomic_file.h"
#include "train/cli/commands.h"
#include "train/cli/data.h"
#include "train/cli/util.h"
#include "train/data/tokenizer.h"
#include "train/export/hf_export.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kExportUsage[] =
    "usage: seqlab export --hf RUN OUT [--checkpoint FILE] [--force]\n"
    "\n"
    "Writes the model of the run directory RUN (its newest checkpoint, or FILE, with the recipe it holds) as a\n"
    "Hugging Face transformers folder OUT: OUT/config.json and OUT/model.safetensors (f32, under transformers'\n"
    "parameter names and layouts), which the class's from_pretrained(OUT) loads. A decoder whose every block is\n"
    "causal attention with a GELU MLP, pre-norm, with LayerNorm, biases, learned positions and full key/value\n"
    "heads, is a GPT2LMHeadModel (d_ff is its n_inner; a tied or untied output). An encoder with BERT's block\n"
    "(post-norm LayerNorm, GELU, biases, learned positions) is a BertForMaskedLM (without the next-sentence head,\n"
    "which that class has no place for). An encoder-decoder with T5's block (pre-norm RMSNorm, ReLU or GEGLU, no\n"
    "biases, relative positions, [model.attention] scale = 1) is a T5ForConditionalGeneration, tied or untied.\n"
    "A model the class cannot hold (RoPE, SwiGLU, RMSNorm in a GPT-2, no biases, grouped key/value heads, a\n"
    "recurrent mixer such as gla, ...) is refused in one line naming each setting that does not map, and\n"
    "nothing is written. OUT is written under a temporary name beside it and renamed when whole.\n"
    "`seqlab logits` gives the logits to compare with.\n"
    "\n"
    "  --hf               the format: Hugging Face transformers (the only one so far; required)\n"
    "  --checkpoint FILE  a checkpoint other than RUN's newest\n"
    "  --force            replace an OUT that already holds files (an earlier export); without it such an OUT\n"
    "                     is refused. A folder holding subfolders or a run's files is never replaced.\n";

// Why `dir`, an existing folder, may not be replaced by --force ("" when it may): it holds a folder,
// or the files of a run.
std::string unreplaceable(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec)) return "it holds the folder " + name + " (--force replaces only a folder of files)";
    if (name == "recipe.toml" || name == "run.json" || name == kRunLockFile ||
        (name.rfind("ckpt_", 0) == 0 && name.find(".safetensors") != std::string::npos)) {
      return "it holds a run's files (" + name + ")";
    }
  }
  if (ec) return "it cannot be read (" + ec.message() + ")";
  return "";
}

// The names of the entries of `dir`, at most a few, for a message.
std::string some_entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  size_t count = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (count++ < 3) names.push_back(e.path().filename().string());
  }
  return absl::StrJoin(names, ", ") + (count > 3 ? ", ..." : "");
}

// Flushes a folder's entries (the files created and renamed in it) to disk; best effort, as the
// data itself is already fsynced by the writers.
void sync_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Deletes OUT.tmp.PID and OUT.old.PID beside `out` whose process PID no longer runs: what an export killed
// in the middle leaves. Nothing else beside OUT is touched.
void remove_leftovers(const fs::path& out, const fs::path& parent) {
  std::error_code ec;
  const std::string stem = out.filename().string();
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    std::string rest;
    for (const char* tag : {".tmp.", ".old."}) {
      if (name.rfind(stem + tag, 0) == 0) rest = name.substr(stem.size() + 5);
    }
    int64_t pid = 0;
    if (rest.empty() || !absl::SimpleAtoi(rest, &pid) || pid <= 0 || !e.is_directory(ec)) continue;
    if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // alive
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
}

// Writes `e` into the folder `out` (OUT, created whole): into a temporary folder beside it, then renamed.
// `replace`: OUT exists with files (an earlier export, checked by the caller) and is replaced.
void write_export(const HfExport& e, const fs::path& out, bool replace) {
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (ec) throw UserError(absl::StrCat(parent.string(), ": cannot create the folder (", ec.message(), ")"));
  remove_leftovers(out, parent);
  const fs::path tmp = temporary_name(out.string());
  fs::remove_all(tmp, ec);  // a leftover of an earlier process with this pid
  if (!fs::create_directory(tmp, ec)) {
    throw UserError(absl::StrCat(out.string(), ": cannot create ", tmp.string(), " (",
                                 ec ? ec.message() : "it exists", ")"));
  }
  auto fail = [&](const std::string& message) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw UserError(message);
  };
  if (absl::Status s = write_file_atomically((tmp / "config.json").string(), e.config_json); !s.ok()) {
    fail(std::string(s.message()));
  }
  if (absl::Status s = write_safetensors((tmp / "model.safetensors").string(), e.tensors, e.metadata); !s.ok()) {
    fail(std::string(s.message()));
  }
  sync_folder(tmp);
  if (!replace) {
    // rename(2) replaces a missing or empty OUT; one that gained entries meanwhile is left alone.
    if (::rename(tmp.c_str(), out.c_str()) != 0) {
      fail(absl::StrCat(out.string(), ": cannot rename ", tmp.string(), " to it (", std::strerror(errno), ")"));
    }
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now the old export
  } else if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    fail(absl::StrCat(out.string(), ": cannot replace it by ", tmp.string(), " (", std::strerror(errno), ")"));
  } else {
    // No atomic exchange on this file system: the old folder aside, the new one in, the old one deleted.
    const fs::path old = absl::StrCat(out.string(), ".old.", ::getpid());
    fs::remove_all(old, ec);
    if (::rename(out.c_str(), old.c_str()) != 0) {
      fail(absl::StrCat(out.string(), ": cannot move it aside to replace it (", std::strerror(errno), ")"));
    }
    if (::rename(tmp.c_str(), out.c_str()) != 0) {
      const std::string reason = std::strerror(errno);
      ::rename(old.c_str(), out.c_str());
      fail(absl::StrCat(out.string(), ": cannot rename ", tmp.string(), " to it (", reason, ")"));
    }
    fs::remove_all(old, ec);
  }
  sync_folder(parent);
}

void export_run(const std::vector<std::string>& args) {
  Flags f(args, "export", {"--checkpoint"}, {"--hf", "--force", "--help", "-h"}, {}, 2);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kExportUsage;
    return;
  }
  if (!f.has("--hf")) {
    throw UserError("name the format to export to: --hf, Hugging Face transformers, the only one so far "
                    "(see seqlab export --help)");
  }
  if (f.positional().size() != 2) {
    throw UserError("expected the run directory and the output folder: seqlab export --hf RUN OUT "
                    "(see seqlab export --help)");
  }
  const std::string run = f.positional()[0];
  // OUT without a trailing slash, so that OUT.tmp.PID lies beside it and not inside it.
  fs::path out = fs::path(f.positional()[1]).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (out.empty() || out.filename() == "." || out.filename() == "..") {
    throw UserError("name the output folder itself, not '" + f.positional()[1] + "'");
  }
  const bool force = f.has("--force");

  // Where the export goes, checked before the work (and OUT's state again by the rename at the end).
  std::error_code ec;
  bool replace = false;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) throw UserError(out.string() + ": exists and is not a folder");
    if (!fs::is_empty(out, ec)) {
      if (!force) {
        throw UserError(absl::StrCat(out.string(), ": exists and is not empty (", some_entries(out),
                                     "); --force replaces it"));
      }
      if (const std::string why = unreplaceable(out); !why.empty()) {
        throw UserError(absl::StrCat(out.string(), ": --force will not replace it: ", why));
      }
      replace = true;
    }
  }

  RunCheckpoint opened = open_run_checkpoint(run, f.get("--checkpoint"), {}, true);
  const Recipe& recipe = opened.recipe;
  const Checkpoint& checkpoint = opened.checkpoint;
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);

  HfExportSource source;
  source.run_id = opened.identity.id;
  source.checkpoint = fs::path(checkpoint.file).filename().string();
  source.step = checkpoint.step;
  // bos and eos are the end-of-text token that starts every training document, as in GPT-2; BERT and T5
  // name the padding id of the objective's table, T5 its [EOS] too.
  if (run_has_text(recipe)) {
    try {
      const std::unique_ptr<TokenDecoder> tokenizer = run_tokenizer(recipe);
      source.eot = tokenizer->eot();
      if (const auto* table = dynamic_cast<const Tokenizer*>(tokenizer.get())) {
        if (table->special_tokens().pad >= 0) source.pad = table->pad();
        if (table->special_tokens().eos >= 0) source.eos = table->eos();
      }
    } catch (const UserError& e) {
      std::cerr << "seqlab export: note: the special token ids (bos_token_id, eos_token_id, pad_token_id) are "
                   "null in config.json: the run's tokenizer cannot be opened here ("
                << e.what() << ")\n";
    }
  }
  const HfExport e = value_or_throw(hf_export(recipe, *model, source));
  write_export(e, out, replace);
  int64_t parameters = 0;
  for (const auto& [name, t] : e.tensors) parameters += t.numel();
  std::cout << absl::StrCat("wrote ", out.string(), ": ", e.architecture, ", ", e.tensors.size(), " tensors, ",
                            parameters, " parameters, from ", source.checkpoint, " (step ", source.step, ")\n");
}

}  // namespace

int export_command(const std::vector<std::string>& args) {
  return run_guarded("export", [&] { export_run(args); });
}

}  // namespace seqlab::cli
