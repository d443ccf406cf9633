// CUDA side of the rotary-embedding slot declared in src/layers/rope.h (the CPU kernel and the
// equations are in src/layers/rope.cpp and rope.h).
//
// Two launches, as the CPU kernel has two passes:
//   1. the [T, D/2] tables cos φ and ±sin φ, φ = (start + t)·θ_i, one thread per (t, i), the angle
//      and its cosine and sine computed in double (positions reach 1e5 and more, where an f32 angle
//      is off by a sizeable fraction of a radian), stored in the element type T. θ_i = base^(−2i/D)
//      is computed on the host with std::pow exactly as the CPU kernel does and copied over, so both
//      devices rotate by the same angles to the last bit;
//   2. y = R(±φ) x, one thread per adjacent pair (x_{2i}, x_{2i+1}) of the contiguous [B, T, H, D]
//      tensors, in a grid-stride loop, reading the pair's (t, i) entry of the tables.
// f32 and f64 only, like the CPU kernel (rope_rotate rejects other dtypes before the slot).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "layers/rope.h"

namespace seqlab::cuda {
namespace {

// For j = t·P + i < T·P:  φ = (start + t)·θ_i (in double, θ [P] from the host);
//   cos_t[j] = cos φ,  sin_t[j] = sign · sin φ  (sign = −1 for the inverse rotation), rounded to T.
// Writes the two [T, P] tables once; reads θ (P doubles) from cache.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_tables(int64_t Tn, int64_t P, const double* theta, int64_t start, double sign, T* cos_t, T* sin_t) {
  const int64_t n = Tn * P;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) {
    const int64_t t = j / P, i = j - t * P;
    const double phi = static_cast<double>(start + t) * theta[i];
    cos_t[j] = static_cast<T>(cos(phi));
    sin_t[j] = static_cast<T>(sign * sin(phi));
  }
}

// For every pair j < B·T·H·P of x, y [B, T, H, D] (pair j is elements 2j and 2j+1; i = j mod P,
// t = (j / (H·P)) mod T), with c = cos_t[t, i], s = sin_t[t, i]:
//   y_{2j} = x_{2j} c − x_{2j+1} s,   y_{2j+1} = x_{2j} s + x_{2j+1} c.
// Reads x once and the small tables once per pair (from cache); writes y once.
template <class T>
__global__ void __launch_bounds__(kThreads) rope_rotate_pairs(int64_t pairs, int64_t Tn, int64_t HP, int64_t P,
                                                               const T* cos_t, const T* sin_t, const T* x, T* y) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < pairs; j += step) {
    const int64_t i = j % P, t = (j / HP) % Tn;
    const T c = cos_t[t * P + i], s = sin_t[t * P + i];
    const T x0 = x[2 * j], x1 = x[2 * j + 1];
    y[2 * j] = x0 * c - x1 * s;
    y[2 * j + 1] = x0 * s + x1 * c;
  }
}

void rope_cuda(const Tensor& x, const RopeOptions& opts, bool inverse, const Tensor& y) {
  const int device = x.device().index;
  if (x.dim() != 4 || x.size(3) % 2 != 0 || !x.is_contiguous() || !y.is_contiguous() || x.shape() != y.shape() ||
      x.dtype() != y.dtype() || !y.device().is_cuda() || y.device().index != device) {
    throw std::logic_error("rope on CUDA: expected contiguous x and y [B, T, H, D] (D even) of one dtype on cuda:" +
                           std::to_string(device) + ", got x " + shape_str(x.shape()) + " " + dtype_name(x.dtype()) +
                           " and y " + shape_str(y.shape()) + " " + dtype_name(y.dtype()) + " on " +
                           y.device().str());
  }
  const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3), P = D / 2;
  const int64_t pairs = B * Tn * H * P;
  if (pairs == 0) return;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<double> theta(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) {
      theta[static_cast<size_t>(i)] = std::pow(opts.base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    }
    // Scratch (θ and the tables), returned to the allocator's cache at exit: safe, since every later
    // user of their blocks is queued after these kernels on the same stream.
    Tensor theta_dev = Tensor::empty({P}, DType::f64, x.device());
    Tensor cos_tab = Tensor::empty({Tn, P}, x.dtype(), x.device());
    Tensor sin_tab = Tensor::empty({Tn, P}, x.dtype(), x.device());
    T* c = static_cast<T*>(cos_tab.raw_data());
    T* s = static_cast<T*>(sin_tab.raw_data());
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    // From pageable memory: the call returns once `theta` has been staged, so it may go out of scope.
    SEQLAB_CUDA_CHECK(cudaMemcpyAsync(theta_dev.raw_data(), theta.data(), static_cast<size_t>(P) * sizeof(double),
                                      cudaMemcpyHostToDevice, st));
    rope_tables<T><<<blocks_for(Tn * P, device), kThreads, 0, st>>>(
        Tn, P, static_cast<const double*>(theta_dev.raw_data()), opts.start, inverse ? -1.0 : 1.0, c, s);
    SEQLAB_CUDA_CHECK_LAUNCH("rope tables kernel");
    rope_rotate_pairs<T><<<blocks_for(pairs, device), kThreads, 0, st>>>(
        pairs, Tn, H * P, P, c, s, static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("rope rotation kernel");
  };
  switch (x.dtype()) {
    case DType::f32:
      return run(Tag<float>{});
    case DType::f64:
      return run(Tag<double>{});
    default:
      throw std::invalid_argument(std::string("rope on CUDA: x must be f32 or f64, got ") + dtype_name(x.dtype()));
  }
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(rope_kernel, DeviceType::CUDA, &cuda::rope_cuda);
}  // namespace seqlab::kernel
