// Tensor: a view (shape, strides in elements, offset) over reference-counted storage.
//
// The tensor layer knows nothing of gradients. A tensor carries one opaque slot, AutogradMeta,
// that the autograd layer (src/autograd) fills and reads through its own free functions
// (requires_grad, set_requires_grad, grad_of, backward: src/autograd/variable.h). Differentiable operations are free functions in namespace seqlab
// (src/autograd/ops.h); raw, non-recording kernels are in namespace seqlab::kernel
// (src/tensor/kernels.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace seqlab {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// One allocation on one device. Freed through its allocator when the last view goes away.
class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

struct AutogradMeta;  // src/autograd/variable.h

// Deterministic random source for initialisation, dropout and tests. One seed gives one stream.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  double normal() { return normal_(engine_); }
  double uniform() { return uniform_(engine_); }  // [0, 1)
  uint64_t next_u64() { return engine_(); }
  std::mt19937_64& engine() { return engine_; }

  // The whole state as text: the engine, and both distributions (the normal one caches the spare
  // of each pair it draws), so a generator given this state by set_state continues the stream
  // draw for draw. Used to checkpoint dropout for an exact resume.
  std::string state() const;
  // Throws std::invalid_argument when `state` is not text that state() wrote.
  void set_state(const std::string& state);

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  // ---- creation (all contiguous) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = cpu_device());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = cpu_device());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = cpu_device());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = cpu_device());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = cpu_device());
  static Tensor arange(int64_t n, DType dtype = DType::i64, Device device = cpu_device());
  // Standard normal times `stddev`, or uniform in [lo, hi), drawn on the CPU in row-major order.
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, double stddev = 1.0,
                      Device device = cpu_device());
  static Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32, double lo = 0.0,
                     double hi = 1.0, Device device = cpu_device());
  // From host values, converted to `dtype`.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32,
                            Device device = cpu_device());
  static Tensor from_indices(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64,
                             Device device = cpu_device());

  // A view over existing storage. Checks that every reachable element lies inside it.
  static Tensor make_view(std::shared_ptr<Storage> storage, const Shape& shape, const Shape& strides,
                          int64_t offset, DType dtype);

  // ---- metadata ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : cpu_device(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // Pointer to the first element of the view (not of the storage).
  void* raw_data() const;
  template <class T>
  T* data() const {
    check_element_type(dtype_of<T>::value);
    return static_cast<T*>(raw_data());
  }

  // ---- host access (copies from the device when needed) ----
  double item() const;                       // a one-element tensor as double
  std::vector<double> to_doubles() const;    // all elements in row-major order
  std::vector<int64_t> to_indices() const;   // integer tensor, row-major order

  // A tensor sharing this storage and view, with no autograd history.
  Tensor detach() const;
  std::string str(int64_t max_per_dim = 6) const;  // readable printing, elided beyond max_per_dim

  // The autograd layer's slot (src/autograd/variable.h reads and writes it; this layer never does).
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return meta_; }
  std::shared_ptr<AutogradMeta>& mutable_autograd_meta() { return meta_; }

 private:
  void check_element_type(DType requested) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
  std::shared_ptr<AutogradMeta> meta_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace seqlab
