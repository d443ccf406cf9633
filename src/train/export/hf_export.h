// A trained model as a Hugging Face `transformers` folder: config.json and model.safetensors under
// transformers' own parameter names and layouts, so that `<Class>.from_pretrained(folder)` loads it
// and its logits are seqlab's. This is how code no one here wrote checks seqlab's models
// (tests/hf_export_test.py), and how a trained model leaves seqlab.
//
// Each model family maps to one transformers class through one mapping table (hf_export.cpp): the
// seqlab name of every parameter, its transformers name, and its layout there. Every parameter of the
// model must be mapped and every entry of the table found, so a parameter added to a model later is
// refused by name instead of being dropped. A model that the class cannot hold — a setting of the
// recipe that the class has no counterpart for — is refused with one line naming each such setting
// (and its recipe key); nothing is exported in part.
//
// Mapped: model.arch = "decoder" with every block causal softmax attention and a GELU MLP (of any width),
// pre-norm, LayerNorm, biases, learned positions, full key/value heads and a tied or untied output
// → GPT2LMHeadModel; model.arch = "encoder" with BERT's block (post-norm LayerNorm, GELU, biases, learned
// positions, full key/value heads, default attention scale) → BertForMaskedLM, without the next-sentence
// head (pooler, nsp), which that class has no place for; model.arch = "encoder_decoder" with T5's block
// (pre-norm RMSNorm, a ReLU or GEGLU FFN, no biases, relative positions, [model.attention] scale = 1,
// full key/value heads), tied (T5) or untied (T5 v1.1) → T5ForConditionalGeneration.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <absl/status/statusor.h>

#include "layers/model/language_model.h"
#include "tensor/tensor.h"
#include "train/recipe/recipe.h"

namespace seqlab {

// What the folder says of where the weights came from, and what the tokenizer knows.
struct HfExportSource {
  std::string run_id;          // the run's identity (checkpoint.h RunIdentity::id)
  std::string checkpoint;      // the file name of the checkpoint the weights were read from
  int64_t step = 0;            // its step
  std::optional<int32_t> eot;  // the end-of-text id of the run's tokenizer (bos/eos); none for synthetic tasks
  std::optional<int32_t> pad;  // its padding id ([PAD]: BERT's pad_token_id, T5's and its decoder start)
  std::optional<int32_t> eos;  // its [EOS] id (T5's eos_token_id; span_corruption's table has one)
};

struct HfExport {
  std::string architecture;  // the transformers class: "GPT2LMHeadModel", "BertForMaskedLM", ...
  std::string config_json;   // config.json
  // model.safetensors: transformers' names, f32, contiguous on the CPU (a tied output matrix is not
  // stored: transformers ties it to the input embedding on loading, as its own save_pretrained does; an
  // untied one is).
  std::vector<std::pair<std::string, Tensor>> tensors;
  // model.safetensors' metadata: "format": "pt", which transformers requires of a safetensors file, and
  // where the weights came from (seqlab_run_id, seqlab_checkpoint, seqlab_step).
  std::map<std::string, std::string> metadata;
};

// The export of `model`, built from `recipe` (its resolved recipe) with its trained weights.
// InvalidArgument, one line naming the recipe file, the transformers class and every setting that does
// not map (with its recipe key), when the class cannot hold the model.
absl::StatusOr<HfExport> hf_export(const Recipe& recipe, LanguageModel& model, const HfExportSource& source);

}  // namespace seqlab
