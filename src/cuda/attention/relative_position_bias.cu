// CUDA side of T5's relative position bias slots declared in src/tensor/slots/attention/relative_position_bias.h
// (the CPU kernels, the entry point that checks shapes and options, and the op are in
// src/layers/attention/relative_position_bias.cpp and .h). The kernels are in relative_position_bias_kernels.cuh
// (tests/relative_position_bias_emulation_test.cc runs them on the CPU against the CPU slots).
//
//   table [NB, H] -> bias [1, H, T, S]:  bias[0, h, i, j] = table[bucket(j − i), h]
//   dbias [1, H, T, S] -> dtable [NB, H]:  dtable[b, h] = Σ_{(i, j): bucket(j − i) = b} dbias[0, h, i, j]
//
// The bucket depends only on the diagonal d = j − i (rel = d − (S − T)), so there are T + S − 1 of them to
// compute. They are computed on the host (diagonal_buckets, the log in float32 with std::log as the CPU
// kernels do) and copied over: T5's bucketing truncates a float32 log expression, which lands exactly on
// an integer at powers of two (distance 16 of the default 32 buckets and max_distance 128 gives exactly
// 2.0), where a device log one ulp off would move the distance into the neighbouring bucket.
// Launches:
//   forward: one thread per bias element (grid-stride), bias = table[bucket, h] (a copy, any dtype);
//   backward, deterministic (no atomics), in the compute type (f32 for bf16, f64 for f64):
//     1. per (head, chunk of 32 diagonals), the sum of each diagonal of dbias, rows split over 4 warps and
//        their partial sums added in warp order;
//     2. per (bucket, head), the sum of its diagonals' sums in increasing d, rounded once to the dtype.
// f32, f64 and bf16 (the table's dtype, which the bias and the gradients share).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/attention/relative_position_bias_kernels.cuh"
#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "tensor/slots/attention/relative_position_bias.h"

namespace seqlab::cuda {
namespace {

using namespace relative_position;  // the kernels (relative_position_bias_kernels.cuh)

// table (or dtable) [NB, H] and bias (or dbias) [1, H, T, S]: contiguous, one floating dtype, on one CUDA
// device, NB = num_buckets (the entry point checks these; a mismatch here is a caller's bug).
void check_call(const char* op, const Tensor& table, const Tensor& bias, const kernel::RelativePositionParams& p) {
  const bool ok = table.dim() == 2 && table.size(0) == p.num_buckets && bias.dim() == 4 && bias.size(0) == 1 &&
                  bias.size(1) == table.size(1) && bias.size(2) == p.T && bias.size(3) == p.S &&
                  table.is_contiguous() && bias.is_contiguous() && table.dtype() == bias.dtype() &&
                  table.device().is_cuda() && table.device() == bias.device();
  if (!ok) {
    throw std::logic_error(std::string(op) + " on CUDA: expected contiguous table [" + std::to_string(p.num_buckets) +
                           ", H] and bias [1, H, " + std::to_string(p.T) + ", " + std::to_string(p.S) +
                           "] of one dtype on one CUDA device, got " + shape_str(table.shape()) + " " +
                           dtype_name(table.dtype()) + " on " + table.device().str() + " and " +
                           shape_str(bias.shape()) + " " + dtype_name(bias.dtype()) + " on " + bias.device().str());
  }
}

// The diagonals' buckets (diagonal_buckets) in a device scratch tensor [T + S − 1] (i32), returned to the
// allocator's cache when the caller drops it: safe, since every later user of its block is queued after the
// kernels that read it on the same stream.
Tensor device_buckets(const kernel::RelativePositionParams& p, Device device) {
  const std::vector<int32_t> host = diagonal_buckets(p.bidirectional, p.num_buckets, p.max_distance, p.T, p.S);
  Tensor buckets = Tensor::empty({static_cast<int64_t>(host.size())}, DType::i32, device);
  if (!host.empty()) {
    // From pageable memory: the call returns once `host` has been staged, so it may go out of scope.
    SEQLAB_CUDA_CHECK(cudaMemcpyAsync(buckets.raw_data(), host.data(), host.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream(device.index)));
  }
  return buckets;
}

void forward_cuda(const Tensor& table, const kernel::RelativePositionParams& p, const Tensor& bias) {
  check_call("relative_position_bias", table, bias, p);
  const int device = table.device().index;
  const int64_t H = table.size(1), n = H * p.T * p.S;
  DeviceGuard guard(device);
  const Tensor buckets = device_buckets(p, table.device());  // (checks the options, also when n = 0)
  if (n == 0) return;
  dispatch_floating(table.dtype(), "relative_position_bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    relative_position_bias_fwd<T><<<blocks_for(n, device), kThreads, 0, stream(device)>>>(
        H, p.T, p.S, buckets.data<int32_t>(), cptr<T>(table), mptr<T>(bias));
    SEQLAB_CUDA_CHECK_LAUNCH("relative_position_bias forward kernel");
  });
}

void backward_cuda(const Tensor& dbias, const kernel::RelativePositionParams& p, const Tensor& dtable) {
  check_call("relative_position_bias backward", dtable, dbias, p);
  const int device = dtable.device().index;
  const int64_t H = dtable.size(1), NB = p.num_buckets, diagonals = p.T > 0 && p.S > 0 ? p.T + p.S - 1 : 0;
  DeviceGuard guard(device);
  cudaStream_t st = stream(device);
  const Tensor buckets = device_buckets(p, dtable.device());
  if (NB * H == 0) return;
  if (diagonals == 0) {  // an empty bias: every bucket's gradient is 0
    SEQLAB_CUDA_CHECK(cudaMemsetAsync(dtable.raw_data(), 0, dtable.nbytes(), st));
    return;
  }
  if (H > 65535) {  // heads are the diagonal kernel's grid.y
    throw std::invalid_argument("relative_position_bias backward on CUDA: up to 65535 heads are supported, got " +
                                std::to_string(H));
  }
  dispatch_floating(dtable.dtype(), "relative_position_bias backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    // diag [H, T + S − 1] in the compute type (scratch, returned to the cache as the buckets are).
    Tensor diag = Tensor::empty({H, diagonals}, dtype_of_compute<A>(), dtable.device());
    const dim3 grid(static_cast<unsigned>((diagonals + 31) / 32), static_cast<unsigned>(H));
    relative_position_bias_diagonals<T><<<grid, kDiagonalThreads, 0, st>>>(p.T, p.S, cptr<T>(dbias), mptr<A>(diag));
    SEQLAB_CUDA_CHECK_LAUNCH("relative_position_bias backward diagonal kernel");
    relative_position_bias_buckets<T><<<blocks_for(NB * H, device), kThreads, 0, st>>>(
        NB, H, diagonals, buckets.data<int32_t>(), cptr<A>(diag), mptr<T>(dtable));
    SEQLAB_CUDA_CHECK_LAUNCH("relative_position_bias backward bucket kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(relative_position_bias_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(relative_position_bias_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
