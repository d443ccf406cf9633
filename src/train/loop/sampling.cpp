#include "train/loop/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include <absl/strings/str_cat.h>

#include "autograd/variable.h"
#include "layers/model/encoder_decoder.h"
#include "tensor/kernels.h"

namespace seqlab {

int32_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, Generator& gen) {
  if (logits.empty()) throw std::invalid_argument("sample_token: no logits");
  if (options.temperature < 0 || options.top_k < 0 || !(options.top_p > 0 && options.top_p <= 1)) {
    throw std::invalid_argument("sample_token: needs temperature ≥ 0, top_k ≥ 0 and top_p in (0, 1]");
  }
  // The candidate ids by decreasing logit (stable: ties keep the lower id first).
  std::vector<int32_t> order;
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
    if (std::find(options.suppressed.begin(), options.suppressed.end(), id) == options.suppressed.end()) {
      order.push_back(id);
    }
  }
  if (order.empty()) throw std::invalid_argument("sample_token: every id is suppressed");
  // −infinity is a legal logit (an id ruled out); NaN and +infinity leave the softmax undefined.
  bool any_finite = false;
  for (int32_t id : order) {
    if (std::isnan(logits[id]) || logits[id] == HUGE_VAL) {
      throw NonFiniteLogits(std::string("the model's logits are not finite (") +
                            (std::isnan(logits[id]) ? "NaN" : "infinity") + " for token id " + std::to_string(id) +
                            "): its weights give no distribution to sample from");
    }
    any_finite = any_finite || std::isfinite(logits[id]);
  }
  if (!any_finite) throw NonFiniteLogits("the model's logits are −infinity for every token: nothing to sample");
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (options.temperature == 0) return order[0];
  size_t keep = order.size();
  if (options.top_k > 0) keep = std::min(keep, static_cast<size_t>(options.top_k));
  // p_i = exp((l_i − l_max) / τ) / Σ_j exp((l_j − l_max) / τ) over the kept ids.
  std::vector<double> prob(keep);
  const double top = logits[order[0]];
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i] = std::exp((logits[order[i]] - top) / options.temperature);
  // Nucleus: the shortest prefix whose mass reaches top_p.
  double mass = 0;
  size_t nucleus = 0;
  while (nucleus < keep && (nucleus == 0 || mass < options.top_p * total)) mass += prob[nucleus++];
  double u = gen.uniform() * mass;
  for (size_t i = 0; i < nucleus; ++i) {
    if (u < prob[i]) return order[i];
    u -= prob[i];
  }
  return order[nucleus - 1];  // u rounded up to the total
}

std::vector<int32_t> non_text_ids(const TokenDecoder& tokenizer, int64_t model_vocab_size) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < static_cast<int32_t>(model_vocab_size); ++id) {
    if ((tokenizer.is_special(id) && id != tokenizer.eot()) || id >= tokenizer.vocab_size()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> sample_prompt_ids(const TokenDecoder& tokenizer, absl::string_view prompt) {
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.encode_prompt(prompt);
  if (!ids.ok()) return ids.status();
  ids->insert(ids->begin(), tokenizer.eot());
  return ids;
}

std::string decode_sample(const TokenDecoder& tokenizer, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& generated) {
  std::vector<int32_t> shown(prompt.begin() + (prompt.empty() ? 0 : 1), prompt.end());
  shown.insert(shown.end(), generated.begin(), generated.end());
  return tokenizer.decode(shown);
}

namespace {

// The last row of logits [1, t, V] as doubles.
std::vector<double> last_row(const Tensor& logits) {
  return kernel::narrow(logits, 1, logits.shape()[1] - 1, 1).to_doubles();
}

Tensor as_ids(const std::vector<int32_t>& ids, Device device) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return Tensor::from_indices(wide, {1, static_cast<int64_t>(ids.size())}, DType::i64, device);
}

}  // namespace

std::vector<int32_t> generate(LanguageModel& model, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                              Generator& gen) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt needs at least one token");
  const int64_t window = model.max_context();  // 0: unbounded
  const Device device = model.parameters().front().tensor->device();
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.set_training(false);
  std::vector<int32_t> context = prompt, out;
  // Feeds the last half window (all of a short context) into a fresh state; returns the last logits.
  std::unique_ptr<DecodeState> state;
  auto refill = [&]() {
    state = model.new_decode_state();
    const size_t n = std::min(context.size(), static_cast<size_t>(std::max<int64_t>(1, window / 2)));
    std::vector<int32_t> tail(context.end() - static_cast<std::ptrdiff_t>(n), context.end());
    return last_row(model.forward_step(as_ids(tail, device), *state));
  };
  std::vector<double> logits;
  if (window == 0 || static_cast<int64_t>(context.size()) <= window) {
    state = model.new_decode_state();
    logits = last_row(model.forward_step(as_ids(context, device), *state));
  } else {
    logits = refill();
  }
  for (int64_t i = 0; i < options.tokens; ++i) {
    int32_t next;
    try {
      next = sample_token(logits, options, gen);
    } catch (const NonFiniteLogits& e) {
      model.set_training(was_training);
      throw NonFiniteLogits(absl::StrCat("token ", i + 1, " of the sample: ", e.what()));
    }
    out.push_back(next);
    context.push_back(next);
    if (next == options.stop_token || i + 1 == options.tokens) break;
    if (window > 0 && state->position + 1 > window) {
      logits = refill();
    } else {
      logits = last_row(model.forward_step(as_ids({next}, device), *state));
    }
  }
  model.set_training(was_training);
  return out;
}

std::vector<int32_t> fill_masks(LanguageModel& model, const std::vector<int32_t>& ids, int32_t mask_id,
                                const std::vector<int32_t>& segments, const SamplingOptions& options, Generator& gen) {
  if (ids.empty()) throw std::invalid_argument("fill_masks: the row needs at least one token");
  const Device device = model.parameters().front().tensor->device();
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.set_training(false);
  Batch batch(as_ids(ids, device));
  if (!segments.empty()) batch.segment_ids = as_ids(segments, device);
  const Tensor logits = kernel::to_dtype(kernel::to_device(model.logits(batch), cpu_device()), DType::f64);
  model.set_training(was_training);
  const int64_t V = logits.size(2);
  const std::vector<double> all = logits.to_doubles();
  std::vector<int32_t> out = ids;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] != mask_id) continue;
    const std::vector<double> row(all.begin() + static_cast<std::ptrdiff_t>(t * V),
                                  all.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
    try {
      out[t] = sample_token(row, options, gen);
    } catch (const NonFiniteLogits& e) {
      throw NonFiniteLogits(absl::StrCat("the mask at position ", t, ": ", e.what()));
    }
  }
  return out;
}

std::vector<int32_t> generate_from_source(LanguageModel& model, const std::vector<int32_t>& source, int32_t start_id,
                                          const SamplingOptions& options, Generator& gen) {
  auto* seq2seq = dynamic_cast<EncoderDecoder*>(&model);
  if (seq2seq == nullptr) throw std::invalid_argument("generate_from_source: the model is not an encoder-decoder");
  if (source.empty()) throw std::invalid_argument("generate_from_source: the source needs at least one token");
  const Device device = model.parameters().front().tensor->device();
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.set_training(false);
  std::unique_ptr<DecodeState> state = model.new_decode_state();
  seq2seq->encode(as_ids(source, device), Tensor(), *state);
  std::vector<int32_t> out;
  int32_t next = start_id;
  const int64_t room = model.max_context();
  for (int64_t i = 0; i < options.tokens && (room == 0 || i < room); ++i) {
    const std::vector<double> logits = last_row(model.forward_step(as_ids({next}, device), *state));
    try {
      next = sample_token(logits, options, gen);
    } catch (const NonFiniteLogits& e) {
      model.set_training(was_training);
      throw NonFiniteLogits(absl::StrCat("token ", i + 1, " of the sample: ", e.what()));
    }
    out.push_back(next);
    if (next == options.stop_token) break;
  }
  model.set_training(was_training);
  return out;
}

}  // namespace seqlab
