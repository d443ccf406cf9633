// Views: new shape/strides/offset over the same storage. No data moves here.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim) {
    throw std::out_of_range(std::string(op) + ": dimension " + std::to_string(dim) + " is out of range for a " +
                            std::to_string(ndim) + "-d tensor");
  }
  return d;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape infer_reshape(const Shape& from, Shape to) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      if (infer_at >= 0) throw std::invalid_argument("reshape to " + shape_str(to) + ": more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else if (to[i] < 0) {
      throw std::invalid_argument("reshape to " + shape_str(to) + ": negative dimension");
    } else {
      known *= to[i];
    }
  }
  int64_t n = shape_numel(from);
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0) {
      throw std::invalid_argument("cannot reshape " + shape_str(from) + " to " + shape_str(to));
    }
    to[static_cast<size_t>(infer_at)] = n / known;
  }
  if (shape_numel(to) != n) throw std::invalid_argument("cannot reshape " + shape_str(from) + " to " + shape_str(to));
  return to;
}

Tensor view(const Tensor& x, const Shape& shape) {
  if (!x.is_contiguous()) throw std::invalid_argument("view of a non-contiguous tensor " + shape_str(x.shape()));
  Shape s = infer_reshape(x.shape(), shape);
  return Tensor::make_view(x.storage(), s, contiguous_strides(s), x.offset(), x.dtype());
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  if (static_cast<int64_t>(dims.size()) != x.dim()) {
    throw std::invalid_argument("permute: " + std::to_string(dims.size()) + " dims for a " + std::to_string(x.dim()) +
                                "-d tensor");
  }
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], x.dim(), "permute");
    if (seen[static_cast<size_t>(d)]) throw std::invalid_argument("permute: dimension repeated");
    seen[static_cast<size_t>(d)] = true;
    shape[i] = x.shape()[static_cast<size_t>(d)];
    strides[i] = x.strides()[static_cast<size_t>(d)];
  }
  return Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  std::vector<int64_t> dims(static_cast<size_t>(x.dim()));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  std::swap(dims[static_cast<size_t>(normalize_dim(a, x.dim(), "transpose"))],
            dims[static_cast<size_t>(normalize_dim(b, x.dim(), "transpose"))]);
  return permute(x, dims);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  size_t d = static_cast<size_t>(normalize_dim(dim, x.dim(), "narrow"));
  if (start < 0) start += x.shape()[d];
  if (start < 0 || length < 0 || start + length > x.shape()[d]) {
    throw std::out_of_range("narrow: [" + std::to_string(start) + ", " + std::to_string(start + length) +
                            ") is outside dimension " + std::to_string(dim) + " of " + shape_str(x.shape()));
  }
  Shape shape = x.shape();
  shape[d] = length;
  return Tensor::make_view(x.storage(), shape, x.strides(), x.offset() + start * x.strides()[d], x.dtype());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  if (shape.size() < static_cast<size_t>(x.dim())) {
    throw std::invalid_argument("expand: cannot expand " + shape_str(x.shape()) + " to " + shape_str(shape));
  }
  size_t lead = shape.size() - static_cast<size_t>(x.dim());
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) continue;
    int64_t have = x.shape()[i - lead];
    if (have == shape[i]) {
      strides[i] = x.strides()[i - lead];
    } else if (have != 1) {
      throw std::invalid_argument("expand: cannot expand " + shape_str(x.shape()) + " to " + shape_str(shape));
    }
  }
  return Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  size_t d = static_cast<size_t>(normalize_dim(dim, x.dim() + 1, "unsqueeze"));
  Shape shape = x.shape(), strides = x.strides();
  int64_t stride = d < strides.size() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(d), 1);
  strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(d), stride);
  return Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  size_t d = static_cast<size_t>(normalize_dim(dim, x.dim(), "squeeze"));
  if (x.shape()[d] != 1) {
    throw std::invalid_argument("squeeze: dimension " + std::to_string(dim) + " of " + shape_str(x.shape()) +
                                " is not 1");
  }
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(d));
  return Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
}

}  // namespace seqlab::kernel
