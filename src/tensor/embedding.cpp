// Embedding entry points. The index tensor is flattened to [N] and the gradient/output to [N, C].
// Indices are read on the host once per call to reject out-of-range rows with a clear message: a
// device kernel cannot throw, and a bad row would read or write outside the weight.
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

// index as a contiguous [N], every value checked to lie in [0, V).
Tensor checked_rows(const Tensor& index, int64_t num_embeddings, const char* op) {
  if (!index.defined() || !is_integer(index.dtype())) {
    throw std::invalid_argument(std::string(op) + ": index must be an i32 or i64 tensor, got " +
                                (index.defined() ? dtype_name(index.dtype()) : "an undefined tensor"));
  }
  Tensor flat = reshape(index, {index.numel()});
  for (int64_t i : flat.to_indices()) {
    if (i < 0 || i >= num_embeddings) {
      throw std::invalid_argument(std::string(op) + ": index " + std::to_string(i) + " is out of range [0, V) for V = " +
                                  std::to_string(num_embeddings) + " embeddings");
    }
  }
  return flat;
}

}  // namespace

// out[..., :] = weight[index[...], :]   weight [V, C], index [...], out [..., C]
Tensor embedding(const Tensor& weight, const Tensor& index) {
  if (!weight.defined() || !is_floating(weight.dtype()) || weight.dim() != 2) {
    throw std::invalid_argument("embedding: weight must be a floating [V, C] tensor, got " +
                                (weight.defined() ? shape_str(weight.shape()) : std::string("undefined")));
  }
  if (index.defined() && index.device() != weight.device()) {
    throw std::invalid_argument("embedding: index on " + index.device().str() + ", weight on " +
                                weight.device().str());
  }
  const int64_t v = weight.size(0), c = weight.size(1);
  Tensor rows = checked_rows(index, v, "embedding");
  Shape out_shape = index.shape();
  out_shape.push_back(c);
  Tensor out = Tensor::empty({rows.numel(), c}, weight.dtype(), weight.device());
  embedding_kernel(weight.device(), contiguous(weight), rows, out);
  return view(out, out_shape);
}

// dweight[v, :] = Σ_{n : index[n] = v} dy[n, :]   dy [..., C], index [...], dweight [V, C]
Tensor embedding_backward(const Tensor& dy, const Tensor& index, int64_t num_embeddings) {
  if (!dy.defined() || !is_floating(dy.dtype()) || !index.defined() || dy.dim() != index.dim() + 1 ||
      Shape(dy.shape().begin(), dy.shape().end() - 1) != index.shape()) {
    throw std::invalid_argument("embedding backward: gradient " +
                                (dy.defined() ? shape_str(dy.shape()) : std::string("undefined")) +
                                " does not match index " +
                                (index.defined() ? shape_str(index.shape()) : std::string("undefined")) + " + [C]");
  }
  if (index.device() != dy.device()) throw std::invalid_argument("embedding backward: index and gradient on different devices");
  Tensor rows = checked_rows(index, num_embeddings, "embedding backward");
  const int64_t c = dy.size(-1);
  Tensor dweight = Tensor::empty({num_embeddings, c}, dy.dtype(), dy.device());
  embedding_backward_kernel(dy.device(), reshape(dy, {rows.numel(), c}), rows, dweight);
  return dweight;
}

}  // namespace seqlab::kernel
