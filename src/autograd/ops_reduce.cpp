// Reductions and the cumulative sum.
#include <algorithm>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

namespace {

// Normalised, sorted reduction dims (all dims when empty).
std::vector<int64_t> reduction_dims(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(kernel::normalize_dim(d, x.dim(), op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The reduced shape with size-1 dims kept in place of the reduced ones.
Shape kept_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape s = shape;
  for (int64_t d : dims) s[static_cast<size_t>(d)] = 1;
  return s;
}

// dx = dy broadcast back over the reduced dimensions
Tensor broadcast_back(const Tensor& dy, const Shape& kept, const Shape& full) {
  return kernel::contiguous(kernel::expand(kernel::reshape(dy, kept), full));
}

}  // namespace

// y = Σ_dims x;  dx = dy broadcast over dims
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = kernel::sum(x, dims, keepdim);
  Shape full = x.shape(), kept = kept_shape(x.shape(), reduction_dims(x, dims, "sum"));
  record("sum", {x}, {&y}, {}, [full, kept](const Grads& g, const Grads&, const Needs&) {
    return Grads{broadcast_back(g[0], kept, full)};
  });
  return y;
}

// y = Σ_dims x / n;  dx = dy / n broadcast over dims
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<int64_t> d = reduction_dims(x, dims, "mean");
  int64_t n = 1;
  for (int64_t i : d) n *= x.shape()[static_cast<size_t>(i)];
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(n));
}

// y = max_dims x;  dx = dy at the first position attaining the max, 0 elsewhere
Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  auto [y, index] = kernel::max(x, dims, keepdim);
  std::vector<int64_t> reduced = reduction_dims(x, dims, "max");
  // The layout kernel::max reduced in: kept dims in order, then reduced dims in order.
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!std::binary_search(reduced.begin(), reduced.end(), d)) order.push_back(d);
  }
  order.insert(order.end(), reduced.begin(), reduced.end());
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  TensorInfo in{x.shape(), x.dtype(), x.device()};
  record("max", {x}, {&y}, {index}, [in, order, inverse](const Grads& g, const Grads& s, const Needs&) {
    Shape permuted;
    for (int64_t d : order) permuted.push_back(in.shape[static_cast<size_t>(d)]);
    const int64_t outer = s[0].numel();
    Tensor dx_rows = Tensor::zeros({outer, shape_numel(in.shape) / std::max<int64_t>(outer, 1)}, in.dtype, in.device);
    kernel::scatter_rows_kernel(in.device, kernel::reshape(g[0], {outer}), kernel::reshape(s[0], {outer}), dx_rows);
    return Grads{kernel::contiguous(kernel::permute(kernel::view(dx_rows, permuted), inverse))};
  });
  return y;
}

// y_j = Σ_{i ≤ j} x_i along dim;  dx_i = Σ_{j ≥ i} dy_j (a reversed cumulative sum)
Tensor cumsum(const Tensor& x, int64_t dim) {
  Tensor y = kernel::cumsum(x, dim);
  record("cumsum", {x}, {&y}, {}, [dim](const Grads& g, const Grads&, const Needs&) {
    return Grads{kernel::cumsum(g[0], dim, /*reverse=*/true)};
  });
  return y;
}

// ---- registry entries ----
namespace {

OpSpec reduce_spec(const char* name, const char* summary, Tensor (*fn)(const Tensor&, const std::vector<int64_t>&, bool),
                   bool distinct_values) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"dims", AttrType::int_list, "", "dimensions to reduce (empty: all)"},
             {"keepdim", AttrType::boolean, "false", "keep reduced dimensions as size 1"}};
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs& a) {
    return Grads{fn(in[0], a.get_int_list("dims"), a.get_bool("keepdim"))};
  };
  s.example = [distinct_values](Generator& gen, DType dtype) {
    if (!distinct_values) return Grads{Tensor::randn({3, 4, 5}, gen, dtype)};
    // A shuffled ramp: no two values within 0.05 of each other, so the max is never a near tie.
    std::vector<double> v(60);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * static_cast<double>(i) - 3.0;
    std::shuffle(v.begin(), v.end(), gen.engine());
    return Grads{Tensor::from_vector(v, {3, 4, 5}, dtype)};
  };
  s.example_attrs = {{"dims", "0,2"}};
  return s;
}

SEQLAB_REGISTER_OP(reduce_spec("sum", "y = Σ x over dims", &sum, false));
SEQLAB_REGISTER_OP(reduce_spec("mean", "y = mean of x over dims", &mean, false));
SEQLAB_REGISTER_OP(reduce_spec("max", "y = max of x over dims (gradient to the first maximum)", &max, true));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "cumsum";
  s.summary = "y_j = Σ_{i ≤ j} x_i along dim";
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"dim", AttrType::integer, "-1", "the dimension to accumulate along"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) { return Grads{cumsum(in[0], a.get_int("dim"))}; };
  s.example = [](Generator& gen, DType dtype) { return Grads{Tensor::randn({3, 7, 2}, gen, dtype)}; };
  s.example_attrs = {{"dim", "1"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
