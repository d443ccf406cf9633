// The CUDA DeviceBackend: device discovery, one stream per device, a caching device allocator and
// host/device copies. It registers itself when the library loads but touches the driver only on
// first use, so loading seqlab on a machine without a GPU costs nothing and prints nothing.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/runtime.h"
#include "tensor/caching_pool.h"
#include "tensor/device.h"

namespace seqlab::cuda {

void fail(cudaError_t err, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  SEQLAB_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) SEQLAB_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != device_) cudaSetDevice(previous_);  // a destructor must not throw; nothing to undo
}

namespace {

// cudaMalloc and cudaFree on one device: the raw memory under that device's CachingPool, which
// serves requests in the device size classes (caching_pool.h: multiples of 512 bytes up to 4 KiB,
// then eight classes per octave). The pool caches every block, so a freed block goes to its class's
// free list and serves the next request of its class: cudaMalloc runs only when that list is empty,
// and cudaFree only in empty_cache() or when cudaMalloc runs out and the pool makes room before
// trying once more. Freeing a tensor (Storage's destructor, maybe during static destruction) thus
// makes no CUDA call and never throws. See runtime.h for why reuse needs no event.
class DeviceMemory final : public RawMemory {
 public:
  explicit DeviceMemory(int device) : device_(device) {}

  void* obtain(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the failed call's error: the pool may retry, or reports it itself
      return nullptr;
    }
    SEQLAB_CUDA_CHECK(err);
    return p;
  }

  void release(void* ptr, size_t) override {
    DeviceGuard guard(device_);
    SEQLAB_CUDA_CHECK(cudaFree(ptr));
  }

 private:
  const int device_;
};

struct PerDevice {
  explicit PerDevice(int index)
      : memory(index), allocator(memory, device_size_classes(), "cuda:" + std::to_string(index)) {}
  DeviceMemory memory;
  CachingPool allocator;
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  int multiprocessors = 0;
};

std::string version_str(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// "800,900" as nvcc passes __CUDA_ARCH_LIST__ becomes "sm_80,sm_90".
std::string arch_list() {
#ifdef __CUDA_ARCH_LIST__
#define SEQLAB_STRINGIFY_ARGS(...) #__VA_ARGS__
#define SEQLAB_STRINGIFY(...) SEQLAB_STRINGIFY_ARGS(__VA_ARGS__)
  std::string list = SEQLAB_STRINGIFY(__CUDA_ARCH_LIST__), out;
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    out += (out.empty() ? "sm_" : ",sm_") + std::to_string(std::stoi(list.substr(start, end - start)) / 10);
    start = end + 1;
  }
  return out;
#else
  return "unknown";
#endif
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) is X*1000+Y*100+Z up to 2.8 and X*10000+Y*100+Z after.
  int major = v < 10000 ? v / 1000 : v / 10000, minor = v < 10000 ? v % 1000 / 100 : v % 10000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

class CudaBackend final : public DeviceBackend {
 public:
  bool available() const override { return device_count() > 0; }

  int device_count() const override {
    probe();
    return static_cast<int>(devices_.size());
  }

  Allocator& allocator(int index) override { return device(index).allocator; }

  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) override {
    if (nbytes == 0) return;
    if (dst_dev.is_cpu() && src_dev.is_cpu()) {
      std::memcpy(dst, src, nbytes);
    } else if (src_dev.is_cpu() || dst_dev.is_cpu()) {
      // Host memory is pageable and its owner may free it as soon as we return: wait for the copy.
      const int d = src_dev.is_cpu() ? dst_dev.index : src_dev.index;
      DeviceGuard guard(d);
      const cudaMemcpyKind kind = src_dev.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      SEQLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, cuda::stream(d)));
      SEQLAB_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(d)));
    } else if (src_dev.index == dst_dev.index) {
      DeviceGuard guard(dst_dev.index);
      SEQLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cuda::stream(dst_dev.index)));
    } else {
      // Two streams are involved: the source must be complete before, and may be reused after.
      synchronize(src_dev.index);
      DeviceGuard guard(dst_dev.index);
      SEQLAB_CUDA_CHECK(
          cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, cuda::stream(dst_dev.index)));
      synchronize(dst_dev.index);
    }
  }

  void synchronize(int index) override {
    DeviceGuard guard(index);
    SEQLAB_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(index)));
  }

  std::string describe() const override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    std::string s = "CUDA toolkit " + version_str(CUDART_VERSION) + " (runtime " + version_str(runtime) + ", driver " +
                    (driver > 0 ? version_str(driver) : std::string("none")) + "), architectures " + arch_list() +
                    ", NCCL " + nccl_version() + ", devices: " + std::to_string(device_count());
    if (devices_.empty()) return s + " (no usable GPU: " + probe_error_ + ")";
    s += " (";
    for (size_t i = 0; i < devices_.size(); ++i) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, static_cast<int>(i)) != cudaSuccess) continue;
      s += (i ? "; " : "") + std::to_string(i) + ": " + prop.name + ", sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB";
    }
    return s + ")";
  }

  int64_t available_bytes(int index) override {
    PerDevice& d = device(index);
    DeviceGuard guard(index);
    size_t free_bytes = 0, total_bytes = 0;
    SEQLAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Blocks the pool holds but no tensor uses serve new tensors before cudaMalloc runs again.
    const MemoryStats st = d.allocator.stats();
    return static_cast<int64_t>(free_bytes) + std::max<int64_t>(0, st.reserved_bytes - st.live_bytes);
  }

  PerDevice& device(int index) {
    const int n = device_count();
    if (index < 0 || index >= n) {
      throw std::out_of_range("cuda:" + std::to_string(index) + " does not exist: this machine has " +
                              std::to_string(n) + " usable CUDA device(s)" +
                              (n == 0 ? " (" + probe_error_ + ")" : std::string()));
    }
    return *devices_[static_cast<size_t>(index)];
  }

 private:
  // Counts devices once. Any error (no driver, driver too old, no device) means "no GPU".
  void probe() const {
    std::call_once(probed_, [this] {
      int n = 0;
      cudaError_t err = cudaGetDeviceCount(&n);
      if (err != cudaSuccess) {
        cudaGetLastError();
        probe_error_ = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
        return;
      }
      if (n == 0) probe_error_ = "no CUDA device found";
      for (int i = 0; i < n; ++i) devices_.push_back(std::make_unique<PerDevice>(i));
    });
  }

  mutable std::once_flag probed_;
  mutable std::string probe_error_;
  mutable std::vector<std::unique_ptr<PerDevice>> devices_;
};

// Never destroyed: tensors in static objects may return memory after other statics are gone, and
// freeing device memory while the CUDA runtime unloads at exit is an error.
CudaBackend& backend() {
  static CudaBackend* b = new CudaBackend;
  return *b;
}

[[maybe_unused]] const bool registered = (register_cuda_backend(&backend()), true);

}  // namespace

cudaStream_t stream(int device) {
  PerDevice& d = backend().device(device);
  std::call_once(d.stream_once, [&] {
    DeviceGuard guard(device);
    SEQLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    SEQLAB_CUDA_CHECK(cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  });
  return d.stream;
}

int multiprocessor_count(int device) {
  stream(device);
  return backend().device(device).multiprocessors;
}

void empty_cache() {
  CudaBackend& b = backend();
  for (int i = 0; i < b.device_count(); ++i) b.device(i).allocator.empty_cache();
}

}  // namespace seqlab::cuda
