// Evaluation on a run's held-out data (evaluation.h).
#include "train/loop/evaluation.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>

#include "autograd/variable.h"
#include "train/common/errors.h"
#include "train/common/json.h"
#include "train/data/masked_lm.h"
#include "train/data/prepare.h"
#include "train/data/span_corruption.h"
#include "train/data/synthetic.h"
#include "train/loop/sampling.h"
#include "train/recipe/configs.h"

namespace seqlab::cli {
namespace {

// "FILE: eval.seq_len[1] = 1024: ", the start of an error about one evaluation length.
std::string eval_length_where(const Recipe& r, size_t i) {
  return absl::StrCat(r.source_path, ": eval.seq_len[", i, "] = ", r.eval.seq_len[i], ": ");
}

// The rows of data.objective = "masked_lm" or "span_corruption" (masked_lm.h, span_corruption.h) from
// the prepared folder `dir`, into `d`: the training rows of rank `rank` of `world`, the evaluation
// walks at train.seq_len and at each eval.seq_len, and the vocabulary with the objective's special
// tokens. No sample prompt: these models are not sampled as text continuations.
void open_objective_rows(const Recipe& r, const DatasetInfo& info, const std::string& dir, int rank, int world,
                         Data& d) {
  const Objective objective = data_objective(r);
  std::unique_ptr<Tokenizer> tokenizer = value_or_throw(open_tokenizer(info, objective_special_tokens(r)));
  const std::vector<std::string> train_shards = value_or_throw(find_shards(dir, "train"));
  const std::vector<std::string> val_shards = value_or_throw(find_shards(dir, "val"));
  struct Opened {
    std::unique_ptr<BatchSource> source;
    int64_t eval_batches = 0;  // of the batch size asked for, before the walk wraps around
    std::string size;          // how much data, for the run's first line
  };
  auto open = [&](const std::vector<std::string>& shards, const LoaderOptions& lo,
                  int64_t batch_size) -> absl::StatusOr<Opened> {
    if (objective == Objective::masked_lm) {
      absl::StatusOr<MaskedLmSource> s = MaskedLmSource::open(shards, static_cast<int32_t>(info.eot), *tokenizer, lo,
                                                              masked_lm_config(r));
      if (!s.ok()) return s.status();
      Opened o{nullptr, s->eval_batches(batch_size), absl::StrFormat("%d documents", s->num_documents())};
      o.source = std::make_unique<MaskedLmSource>(*std::move(s));
      return o;
    }
    absl::StatusOr<SpanCorruptionSource> s = SpanCorruptionSource::open(shards, static_cast<int32_t>(info.eot),
                                                                        *tokenizer, lo, span_corruption_config(r));
    if (!s.ok()) return s.status();
    const SpanLengths& l = s->lengths();
    Opened o{nullptr, s->eval_batches(batch_size),
             absl::StrFormat("%d text tokens, rows of %d (encoder inputs of %d tokens, decoder sequences of %d)",
                             s->num_text_tokens(), l.raw, l.inputs, l.targets)};
    o.source = std::make_unique<SpanCorruptionSource>(*std::move(s));
    return o;
  };
  LoaderOptions lo = loader_options(r);
  lo.vocab_size = info.vocab_size;  // the prepared stream's ids, checked as the shards open
  lo.rank = rank;
  lo.world = world;
  Opened train = value_or_throw(open(train_shards, lo, r.train.batch_size));
  lo.rank = 0;
  lo.world = 1;
  lo.shuffle = false;
  Opened val = value_or_throw(open(val_shards, lo, r.train.batch_size));
  d.eval_batches = std::min(r.log.eval_batches, val.eval_batches);
  if (d.eval_batches < 1) {
    throw UserError(absl::StrFormat("%s: the val split holds fewer than %d %s rows of %d tokens (one batch)", dir,
                                    r.train.batch_size, r.data.objective, r.train.seq_len));
  }
  for (size_t i = 0; i < d.eval_lengths.size(); ++i) {
    EvalLength& e = d.eval_lengths[i];
    if (e.seq_len == r.train.seq_len) {
      e.batches = d.eval_batches;
      continue;
    }
    LoaderOptions at = lo;
    at.seq_len = e.seq_len;
    absl::StatusOr<Opened> walk = open(val_shards, at, e.batch_size);
    if (!walk.ok()) throw UserError(eval_length_where(r, i) + std::string(walk.status().message()));
    e.batches = std::min(r.log.eval_batches, walk->eval_batches);
    if (e.batches < 1) {
      throw UserError(absl::StrFormat("%s%s: the val split holds fewer than %d %s rows of %d tokens (one batch)",
                                      eval_length_where(r, i), dir, e.batch_size, r.data.objective, e.seq_len));
    }
    e.val = std::move(walk->source);
  }
  d.train = std::move(train.source);
  d.val = std::move(val.source);
  d.vocab_size = tokenizer->vocab_size();
  d.tokenizer = std::move(tokenizer);
  d.description = absl::StrFormat("%s rows from %s in %s", r.data.objective, train.size, dir);
}

}  // namespace

Data open_data(const Recipe& r, int rank, int world) {
  Data d;
  for (const int64_t len : r.eval.seq_len) d.eval_lengths.push_back({len, eval_batch_size(r, len), 0, nullptr});
  if (r.data.source != "text" && r.data.source != "shards") {
    const SyntheticConfig c = synthetic_config(r);
    if (absl::Status s = validate(c); !s.ok()) throw UserError(absl::StrCat(r.source_path, ": data: ", s.message()));
    auto source = std::make_unique<SyntheticSource>(
        value_or_throw(SyntheticSource::create(c, static_cast<uint64_t>(r.train.seed))));
    d.val = std::make_unique<SyntheticSource>(*source);
    d.train = std::move(source);
    d.vocab_size = c.vocab_size;
    d.eval_batches = r.log.eval_batches;
    // Each length: the same task and seed, generated at that length (an MQAR or copy example keeps its
    // layout at the start and is padded with blanks; induction and selective_copy spread over it).
    for (size_t i = 0; i < d.eval_lengths.size(); ++i) {
      EvalLength& e = d.eval_lengths[i];
      e.batches = r.log.eval_batches;
      if (e.seq_len == r.train.seq_len) continue;
      absl::StatusOr<SyntheticSource> at = SyntheticSource::create(synthetic_config(r, e.seq_len),
                                                                   static_cast<uint64_t>(r.train.seed));
      if (!at.ok()) throw UserError(absl::StrCat(eval_length_where(r, i), "data: ", at.status().message()));
      e.val = std::make_unique<SyntheticSource>(*std::move(at));
    }
    d.synthetic = true;
    d.description = absl::StrCat("synthetic task ", r.data.source);
    return d;
  }
  std::string dir = r.data.path;
  DatasetInfo info;
  if (r.data.source == "text") {
    info = value_or_throw(prepare_cached(prepare_options(r), r.data.cache_dir));
    dir = info.dir;
  } else {
    info = value_or_throw(open_shard_folder(dir, r.data.vocab_size, r.data.tokenizer_path));
  }
  if (data_objective(r) != Objective::lm) {
    open_objective_rows(r, info, dir, rank, world, d);
    return d;
  }
  d.vocab_size = info.vocab_size;
  d.tokenizer = value_or_throw(open_decoder(info));
  absl::StatusOr<std::vector<int32_t>> prompt = sample_prompt_ids(*d.tokenizer, r.log.sample_prompt);
  if (!prompt.ok()) throw UserError(absl::StrCat(r.source_path, ": log.sample_prompt: ", prompt.status().message()));
  d.sample_prompt = std::move(*prompt);
  LoaderOptions lo = loader_options(r);
  lo.vocab_size = info.vocab_size;  // every id of every shard is checked against it as the shards open
  lo.rank = rank;
  lo.world = world;
  auto train = std::make_unique<TokenLoader>(value_or_throw(TokenLoader::open_split(dir, "train", lo)));
  lo.rank = 0;
  lo.world = 1;
  lo.shuffle = false;
  auto val = std::make_unique<TokenLoader>(value_or_throw(TokenLoader::open_split(dir, "val", lo)));
  d.eval_batches = std::min(r.log.eval_batches, val->eval_batches(r.train.batch_size));
  if (d.eval_batches < 1) {
    throw UserError(absl::StrFormat("%s: the val split holds fewer than %d sequences of %d tokens (one batch)", dir,
                                    r.train.batch_size, r.train.seq_len + 1));
  }
  // Each length: the val split cut into windows of L + 1 tokens, walked from its start as at train.seq_len.
  for (size_t i = 0; i < d.eval_lengths.size(); ++i) {
    EvalLength& e = d.eval_lengths[i];
    if (e.seq_len == r.train.seq_len) {
      e.batches = d.eval_batches;
      continue;
    }
    LoaderOptions at = lo;
    at.seq_len = e.seq_len;
    absl::StatusOr<TokenLoader> loader = TokenLoader::open_split(dir, "val", at);
    if (!loader.ok()) throw UserError(eval_length_where(r, i) + std::string(loader.status().message()));
    e.batches = std::min(r.log.eval_batches, loader->eval_batches(e.batch_size));
    if (e.batches < 1) {
      throw UserError(absl::StrFormat("%s%s: the val split holds fewer than %d sequences of %d tokens (one batch)",
                                      eval_length_where(r, i), dir, e.batch_size, e.seq_len + 1));
    }
    e.val = std::make_unique<TokenLoader>(*std::move(loader));
  }
  d.description = absl::StrFormat("%d train tokens in %s", train->num_tokens(), dir);
  if (info.source_format == "llm.c") {
    absl::StrAppend(&d.description, absl::StrFormat(
        " (llm.c shards: vocabulary %d, samples %s)", info.vocab_size,
        info.tokenizer == "ids" ? std::string("as token ids") : "decoded by " + info.tokenizer_path));
  }
  d.train = std::move(train);
  d.val = std::move(val);
  return d;
}

Evaluation evaluate(LanguageModel& model, const BatchSource& val, int64_t batches, int64_t batch_size, bool accuracy,
                    Device device) {
  NoGradGuard no_grad;
  model.set_training(false);
  double total = 0;
  AccuracyCount count, sequences;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = val.eval_batch(i, batch_size).to(device);
    const ModelOutputs out = model.outputs(b);
    total += model.loss_from_logits(b, out.logits).item();  // the token loss (next-sentence apart)
    if (accuracy) {
      AccuracyCount c = count_correct(out.logits, ignore_past_lengths(b.scored_targets(), b.scored_lengths()));
      count.correct += c.correct;
      count.scored += c.scored;
    }
    if (out.sequence_logits.defined() && b.sequence_targets.defined()) {
      const int64_t B = out.sequence_logits.size(0), K = out.sequence_logits.size(1);
      AccuracyCount c = count_correct(kernel::view(out.sequence_logits, {B, 1, K}), kernel::view(b.sequence_targets, {B, 1}));
      sequences.correct += c.correct;
      sequences.scored += c.scored;
    }
  }
  model.set_training(true);
  Evaluation e;
  e.loss = total / static_cast<double>(batches);
  if (accuracy) e.accuracy = count.fraction();
  if (sequences.scored > 0) e.sequence_accuracy = sequences.fraction();
  return e;
}

EvalFields eval_fields(const Evaluation& e, bool bytes, const std::string& suffix) {
  const double v = e.loss;
  EvalFields f;
  // A loss that is not finite (a diverged model) is null in JSON; the shown line says nan or inf.
  f.json = absl::StrFormat(", \"val_loss%s\": %s, \"val_ppl%s\": %s", suffix, json_number("%.6f", v), suffix,
                           json_number("%.4f", std::exp(v)));
  f.shown = absl::StrFormat("val_loss %.4f  val_ppl %.2f", v, std::exp(v));
  if (bytes) {
    f.json += absl::StrFormat(", \"val_bpb%s\": %s", suffix, json_number("%.5f", v / std::log(2.0)));
    f.shown += absl::StrFormat("  bits/byte %.4f", v / std::log(2.0));
  }
  if (e.accuracy) {
    f.json += absl::StrFormat(", \"val_acc%s\": %s", suffix, json_number("%.5f", *e.accuracy));
    f.shown += absl::StrFormat("  %s %.2f%%", e.accuracy_name, 100.0 * *e.accuracy);
  }
  if (e.sequence_accuracy) {
    f.json += absl::StrFormat(", \"val_nsp_acc%s\": %s", suffix, json_number("%.5f", *e.sequence_accuracy));
    f.shown += absl::StrFormat("  next-sentence acc %.2f%%", 100.0 * *e.sequence_accuracy);
  }
  return f;
}


EvalReport evaluate_all(LanguageModel& model, const Data& data, const Recipe& r, Device device) {
  EvalReport report;
  // Accuracy where a subset of positions is scored: a synthetic task's answers, the objectives' masks and spans.
  const bool accuracy = data.synthetic || r.data.objective != "lm";
  const std::string accuracy_name = r.data.objective == "masked_lm"         ? "masked acc"
                                    : r.data.objective == "span_corruption" ? "span acc"
                                                                            : "accuracy";
  report.main = evaluate(model, *data.val, data.eval_batches, r.train.batch_size, accuracy, device);
  report.main.accuracy_name = accuracy_name;
  // Bits per byte of text: a language model's loss over byte tokens (the objectives score other things).
  const bool bytes = data.tokenizer && data.tokenizer->name() == "byte" && r.data.objective == "lm";
  const EvalFields at_train = eval_fields(report.main, bytes, "");
  report.json = at_train.json;
  report.shown.push_back(at_train.shown);
  for (const EvalLength& e : data.eval_lengths) {
    Evaluation at = e.val ? evaluate(model, *e.val, e.batches, e.batch_size, accuracy, device) : report.main;
    at.accuracy_name = accuracy_name;
    const EvalFields f = eval_fields(at, bytes, absl::StrCat("@", e.seq_len));
    report.json += f.json;
    report.shown.push_back(absl::StrFormat("at %d tokens: %s", e.seq_len, f.shown));
  }
  return report;
}

std::vector<std::string> reported_metrics(const Recipe& r) {
  std::vector<std::string> out{"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "elapsed_s", "tokens", "train_flops"};
  const bool synthetic = r.data.source != "text" && r.data.source != "shards";
  const bool bytes =
      r.data.objective == "lm" && ((r.data.source == "text" && r.data.tokenizer == "byte") || r.data.source == "shards");
  std::vector<std::string> eval{"val_loss", "val_ppl"};
  if (bytes) eval.push_back("val_bpb");
  if (synthetic || r.data.objective != "lm") eval.push_back("val_acc");
  if (r.data.objective == "masked_lm" && r.data.next_sentence) eval.push_back("val_nsp_acc");
  out.insert(out.end(), eval.begin(), eval.end());
  for (int64_t len : r.eval.seq_len) {
    for (const std::string& name : eval) out.push_back(absl::StrCat(name, "@", len));
  }
  return out;
}

}  // namespace seqlab::cli
