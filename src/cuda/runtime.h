// The CUDA runtime as the rest of src/cuda sees it: checked calls, the current-device guard, the
// one stream per device and the caching allocator's cache. Included only by code that nvcc or the
// CUDA headers compile; the tensor layer reaches all of this through DeviceBackend (tensor/device.h).
//
// Ordering rule: every kernel, copy and (later) cuBLAS/NCCL call on device d is issued on stream(d).
// Because there is exactly one stream per device, a block returned to the allocator's cache can be
// handed to the next tensor at once: any kernel that still reads the old tensor was queued earlier
// on the same stream and finishes before the new owner's kernels start.
#pragma once

#include <cuda_runtime.h>

namespace seqlab::cuda {

// Throws std::runtime_error naming the call, file:line and CUDA's own name and description of err.
[[noreturn]] void fail(cudaError_t err, const char* call, const char* file, int line);
inline void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) fail(err, call, file, line);
}

}  // namespace seqlab::cuda

#define SEQLAB_CUDA_CHECK(call) ::seqlab::cuda::check((call), #call, __FILE__, __LINE__)
// After a <<<...>>> launch: a bad configuration (or an earlier asynchronous fault) surfaces here.
// `what` (a const char*) names the launch in the message.
#define SEQLAB_CUDA_CHECK_LAUNCH(what) ::seqlab::cuda::check(cudaGetLastError(), (what), __FILE__, __LINE__)

namespace seqlab::cuda {

// Makes `device` current for this thread for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

// The stream all work on `device` goes to (created on first use, never destroyed).
cudaStream_t stream(int device);
int multiprocessor_count(int device);
// Returns every cached (free) device block of every device to the driver. Live tensors keep theirs.
void empty_cache();

}  // namespace seqlab::cuda
