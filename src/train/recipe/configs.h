// The recipe → config mapping, in one place: every config the layers and the data pipeline take is
// made here from a loaded Recipe (recipe.h), so no other file copies recipe fields by hand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <absl/status/statusor.h>

#include "layers/model/decoder.h"
#include "layers/model/language_model.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "train/data/loader.h"
#include "train/data/masked_lm.h"
#include "train/data/prepare.h"
#include "train/data/span_corruption.h"
#include "train/data/special_tokens.h"
#include "train/data/synthetic.h"
#include "train/optim/optim.h"
#include "train/optim/schedule.h"
#include "train/recipe/recipe.h"

namespace seqlab {

// The model of [model] and [model.<mixer>], for data with `data_vocab` ids (model.vocab_size, when
// set, must hold them); max_seq_len is longest_seq_len: train.seq_len, or a longer eval.seq_len, which
// attention then reaches (a learned position table stays at train.seq_len: the recipe refuses longer
// eval lengths with it). InvalidArgument naming the recipe key.
absl::StatusOr<ModelConfig> model_config(const Recipe& recipe, int64_t data_vocab);
// The model built from model_config, its weights drawn from train.seed and its dropout masks from a
// stream of its own. InvalidArgument, prefixed with the recipe's file, for a model that does not fit
// its settings, or whose f32 weights alone exceed the host's available memory (check_memory, before
// anything is allocated: the model is built on the host).
absl::StatusOr<std::unique_ptr<LanguageModel>> build_model(const Recipe& recipe, int64_t data_vocab);

// The memory a run of the recipe takes, in bytes, estimated from the recipe alone (nothing is
// allocated; doubles, since a recipe's sizes may be absurd). Weights, gradients and optimizer state
// are exact for the parameter count (model_parameter_count); the activations are those one
// micro-batch keeps for its backward pass, counted low per block from the shapes the ops save (see
// configs.cpp): the estimate is a lower bound of what a step needs, so a refusal is never wrong, and a
// run that passes may still need up to about twice the activations counted.
struct MemoryEstimate {
  double parameters = 0;
  double weights = 0;      // in train.dtype; bf16 adds the optimizer's f32 masters
  double gradients = 0;    // one per weight, in train.dtype
  double optimizer = 0;    // AdamW: two f32 moments; SGD: one f32 buffer when momentum > 0
  double activations = 0;  // one micro-batch of train.batch_size × train.seq_len tokens
  double training() const { return weights + gradients + optimizer + activations; }
};
absl::StatusOr<MemoryEstimate> estimate_memory(const Recipe& recipe, int64_t data_vocab);

// OK when the model fits in `available_bytes` (< 0: unknown, always OK): with `training`, everything a
// training step holds (MemoryEstimate::training); without, the f32 weights of the model being built.
// Otherwise InvalidArgument naming the recipe file and the key whose value makes the model too big
// — of model.d_model, model.n_layers, model.d_ff, model.vocab_size, train.batch_size and
// train.seq_len, the one whose reset to its default shrinks the estimate most — with the estimate and
// what `where` ("cpu", "cuda:0") has available.
absl::Status check_memory(const Recipe& recipe, int64_t data_vocab, int64_t available_bytes, bool training,
                          const std::string& where);

OptimConfig optim_config(const Recipe& recipe);  // [optim]
TrainerOptions trainer_options(const Recipe& recipe);  // train.grad_accum, optim.grad_clip
LrSchedule lr_schedule(const Recipe& recipe);    // [optim] with train.steps
// train.device: "cpu"; "cuda" (a UserError without a usable GPU); "auto": the first GPU if one is usable.
Device training_device(const Recipe& r);
// train.dtype: the dtype of weights and activations (bf16: mixed precision, with f32 masters); "auto"
// is bf16 where the run's device (training_device) has bf16 instructions (bf16_is_native), else f32.
DType training_dtype(const Recipe& recipe);
bool bf16_is_native(Device device);

// The longest sequence the model sees: train.seq_len and every eval.seq_len.
int64_t longest_seq_len(const Recipe& recipe);
// Sequences per evaluation batch at `seq_len` tokens: max(1, floor(train.batch_size · train.seq_len /
// seq_len)), so that every eval.seq_len scores about the tokens (and the time and activation memory)
// of an evaluation at train.seq_len; train.batch_size itself at train.seq_len.
int64_t eval_batch_size(const Recipe& recipe, int64_t seq_len);

// [data] with a synthetic task as source (data.source names one), generating sequences of `seq_len`
// tokens (0: train.seq_len; an eval.seq_len for evaluation at that length).
SyntheticConfig synthetic_config(const Recipe& recipe, int64_t seq_len = 0);
// [data] with text files as source.
PrepareOptions prepare_options(const Recipe& recipe);
// Windows of seq_len + 1 tokens (0: train.seq_len), shuffled from train.seed.
LoaderOptions loader_options(const Recipe& recipe, int64_t seq_len = 0);

// data.objective and its keys.
Objective data_objective(const Recipe& recipe);
MaskedLmConfig masked_lm_config(const Recipe& recipe);
SpanCorruptionConfig span_corruption_config(const Recipe& recipe);
// The special tokens of the run's vocabulary (special_tokens.h): data.objective's table; for
// span_corruption with one sentinel per noise span of a row of train.seq_len tokens, the most any row
// holds (span_corruption_lengths). With the tokenizer's regular ids it gives the model's vocab_size,
// and the recipe a checkpoint holds rebuilds it for `seqlab sample` and `seqlab eval`.
SpecialTokens objective_special_tokens(const Recipe& recipe);
// The model's vocabulary as far as the recipe alone says it, for plans made before any data is opened (a
// sweep's sizes and FLOPs): model.vocab_size when set; the byte tokenizer's 256 ids and the objective's
// special tokens for text; a synthetic task's; 256 where only the data's files know (a BPE merges file,
// shards).
int64_t planned_vocab_size(const Recipe& recipe);

}  // namespace seqlab
