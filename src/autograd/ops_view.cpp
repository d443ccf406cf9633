// Views and copies. Their backward passes move the gradient back into the input's layout.
#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = kernel::reshape(x, shape);
  Shape in_shape = x.shape();
  record("reshape", {x}, {&y}, {}, [in_shape](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::reshape(g[0], in_shape)};
  });
  return y;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = kernel::permute(x, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[static_cast<size_t>(kernel::normalize_dim(dims[i], x.dim(), "permute"))] = static_cast<int64_t>(i);
  }
  record("permute", {x}, {&y}, {}, [inverse](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::permute(g[0], inverse)};
  });
  return y;
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  Tensor y = kernel::transpose(x, a, b);
  record("transpose", {x}, {&y}, {}, [a, b](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::transpose(g[0], a, b)};
  });
  return y;
}

// dx = zeros with dy placed at [start, start + length) along dim
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor y = kernel::narrow(x, dim, start, length);
  TensorInfo in{x.shape(), x.dtype(), x.device()};
  record("narrow", {x}, {&y}, {}, [in, dim, start, length](const Grads& g, const Grads&, const std::vector<bool>&) {
    Tensor dx = Tensor::zeros(in.shape, in.dtype, in.device);
    kernel::copy_(kernel::narrow(dx, dim, start, length), g[0]);
    return Grads{dx};
  });
  return y;
}

// dx = dy summed over the broadcast dimensions
Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor y = kernel::expand(x, shape);
  Shape in_shape = x.shape();
  record("expand", {x}, {&y}, {}, [in_shape](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::sum_to(g[0], in_shape)};
  });
  return y;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) { return reshape(x, kernel::unsqueeze(x, dim).shape()); }
Tensor squeeze(const Tensor& x, int64_t dim) { return reshape(x, kernel::squeeze(x, dim).shape()); }

Tensor contiguous(const Tensor& x) {
  Tensor y = kernel::contiguous(x);
  record("contiguous", {x}, {&y}, {}, [](const Grads& g, const Grads&, const std::vector<bool>&) { return Grads{g[0]}; });
  return y;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  Tensor y = kernel::to_dtype(x, dtype).detach();
  DType from = x.dtype();
  record("to_dtype", {x}, {&y}, {}, [from](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::to_dtype(g[0], from)};
  });
  return y;
}

Tensor to_device(const Tensor& x, Device device) {
  Tensor y = kernel::to_device(x, device).detach();
  Device from = x.device();
  record("to_device", {x}, {&y}, {}, [from](const Grads& g, const Grads&, const std::vector<bool>&) {
    return Grads{kernel::to_device(g[0], from)};
  });
  return y;
}

// ---- registry entries ----
namespace {

OpSpec view_spec(const std::string& name, const std::string& summary, std::vector<OpAttrSpec> attrs,
                 std::function<Tensor(const Tensor&, const OpAttrs&)> fn, Shape example_shape,
                 std::map<std::string, std::string> example_attrs) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = std::move(attrs);
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs& a) { return std::vector<Tensor>{fn(in[0], a)}; };
  s.example = [example_shape](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn(example_shape, gen, dtype)};
  };
  s.example_attrs = std::move(example_attrs);
  return s;
}

SEQLAB_REGISTER_OP(view_spec("reshape", "y = x viewed with a new shape (one -1 inferred)",
                             {{"shape", AttrType::int_list, "-1", "the new shape"}},
                             [](const Tensor& x, const OpAttrs& a) { return reshape(x, a.get_int_list("shape")); },
                             {3, 4, 5}, {{"shape", "5,-1"}}));
SEQLAB_REGISTER_OP(view_spec("permute", "y = x with dimensions reordered",
                             {{"dims", AttrType::int_list, "", "the new order of the dimensions"}},
                             [](const Tensor& x, const OpAttrs& a) { return permute(x, a.get_int_list("dims")); },
                             {2, 3, 5}, {{"dims", "2,0,1"}}));
SEQLAB_REGISTER_OP(view_spec("transpose", "y = x with two dimensions swapped",
                             {{"dim0", AttrType::integer, "-2", ""}, {"dim1", AttrType::integer, "-1", ""}},
                             [](const Tensor& x, const OpAttrs& a) {
                               return transpose(x, a.get_int("dim0"), a.get_int("dim1"));
                             },
                             {2, 3, 5}, {}));
SEQLAB_REGISTER_OP(view_spec("narrow", "y = x[..., start:start+length, ...] along dim",
                             {{"dim", AttrType::integer, "0", ""},
                              {"start", AttrType::integer, "0", ""},
                              {"length", AttrType::integer, "1", ""}},
                             [](const Tensor& x, const OpAttrs& a) {
                               return narrow(x, a.get_int("dim"), a.get_int("start"), a.get_int("length"));
                             },
                             {3, 7}, {{"dim", "1"}, {"start", "2"}, {"length", "4"}}));
SEQLAB_REGISTER_OP(view_spec("expand", "y = x broadcast to a larger shape",
                             {{"shape", AttrType::int_list, "", "the target shape"}},
                             [](const Tensor& x, const OpAttrs& a) { return expand(x, a.get_int_list("shape")); },
                             {3, 1}, {{"shape", "2,3,5"}}));

}  // namespace
}  // namespace seqlab
