// The caching logic shared by the host and the CUDA allocators, in plain host code so that the CPU
// tests exercise it: requests are rounded up to a size class, a freed block goes to its class's
// free list and serves the next request of that class, and raw memory (aligned_alloc, cudaMalloc)
// is asked for only when the list is empty. When raw memory runs out, the pool hands its cached
// blocks back and tries once more before it reports the failure. What differs per device is only
// the raw memory (RawMemory) and the size-class rule (SizeClasses).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/device.h"

namespace seqlab {

// Where a pool's blocks come from and go back to.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  // A block of `nbytes` (a size the pool's rule produced), or nullptr when the memory is exhausted;
  // any other failure throws.
  virtual void* obtain(size_t nbytes) = 0;
  // Returns a block that obtain(nbytes) gave.
  virtual void release(void* ptr, size_t nbytes) = 0;
};

// How requests map to blocks. block_size(n) ≥ n is the block (the size class) that serves a request
// of n bytes; blocks of cached_from bytes and more are kept on a free list when freed, smaller ones
// go straight back to the raw memory.
struct SizeClasses {
  size_t (*block_size)(size_t nbytes);
  size_t cached_from;
};

// Device memory: multiples of 512 bytes up to 4 KiB (0 bytes takes 512), then eight classes per
// octave [2^k, 2^(k+1)), i.e. multiples of 2^k / 8, at most 12.5% waste. Every block is cached.
size_t device_block_size(size_t nbytes);
inline SizeClasses device_size_classes() { return {&device_block_size, 0}; }

// Host memory, 64-byte aligned: multiples of 64 bytes (0 bytes takes 64) below 256 KiB and multiples
// of 64 KiB from there, so nearby large sizes share blocks. Blocks of 256 KiB and more are cached: a
// training step allocates the same activation sizes every step, and handing a large block back to
// the system would make the next step pay page faults to touch it again. Smaller blocks go straight
// back to malloc, which caches them itself.
inline constexpr size_t kHostCachedFrom = 256 * 1024;
size_t host_block_size(size_t nbytes);
inline SizeClasses host_size_classes() { return {&host_block_size, kHostCachedFrom}; }

// An Allocator over a RawMemory. Thread-safe. Statistics: live, peak and allocations count the
// bytes callers asked for; reserved_bytes counts whole blocks obtained from the raw memory and not
// yet released (live blocks plus cached ones).
//
// deallocate() calls the raw memory only for blocks the rule does not cache, so with a rule that
// caches everything (the device one) freeing never touches the device and never throws: Storage's
// destructor, which may run during static destruction, relies on it. Cached blocks go back to the
// raw memory only in empty_cache() and in the out-of-memory retry. The pool does not empty itself
// when destroyed: its owner calls empty_cache() if the raw memory is still usable then.
class CachingPool final : public Allocator {
 public:
  // `device` names the memory in the out-of-memory message ("cpu", "cuda:1").
  CachingPool(RawMemory& raw, SizeClasses classes, std::string device);
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // Throws std::runtime_error naming the device, the request, its block size and the live and
  // reserved bytes when the raw memory fails even after the cache was released.
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override;
  void reset_peak() override { counter_.reset_peak(); }

  // Returns every cached (free) block to the raw memory; live blocks are untouched.
  void empty_cache();
  int64_t cached_bytes() const;
  const SizeClasses& size_classes() const { return classes_; }

 private:
  size_t checked_block_size(size_t nbytes) const;
  void* obtain_locked(size_t size, size_t nbytes, bool already_failed);  // mutex_ held
  void release_cached_locked();                                          // mutex_ held

  RawMemory& raw_;
  const SizeClasses classes_;
  const std::string device_;
  MemoryCounter counter_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // block size → cached blocks of that size
  int64_t reserved_ = 0;                       // bytes obtained from raw_ and not released
  int64_t cached_ = 0;                         // of which on free_
};

}  // namespace seqlab
