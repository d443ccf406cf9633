#include "tensor/device.h"

#include <cstdlib>
#include <new>
#include <stdexcept>

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

// 64-byte aligned host memory straight from the C library: malloc is already a caching
// allocator on the host, so no cache of our own.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    counter_.on_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    counter_.on_free(nbytes);
  }
  MemoryStats stats() const override { return counter_.snapshot(); }
  void reset_peak() override { counter_.reset_peak(); }

 private:
  MemoryCounter counter_;
};

DeviceBackend*& cuda_slot() {
  static DeviceBackend* backend = nullptr;
  return backend;
}

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

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
