// The CUDA DeviceBackend: device discovery, one stream per device, a caching device allocator and
// host/device copies. It registers itself when the library loads but touches the driver only on
// first use, so loading seqlab on a machine without a GPU costs nothing and prints nothing.
#include <nccl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/runtime.h"
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

// Device memory in size classes: multiples of 512 bytes up to 4 KiB, then eight classes per octave
// (at most 12.5% waste). A freed block goes to a per-class free list and serves the next request of
// its class; cudaMalloc is called only when the list is empty, and cudaFree only by empty_cache()
// or to make room when cudaMalloc runs out. See runtime.h for why reuse needs no event.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    const size_t size = block_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= size;
    } else {
      p = device_malloc(size);
      reserved_ += size;
    }
    counter_.on_alloc(nbytes);
    return p;
  }

  // Runs in Storage's destructor (maybe during static destruction): no CUDA call, no throw.
  void deallocate(void* ptr, size_t nbytes) override {
    counter_.on_free(nbytes);
    const size_t size = block_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(ptr);
    cached_ += size;
  }

  MemoryStats stats() const override {
    MemoryStats s = counter_.snapshot();
    std::lock_guard<std::mutex> lock(mutex_);
    s.reserved_bytes = static_cast<int64_t>(reserved_);
    return s;
  }
  void reset_peak() override { counter_.reset_peak(); }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached();
  }

 private:
  static size_t block_size(size_t nbytes) {
    if (nbytes <= 4096) return nbytes == 0 ? 512 : (nbytes + 511) / 512 * 512;
    size_t octave = size_t{1} << (63 - __builtin_clzll(nbytes));
    size_t unit = octave / 8;
    return (nbytes + unit - 1) / unit * unit;
  }

  // cudaMalloc; on failure, hands the cache back to the driver and tries once more.
  void* device_malloc(size_t size) {
    DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && cached_ > 0) {
      cudaGetLastError();  // clear the failed call's error before retrying
      release_cached();
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::runtime_error("CUDA out of memory on cuda:" + std::to_string(device_) + " allocating " +
                               std::to_string(size) + " bytes (" + std::to_string(counter_.snapshot().live_bytes) +
                               " bytes live in tensors, " + std::to_string(reserved_) + " reserved)");
    }
    SEQLAB_CUDA_CHECK(err);
    return p;
  }

  void release_cached() {  // mutex_ held
    if (cached_ == 0) return;
    DeviceGuard guard(device_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) SEQLAB_CUDA_CHECK(cudaFree(p));
      reserved_ -= size * blocks.size();
      blocks.clear();
    }
    cached_ = 0;
  }

  const int device_;
  MemoryCounter counter_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
  size_t reserved_ = 0;  // bytes obtained from cudaMalloc and not yet freed
  size_t cached_ = 0;    // of which in free_
};

struct PerDevice {
  explicit PerDevice(int index) : allocator(index) {}
  CudaAllocator allocator;
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
