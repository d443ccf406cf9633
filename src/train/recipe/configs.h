// The recipe → config mapping, in one place: every config the layers and the data pipeline take is
// made here from a loaded Recipe (recipe.h), so no other file copies recipe fields by hand.
#pragma once

#include <cstdint>
#include <memory>

#include <absl/status/statusor.h>

#include "layers/model/decoder.h"
#include "layers/model/language_model.h"
#include "tensor/dtype.h"
#include "train/data/loader.h"
#include "train/data/prepare.h"
#include "train/data/synthetic.h"
#include "train/loop/trainer.h"
#include "train/optim/optim.h"
#include "train/optim/schedule.h"
#include "train/recipe/recipe.h"

namespace seqlab {

// The model of [model] and [model.<mixer>], for data with `data_vocab` ids (model.vocab_size, when
// set, must hold them); max_seq_len is train.seq_len. InvalidArgument naming the recipe key.
absl::StatusOr<DecoderConfig> decoder_config(const Recipe& recipe, int64_t data_vocab);
// The model built from decoder_config, its weights drawn from train.seed and its dropout masks from a
// stream of its own. InvalidArgument, prefixed with the recipe's file, for a model that does not fit.
absl::StatusOr<std::unique_ptr<LanguageModel>> build_model(const Recipe& recipe, int64_t data_vocab);

OptimConfig optim_config(const Recipe& recipe);  // [optim]
TrainerOptions trainer_options(const Recipe& recipe);  // train.grad_accum, optim.grad_clip
LrSchedule lr_schedule(const Recipe& recipe);    // [optim] with train.steps
// train.dtype: the dtype of weights and activations (bf16: mixed precision, with f32 masters).
DType training_dtype(const Recipe& recipe);

// [data] with a synthetic task as source (data.source names one).
SyntheticConfig synthetic_config(const Recipe& recipe);
// [data] with text files as source.
PrepareOptions prepare_options(const Recipe& recipe);
// Windows of train.seq_len + 1 tokens, shuffled from train.seed.
LoaderOptions loader_options(const Recipe& recipe);

}  // namespace seqlab
