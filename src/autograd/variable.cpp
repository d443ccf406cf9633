// A tensor's gradient: the free functions of src/autograd/variable.h that read and write the
// AutogradMeta a Tensor carries (src/tensor knows it only as an opaque pointer).
#include <stdexcept>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

Node::~Node() {
  // Each node whose last owner is being destroyed gives up its own edges to the list before it goes,
  // so at most one node's destruction is under way at any time.
  std::vector<std::shared_ptr<Node>> orphans;
  auto adopt = [&orphans](std::vector<Edge>& edges) {
    for (Edge& e : edges) {
      if (e.node && e.node.use_count() == 1) orphans.push_back(std::move(e.node));
    }
  };
  adopt(next);
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    adopt(n->next);
  }  // n, its edges taken, is destroyed here without descending further
}

bool requires_grad(const Tensor& t) { return t.autograd_meta() && t.autograd_meta()->requires_grad; }

Tensor& set_requires_grad(Tensor& t, bool on) {
  if (on && !is_floating(t.dtype())) {
    throw std::invalid_argument(std::string("only floating tensors can require grad, not ") + dtype_name(t.dtype()));
  }
  std::shared_ptr<AutogradMeta>& meta = t.mutable_autograd_meta();
  if (meta && meta->grad_fn) {
    throw std::invalid_argument("set_requires_grad on a non-leaf tensor (computed by '" + meta->grad_fn->name +
                                "'); detach() it first");
  }
  if (!meta) meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = on;
  return t;
}

Tensor set_requires_grad(Tensor&& t, bool on) {
  set_requires_grad(t, on);
  return std::move(t);
}

Tensor grad_of(const Tensor& t) { return t.autograd_meta() ? t.autograd_meta()->grad : Tensor(); }

void clear_grad(Tensor& t) {
  if (t.autograd_meta()) t.autograd_meta()->grad = Tensor();
}

void set_grad(Tensor& t, const Tensor& g) {
  if (g.defined() && g.shape() != t.shape()) {
    throw std::invalid_argument("set_grad: gradient " + shape_str(g.shape()) + " for a tensor " + shape_str(t.shape()));
  }
  std::shared_ptr<AutogradMeta>& meta = t.mutable_autograd_meta();
  if (!meta) meta = std::make_shared<AutogradMeta>();
  meta->grad = g;
}

void backward(const Tensor& root) { backward(std::vector<Tensor>{root}, std::vector<Tensor>{Tensor()}, false); }

}  // namespace seqlab
