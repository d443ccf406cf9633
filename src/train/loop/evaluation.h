// Evaluation of a language model on a run's held-out data, as the training loop does at every
// log.eval_interval and `seqlab eval RUN` does for a finished checkpoint: the data sources (a prepared
// corpus or a synthetic task, with a source per eval.seq_len), the mean loss and accuracy over the
// evaluation batches, and the fields they add to a metrics line.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/model/language_model.h"
#include "tensor/device.h"
#include "train/data/loader.h"
#include "train/data/tokenizer.h"
#include "train/recipe/configs.h"  // training_device
#include "train/recipe/recipe.h"

namespace seqlab::cli {

// One length of eval.seq_len: validation sequences of seq_len tokens, batch_size of them a batch.
struct EvalLength {
  int64_t seq_len = 0;
  int64_t batch_size = 0;  // eval_batch_size: about the tokens of a batch at train.seq_len
  int64_t batches = 0;
  // Windows of seq_len + 1 tokens of the val split, or the synthetic task's evaluation stream generated
  // at seq_len; nullptr for train.seq_len itself, whose values are those of the main evaluation.
  std::unique_ptr<BatchSource> val;
};

struct Data {
  std::unique_ptr<BatchSource> train;
  std::unique_ptr<BatchSource> val;  // for synthetic tasks, the train source's own evaluation stream
  int64_t vocab_size = 0;
  int64_t eval_batches = 0;
  std::vector<EvalLength> eval_lengths;  // eval.seq_len, in the recipe's order
  std::unique_ptr<TokenDecoder> tokenizer;  // text data only: decodes samples
  // End-of-text, then log.sample_prompt's ids; empty where the run samples no text (data.objective
  // "masked_lm" and "span_corruption": their models do not continue a text).
  std::vector<int32_t> sample_prompt;
  bool synthetic = false;
  std::string description;
};

// The run's data: rank `rank` of `world` reads its share of the training windows (loader.h); every rank
// opens the whole evaluation split, and its windows at each eval.seq_len, which rank 0 alone walks.
// A UserError names what is wrong (the recipe key, the file, a split too short for a batch).
Data open_data(const Recipe& r, int rank = 0, int world = 1);


struct Evaluation {
  double loss = 0;
  // The fraction of scored positions predicted right (argmax): a synthetic task's answers, the masked
  // tokens of masked_lm, the targets of span_corruption (sentinels and span tokens).
  std::optional<double> accuracy;
  std::string accuracy_name = "accuracy";  // how the progress line names it ("masked acc", "span acc")
  std::optional<double> sequence_accuracy;  // BERT's next-sentence prediction, rows with a label
};

// The mean loss (and, for synthetic tasks, the accuracy) over the first `batches` evaluation batches
// of `val`, in evaluation mode and without gradients (the model is left in training mode).
Evaluation evaluate(LanguageModel& model, const BatchSource& val, int64_t batches, int64_t batch_size, bool accuracy,
                    Device device);

// The fields of one evaluation in a metrics line, their names ending in `suffix` ("" at train.seq_len,
// "@L" at an eval.seq_len), and the same for the progress line.
struct EvalFields {
  std::string json, shown;
};
EvalFields eval_fields(const Evaluation& e, bool bytes, const std::string& suffix);

// One evaluation of everything the recipe asks for: at train.seq_len (`main`, its fields unsuffixed) and
// at every eval.seq_len (fields NAME@L; train.seq_len's own length reuses `main`). `json` is the fields'
// text for a metrics line (", \"val_loss\": …"); `shown` one human-readable line per length.
struct EvalReport {
  Evaluation main;
  std::string json;
  std::vector<std::string> shown;
};
EvalReport evaluate_all(LanguageModel& model, const Data& data, const Recipe& r, Device device);

// The fields a run of the recipe may log on its last step's metrics line (what a sweep's metric can
// name): the training fields (loss, lr, grad_norm, tokens_per_s, mfu, elapsed_s, tokens, train_flops)
// and the evaluation's — val_loss, val_ppl; val_bpb with bytes (data.objective = "lm" on text with
// data.tokenizer = "byte", or on shards, whose tokenizer the recipe does not say); val_acc for a
// synthetic task — and the same fields NAME@L for each eval.seq_len L. Decided from the recipe alone,
// before any run.
std::vector<std::string> reported_metrics(const Recipe& r);

}  // namespace seqlab::cli
