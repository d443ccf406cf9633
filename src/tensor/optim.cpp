// The entry points of the optimizer's slots that are more than a slot call (src/tensor/slots/optim.h).
#include <stdexcept>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/slots/optim.h"

namespace seqlab::kernel {

double squared_norm(const Tensor& x) { return squared_norm(std::vector<Tensor>{x}); }

double squared_norm(const std::vector<Tensor>& xs) {
  if (xs.empty()) return 0.0;
  const Device device = xs[0].device();
  // One f64 slot per tensor on their device, filled by queued kernels, then one copy back.
  Tensor sums = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::f64, device);
  for (const Tensor& x : xs) {
    if (x.device() != device) {
      throw std::invalid_argument("squared_norm: tensors on " + device.str() + " and " + x.device().str());
    }
  }
  if (device.is_cpu() && sum_squares_multi_kernel.has(DeviceType::CPU)) {
    // All of them in one call (the same sums, one parallel region).
    std::vector<Tensor> dense;
    for (const Tensor& x : xs) dense.push_back(contiguous(x));
    sum_squares_multi_kernel(device, dense, sums);
  } else {
    for (size_t i = 0; i < xs.size(); ++i) {
      sum_squares_kernel(device, contiguous(xs[i]), narrow(sums, 0, static_cast<int64_t>(i), 1));
    }
  }
  double total = 0.0;
  for (double v : to_device(sums, cpu_device()).to_doubles()) total += v;
  return total;
}

}  // namespace seqlab::kernel
