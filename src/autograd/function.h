// Recording an op in the graph. An op's forward computes its outputs with raw kernels and then
// calls record() with its backward, written right under it in the same file:
//
//   Tensor tanh(const Tensor& x) {
//     Tensor y = kernel::unary(UnaryOp::tanh, x);
//     record("tanh", {x}, {&y}, {x, y}, [](const auto& g, const auto& saved, const auto&) {
//       return std::vector<Tensor>{kernel::unary_backward(UnaryOp::tanh, g[0], saved[0], saved[1])};
//     });
//     return y;
//   }
#pragma once

#include <vector>

#include "autograd/variable.h"

namespace seqlab {

// True when record() would build a node for these inputs.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Makes `outputs` non-leaf tensors produced by a new node, when grad mode is on and some input
// requires a gradient; otherwise does nothing. `saved` are stored detached for the backward.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            std::vector<Tensor> saved, BackwardFn backward);

}  // namespace seqlab
