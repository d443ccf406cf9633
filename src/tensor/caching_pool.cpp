#include "tensor/caching_pool.h"

#include <stdexcept>
#include <utility>

namespace seqlab {

size_t device_block_size(size_t nbytes) {
  if (nbytes <= 4096) return nbytes == 0 ? 512 : (nbytes + 511) / 512 * 512;
  const size_t octave = size_t{1} << (63 - __builtin_clzll(nbytes));
  const size_t unit = octave / 8;
  return (nbytes + unit - 1) / unit * unit;
}

size_t host_block_size(size_t nbytes) {
  if (nbytes == 0) return 64;
  const size_t unit = nbytes >= kHostCachedFrom ? 65536 : 64;
  return (nbytes + unit - 1) / unit * unit;
}

CachingPool::CachingPool(RawMemory& raw, SizeClasses classes, std::string device)
    : raw_(raw), classes_(classes), device_(std::move(device)) {}

size_t CachingPool::checked_block_size(size_t nbytes) const {
  const size_t size = classes_.block_size(nbytes);
  // Rounding up wraps around only for requests within one unit of SIZE_MAX.
  if (size < nbytes) {
    throw std::runtime_error("cannot allocate " + std::to_string(nbytes) + " bytes on " + device_ +
                             ": the request is larger than any block");
  }
  return size;
}

void* CachingPool::allocate(size_t nbytes) {
  const size_t size = checked_block_size(nbytes);
  void* p = nullptr;
  if (size >= classes_.cached_from) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= static_cast<int64_t>(size);
    } else {
      p = obtain_locked(size, nbytes, false);
    }
  } else {
    // Uncached blocks do not wait for each other: the raw memory is thread-safe itself.
    p = raw_.obtain(size);
    std::lock_guard<std::mutex> lock(mutex_);
    if (p) {
      reserved_ += static_cast<int64_t>(size);
    } else {
      p = obtain_locked(size, nbytes, true);
    }
  }
  counter_.on_alloc(nbytes);
  return p;
}

void* CachingPool::obtain_locked(size_t size, size_t nbytes, bool already_failed) {
  void* p = already_failed ? nullptr : raw_.obtain(size);
  if (!p && cached_ > 0) {
    release_cached_locked();  // make room, then try once more
    p = raw_.obtain(size);
  }
  if (!p) {
    throw std::runtime_error("out of memory on " + device_ + " allocating " + std::to_string(nbytes) + " bytes (a " +
                             std::to_string(size) + "-byte block; " + std::to_string(counter_.snapshot().live_bytes) +
                             " bytes live in tensors, " + std::to_string(reserved_) + " reserved)");
  }
  reserved_ += static_cast<int64_t>(size);
  return p;
}

void CachingPool::deallocate(void* ptr, size_t nbytes) {
  counter_.on_free(nbytes);
  const size_t size = classes_.block_size(nbytes);
  if (size < classes_.cached_from) {
    raw_.release(ptr, size);
    std::lock_guard<std::mutex> lock(mutex_);
    reserved_ -= static_cast<int64_t>(size);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  free_[size].push_back(ptr);
  cached_ += static_cast<int64_t>(size);
}

MemoryStats CachingPool::stats() const {
  MemoryStats s = counter_.snapshot();
  std::lock_guard<std::mutex> lock(mutex_);
  s.reserved_bytes = reserved_;
  return s;
}

void CachingPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

int64_t CachingPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

// Each block leaves the books as it is released, so a release that throws (a CUDA error) leaves
// the counts true for the blocks still cached.
void CachingPool::release_cached_locked() {
  for (auto& [size, blocks] : free_) {
    while (!blocks.empty()) {
      void* p = blocks.back();
      blocks.pop_back();
      cached_ -= static_cast<int64_t>(size);
      reserved_ -= static_cast<int64_t>(size);
      raw_.release(p, size);
    }
  }
}

}  // namespace seqlab
