// The backward engine: grad mode, recording, and the topological walk that runs each node's
// backward once all gradients flowing into it have arrived.
#include <stdexcept>
#include <unordered_map>

#include "autograd/function.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {
thread_local bool g_grad_enabled = true;

TensorInfo info_of(const Tensor& t) { return TensorInfo{t.shape(), t.dtype(), t.device()}; }

bool tensor_requires_grad(const Tensor& t) { return t.defined() && t.autograd_meta() && t.autograd_meta()->requires_grad; }

// The edge along which a gradient for `t` travels: its producing node, or its leaf accumulator.
Edge edge_of(const Tensor& t) {
  const auto& meta = t.autograd_meta();
  if (meta->grad_fn) return Edge{meta->grad_fn, meta->output_nr};
  if (!meta->accumulator) {
    auto acc = std::make_shared<Node>();
    acc->name = "accumulate_grad";
    acc->leaf = meta;
    acc->is_accumulator = true;
    acc->outputs = {info_of(t)};
    meta->accumulator = acc;
  }
  return Edge{meta->accumulator, 0};
}

// leaf.grad += g, in place once a gradient exists (so references to it stay valid). The first gradient
// is taken as it is when nothing else refers to its memory (the engine drops its own reference next),
// else copied, so that the later in-place adds never write into memory another tensor reads.
void accumulate_into_leaf(const std::shared_ptr<AutogradMeta>& meta, const Tensor& g) {
  if (!meta->grad.defined()) {
    const bool sole = g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
                      g.nbytes() == g.storage()->nbytes();
    meta->grad = sole ? g : kernel::clone(g);
  } else {
    kernel::binary_kernel(g.device(), kernel::BinaryOp::add, meta->grad, kernel::contiguous(g), meta->grad);
  }
}

Tensor add_grads(const Tensor& a, const Tensor& b) { return kernel::binary(kernel::BinaryOp::add, a, b); }

}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (tensor_requires_grad(t)) return true;
  }
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            std::vector<Tensor> saved, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  for (const Tensor& in : inputs) {
    bool needs = tensor_requires_grad(in);
    node->needs_grad.push_back(needs);
    node->next.push_back(needs ? edge_of(in) : Edge{});
    node->inputs.push_back(in.defined() ? info_of(in) : TensorInfo{});
  }
  for (Tensor& s : saved) s = s.defined() ? s.detach() : s;
  node->saved = std::move(saved);
  node->backward = std::move(backward);
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = *outputs[i];
    node->outputs.push_back(info_of(out));
    auto meta = std::make_shared<AutogradMeta>();
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_nr = static_cast<int>(i);
    out.mutable_autograd_meta() = meta;
  }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  if (roots.size() != grads.size()) throw std::invalid_argument("backward: one gradient per root is needed");
  NoGradGuard no_grad;

  // Gradients waiting at each node, one slot per node output.
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  auto deliver = [&](const Edge& e, const Tensor& g) {
    auto& slots = pending[e.node.get()];
    keep[e.node.get()] = e.node;
    if (slots.empty()) slots.resize(e.node->outputs.size());
    Tensor& slot = slots[static_cast<size_t>(e.output_nr)];
    slot = slot.defined() ? add_grads(slot, g) : g;
  };

  std::vector<Edge> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    if (!tensor_requires_grad(root)) {
      throw std::invalid_argument("backward: root " + std::to_string(i) + " " + shape_str(root.shape()) +
                                  " does not require grad");
    }
    Tensor g = grads[i];
    if (!g.defined()) {
      if (root.numel() != 1) {
        throw std::invalid_argument("backward: a gradient must be given for a non-scalar root " +
                                    shape_str(root.shape()));
      }
      g = Tensor::ones(root.shape(), root.dtype(), root.device());
    }
    if (g.shape() != root.shape()) {
      throw std::invalid_argument("backward: gradient " + shape_str(g.shape()) + " for root " +
                                  shape_str(root.shape()));
    }
    Edge e = edge_of(root);
    deliver(e, g);
    starts.push_back(e);
  }

  // Count, for every node reachable from the roots, the edges that point into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : starts) {
    if (!seen[e.node.get()]) {
      seen[e.node.get()] = true;
      stack.push_back(e.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      dependencies[e.node.get()]++;
      keep[e.node.get()] = e.node;
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  std::vector<Node*> ready;
  for (auto& [n, _] : seen) {
    if (dependencies[n] == 0) ready.push_back(n);
  }
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::vector<Tensor> grad_outputs = std::move(pending[n]);
    pending.erase(n);
    grad_outputs.resize(n->outputs.size());

    if (n->is_accumulator) {
      auto leaf = n->leaf.lock();
      if (leaf && grad_outputs[0].defined()) {
        accumulate_into_leaf(leaf, grad_outputs[0]);
        if (leaf->on_grad_ready) leaf->on_grad_ready();
      }
    } else {
      if (n->released) {
        throw std::runtime_error("backward through '" + n->name +
                                 "' a second time: its saved tensors were freed; pass retain_graph=true the first time");
      }
      for (size_t i = 0; i < grad_outputs.size(); ++i) {
        if (!grad_outputs[i].defined()) {
          const TensorInfo& o = n->outputs[i];
          grad_outputs[i] = Tensor::zeros(o.shape, o.dtype, o.device);
        }
      }
      std::vector<Tensor> grad_inputs = n->backward(grad_outputs, n->saved, n->needs_grad);
      if (grad_inputs.size() != n->next.size()) {
        throw std::logic_error("backward of '" + n->name + "' returned " + std::to_string(grad_inputs.size()) +
                               " gradients for " + std::to_string(n->next.size()) + " inputs");
      }
      for (size_t i = 0; i < grad_inputs.size(); ++i) {
        if (!n->next[i].node) continue;
        const Tensor& g = grad_inputs[i];
        if (!g.defined()) {
          throw std::logic_error("backward of '" + n->name + "' gave no gradient for input " + std::to_string(i) +
                                 ", which needs one");
        }
        if (g.shape() != n->inputs[i].shape) {
          throw std::logic_error("backward of '" + n->name + "' gave a gradient " + shape_str(g.shape()) +
                                 " for input " + std::to_string(i) + " of shape " + shape_str(n->inputs[i].shape));
        }
        deliver(n->next[i], g);
      }
      if (!retain_graph) {
        n->saved.clear();
        n->backward = nullptr;
        n->released = true;
      }
    }
    for (const Edge& e : n->next) {
      if (e.node && --dependencies[e.node.get()] == 0) ready.push_back(e.node.get());
    }
  }
}

}  // namespace seqlab
