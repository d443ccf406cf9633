// The blocks of a recipe's model: model.mixer and model.pattern read into the decoder's block list,
// and the "auto" block settings (model.norm, model.mlp, model.bias, model.positions) resolved from the
// mixers those blocks use.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "layers/model/decoder.h"
#include "train/recipe/recipe.h"

namespace seqlab {

// The values model.mixer takes: every registered mixer, attention (the default) first.
std::vector<std::string> mixer_choices();
// Older mixer names → current ones ("retnet" → "retention"), from the registry.
std::map<std::string, std::string> mixer_value_aliases();

// The items of a pattern, each repeated as its *N says, before the pattern repeats to fill n_layers:
// mixer names separated by spaces or commas, each optionally with ":FFN" (gelu, swiglu, relu, geglu, moe, none; else
// `default_ffn`) and "*N". InvalidArgument naming the item that is wrong (an unknown mixer with a
// did-you-mean, an unknown FFN, a bad count).
absl::StatusOr<std::vector<BlockSpec>> pattern_blocks(const std::string& pattern, FfnKind default_ffn);

// The blocks of the model, bottom first: model.pattern (or model.mixer in every layer) repeated to
// model.n_layers, each block's FFN its own or model.mlp, which must be resolved (not "auto").
// InvalidArgument when the pattern is wrong or its length does not divide n_layers.
absl::StatusOr<std::vector<BlockSpec>> block_pattern(const RecipeModel& model);

// Resolves "auto" in model.norm, model.mlp, model.positions and model.bias from the model's mixers
// (decoder_conventions: GPT-2's choices when every block is attention, the recurrent models' otherwise).
// A recipe with the older flat mixer keys keeps their meaning: its recurrent blocks took the recurrent
// conventions whatever [model] said. InvalidArgument when the pattern is wrong.
absl::Status resolve_conventions(RecipeModel& model);
// The recipe value of a position kind: "learned", "rope", "none", "sinusoidal", "relative".
const char* position_kind_name(PositionKind kind);

// The keys resolve_conventions resolves from the mixers ("model.norm", ...): where a comparison varies the
// mixers, these vary with them unless pinned (the sweep pins them: docs/scaling.md, "Fair comparisons").
const std::vector<std::string>& convention_keys();

}  // namespace seqlab
