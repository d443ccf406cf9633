#include "layers/variant_inputs.h"

#include <stdexcept>

namespace seqlab {

VariantInputs::VariantInputs(std::string op, std::vector<std::pair<std::string, Tensor>> inputs, std::string layout)
    : op_(std::move(op)), layout_(std::move(layout)), inputs_(std::move(inputs)) {}

void VariantInputs::fail(const std::string& why) const {
  std::string got;
  for (const auto& [name, t] : inputs_) got += (got.empty() ? "" : ", ") + name + " " + shape_or_undefined(t);
  throw std::invalid_argument(op_ + ": " + why + " (got " + got + "; expected " + layout_ + ")");
}

const Tensor& VariantInputs::operator[](const char* name) const {
  for (const auto& [n, t] : inputs_) {
    if (n == name) return t;
  }
  throw std::logic_error(op_ + ": no input named " + name);
}

void VariantInputs::given(std::initializer_list<const char*> names) const {
  bool all = true;
  std::string list;
  size_t i = 0;
  for (const char* n : names) {
    all = all && (*this)[n].defined();
    list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + std::string(n);
    ++i;
  }
  if (!all) fail(list + " must all be given");
}

HeadDims VariantInputs::qkv() const {
  given({"q", "k", "v"});
  const Tensor &q = (*this)["q"], &k = (*this)["k"], &v = (*this)["v"];
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k and v must have 4 dimensions");
  const HeadDims d{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), q.size(1), q.size(2)};
  if (k.shape() != q.shape()) fail("q and k differ in shape (they must have the same shape)");
  if (v.size(0) != d.B || v.size(1) != d.T || v.size(2) != d.H) fail("v differs from q in batch, length or heads");
  if (d.dk == 0 || d.dv == 0) fail("the head dims dk and dv must be positive");
  return d;
}

HeadDims VariantInputs::qkv_with_kv_heads() const {
  given({"q", "k", "v"});
  const Tensor &q = (*this)["q"], &k = (*this)["k"], &v = (*this)["v"];
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k and v must have 4 dimensions");
  const HeadDims d{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), k.size(1), k.size(2)};
  if (k.size(0) != d.B || v.size(0) != d.B) fail("batch sizes differ");
  if (v.size(1) != d.S || v.size(2) != d.Hk) fail("k and v differ in length or heads");
  if (k.size(3) != d.dk) fail("q and k head dims differ");
  if (d.dk == 0) fail("the head dim is 0");
  if (d.Hk == 0 || d.H % d.Hk != 0) fail("query heads H must be a multiple of kv heads Hk");
  if (d.S == 0) fail("no keys to attend to");
  return d;
}

void VariantInputs::shaped(const char* name, const Shape& shape, const char* layout) const {
  const Tensor& t = (*this)[name];
  if (t.defined() && t.shape() != shape) fail(std::string(name) + " must be " + layout);
}

void VariantInputs::same_dtype_and_device() const {
  const Tensor& q = (*this)["q"];
  const DType dt = q.dtype();
  if (!is_floating(dt)) fail(std::string("inputs must be f32, f64 or bf16, got ") + dtype_name(dt));
  for (const auto& [name, t] : inputs_) {
    if (!t.defined()) continue;
    if (t.dtype() != dt) {
      fail("inputs must share one dtype, got q " + std::string(dtype_name(dt)) + " and " + name + " " +
           dtype_name(t.dtype()));
    }
    if (t.device() != q.device()) fail("inputs are on different devices (q on " + q.device().str() + ", " + name +
                                       " on " + t.device().str() + ")");
  }
}

}  // namespace seqlab
