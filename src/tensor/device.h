// Devices, allocators with memory accounting, and the backend interface through which the CUDA
// backend (src/cuda) plugs in without any #ifdef in tensor or op code.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace seqlab {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

inline Device cpu_device() { return Device{DeviceType::CPU, 0}; }
inline Device cuda_device(int index = 0) { return Device{DeviceType::CUDA, index}; }

// Live and peak bytes handed out by an allocator (what tensors hold, not what a cache reserves).
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;    // calls to allocate since start
  int64_t reserved_bytes = 0; // bytes held from the system: live plus what the allocator caches
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
};

// Bookkeeping shared by allocators: thread-safe live/peak counters.
class MemoryCounter {
 public:
  void on_alloc(size_t n);
  void on_free(size_t n);
  MemoryStats snapshot() const;
  void reset_peak() { peak_.store(live_.load()); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, count_{0};
};

Allocator& cpu_allocator();
void cpu_empty_cache();  // returns cached host blocks to the system

// What a device backend provides to the tensor layer. The CPU backend is built in; the CUDA
// backend registers itself at load time when the library was compiled with CUDA.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual bool available() const = 0;      // a usable device is present
  virtual int device_count() const = 0;
  virtual Allocator& allocator(int index) = 0;
  // Copies nbytes between host and device memory of this backend (either side may be the host).
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) = 0;
  virtual void synchronize(int index) = 0;
  virtual std::string describe() const = 0;  // toolkit version, architectures, library versions
  // Bytes that allocations on device `index` can still obtain: free device memory plus what the
  // allocator caches unused.
  virtual int64_t available_bytes(int index) = 0;
};

void register_cuda_backend(DeviceBackend* backend);
// The CUDA backend, or nullptr when this build has none.
DeviceBackend* cuda_backend();
// True when this build has CUDA and a GPU is present and usable.
bool cuda_available();
Allocator& allocator_for(Device d);

// Bytes that new tensors on `d` can still obtain, as far as the system tells: for the host,
// MemAvailable of /proc/meminfo, capped by the room left under the process's cgroup memory limit
// (memory.max − memory.current) where one is set; for a GPU, the backend's available_bytes. -1 when
// it cannot be told. What the size checks before allocation compare an estimate with.
int64_t available_memory(Device d);

}  // namespace seqlab
