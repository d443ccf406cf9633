// Softmax, log-softmax and cross-entropy, each with a hand-derived backward. The kernels work on
// the last dimension only; another `dim` is swapped with the last one and made contiguous, and
// the result swapped back (a swap is its own inverse).
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

namespace {

// t with dimension d and the last one swapped, contiguous; t itself when d is already last.
Tensor swap_last(const Tensor& t, int64_t d) {
  return d == t.dim() - 1 ? t : kernel::contiguous(kernel::transpose(t, d, -1));
}

// y = softmax(x) or log softmax(x) along dim; the backward reads only y (in the swapped layout).
Tensor softmax_along(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  const int64_t d = kernel::normalize_dim(dim, x.dim(), name);
  Tensor y_last = log ? kernel::log_softmax(swap_last(x, d)) : kernel::softmax(swap_last(x, d));
  Tensor y = swap_last(y_last, d);
  record(name, {x}, {&y}, {y_last}, [d, log](const Grads& g, const Grads& s, const Needs&) {
    Tensor dy = swap_last(g[0], d);
    return Grads{swap_last(log ? kernel::log_softmax_backward(dy, s[0]) : kernel::softmax_backward(dy, s[0]), d)};
  });
  return y;
}

}  // namespace

// y = exp(x) / Σ_dim exp(x);  dx = y ⊙ (dy − Σ_dim dy ⊙ y)
Tensor softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, false); }

// y = x − log Σ_dim exp(x);  dx = dy − exp(y) Σ_dim dy
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, true); }

// loss = (1 / count) Σ_{n counted} ℓ_n,  ℓ_n = lse_n − logits[n, t_n];
// dlogits[n] = dloss / count · (softmax(logits[n]) − onehot(t_n)), 0 for ignored n.
// With weights: loss = Σ_counted w_n ℓ_n / W, W = Σ_counted w_n, so
// dlogits[n] = dloss · w_n / W · (softmax(logits[n]) − onehot(t_n)) and dw_n = dloss · (ℓ_n − loss) / W
// for counted n (0 for ignored ones).
// The forward's lse [N] is saved so the backward needs no second reduction over V.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& weights) {
  kernel::CrossEntropyOutput out = kernel::cross_entropy(logits, targets, ignore_index, weights);
  Tensor loss = out.loss;
  const double total = out.total_weight;
  if (!weights.defined()) {
    record("cross_entropy", {logits, targets}, {&loss}, {logits, targets, out.lse},
           [ignore_index, total](const Grads& g, const Grads& s, const Needs& need) {
             Tensor dlogits;
             if (need[0]) dlogits = kernel::cross_entropy_backward(g[0], s[0], s[1], s[2], ignore_index, total);
             return Grads{dlogits, Tensor()};
           });
    return loss;
  }
  record("cross_entropy", {logits, targets, weights}, {&loss}, {logits, targets, out.lse, weights, out.losses, loss},
         [ignore_index, total](const Grads& g, const Grads& s, const Needs& need) {
           Tensor dlogits, dweights;
           if (need[0]) dlogits = kernel::cross_entropy_backward(g[0], s[0], s[1], s[2], ignore_index, total, s[3]);
           if (need[2]) {
             // On the host (N values): dw_n = dloss · (ℓ_n − loss) / W where t_n counts, else 0.
             const std::vector<int64_t> t = s[1].to_indices();
             const std::vector<double> losses = s[4].to_doubles();
             const double mean = s[5].item(), k = total != 0 ? g[0].item() / total : 0.0;
             std::vector<double> dw(t.size(), 0.0);
             for (size_t n = 0; n < t.size(); ++n) {
               if (t[n] != ignore_index) dw[n] = k * (losses[n] - mean);
             }
             dweights = Tensor::from_vector(dw, s[3].shape(), s[3].dtype(), s[3].device());
           }
           return Grads{dlogits, Tensor(), dweights};
         });
  return loss;
}

// ---- registry entries ----
namespace {

OpSpec softmax_spec(const char* name, const char* summary, Tensor (*fn)(const Tensor&, int64_t), const char* dim) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"dim", AttrType::integer, "-1", "the dimension to normalise over"}};
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs& a) { return Grads{fn(in[0], a.get_int("dim"))}; };
  s.example = [](Generator& gen, DType dtype) { return Grads{Tensor::randn({3, 5, 7}, gen, dtype)}; };
  s.example_attrs = {{"dim", dim}};
  return s;
}

SEQLAB_REGISTER_OP(softmax_spec("softmax", "y = exp(x) / Σ_dim exp(x)", &softmax, "1"));
SEQLAB_REGISTER_OP(softmax_spec("log_softmax", "y = x − log Σ_dim exp(x)", &log_softmax, "-1"));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "cross_entropy";
  s.summary =
      "loss = mean over targets ≠ ignore_index of −log softmax(logits)[target] (weighted: Σ w·ℓ / Σ w); "
      "logits [..., V], targets [...], weights [...] or none";
  s.inputs = {{"logits"}, {"targets", OpInputKind::index}, {"weights", OpInputKind::floating, true}};
  s.outputs = {"loss"};
  s.attrs = {{"ignore_index", AttrType::integer, "-100", "targets equal to this are left out of the mean"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return Grads{cross_entropy(in[0], in[1], a.get_int("ignore_index"), in.size() > 2 ? in[2] : Tensor())};
  };
  s.example = [](Generator& gen, DType dtype) {
    constexpr int64_t kClasses = 7;
    std::vector<int64_t> t(6);
    for (int64_t& v : t) v = static_cast<int64_t>(gen.next_u64() % kClasses);
    t[4] = -100;  // one ignored target, so the gradcheck covers the zero rows
    return Grads{Tensor::randn({2, 3, kClasses}, gen, dtype), Tensor::from_indices(t, {2, 3}),
                 Tensor::rand({2, 3}, gen, dtype, 0.5, 2.0)};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
