#include "train/recipe/configs.h"

#include <absl/strings/str_cat.h>

#include <stdexcept>
#include <utility>

#include "train/recipe/blocks.h"

namespace seqlab {
namespace {

// The schema admits only values these parse, so a failure here is a bug, not a user error.
template <class T>
T parsed(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::logic_error("recipe: a validated value does not parse: " + std::string(v.status().message()));
  return *std::move(v);
}

}  // namespace

absl::StatusOr<DecoderConfig> decoder_config(const Recipe& r, int64_t data_vocab) {
  const RecipeModel& m = r.model;
  const std::string& file = r.source_path;
  if (!m.tie_embeddings) {
    return absl::InvalidArgumentError(file + ": model.tie_embeddings = false is not supported by the decoder yet");
  }
  if (m.vocab_size > 0 && m.vocab_size < data_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": model.vocab_size = ", m.vocab_size,
                                                   " is smaller than the data's vocabulary (", data_vocab, " ids)"));
  }
  absl::StatusOr<std::vector<BlockSpec>> blocks = block_pattern(m);
  if (!blocks.ok()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", blocks.status().message()));
  if (m.norm == "auto" || m.positions == "auto" || !m.bias) {
    return absl::InvalidArgumentError(file + ": model.norm, model.positions and model.bias must be resolved (load_recipe)");
  }
  DecoderConfig c;
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : data_vocab;
  c.d_model = m.d_model;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  c.d_ff = m.d_ff;
  c.max_seq_len = r.train.seq_len;
  c.blocks = *std::move(blocks);
  c.mixer_options = m.mixers;
  c.positions = m.positions == "rope"   ? PositionKind::rope
                : m.positions == "none" ? PositionKind::none
                                        : PositionKind::learned;
  c.rope_base = m.rope_base;
  c.norm = m.norm == "rmsnorm" ? NormKind::rms_norm : NormKind::layer_norm;
  c.norm_eps = m.norm_eps;
  c.bias = *m.bias;
  c.init_std = m.init_std;
  c.dropout = m.dropout;
  // Its own stream, apart from the initialisation's (which draws from the raw seed).
  c.dropout_seed = static_cast<uint64_t>(r.train.seed) ^ 0x9e3779b97f4a7c15ULL;
  return c;
}

absl::StatusOr<std::unique_ptr<LanguageModel>> build_model(const Recipe& r, int64_t data_vocab) {
  absl::StatusOr<DecoderConfig> c = decoder_config(r, data_vocab);
  if (!c.ok()) return c.status();
  Generator init(static_cast<uint64_t>(r.train.seed));
  try {
    return std::unique_ptr<LanguageModel>(std::make_unique<Decoder>(*c, init));
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(r.source_path + ": " + e.what());
  }
}

OptimConfig optim_config(const Recipe& r) {
  OptimConfig c;
  c.name = r.optim.name;
  c.lr = r.optim.lr;
  c.beta1 = r.optim.beta1;
  c.beta2 = r.optim.beta2;
  c.eps = r.optim.eps;
  c.weight_decay = r.optim.weight_decay;
  c.momentum = r.optim.momentum;
  c.nesterov = r.optim.nesterov;
  c.grad_clip = r.optim.grad_clip;
  c.decay_biases = r.optim.decay_biases;
  c.decay_norms = r.optim.decay_norms;
  c.decay_embeddings = r.optim.decay_embeddings;
  return c;
}

TrainerOptions trainer_options(const Recipe& r) { return {r.train.grad_accum, r.optim.grad_clip}; }

LrSchedule lr_schedule(const Recipe& r) {
  return {parsed(parse_schedule_kind(r.optim.schedule)), r.optim.lr, r.optim.warmup_steps, r.train.steps,
          r.optim.min_lr_ratio};
}

DType training_dtype(const Recipe& r) { return r.train.dtype == "bf16" ? DType::bf16 : DType::f32; }

SyntheticConfig synthetic_config(const Recipe& r) {
  SyntheticConfig c;
  c.task = parsed(parse_synthetic_task(r.data.source));
  c.seq_len = r.train.seq_len;
  c.vocab_size = static_cast<int32_t>(r.data.task_vocab);
  c.num_pairs = r.data.task_num_pairs;
  c.copy_len = r.data.task_copy_len;
  return c;
}

PrepareOptions prepare_options(const Recipe& r) {
  PrepareOptions p;
  p.source.path = r.data.path;
  p.source.format = parsed(parse_doc_format(r.data.format));
  p.source.json_field = r.data.jsonl_field;
  p.tokenizer = r.data.tokenizer;
  p.tokenizer_path = r.data.tokenizer_path;
  p.val_fraction = r.data.val_fraction;
  p.seed = static_cast<uint64_t>(r.train.seed);
  return p;
}

LoaderOptions loader_options(const Recipe& r) {
  LoaderOptions lo;
  lo.seq_len = r.train.seq_len;
  lo.seed = static_cast<uint64_t>(r.train.seed);
  return lo;
}

}  // namespace seqlab
