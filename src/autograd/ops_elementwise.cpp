// Elementwise ops. Binary ops broadcast; their backward sums the gradient back over the
// broadcast dimensions (kernel::sum_to).
#include <cmath>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;
using kernel::BinaryOp;
using kernel::ScalarOp;
using kernel::UnaryOp;

namespace {

Tensor mul_raw(const Tensor& a, const Tensor& b) { return kernel::binary(BinaryOp::mul, a, b); }
Tensor div_raw(const Tensor& a, const Tensor& b) { return kernel::binary(BinaryOp::div, a, b); }

// y = f(x); dx = dy · f'(x), from x and y
Tensor unary_op(UnaryOp op, const Tensor& x, double alpha = 1.0) {
  Tensor y = kernel::unary(op, x, alpha);
  record(kernel::unary_name(op), {x}, {&y}, {x, y}, [op, alpha](const Grads& g, const Grads& s, const Needs&) {
    return Grads{kernel::unary_backward(op, g[0], s[0], s[1], alpha)};
  });
  return y;
}

}  // namespace

// y = a + b;  da = Σ_broadcast dy,  db = Σ_broadcast dy
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::binary(BinaryOp::add, a, b);
  Shape sa = a.shape(), sb = b.shape();
  record("add", {a, b}, {&y}, {}, [sa, sb](const Grads& g, const Grads&, const Needs& need) {
    return Grads{need[0] ? kernel::sum_to(g[0], sa) : Tensor(), need[1] ? kernel::sum_to(g[0], sb) : Tensor()};
  });
  return y;
}

// y = a − b;  da = Σ dy,  db = −Σ dy
Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::binary(BinaryOp::sub, a, b);
  Shape sa = a.shape(), sb = b.shape();
  record("sub", {a, b}, {&y}, {}, [sa, sb](const Grads& g, const Grads&, const Needs& need) {
    return Grads{need[0] ? kernel::sum_to(g[0], sa) : Tensor(),
                 need[1] ? kernel::unary(UnaryOp::neg, kernel::sum_to(g[0], sb)) : Tensor()};
  });
  return y;
}

// y = a ⊙ b;  da = Σ dy ⊙ b,  db = Σ dy ⊙ a
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::binary(BinaryOp::mul, a, b);
  record("mul", {a, b}, {&y}, {a, b}, [](const Grads& g, const Grads& s, const Needs& need) {
    return Grads{need[0] ? kernel::sum_to(mul_raw(g[0], s[1]), s[0].shape()) : Tensor(),
                 need[1] ? kernel::sum_to(mul_raw(g[0], s[0]), s[1].shape()) : Tensor()};
  });
  return y;
}

// y = a / b;  da = Σ dy / b,  db = −Σ dy ⊙ y / b
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::binary(BinaryOp::div, a, b);
  Shape sa = a.shape();
  record("div", {a, b}, {&y}, {b, y}, [sa](const Grads& g, const Grads& s, const Needs& need) {
    Tensor g_over_b = div_raw(g[0], s[0]);
    return Grads{need[0] ? kernel::sum_to(g_over_b, sa) : Tensor(),
                 need[1] ? kernel::unary(UnaryOp::neg, kernel::sum_to(mul_raw(g_over_b, s[1]), s[0].shape()))
                         : Tensor()};
  });
  return y;
}

// y = x + s;  dx = dy
Tensor add(const Tensor& x, double s) {
  Tensor y = kernel::scalar_op(ScalarOp::add, x, s);
  record("add_scalar", {x}, {&y}, {}, [](const Grads& g, const Grads&, const Needs&) { return Grads{g[0]}; });
  return y;
}

// y = x · s;  dx = s · dy
Tensor mul(const Tensor& x, double s) {
  Tensor y = kernel::scalar_op(ScalarOp::mul, x, s);
  record("mul_scalar", {x}, {&y}, {}, [s](const Grads& g, const Grads&, const Needs&) {
    return Grads{kernel::scalar_op(ScalarOp::mul, g[0], s)};
  });
  return y;
}

// y = x^p;  dx = p · x^(p−1) · dy
Tensor pow(const Tensor& x, double p) {
  Tensor y = kernel::scalar_op(ScalarOp::pow, x, p);
  record("pow", {x}, {&y}, {x}, [p](const Grads& g, const Grads& s, const Needs&) {
    Tensor d = kernel::scalar_op(ScalarOp::mul, kernel::scalar_op(ScalarOp::pow, s[0], p - 1.0), p);
    return Grads{mul_raw(g[0], d)};
  });
  return y;
}

// y = s − x;  dx = −dy
Tensor rsub(const Tensor& x, double s) {
  Tensor y = kernel::scalar_op(ScalarOp::rsub, x, s);
  record("rsub", {x}, {&y}, {}, [](const Grads& g, const Grads&, const Needs&) {
    return Grads{kernel::unary(UnaryOp::neg, g[0])};
  });
  return y;
}

// y = s / x;  dx = −dy · y / x
Tensor rdiv(const Tensor& x, double s) {
  Tensor y = kernel::scalar_op(ScalarOp::rdiv, x, s);
  record("rdiv", {x}, {&y}, {x, y}, [](const Grads& g, const Grads& sv, const Needs&) {
    return Grads{kernel::unary(UnaryOp::neg, div_raw(mul_raw(g[0], sv[1]), sv[0]))};
  });
  return y;
}

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::rsqrt, x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::square, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::sigmoid, x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::silu, x); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::gelu, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::relu, x); }
Tensor elu(const Tensor& x, double alpha) { return unary_op(UnaryOp::elu, x, alpha); }
Tensor softplus(const Tensor& x) { return unary_op(UnaryOp::softplus, x); }

// y = cond ? a : b;  da = Σ cond ? dy : 0,  db = Σ cond ? 0 : dy
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = kernel::where(cond, a, b);
  Shape sa = a.shape(), sb = b.shape();
  record("where", {cond, a, b}, {&y}, {cond}, [sa, sb](const Grads& g, const Grads& s, const Needs& need) {
    Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
    return Grads{Tensor(), need[1] ? kernel::sum_to(kernel::where(s[0], g[0], zero), sa) : Tensor(),
                 need[2] ? kernel::sum_to(kernel::where(s[0], zero, g[0]), sb) : Tensor()};
  });
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor fill = Tensor::full({}, value, x.dtype(), x.device());
  return where(mask, fill, x);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& x, double s) { return add(x, s); }
Tensor operator-(const Tensor& x, double s) { return add(x, -s); }
Tensor operator*(const Tensor& x, double s) { return mul(x, s); }
Tensor operator/(const Tensor& x, double s) { return mul(x, 1.0 / s); }
Tensor operator*(double s, const Tensor& x) { return mul(x, s); }

// ---- registry entries ----
namespace {

// Values of magnitude in [0.2, 2.2) with random sign: away from the kinks of relu and elu at 0.
Tensor away_from_zero(const Shape& shape, Generator& gen, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = (gen.uniform() < 0.5 ? -1.0 : 1.0) * (0.2 + 2.0 * gen.uniform());
  return Tensor::from_vector(v, shape, dtype);
}

struct UnaryEntry {
  UnaryOp op;
  const char* summary;
  bool positive_domain;  // example inputs must be > 0
};

const UnaryEntry kUnaryOps[] = {
    {UnaryOp::neg, "y = −x", false},
    {UnaryOp::exp, "y = exp(x)", false},
    {UnaryOp::log, "y = log(x)", true},
    {UnaryOp::sqrt, "y = √x", true},
    {UnaryOp::rsqrt, "y = 1/√x", true},
    {UnaryOp::square, "y = x²", false},
    {UnaryOp::tanh, "y = tanh(x)", false},
    {UnaryOp::sigmoid, "y = 1/(1 + exp(−x))", false},
    {UnaryOp::silu, "y = x·σ(x)", false},
    {UnaryOp::gelu, "y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))", false},
    {UnaryOp::relu, "y = max(x, 0)", false},
    {UnaryOp::elu, "y = x if x > 0 else α(exp(x) − 1)", false},
    {UnaryOp::softplus, "y = log(1 + exp(x))", false},
};

bool register_unary_ops() {
  for (const UnaryEntry& e : kUnaryOps) {
    OpSpec s;
    s.name = kernel::unary_name(e.op);
    s.summary = e.summary;
    s.inputs = {{"x"}};
    s.outputs = {"y"};
    if (e.op == UnaryOp::elu) s.attrs = {{"alpha", AttrType::number, "1.0", "α"}};
    UnaryOp op = e.op;
    s.forward = [op](const std::vector<Tensor>& in, const OpAttrs& a) {
      return Grads{unary_op(op, in[0], op == UnaryOp::elu ? a.get_number("alpha") : 1.0)};
    };
    bool positive = e.positive_domain;
    s.example = [positive](Generator& gen, DType dtype) {
      return Grads{positive ? Tensor::rand({3, 5}, gen, dtype, 0.3, 2.0) : away_from_zero({3, 5}, gen, dtype)};
    };
    if (e.op == UnaryOp::elu) s.example_attrs = {{"alpha", "0.7"}};
    register_op(std::move(s));
  }
  return true;
}
const bool unary_registered = register_unary_ops();

OpSpec binary_spec(const char* name, const char* summary, Tensor (*fn)(const Tensor&, const Tensor&), bool positive_b) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"a"}, {"b"}};
  s.outputs = {"y"};
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{fn(in[0], in[1])}; };
  s.example = [positive_b](Generator& gen, DType dtype) {
    // [3, 1, 5] against [4, 5]: both operands broadcast.
    return Grads{Tensor::randn({3, 1, 5}, gen, dtype),
                 positive_b ? Tensor::rand({4, 5}, gen, dtype, 0.5, 2.0) : Tensor::randn({4, 5}, gen, dtype)};
  };
  return s;
}

SEQLAB_REGISTER_OP(binary_spec("add", "y = a + b (broadcasting)", &add, false));
SEQLAB_REGISTER_OP(binary_spec("sub", "y = a − b (broadcasting)", &sub, false));
SEQLAB_REGISTER_OP(binary_spec("mul", "y = a ⊙ b (broadcasting)", &mul, false));
SEQLAB_REGISTER_OP(binary_spec("div", "y = a / b (broadcasting)", &div, true));

OpSpec scalar_spec(const char* name, const char* summary, Tensor (*fn)(const Tensor&, double), bool positive_x,
                   const char* example_s) {
  OpSpec s;
  s.name = name;
  s.summary = summary;
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"s", AttrType::number, "1.0", "the scalar"}};
  s.forward = [fn](const std::vector<Tensor>& in, const OpAttrs& a) { return Grads{fn(in[0], a.get_number("s"))}; };
  s.example = [positive_x](Generator& gen, DType dtype) {
    return Grads{positive_x ? Tensor::rand({2, 3, 5}, gen, dtype, 0.5, 2.0) : Tensor::randn({2, 3, 5}, gen, dtype)};
  };
  s.example_attrs = {{"s", example_s}};
  return s;
}

Tensor add_scalar_fn(const Tensor& x, double s) { return add(x, s); }
Tensor mul_scalar_fn(const Tensor& x, double s) { return mul(x, s); }
SEQLAB_REGISTER_OP(scalar_spec("add_scalar", "y = x + s", &add_scalar_fn, false, "1.5"));
SEQLAB_REGISTER_OP(scalar_spec("mul_scalar", "y = x · s", &mul_scalar_fn, false, "-0.75"));
SEQLAB_REGISTER_OP(scalar_spec("pow", "y = x^s", &pow, true, "2.5"));
SEQLAB_REGISTER_OP(scalar_spec("rsub", "y = s − x", &rsub, false, "3"));
SEQLAB_REGISTER_OP(scalar_spec("rdiv", "y = s / x", &rdiv, true, "2"));

Tensor random_mask(const Shape& shape, Generator& gen) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  for (int64_t& m : v) m = gen.uniform() < 0.5 ? 1 : 0;
  return Tensor::from_indices(v, shape, DType::i64);
}

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "where";
  s.summary = "y = cond ≠ 0 ? a : b (broadcasting)";
  s.inputs = {{"cond", OpInputKind::mask}, {"a"}, {"b"}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{where(in[0], in[1], in[2])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{random_mask({3, 5}, gen), Tensor::randn({3, 5}, gen, dtype), Tensor::randn({5}, gen, dtype)};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "masked_fill";
  s.summary = "y = mask ≠ 0 ? value : x";
  s.inputs = {{"x"}, {"mask", OpInputKind::mask}};
  s.outputs = {"y"};
  s.attrs = {{"value", AttrType::number, "0.0", "the fill value"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return Grads{masked_fill(in[0], in[1], a.get_number("value"))};
  };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 5}, gen, dtype), random_mask({3, 5}, gen)};
  };
  s.example_attrs = {{"value", "-2.5"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
