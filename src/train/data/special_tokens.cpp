#include "train/data/special_tokens.h"

#include <absl/strings/str_cat.h>

#include <stdexcept>

namespace seqlab {

absl::StatusOr<Objective> parse_objective(const std::string& name) {
  for (Objective o : {Objective::lm, Objective::masked_lm, Objective::span_corruption}) {
    if (name == objective_name(o)) return o;
  }
  return absl::InvalidArgumentError("unknown objective '" + name + "' (lm, masked_lm or span_corruption)");
}

const char* objective_name(Objective objective) {
  switch (objective) {
    case Objective::lm: return "lm";
    case Objective::masked_lm: return "masked_lm";
    case Objective::span_corruption: return "span_corruption";
  }
  return "?";
}

SpecialTokens special_tokens(Objective objective, int64_t sentinels) {
  SpecialTokens t;
  t.objective = objective_name(objective);
  switch (objective) {
    case Objective::lm:
      t.texts = {"<|eot|>", "<|pad|>", "<|mask|>"};
      t.eot = 0;
      t.pad = 1;
      t.mask = 2;
      t.first_sentinel = 3;
      t.sentinels = kLmSentinels;
      for (int i = 0; i < kLmSentinels; ++i) t.texts.push_back(absl::StrCat("<|sentinel_", i, "|>"));
      break;
    case Objective::masked_lm:
      t.texts = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};
      t.in_prompts = true;
      t.pad = 0;
      t.cls = 1;
      t.sep = 2;
      t.mask = 3;
      t.eot = t.sep;
      break;
    case Objective::span_corruption:
      if (sentinels < 1 || sentinels > (int64_t{1} << 24)) {
        throw std::invalid_argument(absl::StrCat("span_corruption needs 1 to 2^24 sentinels, not ", sentinels));
      }
      t.texts = {"[PAD]", "[EOS]"};
      t.in_prompts = true;
      t.pad = 0;
      t.eos = 1;
      t.eot = t.eos;
      t.first_sentinel = 2;
      t.sentinels = static_cast<int>(sentinels);
      for (int64_t i = 0; i < sentinels; ++i) t.texts.push_back(absl::StrCat("<extra_id_", i, ">"));
      break;
  }
  return t;
}

}  // namespace seqlab
