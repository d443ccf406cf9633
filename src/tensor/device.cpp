#include "tensor/device.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace {

// The first number in `path` (bytes), or -1 when the file is missing or holds no number ("max").
int64_t number_in_file(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

int64_t host_available_bytes() {
  int64_t available = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long kib = 0;
    while (std::fscanf(f, "%63s %lld kB", key, &kib) == 2) {
      if (std::strcmp(key, "MemAvailable:") == 0) {
        available = static_cast<int64_t>(kib) * 1024;
        break;
      }
    }
    std::fclose(f);
  }
  if (available < 0) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = static_cast<int64_t>(pages) * page;
  }
  // A container's limit (cgroup v2) can be far below what the machine has free.
  const int64_t limit = number_in_file("/sys/fs/cgroup/memory.max");
  const int64_t used = number_in_file("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    const int64_t room = limit > used ? limit - used : 0;
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

}  // namespace

int64_t available_memory(Device d) {
  if (d.is_cpu()) return host_available_bytes();
  if (!cuda_slot() || !cuda_slot()->available()) return -1;
  return cuda_slot()->available_bytes(d.index);
}

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  if (!cuda_slot()) throw std::runtime_error("this build of seqlab has no CUDA backend (configured without CUDA)");
  if (!cuda_slot()->available()) throw std::runtime_error("no usable CUDA device: " + cuda_slot()->describe());
  return cuda_slot()->allocator(d.index);
}

}  // namespace seqlab
