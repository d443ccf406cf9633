#include "train/recipe/configs.h"

#include <algorithm>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "layers/model/moe.h"
#include "tensor/kernels.h"
#include "train/common/errors.h"
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

absl::StatusOr<ModelConfig> model_config(const Recipe& r, int64_t data_vocab) {
  const RecipeModel& m = r.model;
  const std::string& file = r.source_path;
  if (m.vocab_size > 0 && m.vocab_size < data_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": model.vocab_size = ", m.vocab_size,
                                                   " is smaller than the data's vocabulary (", data_vocab, " ids)"));
  }
  absl::StatusOr<std::vector<BlockSpec>> blocks = block_pattern(m);
  if (!blocks.ok()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", blocks.status().message()));
  if (m.norm == "auto" || m.positions == "auto" || !m.bias || m.norm_placement == "auto") {
    return absl::InvalidArgumentError(
        file + ": model.norm, model.positions, model.bias and model.norm_placement must be resolved (load_recipe)");
  }
  ModelConfig c;
  c.kind = m.arch == "encoder"           ? ModelKind::encoder
           : m.arch == "encoder_decoder" ? ModelKind::encoder_decoder
                                         : ModelKind::decoder;
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : data_vocab;
  c.d_model = m.d_model;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  c.d_ff = m.d_ff;
  c.max_seq_len = longest_seq_len(r);
  c.blocks = *std::move(blocks);
  if (c.kind == ModelKind::encoder_decoder) {
    // The decoder stack repeats the same pattern over decoder_layers blocks (n_layers when 0).
    RecipeModel decoder = m;
    if (m.decoder_layers > 0) decoder.n_layers = m.decoder_layers;
    absl::StatusOr<std::vector<BlockSpec>> d = block_pattern(decoder);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(file, ": model.decoder_layers: ", d.status().message()));
    c.decoder_blocks = *std::move(d);
  }
  c.mixer_options = m.mixers;
  c.positions = m.positions == "rope"         ? PositionKind::rope
                : m.positions == "none"       ? PositionKind::none
                : m.positions == "sinusoidal" ? PositionKind::sinusoidal
                : m.positions == "relative"   ? PositionKind::relative
                                              : PositionKind::learned;
  c.rope_base = m.rope_base;
  c.relative_buckets = m.relative_buckets;
  c.relative_max_distance = m.relative_max_distance;
  c.norm_placement = m.norm_placement == "post" ? NormPlacement::post : NormPlacement::pre;
  c.tie_embeddings = m.tie_embeddings;
  c.segments = c.kind == ModelKind::encoder ? m.segments : 0;
  c.next_sentence = c.kind == ModelKind::encoder && r.data.objective == "masked_lm" && r.data.next_sentence;
  c.norm = m.norm == "rmsnorm" ? NormKind::rms_norm : NormKind::layer_norm;
  c.norm_eps = m.norm_eps;
  c.bias = *m.bias;
  c.init_std = m.init_std;
  c.dropout = m.dropout;
  c.shared_attention_every = m.shared_attention_every;
  // The shared block takes model.mlp's FFN (resolved: a concrete kind).
  c.shared_attention_ffn = m.mlp == "gelu"    ? FfnKind::gelu
                           : m.mlp == "relu"  ? FfnKind::relu
                           : m.mlp == "geglu" ? FfnKind::geglu
                           : m.mlp == "none"  ? FfnKind::none
                           : m.mlp == "moe"   ? FfnKind::moe
                                              : FfnKind::swiglu;
  c.moe.experts = m.moe.experts;
  c.moe.top_k = m.moe.top_k;
  c.moe.capacity_factor = m.moe.capacity_factor;
  c.moe.expert = m.moe.expert == "gelu"    ? FfnKind::gelu
                 : m.moe.expert == "relu"  ? FfnKind::relu
                 : m.moe.expert == "geglu" ? FfnKind::geglu
                                           : FfnKind::swiglu;
  c.moe.d_ff = m.moe.d_ff;
  c.moe.aux_loss_weight = m.moe.aux_loss_weight;
  c.moe.renormalize = m.moe.router_weights == "renormalized";
  // Its own stream, apart from the initialisation's (which draws from the raw seed).
  c.dropout_seed = static_cast<uint64_t>(r.train.seed) ^ 0x9e3779b97f4a7c15ULL;
  return c;
}

absl::StatusOr<std::unique_ptr<LanguageModel>> build_model(const Recipe& r, int64_t data_vocab) {
  absl::StatusOr<ModelConfig> c = model_config(r, data_vocab);
  if (!c.ok()) return c.status();
  if (absl::Status s = check_memory(r, data_vocab, available_memory(cpu_device()), false, "the host"); !s.ok()) {
    return s;
  }
  Generator init(static_cast<uint64_t>(r.train.seed));
  try {
    return make_model(*c, init);
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(r.source_path + ": " + e.what());
  }
}

absl::StatusOr<MemoryEstimate> estimate_memory(const Recipe& r, int64_t data_vocab) {
  absl::StatusOr<ModelConfig> c = model_config(r, data_vocab);
  if (!c.ok()) return c.status();
  MemoryEstimate e;
  try {
    e.parameters = model_parameter_count(*c);
  } catch (const std::invalid_argument& err) {
    return absl::InvalidArgumentError(r.source_path + ": " + err.what());
  }
  const bool bf16 = training_dtype(r) == DType::bf16;
  const double n = e.parameters, size = bf16 ? 2 : 4;
  e.weights = n * size + (bf16 ? 4 * n : 0);
  e.gradients = n * size;
  e.optimizer = r.optim.name == "adamw" ? 8 * n : (r.optim.momentum > 0 ? 4 * n : 0);
  // Activations kept for the backward pass of one micro-batch of N = B·T tokens, counted low: per
  // block the residual stream and the two norms' outputs and sums (4·d), the mixer's queries, keys,
  // values and output (4·d; gates and states come on top), the FFN's output (d) and hidden layer (fc
  // and its activation, and SwiGLU's gate: 2 or 3 · d_ff); then the final norm (2·d) and the logits
  // with their softmax (2·V). tests/configs_test.cc measures it at 0.4 to 1 times what a CPU step
  // allocates.
  const double tokens = static_cast<double>(r.train.batch_size) * static_cast<double>(r.train.seq_len);
  const double d = static_cast<double>(c->d_model), vocab = static_cast<double>(c->vocab_size);
  // An encoder-decoder's decoder blocks add their cross attention's (4·d); its source and target are
  // counted as train.seq_len tokens each.
  double per_token = 2 * d + 2 * vocab;
  // An MoE block keeps its router's logits and probabilities (2·E) and, per assignment of the top_k, the
  // gathered input, the expert's hidden layer and output and the weighted output (3·d + 2 or 3 · d_ff).
  auto add_blocks = [&](const std::vector<BlockSpec>& blocks, bool cross) {
    for (const BlockSpec& b : blocks) {
      per_token += 8 * d + (cross ? 4 * d : 0);
      if (b.ffn == FfnKind::none) continue;
      if (b.ffn == FfnKind::moe) {
        const double ff = static_cast<double>(moe_expert_d_ff(c->moe, c->d_ff, c->d_model));
        per_token += d + 2 * static_cast<double>(c->moe.experts) +
                     static_cast<double>(c->moe.top_k) * (3 * d + (ffn_gated(c->moe.expert) ? 3 : 2) * ff);
        continue;
      }
      const double ff = static_cast<double>(c->d_ff > 0 ? c->d_ff : ffn_d_ff(b.ffn, c->d_model));
      per_token += d + (ffn_gated(b.ffn) ? 3 : 2) * ff;
    }
  };
  add_blocks(c->blocks, false);
  add_blocks(c->decoder_blocks, true);
  // Each use of the shared attention block: a block's activations, and its input [x ; x_0] and projection.
  for (int64_t u = 0; u < shared_attention_uses(*c, c->blocks.size()); ++u) {
    add_blocks({BlockSpec{"attention", c->shared_attention_ffn}}, false);
    per_token += 3 * d;
  }
  e.activations = tokens * per_token * size;
  return e;
}

namespace {

// "1.5 GiB", "3.2e+06 GiB".
std::string gib(double bytes) { return absl::StrFormat("%.3g GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

// The sizes that make a model big, each with a way to put it back to its default.
struct SizeKey {
  const char* name;
  std::function<int64_t(const Recipe&)> value;
  std::function<void(Recipe&, const Recipe& defaults)> reset;
};

std::vector<SizeKey> size_keys() {
  return {
      {"model.d_model", [](const Recipe& r) { return r.model.d_model; },
       [](Recipe& r, const Recipe& d) { r.model.d_model = d.model.d_model; }},
      {"model.n_layers", [](const Recipe& r) { return r.model.n_layers; },
       [](Recipe& r, const Recipe& d) {
         r.model.n_layers = d.model.n_layers;
         r.model.pattern = "";
       }},
      {"model.d_ff", [](const Recipe& r) { return r.model.d_ff; },
       [](Recipe& r, const Recipe& d) { r.model.d_ff = d.model.d_ff; }},
      {"model.vocab_size", [](const Recipe& r) { return r.model.vocab_size; },
       [](Recipe& r, const Recipe& d) { r.model.vocab_size = d.model.vocab_size; }},
      {"train.batch_size", [](const Recipe& r) { return r.train.batch_size; },
       [](Recipe& r, const Recipe& d) { r.train.batch_size = d.train.batch_size; }},
      {"train.seq_len", [](const Recipe& r) { return r.train.seq_len; },
       [](Recipe& r, const Recipe& d) { r.train.seq_len = d.train.seq_len; }},
  };
}

}  // namespace

absl::Status check_memory(const Recipe& r, int64_t data_vocab, int64_t available_bytes, bool training,
                          const std::string& where) {
  auto need = [&](const Recipe& recipe) -> absl::StatusOr<double> {
    absl::StatusOr<MemoryEstimate> e = estimate_memory(recipe, data_vocab);
    if (!e.ok()) return e.status();
    return training ? e->training() : 4 * e->parameters;
  };
  absl::StatusOr<MemoryEstimate> estimate = estimate_memory(r, data_vocab);
  if (!estimate.ok()) return estimate.status();
  const double needed = training ? estimate->training() : 4 * estimate->parameters;
  if (available_bytes < 0 || needed <= static_cast<double>(available_bytes)) return absl::OkStatus();

  // The key whose default shrinks the estimate most is the one that makes the model too big.
  const Recipe defaults;
  const std::vector<SizeKey> keys = size_keys();
  const SizeKey* culprit = nullptr;
  double smallest = needed;
  for (const SizeKey& k : keys) {
    if (k.value(r) == k.value(defaults)) continue;
    Recipe trial = r;
    k.reset(trial, defaults);
    absl::StatusOr<double> n = need(trial);
    if (n.ok() && *n < smallest) {
      smallest = *n;
      culprit = &k;
    }
  }
  const std::string what = training ? "its weights, gradients, optimizer state and one micro-batch's activations"
                                    : "its f32 weights, built on the host";
  const std::string which =
      culprit ? absl::StrCat(culprit->name, " = ", culprit->value(r), " makes the model too big: ")
              : std::string("the model is too big: ");
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: %s%.3g parameters; %s need at least %s, more than the %s available on %s (sizes are checked before "
      "anything is allocated)",
      r.source_path, which, estimate->parameters, what, gib(needed), gib(static_cast<double>(available_bytes)), where));
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
  // A warm-up longer than the run is cut to the run (a short trial run of a recipe warms up over all of it).
  return {parsed(parse_schedule_kind(r.optim.schedule)), r.optim.lr, std::min(r.optim.warmup_steps, r.train.steps),
          r.train.steps,
          r.optim.min_lr_ratio};
}

Device training_device(const Recipe& r) {
  if (r.train.device == "cpu") return cpu_device();
  if (cuda_available()) return cuda_device(0);
  if (r.train.device == "cuda") {
    throw cli::UserError(r.source_path + ": train.device = \"cuda\" but no GPU is usable here (no CUDA device, or a " +
                    "build without the CUDA backend: ./train --version says which); use \"auto\" or \"cpu\"");
  }
  return cpu_device();
}

bool bf16_is_native(Device device) {
  // The CUDA backend is built for sm_80 and later, whose tensor cores all multiply bf16.
  return device.is_cuda() || kernel::cpu_bf16_gemm_native();
}

DType training_dtype(const Recipe& r) {
  if (r.train.dtype == "auto") return bf16_is_native(training_device(r)) ? DType::bf16 : DType::f32;
  return r.train.dtype == "bf16" ? DType::bf16 : DType::f32;
}

int64_t longest_seq_len(const Recipe& r) {
  int64_t longest = r.train.seq_len;
  for (int64_t l : r.eval.seq_len) longest = std::max(longest, l);
  return longest;
}

int64_t eval_batch_size(const Recipe& r, int64_t seq_len) {
  return std::max<int64_t>(1, r.train.batch_size * r.train.seq_len / seq_len);
}

SyntheticConfig synthetic_config(const Recipe& r, int64_t seq_len) {
  SyntheticConfig c;
  c.task = parsed(parse_synthetic_task(r.data.source));
  c.seq_len = seq_len > 0 ? seq_len : r.train.seq_len;
  c.vocab_size = static_cast<int32_t>(r.data.task_vocab);
  c.num_pairs = r.data.task_num_pairs;
  c.mqar_layout = parsed(parse_mqar_layout(r.data.task_mqar_layout));
  c.mqar_power = r.data.task_mqar_power;
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

LoaderOptions loader_options(const Recipe& r, int64_t seq_len) {
  LoaderOptions lo;
  lo.seq_len = seq_len > 0 ? seq_len : r.train.seq_len;
  lo.seed = static_cast<uint64_t>(r.train.seed);
  return lo;
}

Objective data_objective(const Recipe& r) { return parsed(parse_objective(r.data.objective)); }

MaskedLmConfig masked_lm_config(const Recipe& r) { return {r.data.mask_fraction, r.data.next_sentence}; }

SpanCorruptionConfig span_corruption_config(const Recipe& r) { return {r.data.noise_density, r.data.mean_span_length}; }

SpecialTokens objective_special_tokens(const Recipe& r) {
  const Objective o = data_objective(r);
  if (o != Objective::span_corruption) return special_tokens(o);
  return special_tokens(o, parsed(span_corruption_lengths(r.train.seq_len, span_corruption_config(r))).spans);
}

int64_t planned_vocab_size(const Recipe& r) {
  if (r.model.vocab_size > 0) return r.model.vocab_size;
  if (r.data.source == "text" && r.data.tokenizer == "byte") return 256 + objective_special_tokens(r).size();
  if (r.data.source != "text" && r.data.source != "shards") return synthetic_config(r).vocab_size;
  return 256;
}

}  // namespace seqlab
