// The autograd graph: what a tensor carries (AutogradMeta), the nodes that record how an output
// was computed, and the single backward signature every op implements.
//
// A node is created only when grad mode is on and at least one input requires a gradient (see
// record() in src/autograd/function.h), so code under NoGradGuard builds no graph at all.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace seqlab {

struct Node;

// Where the gradient of one op input flows: into output `output_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  int output_nr = 0;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                      // accumulated gradient (leaves)
  std::shared_ptr<Node> grad_fn;    // the op that produced this tensor (non-leaves)
  int output_nr = 0;                // which output of grad_fn this tensor is
  std::shared_ptr<Node> accumulator;  // leaves: the node that adds incoming gradients into `grad`
  // Leaves: called by backward() right after this backward pass's gradient was added into `grad` (once
  // per pass: the engine sums every path into the leaf first). Data parallelism starts averaging a bucket
  // of gradients from here while the backward goes on (train/launch/data_parallel.h).
  std::function<void()> on_grad_ready;
};

// The one backward signature: gradients of the outputs (zeros where an output received none), the
// tensors the forward saved, and which inputs need a gradient. Returns one tensor per input,
// undefined where `needs_grad` is false; nothing is computed for an input nobody needs.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs,
                                                     const std::vector<Tensor>& saved,
                                                     const std::vector<bool>& needs_grad)>;

struct TensorInfo {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

struct Node {
  std::string name;
  std::vector<Edge> next;            // per input; node is null where the input needs no gradient
  std::vector<bool> needs_grad;      // per input
  std::vector<TensorInfo> inputs;    // shapes checked against the gradients the backward returns
  std::vector<TensorInfo> outputs;   // to make zero gradients for outputs nobody used
  std::vector<Tensor> saved;         // detached: a saved output does not keep its own node alive
  BackwardFn backward;               // null for a leaf accumulator
  bool is_accumulator = false;       // adds its gradient into `leaf` instead of running a backward
  std::weak_ptr<AutogradMeta> leaf;
  bool released = false;             // saved tensors freed after a backward without retain_graph

  // Frees the nodes only this one keeps alive one after the other, not by recursion: a graph is as
  // deep as the model (a chain of ops per layer), and destroying it node inside node would overflow
  // the stack for deep models (10⁴ layers of a small model did).
  ~Node();
};

// Grad mode: whether ops record the graph. Thread-local.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- a tensor's gradient (src/tensor keeps only the opaque AutogradMeta pointer) ----
bool requires_grad(const Tensor& t);
// Marks a leaf (a tensor no op computed) as requiring a gradient; returns it. Throws for a non-floating
// tensor or one an op computed (detach() it first).
Tensor& set_requires_grad(Tensor& t, bool on = true);
Tensor set_requires_grad(Tensor&& t, bool on = true);  // a temporary: `set_requires_grad(Tensor::randn(...))`
Tensor grad_of(const Tensor& t);  // the accumulated gradient of a leaf, or an undefined tensor
void clear_grad(Tensor& t);       // drops the accumulated gradient
void set_grad(Tensor& t, const Tensor& g);
// Runs the backward pass from a scalar `root`, seeded with 1 (for another seed, or to keep the graph,
// backward({root}, {grad_output}, retain_graph) below).
void backward(const Tensor& root);

// Runs the backward pass from several roots at once, seeding root i with grads[i] (undefined:
// ones, allowed for scalars). Frees the graph's saved tensors unless retain_graph.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);

}  // namespace seqlab
