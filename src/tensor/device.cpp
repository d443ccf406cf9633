#include "tensor/device.h"

#include <cstdlib>
#include <stdexcept>

#include "tensor/caching_pool.h"

namespace seqlab {

void MemoryCounter::on_alloc(size_t n) {
  int64_t live = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  count_.fetch_add(1);
  int64_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
}

void MemoryCounter::on_free(size_t n) { live_.fetch_sub(static_cast<int64_t>(n)); }

MemoryStats MemoryCounter::snapshot() const {
  MemoryStats s;
  s.live_bytes = live_.load();
  s.peak_bytes = peak_.load();
  s.allocations = count_.load();
  s.reserved_bytes = s.live_bytes;
  return s;
}

namespace {

// 64-byte aligned host memory from the C library, under a CachingPool with the host size classes
// (caching_pool.h: which sizes are cached and why).
class HostMemory final : public RawMemory {
 public:
  void* obtain(size_t nbytes) override { return std::aligned_alloc(64, nbytes); }  // nbytes: a multiple of 64
  void release(void* ptr, size_t) override { std::free(ptr); }
};

// The host allocator: the pool and the memory under it. Its cache goes back to the system at exit.
struct CpuAllocator {
  ~CpuAllocator() { pool.empty_cache(); }
  HostMemory memory;
  CachingPool pool{memory, host_size_classes(), "cpu"};
};

CpuAllocator& cpu_allocator_instance() {
  static CpuAllocator a;
  return a;
}

DeviceBackend*& cuda_slot() {
  static DeviceBackend* backend = nullptr;
  return backend;
}

}  // namespace

Allocator& cpu_allocator() { return cpu_allocator_instance().pool; }
void cpu_empty_cache() { cpu_allocator_instance().pool.empty_cache(); }

void register_cuda_backend(DeviceBackend* backend) { cuda_slot() = backend; }
DeviceBackend* cuda_backend() { return cuda_slot(); }
bool cuda_available() { return cuda_slot() != nullptr && cuda_slot()->available(); }

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  if (!cuda_slot()) throw std::runtime_error("this build of seqlab has no CUDA backend (configured without CUDA)");
  if (!cuda_slot()->available()) throw std::runtime_error("no usable CUDA device: " + cuda_slot()->describe());
  return cuda_slot()->allocator(d.index);
}

}  // namespace seqlab
