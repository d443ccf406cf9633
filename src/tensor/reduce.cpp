// Reductions: the reduced dimensions are moved last and the tensor is viewed as [outer, inner],
// so every device implements only row reductions.
#include <algorithm>
#include <stdexcept>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

struct RowLayout {
  Tensor rows;       // [outer, inner], contiguous
  Shape out_shape;   // shape of the result (with or without kept dims)
};

RowLayout to_rows(const Tensor& x, std::vector<int64_t> dims, bool keepdim, const char* op) {
  if (!is_floating(x.dtype())) throw std::invalid_argument(std::string(op) + ": expected a floating tensor");
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  }
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), false);
  for (int64_t& d : dims) {
    d = normalize_dim(d, x.dim(), op);
    if (reduced[static_cast<size_t>(d)]) throw std::invalid_argument(std::string(op) + ": dimension repeated");
    reduced[static_cast<size_t>(d)] = true;
  }
  std::sort(dims.begin(), dims.end());
  std::vector<int64_t> order;
  Shape out_shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    size_t i = static_cast<size_t>(d);
    if (!reduced[i]) {
      order.push_back(d);
      out_shape.push_back(x.shape()[i]);
      outer *= x.shape()[i];
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  for (int64_t d : dims) {
    order.push_back(d);
    inner *= x.shape()[static_cast<size_t>(d)];
  }
  Tensor rows = reshape(permute(x, order), {outer, inner});
  return {rows, out_shape};
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  RowLayout l = to_rows(x, dims, keepdim, "sum");
  Tensor out = Tensor::empty({l.rows.size(0)}, x.dtype(), x.device());
  sum_rows_kernel(x.device(), l.rows, out);
  return view(out, l.out_shape);
}

std::pair<Tensor, Tensor> max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  RowLayout l = to_rows(x, dims, keepdim, "max");
  if (l.rows.size(1) == 0) throw std::invalid_argument("max over an empty dimension of " + shape_str(x.shape()));
  Tensor out = Tensor::empty({l.rows.size(0)}, x.dtype(), x.device());
  Tensor index = Tensor::empty({l.rows.size(0)}, DType::i64, x.device());
  max_rows_kernel(x.device(), l.rows, out, index);
  return {view(out, l.out_shape), view(index, l.out_shape)};
}

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse) {
  if (!is_floating(x.dtype())) throw std::invalid_argument("cumsum: expected a floating tensor");
  size_t d = static_cast<size_t>(normalize_dim(dim, x.dim(), "cumsum"));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= x.shape()[i];
  for (size_t i = d + 1; i < x.shape().size(); ++i) inner *= x.shape()[i];
  Tensor in = reshape(x, {outer, x.shape()[d], inner});
  Tensor out = Tensor::empty(in.shape(), x.dtype(), x.device());
  cumsum_kernel(x.device(), in, reverse, out);
  return view(out, x.shape());
}

}  // namespace seqlab::kernel
