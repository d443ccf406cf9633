// `seqlab logits RUN --tokens IDS --out FILE.npy`: the logits a run's model gives one sequence of token
// ids, as a .npy file, for comparing seqlab's forward with another implementation's (an export loaded in
// Hugging Face transformers: tests/hf_export_test.py). One forward over the whole sequence, as training
// computes it — not the decoding path of `sample` —, on the CPU (the reference backend) in f32 and in
// evaluation mode (no dropout). Every model kind: a decoder's row of ids; an encoder's (BERT) with its
// segment ids and a length (the ids after it padding, masked as training masks them); an encoder-
// decoder's (T5) source with a length and the decoder's input ids, whose logits are written.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <iostream>

#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "tensor/npy.h"
#include "train/checkpoint/checkpoint.h"
#include "train/cli/commands.h"
#include "train/cli/util.h"
#include "layers/model/encoder.h"
#include "layers/model/encoder_decoder.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

constexpr char kLogitsUsage[] =
    "usage: seqlab logits RUN --tokens \"ID ID ...\" --out FILE.npy [--segments \"S S ...\"] [--length N]\n"
    "                     [--decoder-tokens \"ID ID ...\"] [--checkpoint FILE]\n"
    "\n"
    "Writes the logits that the model of the run directory RUN (its newest checkpoint, or FILE, with the recipe\n"
    "it holds) gives the token ids of --tokens to FILE.npy: float32, shape [T, V] for T ids and the model's\n"
    "vocabulary of V ids. A decoder: row t scores the token that follows ids 0..t. An encoder (BERT): row t\n"
    "scores position t, each row seeing the whole sequence. An encoder-decoder (T5): --tokens is the encoder's\n"
    "input and --decoder-tokens the decoder's; the shape is [S, V] for S decoder ids, row s scoring the token\n"
    "after decoder ids 0..s. One forward over the whole sequence, on the CPU in f32, in evaluation mode (no\n"
    "dropout): what an export (seqlab export --hf) loaded elsewhere must reproduce.\n"
    "\n"
    "  --tokens IDS          the token ids, separated by spaces or commas: at least one, each below the model's\n"
    "                        vocabulary size, at most as many as the positions it knows (train.seq_len for\n"
    "                        learned positions)\n"
    "  --out FILE.npy        where to write the logits (written to a temporary name, then renamed)\n"
    "  --segments S          an encoder with model.segments: the segment (token type) of each id of --tokens,\n"
    "                        one per id, each below model.segments; without it the model adds no segment\n"
    "                        embedding\n"
    "  --length N            an encoder or an encoder-decoder: only the first N ids of --tokens are the text, the\n"
    "                        rest padding, which no row attends to (as padded training rows); rows at and after\n"
    "                        N of an encoder's logits are the padding's own and not meaningful\n"
    "  --decoder-tokens IDS  an encoder-decoder: the decoder's input ids (required there); e.g. [PAD], the\n"
    "                        decoder start, then the target's ids\n"
    "  --checkpoint FILE     a checkpoint other than RUN's newest\n";

// The ids of `flag`'s text, each checked against `limit` (`what` names the limit in the message).
std::vector<int64_t> parse_ids(const std::string& flag, const std::string& text, int64_t limit,
                               const std::string& what) {
  std::vector<int64_t> ids;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(word, &id)) {
      throw UserError(absl::StrCat(flag, " expects ids separated by spaces or commas, got '", word, "'"));
    }
    if (id < 0 || id >= limit) {
      throw UserError(absl::StrCat(flag, ": id ", id, " is outside ", what, " of ", limit, " ids (0 to ", limit - 1,
                                   ")"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) throw UserError(flag + " holds no id");
  return ids;
}

// The token ids of `flag`, checked against the vocabulary and the positions the model knows.
std::vector<int64_t> parse_tokens(const std::string& flag, const std::string& text, const LanguageModel& model) {
  std::vector<int64_t> ids = parse_ids(flag, text, model.vocab_size(), "the model's vocabulary");
  const int64_t T = static_cast<int64_t>(ids.size());
  if (model.max_context() > 0 && T > model.max_context()) {
    throw UserError(absl::StrCat(flag, " holds ", T, " ids, more than the ", model.max_context(),
                                 " positions the model knows"));
  }
  return ids;
}

void logits(const std::vector<std::string>& args) {
  Flags f(args, "logits", {"--tokens", "--out", "--checkpoint", "--segments", "--length", "--decoder-tokens"},
          {"--help", "-h"}, {}, 1);
  if (f.has("--help") || f.has("-h")) {
    std::cout << kLogitsUsage;
    return;
  }
  if (f.positional().empty()) {
    throw UserError("expected the run directory: seqlab logits RUN --tokens IDS --out FILE.npy (see seqlab logits --help)");
  }
  if (!f.has("--tokens")) throw UserError("--tokens is required: the token ids to score (see seqlab logits --help)");
  if (!f.has("--out")) throw UserError("--out is required: the .npy file to write (see seqlab logits --help)");
  const std::string run = f.positional()[0];

  RunCheckpoint opened = open_run_checkpoint(run, f.get("--checkpoint"), {}, true);
  const Recipe& recipe = opened.recipe;
  const Checkpoint& checkpoint = opened.checkpoint;
  // Built on the host in f32, where it stays: the CPU is the reference.
  std::unique_ptr<LanguageModel> model = value_or_throw(build_model(recipe, checkpoint.vocab_size));
  restore_weights(checkpoint, *model);
  const auto* encoder = dynamic_cast<const Encoder*>(model.get());
  const bool seq2seq = dynamic_cast<const EncoderDecoder*>(model.get()) != nullptr;
  const std::string arch = absl::StrCat("this run's model.arch is \"", recipe.model.arch, "\"");
  if (f.has("--segments") && encoder == nullptr) {
    throw UserError("--segments is read by an encoder (model.arch = \"encoder\") only; " + arch);
  }
  if (f.has("--length") && encoder == nullptr && !seq2seq) {
    throw UserError("--length is read by encoders and encoder-decoders only (a decoder's row t never sees the "
                    "padding after it); " + arch);
  }
  if (f.has("--decoder-tokens") != seq2seq) {
    throw UserError(seq2seq ? "--decoder-tokens is required for an encoder-decoder: the decoder's input ids (see "
                              "seqlab logits --help)"
                            : "--decoder-tokens is read by an encoder-decoder (model.arch = \"encoder_decoder\") only; " +
                                  arch);
  }

  const std::vector<int64_t> ids = parse_tokens("--tokens", f.get("--tokens"), *model);
  const int64_t T = static_cast<int64_t>(ids.size());
  Batch batch(Tensor::from_indices(ids, {1, T}, DType::i64));
  if (f.has("--segments")) {
    const int64_t segments = encoder->config().segments;
    if (segments == 0) throw UserError("--segments: the model has no segment embedding (model.segments = 0)");
    const std::vector<int64_t> seg = parse_ids("--segments", f.get("--segments"), segments, "the model's segments");
    if (static_cast<int64_t>(seg.size()) != T) {
      throw UserError(absl::StrCat("--segments holds ", seg.size(), " ids for the ", T, " of --tokens: one per token"));
    }
    batch.segment_ids = Tensor::from_indices(seg, {1, T}, DType::i64);
  }
  if (f.has("--length")) {
    const int64_t length = f.number<int64_t>("--length", T, 1, T);
    batch.lengths = Tensor::from_indices({length}, {1}, DType::i64);
  }
  if (seq2seq) {
    const std::vector<int64_t> target = parse_tokens("--decoder-tokens", f.get("--decoder-tokens"), *model);
    batch.decoder_inputs = Tensor::from_indices(target, {1, static_cast<int64_t>(target.size())}, DType::i64);
  }

  NoGradGuard no_grad;
  model->set_training(false);
  const Tensor out = model->logits(batch);  // [1, T, V] ([1, S, V] for an encoder-decoder)
  ok_or_throw(write_npy(f.get("--out"), kernel::reshape(out, {out.shape()[1], out.shape()[2]})));
}

}  // namespace

int logits_command(const std::vector<std::string>& args) { return run_guarded("logits", [&] { logits(args); }); }

}  // namespace seqlab::cli
