#include "layers/model/language_model.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

Tensor ignore_past_lengths(const Tensor& targets, const Tensor& lengths) {
  if (!lengths.defined()) return targets;
  if (targets.dim() != 2 || lengths.dim() != 1 || lengths.size(0) != targets.size(0) ||
      !is_integer(lengths.dtype())) {
    throw std::invalid_argument("lengths must be integers [B] for targets [B, T], got lengths " +
                                shape_str(lengths.shape()) + " " + dtype_name(lengths.dtype()) + " and targets " +
                                shape_str(targets.shape()));
  }
  // Small and read once per batch: masked on the host.
  const int64_t B = targets.size(0), T = targets.size(1);
  std::vector<int64_t> t = targets.to_indices();
  const std::vector<int64_t> len = lengths.to_indices();
  for (int64_t b = 0; b < B; ++b) {
    if (len[static_cast<size_t>(b)] < 0 || len[static_cast<size_t>(b)] > T) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " + std::to_string(len[static_cast<size_t>(b)]) +
                                  " is outside [0, " + std::to_string(T) + "]");
    }
    for (int64_t i = len[static_cast<size_t>(b)]; i < T; ++i) t[static_cast<size_t>(b * T + i)] = kIgnoreIndex;
  }
  return Tensor::from_indices(t, targets.shape(), targets.dtype(), targets.device());
}

Tensor LanguageModel::loss_from_logits(const Batch& batch, const Tensor& logits) const {
  const Tensor targets = ignore_past_lengths(batch.scored_targets(), batch.scored_lengths());
  return cross_entropy(logits, targets, kIgnoreIndex, batch.loss_weights);
}

Tensor LanguageModel::loss_from_outputs(const Batch& batch, const ModelOutputs& out) const {
  Tensor loss = loss_from_logits(batch, out.logits);
  if (out.sequence_logits.defined() && batch.sequence_targets.defined()) {
    // [B, K] as [B, 1, K] against [B, 1]: one scored position per row.
    const int64_t B = out.sequence_logits.size(0), K = out.sequence_logits.size(1);
    const Tensor targets = kernel::view(batch.sequence_targets, {B, 1});
    loss = add(loss, cross_entropy(reshape(out.sequence_logits, {B, 1, K}), targets, kIgnoreIndex));
  }
  if (out.aux_loss.defined()) loss = add(loss, out.aux_loss);
  return loss;
}

std::unique_ptr<DecodeState> LanguageModel::new_decode_state() const {
  throw std::logic_error("this model does not decode token by token (an encoder has no decode step)");
}

Tensor LanguageModel::forward_step(const Tensor&, DecodeState&) {
  throw std::logic_error("this model does not decode token by token (an encoder has no decode step)");
}

}  // namespace seqlab
