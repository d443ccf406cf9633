#include "tensor/device.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>
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

// 64-byte aligned host memory. Blocks of 256 KiB and more are cached by size and reused: a
// training step allocates the same activation sizes every step, and handing a large block back
// to the system would make the next step pay page faults to touch it again. Small blocks go
// straight to malloc, which caches them itself.
class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override { release_cache(); }

  void* allocate(size_t nbytes) override {
    const size_t size = block_size(nbytes);
    void* p = nullptr;
    if (size >= kCachedFrom) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(size);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= static_cast<int64_t>(size);
      }
    }
    if (!p) p = std::aligned_alloc(64, size);
    if (!p) throw std::bad_alloc();
    counter_.on_alloc(nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    counter_.on_free(nbytes);
    const size_t size = block_size(nbytes);
    if (size < kCachedFrom) {
      std::free(ptr);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    cache_[size].push_back(ptr);
    cached_bytes_ += static_cast<int64_t>(size);
  }

  MemoryStats stats() const override {
    MemoryStats s = counter_.snapshot();
    std::lock_guard<std::mutex> lock(mutex_);
    s.reserved_bytes = s.live_bytes + cached_bytes_;
    return s;
  }
  void reset_peak() override { counter_.reset_peak(); }

  void release_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : cache_) {
      for (void* p : blocks) std::free(p);
    }
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  static constexpr size_t kCachedFrom = 256 * 1024;
  // Multiples of 64 bytes below the cached range; multiples of 64 KiB inside it, so nearby sizes
  // share blocks.
  static size_t block_size(size_t nbytes) {
    if (nbytes == 0) return 64;
    size_t unit = nbytes >= kCachedFrom ? 65536 : 64;
    return (nbytes + unit - 1) / unit * unit;
  }

  MemoryCounter counter_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> cache_;
  int64_t cached_bytes_ = 0;
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

Allocator& cpu_allocator() { return cpu_allocator_instance(); }
void cpu_empty_cache() { cpu_allocator_instance().release_cache(); }

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
