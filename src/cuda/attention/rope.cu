// CUDA side of the rotary-embedding slot declared in src/tensor/slots/attention/rope.h (the CPU kernel and the
// equations are in src/layers/attention/rope.cpp and rope.h). The kernels are in rope_kernels.cuh
// (tests/rope_emulation_test.cc runs them on the CPU against the CPU slot).
//
// Two launches, as the CPU kernel has two passes:
//   1. the [T, D/2] tables cos φ and ±sin φ, φ = (start + t)·θ_i, one thread per (t, i), the angle
//      and its cosine and sine computed in double (positions reach 1e5 and more, where an f32 angle
//      is off by a sizeable fraction of a radian), stored in the compute type (T, f32 for bf16).
//      θ_i = base^(−2i/D) is computed on the host with std::pow exactly as the CPU kernel does
//      (inverse_frequencies) and copied over, so both devices rotate by the same angles to the last bit;
//   2. y = R(±φ) x, one thread per adjacent pair (x_{2i}, x_{2i+1}) of the contiguous [B, T, H, D]
//      tensors, in a grid-stride loop, reading the pair's (t, i) entry of the tables.
// f32, f64 and bf16 (computed in f32, rounded on store: what the CPU slot does with bf16 through its
// f32 stand-ins; rope_rotate accepts all three, and this slot took only f32 and f64 before).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/attention/rope_kernels.cuh"
#include "cuda/runtime.h"
#include "tensor/slots/attention/rope.h"

namespace seqlab::cuda {
namespace {

using namespace rotary;  // the kernels (rope_kernels.cuh)

void rope_cuda(const Tensor& x, const RopeOptions& opts, bool inverse, const Tensor& y) {
  const int device = x.device().index;
  if (x.dim() != 4 || x.size(3) % 2 != 0 || !x.is_contiguous() || !y.is_contiguous() || x.shape() != y.shape() ||
      x.dtype() != y.dtype() || !y.device().is_cuda() || y.device().index != device) {
    throw std::logic_error("rope on CUDA: expected contiguous x and y [B, T, H, D] (D even) of one dtype on cuda:" +
                           std::to_string(device) + ", got x " + shape_str(x.shape()) + " " + dtype_name(x.dtype()) +
                           " and y " + shape_str(y.shape()) + " " + dtype_name(y.dtype()) + " on " + y.device().str());
  }
  const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3), P = D / 2;
  const int64_t pairs = B * Tn * H * P;
  if (pairs == 0) return;
  dispatch_floating(x.dtype(), "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const std::vector<double> theta = inverse_frequencies(opts.base, D);
    // Scratch (θ and the tables, in the compute type), returned to the allocator's cache at exit:
    // safe, since every later user of their blocks is queued after these kernels on the same stream.
    Tensor theta_dev = Tensor::empty({P}, DType::f64, x.device());
    Tensor cos_tab = Tensor::empty({Tn, P}, accumulate_dtype(x.dtype()), x.device());
    Tensor sin_tab = Tensor::empty({Tn, P}, accumulate_dtype(x.dtype()), x.device());
    A* c = static_cast<A*>(cos_tab.raw_data());
    A* s = static_cast<A*>(sin_tab.raw_data());
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    // From pageable memory: the call returns once `theta` has been staged, so it may go out of scope.
    SEQLAB_CUDA_CHECK(cudaMemcpyAsync(theta_dev.raw_data(), theta.data(), static_cast<size_t>(P) * sizeof(double),
                                      cudaMemcpyHostToDevice, st));
    rope_tables<A><<<blocks_for(Tn * P, device), kThreads, 0, st>>>(
        Tn, P, static_cast<const double*>(theta_dev.raw_data()), opts.start, inverse ? -1.0 : 1.0, c, s);
    SEQLAB_CUDA_CHECK_LAUNCH("rope tables kernel");
    rope_rotate_pairs<T><<<blocks_for(pairs, device), kThreads, 0, st>>>(
        pairs, Tn, H * P, P, c, s, static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()));
    SEQLAB_CUDA_CHECK_LAUNCH("rope rotation kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(rope_kernel, DeviceType::CUDA, &cuda::rope_cuda);
}  // namespace seqlab::kernel
