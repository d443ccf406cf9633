#include "tensor/tensor.h"

#include <cmath>
#include <iomanip>
#include <locale>
#include <sstream>
#include <stdexcept>

#include "tensor/kernels.h"

namespace seqlab {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape strides(s.size());
  int64_t stride = 1;
  for (size_t i = s.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= s[i];
  }
  return strides;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() {
  if (data_) allocator_->deallocate(data_, nbytes_);
}

// ---- creation ----

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("Tensor::empty: negative dimension in shape " + shape_str(shape));
  }
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return make_view(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  kernel::fill_(t, value);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i);
  return from_vector(v, {n}, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
    throw std::invalid_argument("Tensor::from_vector: " + std::to_string(values.size()) +
                                " values do not fill shape " + shape_str(shape));
  }
  Tensor host = empty(shape, dtype, cpu_device());
  dispatch_any(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.raw_data());
    for (size_t i = 0; i < values.size(); ++i) p[i] = convert_scalar<T>(values[i]);
  });
  return device.is_cpu() ? host : kernel::to_device(host, device);
}

Tensor Tensor::from_indices(const std::vector<int64_t>& values, const Shape& shape, DType dtype, Device device) {
  if (!is_integer(dtype)) throw std::invalid_argument("Tensor::from_indices: dtype must be i32 or i64");
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
    throw std::invalid_argument("Tensor::from_indices: " + std::to_string(values.size()) +
                                " values do not fill shape " + shape_str(shape));
  }
  Tensor host = empty(shape, dtype, cpu_device());
  dispatch_index(dtype, "from_indices", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.raw_data());
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
  });
  return device.is_cpu() ? host : kernel::to_device(host, device);
}

// Three fields in a fixed order, each written by the standard stream operator of its type:
// "seqlab-generator-1 <engine> | <normal> | <uniform>". The distributions' operators set the
// precision they need (max_digits10) themselves; the classic locale keeps the numbers portable.
std::string Generator::state() const {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << "seqlab-generator-1 " << engine_ << " | " << normal_ << " | " << uniform_;
  return os.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream is(state);
  is.imbue(std::locale::classic());
  std::string tag, bar1, bar2;
  std::mt19937_64 engine;
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  is >> tag;
  if (tag != "seqlab-generator-1") {
    throw std::invalid_argument("Generator::set_state: not a generator state (expected it to start with "
                                "\"seqlab-generator-1\", got \"" + tag.substr(0, 40) + "\")");
  }
  is >> engine >> bar1 >> normal >> bar2 >> uniform;
  const bool parsed = !is.fail();
  std::string rest;
  is >> rest;  // nothing may follow
  if (!parsed || bar1 != "|" || bar2 != "|" || !rest.empty()) {
    throw std::invalid_argument("Generator::set_state: malformed generator state (" + std::to_string(state.size()) +
                                " characters)");
  }
  engine_ = engine;
  normal_ = normal;
  uniform_ = uniform;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, double stddev, Device device) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = gen.normal() * stddev;
  return from_vector(v, shape, dtype, device);
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, DType dtype, double lo, double hi, Device device) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = lo + (hi - lo) * gen.uniform();
  return from_vector(v, shape, dtype, device);
}

Tensor Tensor::make_view(std::shared_ptr<Storage> storage, const Shape& shape, const Shape& strides, int64_t offset,
                         DType dtype) {
  if (shape.size() != strides.size()) throw std::invalid_argument("make_view: shape and strides differ in rank");
  // Every reachable element must lie inside the storage.
  int64_t lo = offset, hi = offset;
  bool empty_view = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw std::invalid_argument("make_view: negative dimension in " + shape_str(shape));
    if (shape[i] == 0) empty_view = true;
    int64_t span = (shape[i] - 1) * strides[i];
    (span < 0 ? lo : hi) += span;
  }
  int64_t capacity = static_cast<int64_t>(storage->nbytes() / dtype_size(dtype));
  if (!empty_view && (lo < 0 || hi >= capacity)) {
    throw std::out_of_range("make_view: view " + shape_str(shape) + " strides " + shape_str(strides) + " offset " +
                            std::to_string(offset) + " exceeds a storage of " + std::to_string(capacity) +
                            " elements");
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.strides_ = strides;
  t.offset_ = offset;
  t.dtype_ = dtype;
  return t;
}

// ---- metadata ----

int64_t Tensor::size(int64_t d) const { return shape_[static_cast<size_t>(kernel::normalize_dim(d, dim(), "size"))]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) throw std::logic_error("raw_data() of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

void Tensor::check_element_type(DType requested) const {
  if (requested != dtype_) {
    throw std::invalid_argument(std::string("data<") + dtype_name(requested) + ">() on a " + dtype_name(dtype_) +
                                " tensor");
  }
}

// ---- host access ----

std::vector<double> Tensor::to_doubles() const {
  Tensor host = kernel::contiguous(device().is_cpu() ? *this : kernel::to_device(*this, cpu_device()));
  std::vector<double> out(static_cast<size_t>(numel()));
  dispatch_any(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.raw_data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = convert_scalar<double>(p[i]);
  });
  return out;
}

std::vector<int64_t> Tensor::to_indices() const {
  Tensor host = kernel::contiguous(device().is_cpu() ? *this : kernel::to_device(*this, cpu_device()));
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  dispatch_index(dtype_, "to_indices", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.raw_data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  });
  return out;
}

double Tensor::item() const {
  if (numel() != 1) throw std::invalid_argument("item() of a tensor with shape " + shape_str(shape_));
  return to_doubles()[0];
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.meta_.reset();
  return t;
}

// ---- printing ----

namespace {

void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape, size_t d, int64_t base,
               int64_t max_per_dim, bool integral, int indent) {
  const Shape strides = contiguous_strides(shape);
  if (d == shape.size()) {
    if (integral) {
      os << static_cast<int64_t>(v[static_cast<size_t>(base)]);
    } else {
      os << std::setprecision(6) << v[static_cast<size_t>(base)];
    }
    return;
  }
  os << "[";
  int64_t n = shape[d];
  bool elide = n > max_per_dim;
  int64_t head = elide ? max_per_dim / 2 : n;
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == head) {
      os << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(static_cast<size_t>(indent + 1), ' '));
      i = n - (max_per_dim - head);
    }
    print_rec(os, v, shape, d + 1, base + i * strides[d], max_per_dim, integral, indent + 1);
    if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(static_cast<size_t>(indent + 1), ' '));
  }
  os << "]";
}

}  // namespace

std::string Tensor::str(int64_t max_per_dim) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(";
  print_rec(os, to_doubles(), shape_, 0, 0, std::max<int64_t>(max_per_dim, 2), is_integer(dtype_), 7);
  os << ", shape=" << shape_str(shape_) << ", dtype=" << dtype_name(dtype_) << ", device=" << device().str() << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace seqlab
