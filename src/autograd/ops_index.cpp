// Indexing and structure: embedding, dropout, concat, split, stack.
#include <string>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

// y[..., :] = W[index[...], :];  dW[v, :] = Σ_{index = v} dy (repeated indices accumulate)
Tensor embedding(const Tensor& weight, const Tensor& index) {
  Tensor y = kernel::embedding(weight, index);
  const int64_t v = weight.size(0);
  record("embedding", {weight, index}, {&y}, {index}, [v](const Grads& g, const Grads& s, const Needs& need) {
    return Grads{need[0] ? kernel::embedding_backward(g[0], s[0], v) : Tensor(), Tensor()};
  });
  return y;
}

// y = x ⊙ m / (1 − p) with m ~ Bernoulli(1 − p) drawn from `gen` in row-major order;
// dx = dy ⊙ m / (1 − p). The scaled mask is the only thing saved.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  if (!(p >= 0.0 && p < 1.0)) {
    throw std::invalid_argument("dropout: p = " + std::to_string(p) + " is outside [0, 1)");
  }
  if (!training || p == 0.0) {
    // Identity, still recorded so that y is a fresh non-leaf whose gradient flows to x.
    Tensor y = x.detach();
    record("dropout", {x}, {&y}, {}, [](const Grads& g, const Grads&, const Needs&) { return Grads{g[0]}; });
    return y;
  }
  // Drawn on the host, one uniform per element, so a seed gives the same mask on every device.
  const double scale = 1.0 / (1.0 - p);
  Tensor mask = Tensor::empty(x.shape(), x.dtype(), cpu_device());
  dispatch_any(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* m = mask.data<T>();
    for (int64_t i = 0; i < mask.numel(); ++i) m[i] = convert_scalar<T>(gen.uniform() < p ? 0.0 : scale);
  });
  mask = kernel::to_device(mask, x.device());
  Tensor y = kernel::binary(kernel::BinaryOp::mul, x, mask);
  record("dropout", {x}, {&y}, {mask}, [](const Grads& g, const Grads& s, const Needs&) {
    return Grads{kernel::binary(kernel::BinaryOp::mul, g[0], s[0])};
  });
  return y;
}

namespace {

// Checks that xs can be joined along `dim` (all sizes equal, except at dim when concatenating;
// one dtype, one device); returns the normalised dim (for stack: the dim of the result).
int64_t check_joinable(const std::vector<Tensor>& xs, int64_t dim, bool stacking, const char* op) {
  if (xs.empty()) throw std::invalid_argument(std::string(op) + ": no tensors given");
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) throw std::invalid_argument(std::string(op) + ": tensor " + std::to_string(i) + " is undefined");
  }
  const Tensor& a = xs[0];
  int64_t d = kernel::normalize_dim(dim, a.dim() + (stacking ? 1 : 0), op);
  for (size_t i = 1; i < xs.size(); ++i) {
    const Tensor& b = xs[i];
    bool same = b.dim() == a.dim();
    for (int64_t k = 0; same && k < a.dim(); ++k) {
      same = a.shape()[static_cast<size_t>(k)] == b.shape()[static_cast<size_t>(k)] || (!stacking && k == d);
    }
    if (!same) {
      throw std::invalid_argument(std::string(op) + ": shapes " + shape_str(a.shape()) + " and " +
                                  shape_str(b.shape()) + " (tensors 0 and " + std::to_string(i) + ") " +
                                  (stacking ? "differ" : "differ outside dimension " + std::to_string(dim)));
    }
    if (b.dtype() != a.dtype() || b.device() != a.device()) {
      throw std::invalid_argument(std::string(op) + ": tensor " + std::to_string(i) + " is " + dtype_name(b.dtype()) +
                                  " on " + b.device().str() + ", tensor 0 is " + dtype_name(a.dtype()) + " on " +
                                  a.device().str());
    }
  }
  return d;
}

// out = the xs laid end to end along d (shapes already checked).
Tensor concat_raw(const std::vector<Tensor>& xs, int64_t d) {
  Shape shape = xs[0].shape();
  shape[static_cast<size_t>(d)] = 0;
  for (const Tensor& x : xs) shape[static_cast<size_t>(d)] += x.shape()[static_cast<size_t>(d)];
  Tensor out = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.shape()[static_cast<size_t>(d)];
    if (x.numel() > 0) kernel::copy_(kernel::narrow(out, d, offset, n), x);
    offset += n;
  }
  return out;
}

// The xs laid end to end along d as split's gradient: when they already lie so in one buffer, in the
// layout of the result (the attention backward writes dq, dk, dv that way for q, k, v split from one
// projection), a view of it; otherwise concat_raw's copy.
Tensor join_grads(const std::vector<Tensor>& xs, int64_t d) {
  Shape shape = xs[0].shape();
  shape[static_cast<size_t>(d)] = 0;
  for (const Tensor& x : xs) shape[static_cast<size_t>(d)] += x.shape()[static_cast<size_t>(d)];
  const Shape strides = contiguous_strides(shape);
  int64_t offset = xs[0].offset();
  bool end_to_end = true;
  for (const Tensor& x : xs) {
    end_to_end = end_to_end && x.storage() == xs[0].storage() && x.dtype() == xs[0].dtype() &&
                 x.strides() == strides && x.offset() == offset;
    offset += x.shape()[static_cast<size_t>(d)] * strides[static_cast<size_t>(d)];
  }
  if (end_to_end) return Tensor::make_view(xs[0].storage(), shape, strides, xs[0].offset(), xs[0].dtype());
  return concat_raw(xs, d);
}

}  // namespace

// y = [x_0, x_1, ...] along dim;  dx_i = dy[..., offset_i : offset_i + n_i, ...]
Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  const int64_t d = check_joinable(xs, dim, false, "concat");
  Tensor y = concat_raw(xs, d);
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.shape()[static_cast<size_t>(d)]);
  record("concat", xs, {&y}, {}, [d, sizes](const Grads& g, const Grads&, const Needs& need) {
    Grads dx(sizes.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (need[i]) dx[i] = kernel::contiguous(kernel::narrow(g[0], d, offset, sizes[i]));
      offset += sizes[i];
    }
    return dx;
  });
  return y;
}

// y_i = x[..., offset_i : offset_i + sizes_i, ...] (views of x);  dx = [dy_0, dy_1, ...] along dim,
// with zeros for pieces that received no gradient (the engine supplies those); no copy when the dy_i
// already lie end to end in one buffer (join_grads).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  if (!x.defined()) throw std::invalid_argument("split: undefined tensor");
  const int64_t d = kernel::normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) throw std::invalid_argument("split: negative size " + std::to_string(n));
    total += n;
  }
  if (sizes.empty() || total != x.shape()[static_cast<size_t>(d)]) {
    throw std::invalid_argument("split: sizes " + shape_str(sizes) + " do not add up to dimension " +
                                std::to_string(dim) + " of " + shape_str(x.shape()));
  }
  std::vector<Tensor> ys;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    ys.push_back(kernel::narrow(x, d, offset, n));
    offset += n;
  }
  std::vector<Tensor*> outs;
  for (Tensor& y : ys) outs.push_back(&y);
  record("split", {x}, outs, {}, [d](const Grads& g, const Grads&, const Needs&) { return Grads{join_grads(g, d)}; });
  return ys;
}

// y = the xs (equal shapes) along a new dimension dim;  dx_i = dy[..., i, ...] with dim removed
Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  const int64_t d = check_joinable(xs, dim, true, "stack");
  std::vector<Tensor> parts;
  for (const Tensor& x : xs) parts.push_back(kernel::unsqueeze(x, d));
  Tensor y = concat_raw(parts, d);
  const size_t n = xs.size();
  record("stack", xs, {&y}, {}, [d, n](const Grads& g, const Grads&, const Needs& need) {
    Grads dx(n);
    for (size_t i = 0; i < n; ++i) {
      if (need[i]) dx[i] = kernel::contiguous(kernel::squeeze(kernel::narrow(g[0], d, static_cast<int64_t>(i), 1), d));
    }
    return dx;
  });
  return y;
}

// ---- registry entries ----
namespace {

// The defined tensors among the registry's fixed inputs a, b and optional c.
std::vector<Tensor> present(const std::vector<Tensor>& in) {
  std::vector<Tensor> xs;
  for (const Tensor& t : in) {
    if (t.defined()) xs.push_back(t);
  }
  return xs;
}

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "embedding";
  s.summary = "y[..., :] = weight[index[...], :]  (weight [V, C]; repeated indices accumulate in dweight)";
  s.inputs = {{"weight"}, {"index", OpInputKind::index}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{embedding(in[0], in[1])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({7, 5}, gen, dtype), Tensor::from_indices({1, 6, 1, 0, 3, 6}, {2, 3})};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "dropout";
  s.summary = "y = x ⊙ m / (1 − p), m ~ Bernoulli(1 − p) from a generator seeded with seed; identity when !training";
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"p", AttrType::number, "0.1", "probability of zeroing an element, in [0, 1)"},
             {"seed", AttrType::integer, "0", "seed of the mask's generator"},
             {"training", AttrType::boolean, "true", "false: identity"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    Generator gen(static_cast<uint64_t>(a.get_int("seed")));
    return Grads{dropout(in[0], a.get_number("p"), gen, a.get_bool("training"))};
  };
  s.example = [](Generator& gen, DType dtype) { return Grads{Tensor::randn({3, 4, 5}, gen, dtype)}; };
  s.example_attrs = {{"p", "0.3"}};
  return s;
}()));

OpSpec join_spec(const char* name, const char* summary, Tensor (*fn)(const std::vector<Tensor>&, int64_t),
                 Shape b_shape) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"a"}, {"b"}, {"c", OpInputKind::floating, /*optional=*/true}};
  s.outputs = {"y"};
  s.attrs = {{"dim", AttrType::integer, "0", "the dimension to join along"}};
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs& a) { return Grads{fn(present(in), a.get_int("dim"))}; };
  s.example = [b_shape](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({3, 2, 5}, gen, dtype), Tensor::randn(b_shape, gen, dtype),
                 Tensor::randn({3, 2, 5}, gen, dtype)};
  };
  s.example_attrs = {{"dim", "1"}};
  return s;
}

SEQLAB_REGISTER_OP(join_spec("concat", "y = [a, b, c] along dim (c optional: two or three pieces)", &concat, {3, 1, 5}));
SEQLAB_REGISTER_OP(join_spec("stack", "y = [a, b, c] stacked along a new dim (c optional: two or three pieces)", &stack,
                             {3, 2, 5}));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "split";
  s.summary = "y0, y1, y2 = consecutive pieces of x along dim of lengths sizes (exactly three; a length may be 0)";
  s.inputs = {{"x"}};
  s.outputs = {"y0", "y1", "y2"};
  s.attrs = {{"sizes", AttrType::int_list, "1,1,1", "three lengths adding up to x's size along dim"},
             {"dim", AttrType::integer, "0", "the dimension to split"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    std::vector<int64_t> sizes = a.get_int_list("sizes");
    if (sizes.size() != 3) {
      throw std::invalid_argument("split: sizes " + shape_str(sizes) + " must list three lengths (outputs y0, y1, y2)");
    }
    return split(in[0], sizes, a.get_int("dim"));
  };
  s.example = [](Generator& gen, DType dtype) { return Grads{Tensor::randn({3, 6, 5}, gen, dtype)}; };
  s.example_attrs = {{"sizes", "2,1,3"}, {"dim", "1"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
