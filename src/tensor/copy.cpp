// Copies, fills and conversions, within a device and across devices.
#include <stdexcept>

#include "tensor/kernels.h"

namespace seqlab::kernel {

void fill_(const Tensor& dst, double value) {
  if (dst.is_contiguous()) {
    fill_kernel(dst.device(), dst, value);
  } else {
    Tensor tmp = Tensor::full(dst.shape(), value, dst.dtype(), dst.device());
    copy_(dst, tmp);
  }
}

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.shape() != src.shape()) {
    // Allow broadcasting the source into the destination.
    copy_(dst, expand(src, dst.shape()));
    return;
  }
  if (dst.device() == src.device()) {
    copy_kernel(dst.device(), dst, src);
    return;
  }
  // Across devices: bring src to a contiguous block of dst's dtype on its own device, move the
  // bytes, then scatter into dst's view on its device.
  Tensor packed = contiguous(to_dtype(src, dst.dtype()));
  DeviceBackend* backend = cuda_backend();
  if (!backend) throw std::runtime_error("copy between devices in a build without CUDA");
  if (dst.is_contiguous()) {
    backend->copy(dst.raw_data(), dst.device(), packed.raw_data(), packed.device(), packed.nbytes());
    return;
  }
  Tensor landed = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  backend->copy(landed.raw_data(), landed.device(), packed.raw_data(), packed.device(), packed.nbytes());
  copy_kernel(dst.device(), dst, landed);
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_kernel(x.device(), out, x);
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) { return view(contiguous(x), shape); }

Tensor clone(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_kernel(x.device(), out, x);
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  copy_kernel(x.device(), out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  copy_(out, x);
  return out;
}

}  // namespace seqlab::kernel

namespace seqlab::bf16_on_cpu {

Tensor Widening::widen(const Tensor& t) {
  if (!is_bf16(t)) return t;
  for (const auto& [original, standin] : originals_and_standins_) {
    if (original.storage() == t.storage() && original.offset() == t.offset() && original.shape() == t.shape() &&
        original.strides() == t.strides()) {
      return standin;
    }
  }
  Tensor standin = kernel::to_dtype(t, DType::f32);
  originals_and_standins_.emplace_back(t, standin);
  return standin;
}

// Every original is rounded back except broadcast views (a stride of 0 over more than one element),
// which are never outputs and would be written repeatedly. Rounding back an input's unchanged
// stand-in gives back its own bits, so inputs are left as they were.
void Widening::narrow_back() {
  for (const auto& [original, standin] : originals_and_standins_) {
    bool broadcast = false;
    for (int64_t d = 0; d < original.dim(); ++d) broadcast |= original.strides()[d] == 0 && original.size(d) > 1;
    if (!broadcast) kernel::copy_kernel(original.device(), original, standin);
  }
}

}  // namespace seqlab::bf16_on_cpu
