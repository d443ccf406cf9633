// Cross-entropy entry points. Logits [..., V] are flattened to [N, V] and targets [...] to [N].
// The targets are read on the host once per forward: to reject out-of-range classes with a clear
// message (a kernel cannot throw) and to count the targets that are not ignored.
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

struct Rows {
  Tensor logits;   // [N, V], contiguous
  Tensor targets;  // [N], contiguous
};

Rows check_and_flatten(const Tensor& logits, const Tensor& targets, const char* op) {
  if (!logits.defined() || !is_floating(logits.dtype()) || logits.dim() < 1) {
    throw std::invalid_argument(std::string(op) + ": logits must be a floating tensor [..., V]");
  }
  if (!targets.defined() || !is_integer(targets.dtype())) {
    throw std::invalid_argument(std::string(op) + ": targets must be an i32 or i64 tensor");
  }
  Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != lead || targets.device() != logits.device()) {
    throw std::invalid_argument(std::string(op) + ": targets " + shape_str(targets.shape()) + " on " +
                                targets.device().str() + " do not match logits " + shape_str(logits.shape()) + " on " +
                                logits.device().str());
  }
  const int64_t v = logits.size(-1), n = shape_numel(lead);
  if (v == 0 && n > 0)
    throw std::invalid_argument(std::string(op) + ": logits " + shape_str(logits.shape()) + " have no classes");
  return {reshape(logits, {n, v}), reshape(targets, {n})};
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const Tensor& weights) {
  Rows r = check_and_flatten(logits, targets, "cross_entropy");
  const int64_t n = r.logits.size(0), v = r.logits.size(1);
  std::vector<double> w;
  if (weights.defined()) {
    if (!is_floating(weights.dtype()) || weights.shape() != targets.shape()) {
      throw std::invalid_argument("cross_entropy: weights " + shape_str(weights.shape()) + " " +
                                  dtype_name(weights.dtype()) + " must be floating and shaped as the targets " +
                                  shape_str(targets.shape()));
    }
    w = weights.to_doubles();
  }
  CrossEntropyOutput out;
  const std::vector<int64_t> t = r.targets.to_indices();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == ignore_index) continue;
    if (t[i] < 0 || t[i] >= v) {
      throw std::invalid_argument("cross_entropy: target " + std::to_string(t[i]) + " is out of range for " +
                                  std::to_string(v) + " classes (ignore_index " + std::to_string(ignore_index) + ")");
    }
    ++out.count;
    if (weights.defined()) out.total_weight += w[i];
  }
  if (!weights.defined()) out.total_weight = static_cast<double>(out.count);
  // Losses and lse in f32 for bf16 logits (mixed precision keeps the loss in f32).
  out.losses = Tensor::empty({n}, accumulate_dtype(logits.dtype()), logits.device());
  out.lse = Tensor::empty({n}, accumulate_dtype(logits.dtype()), logits.device());
  cross_entropy_kernel(logits.device(), r.logits, r.targets, ignore_index, out.losses, out.lse);
  // Ignored rows hold 0, so with no counted target the sum is 0 and the mean is defined as 0.
  const double scale = out.total_weight != 0 ? 1.0 / out.total_weight : 0.0;
  const Tensor weighted =
      weights.defined()
          ? binary(BinaryOp::mul, out.losses, to_dtype(reshape(weights, {n}), out.losses.dtype()))
          : out.losses;
  out.loss = scalar_op(ScalarOp::mul, sum(weighted, {}, false), scale);
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, double total_weight, const Tensor& weights) {
  Rows r = check_and_flatten(logits, targets, "cross_entropy backward");
  if (!dloss.defined() || dloss.numel() != 1 || !lse.defined() || lse.numel() != r.logits.size(0)) {
    throw std::invalid_argument("cross_entropy backward: expected a scalar gradient and lse [N] for logits " +
                                shape_str(logits.shape()));
  }
  const double scale = total_weight != 0 ? dloss.item() / total_weight : 0.0;
  Tensor dlogits = Tensor::empty(r.logits.shape(), logits.dtype(), logits.device());
  cross_entropy_backward_kernel(logits.device(), scale, r.logits, r.targets, contiguous(lse), ignore_index, dlogits);
  if (weights.defined()) {
    // Row n of the unweighted gradient times w_n.
    dlogits = binary(BinaryOp::mul, dlogits, to_dtype(reshape(weights, {r.logits.size(0), 1}), logits.dtype()));
  }
  return view(dlogits, logits.shape());
}

}  // namespace seqlab::kernel
