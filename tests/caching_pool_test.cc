// CachingPool, the caching logic under both the host and the CUDA allocators, over a fake raw memory
// that records every call and runs out where told; then the real host allocator built on it.
#include "tensor/caching_pool.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/device.h"

namespace seqlab {
namespace {

// Hands out distinct made-up addresses (never dereferenced) up to `capacity` bytes held at once,
// and records each call. Thread-safe, like the raw memories it stands in for.
class FakeMemory final : public RawMemory {
 public:
  explicit FakeMemory(size_t capacity = std::numeric_limits<size_t>::max()) : capacity_(capacity) {}

  void* obtain(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    obtains_.push_back(nbytes);
    if (nbytes > capacity_ - held_) {
      ++failures_;
      return nullptr;
    }
    held_ += nbytes;
    void* p = reinterpret_cast<void*>(next_);
    next_ += nbytes + 64;
    blocks_[p] = nbytes;
    return p;
  }

  void release(void* ptr, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    EXPECT_NE(it, blocks_.end()) << "released a block it never gave";
    if (it == blocks_.end()) return;
    EXPECT_EQ(it->second, nbytes) << "released with another size than it was obtained with";
    held_ -= it->second;
    blocks_.erase(it);
    releases_.emplace_back(ptr, nbytes);
  }

  std::vector<size_t> obtains() const {
    std::lock_guard<std::mutex> l(mutex_);
    return obtains_;
  }
  std::vector<std::pair<void*, size_t>> releases() const {
    std::lock_guard<std::mutex> l(mutex_);
    return releases_;
  }
  size_t held() const {
    std::lock_guard<std::mutex> l(mutex_);
    return held_;
  }
  int failures() const {
    std::lock_guard<std::mutex> l(mutex_);
    return failures_;
  }
  void set_capacity(size_t c) {
    std::lock_guard<std::mutex> l(mutex_);
    capacity_ = c;
  }

 private:
  mutable std::mutex mutex_;
  size_t capacity_, held_ = 0;
  uintptr_t next_ = 0x10000;
  int failures_ = 0;
  std::map<void*, size_t> blocks_;
  std::vector<size_t> obtains_;
  std::vector<std::pair<void*, size_t>> releases_;
};

std::string runtime_error_of(CachingPool& pool, size_t nbytes) {
  try {
    pool.allocate(nbytes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in: " << text;
}

// ---- the size-class rules ----

TEST(SizeClasses, DeviceRuleAtItsEdges) {
  const std::vector<std::pair<size_t, size_t>> cases = {{0, 512},
                                                        {1, 512},
                                                        {511, 512},
                                                        {512, 512},
                                                        {513, 1024},
                                                        {4095, 4096},
                                                        {4096, 4096},
                                                        {4097, 4608},
                                                        {4608, 4608},
                                                        {4609, 5120},
                                                        {8191, 8192},
                                                        {8192, 8192},
                                                        {8193, 9216},
                                                        {(1 << 20) - 1, 1 << 20},
                                                        {1 << 20, 1 << 20},
                                                        {(1 << 20) + 1, (1 << 20) + (1 << 17)},
                                                        {3 << 20, 3 << 20},
                                                        {(41 << 20) + 492, 44 << 20},
                                                        {(size_t{1} << 40) + 1, (size_t{1} << 40) + (size_t{1} << 37)},
                                                        {(size_t{1} << 40) - 1, size_t{1} << 40}};
  for (const auto& [n, want] : cases) EXPECT_EQ(device_block_size(n), want) << n << " bytes";
  EXPECT_EQ(device_size_classes().cached_from, 0u);  // every device block is cached
}

TEST(SizeClasses, DeviceRuleHasEightClassesPerOctaveAndWastesAtMostAnEighth) {
  for (int k = 12; k <= 24; ++k) {
    const size_t lo = size_t{1} << k;
    std::set<size_t> classes;
    for (size_t n = lo + 1; n <= 2 * lo; n += lo / 64) classes.insert(device_block_size(n));
    classes.insert(device_block_size(2 * lo));
    EXPECT_EQ(classes.size(), 8u) << "octave 2^" << k;
    EXPECT_EQ(*classes.rbegin(), 2 * lo);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const size_t n = rng() >> (rng() % 60 + 2);  // below 2^62: rounding up cannot wrap
    const size_t b = device_block_size(n);
    EXPECT_GE(b, n);
    if (n > 4096) {
      EXPECT_LE(b - n, n / 8) << n;
    }
    EXPECT_EQ(device_block_size(b), b) << "a block's own size must be its class: " << n;
  }
}

TEST(SizeClasses, HostRuleAtItsEdgesAndItsCachedThreshold) {
  const std::vector<std::pair<size_t, size_t>> cases = {{0, 64},
                                                        {1, 64},
                                                        {64, 64},
                                                        {65, 128},
                                                        {4095, 4096},
                                                        {4096, 4096},
                                                        {4097, 4160},
                                                        {262080, 262080},
                                                        {262081, 262144},
                                                        {262143, 262144},
                                                        {262144, 262144},
                                                        {262145, 327680},
                                                        {1 << 20, 1 << 20},
                                                        {(1 << 20) + 1, (1 << 20) + 65536},
                                                        {(size_t{1} << 33) + 5, (size_t{1} << 33) + 65536}};
  for (const auto& [n, want] : cases) EXPECT_EQ(host_block_size(n), want) << n << " bytes";
  EXPECT_EQ(host_size_classes().cached_from, size_t{256 * 1024});
  std::mt19937_64 rng(8);
  for (int i = 0; i < 20000; ++i) {
    const size_t n = rng() >> (rng() % 60 + 4);
    const size_t b = host_block_size(n);
    EXPECT_GE(b, n);
    EXPECT_EQ(b % 64, 0u) << n;  // aligned_alloc needs a multiple of the alignment
    EXPECT_EQ(host_block_size(b), b) << n;
  }
}

TEST(CachingPool, HostRuleCachesFrom256KiBOnly) {
  FakeMemory raw;
  CachingPool pool(raw, host_size_classes(), "cpu");
  // 262080 bytes: the largest uncached block, back to the raw memory at once.
  void* a = pool.allocate(262080);
  pool.deallocate(a, 262080);
  ASSERT_EQ(raw.releases().size(), 1u);
  EXPECT_EQ(raw.releases()[0], std::make_pair(a, size_t{262080}));
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  // 262081 bytes round up to a 256 KiB block, which is cached.
  void* b = pool.allocate(262081);
  pool.deallocate(b, 262081);
  EXPECT_EQ(raw.releases().size(), 1u);
  EXPECT_EQ(pool.cached_bytes(), 262144);
  EXPECT_EQ(pool.allocate(262144), b);
  EXPECT_EQ(raw.obtains(), (std::vector<size_t>{262080, 262144}));
}

// ---- reuse ----

TEST(CachingPool, FreedBlockServesTheNextRequestOfItsClassOnly) {
  FakeMemory raw;
  CachingPool pool(raw, device_size_classes(), "fake:0");
  void* a = pool.allocate(1000);  // class 1024
  EXPECT_EQ(raw.obtains(), std::vector<size_t>{1024});
  pool.deallocate(a, 1000);
  void* b = pool.allocate(2000);  // class 2048: the cached 1024 block does not serve it
  EXPECT_NE(b, a);
  EXPECT_EQ(raw.obtains(), (std::vector<size_t>{1024, 2048}));
  EXPECT_EQ(pool.allocate(513), a);  // class 1024 again: no raw call
  EXPECT_EQ(raw.obtains().size(), 2u);
  pool.deallocate(b, 2000);
  void* c = pool.allocate(1024);  // class 1024, whose list is now empty: the 2048 block stays cached
  EXPECT_NE(c, b);
  EXPECT_EQ(raw.obtains(), (std::vector<size_t>{1024, 2048, 1024}));
  EXPECT_EQ(pool.allocate(1537), b);  // class 2048
  EXPECT_TRUE(raw.releases().empty());
  EXPECT_EQ(pool.cached_bytes(), 0);
}

TEST(CachingPool, LastFreedBlockOfAClassIsReusedFirst) {
  FakeMemory raw;
  CachingPool pool(raw, device_size_classes(), "fake:0");
  void* a = pool.allocate(100);
  void* b = pool.allocate(100);
  pool.deallocate(a, 100);
  pool.deallocate(b, 100);
  EXPECT_EQ(pool.allocate(100), b);  // the most recently used block is the likeliest still in cache
  EXPECT_EQ(pool.allocate(100), a);
  EXPECT_EQ(raw.obtains().size(), 2u);
}

// ---- statistics ----

TEST(CachingPool, StatisticsThroughASequence) {
  FakeMemory raw;
  CachingPool pool(raw, device_size_classes(), "fake:0");
  auto expect_stats = [&](int64_t live, int64_t peak, int64_t allocations, int64_t reserved, int64_t cached,
                          const char* when) {
    const MemoryStats s = pool.stats();
    EXPECT_EQ(s.live_bytes, live) << when;
    EXPECT_EQ(s.peak_bytes, peak) << when;
    EXPECT_EQ(s.allocations, allocations) << when;
    EXPECT_EQ(s.reserved_bytes, reserved) << when;
    EXPECT_EQ(pool.cached_bytes(), cached) << when;
    EXPECT_EQ(raw.held(), static_cast<size_t>(reserved)) << when;
  };
  expect_stats(0, 0, 0, 0, 0, "fresh");
  void* a = pool.allocate(1000);  // class 1024
  expect_stats(1000, 1000, 1, 1024, 0, "a");
  void* b = pool.allocate(5000);  // class 5120
  expect_stats(6000, 6000, 2, 6144, 0, "a, b");
  pool.deallocate(a, 1000);
  expect_stats(5000, 6000, 2, 6144, 1024, "a freed");
  void* c = pool.allocate(700);  // a's block
  EXPECT_EQ(c, a);
  expect_stats(5700, 6000, 3, 6144, 0, "c in a's block");
  pool.deallocate(b, 5000);
  pool.deallocate(c, 700);
  expect_stats(0, 6000, 3, 6144, 6144, "all freed");
  pool.reset_peak();
  expect_stats(0, 0, 3, 6144, 6144, "peak reset");
  void* d = pool.allocate(100);  // class 512: nothing cached there
  expect_stats(100, 100, 4, 6656, 6144, "d");
  void* e = pool.allocate(4700);  // class 5120: b's block
  EXPECT_EQ(e, b);
  expect_stats(4800, 4800, 5, 6656, 1024, "e in b's block");
  pool.reset_peak();
  pool.deallocate(e, 4700);
  expect_stats(100, 4800, 5, 6656, 6144, "e freed after a peak reset");
  EXPECT_EQ(raw.obtains(), (std::vector<size_t>{1024, 5120, 512}));
  EXPECT_TRUE(raw.releases().empty());
  (void)d;
}

TEST(CachingPool, EmptyCacheReleasesExactlyTheCachedBlocks) {
  FakeMemory raw;
  CachingPool pool(raw, device_size_classes(), "fake:0");
  void* live1 = pool.allocate(1000);
  void* free1 = pool.allocate(1000);
  void* free2 = pool.allocate(9000);
  void* live2 = pool.allocate(9000);
  void* free3 = pool.allocate(9000);
  pool.deallocate(free1, 1000);
  pool.deallocate(free2, 9000);
  pool.deallocate(free3, 9000);
  const int64_t c9000 = static_cast<int64_t>(device_block_size(9000));
  EXPECT_EQ(pool.cached_bytes(), 1024 + 2 * c9000);
  pool.empty_cache();
  std::set<std::pair<void*, size_t>> released;
  for (const auto& r : raw.releases()) released.insert(r);
  EXPECT_EQ(raw.releases().size(), 3u);
  EXPECT_EQ(released, (std::set<std::pair<void*, size_t>>{
                          {free1, 1024}, {free2, static_cast<size_t>(c9000)}, {free3, static_cast<size_t>(c9000)}}));
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.live_bytes, 10000);
  EXPECT_EQ(s.reserved_bytes, 1024 + c9000);
  EXPECT_EQ(pool.cached_bytes(), 0);
  pool.empty_cache();  // nothing cached: no raw call
  EXPECT_EQ(raw.releases().size(), 3u);
  // Live blocks are still the caller's, and come back to the (now empty) cache when freed.
  pool.deallocate(live1, 1000);
  pool.deallocate(live2, 9000);
  EXPECT_EQ(pool.cached_bytes(), 1024 + c9000);
  EXPECT_EQ(pool.allocate(1000), live1);
  EXPECT_EQ(pool.allocate(9000), live2);
  EXPECT_EQ(raw.obtains().size(), 5u);
}

// ---- running out ----

TEST(CachingPool, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  FakeMemory raw(4096);
  CachingPool pool(raw, device_size_classes(), "fake:0");
  void* a = pool.allocate(2048);
  pool.deallocate(a, 2048);       // cached: 2048 of the 4096 are held
  void* b = pool.allocate(3000);  // class 3072: fails, the cache goes back, the retry succeeds
  EXPECT_EQ(raw.obtains(), (std::vector<size_t>{2048, 3072, 3072}));
  EXPECT_EQ(raw.failures(), 1);
  EXPECT_EQ(raw.releases(), (std::vector<std::pair<void*, size_t>>{{a, 2048}}));
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.live_bytes, 3000);
  EXPECT_EQ(s.reserved_bytes, 3072);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(pool.cached_bytes(), 0);
  pool.deallocate(b, 3000);
}

TEST(CachingPool, OutOfMemoryWithNothingCachedThrowsNamingSizeLiveAndReserved) {
  FakeMemory raw(4096);
  CachingPool pool(raw, device_size_classes(), "cuda:3");
  void* a = pool.allocate(3000);                       // class 3072
  const std::string e = runtime_error_of(pool, 2000);  // class 2048 does not fit beside it
  expect_contains(e, "out of memory on cuda:3");
  expect_contains(e, "allocating 2000 bytes");
  expect_contains(e, "2048-byte block");
  expect_contains(e, "3000 bytes live");
  expect_contains(e, "3072 reserved");
  EXPECT_EQ(raw.failures(), 1);  // nothing cached: no retry
  EXPECT_TRUE(raw.releases().empty());
  const MemoryStats s = pool.stats();  // the failed call changed nothing
  EXPECT_EQ(s.live_bytes, 3000);
  EXPECT_EQ(s.allocations, 1);
  EXPECT_EQ(s.reserved_bytes, 3072);
  pool.deallocate(a, 3000);
}

TEST(CachingPool, OutOfMemoryAfterTheRetryThrows) {
  FakeMemory raw(4096);
  CachingPool pool(raw, device_size_classes(), "fake:1");
  void* live = pool.allocate(1024);
  void* cached = pool.allocate(1024);
  pool.deallocate(cached, 1024);
  const std::string e = runtime_error_of(pool, 4000);  // class 4096: too big even with the cache released
  expect_contains(e,
                  "out of memory on fake:1 allocating 4000 bytes (a 4096-byte block; 1024 bytes live in tensors, "
                  "1024 reserved)");
  EXPECT_EQ(raw.failures(), 2);  // the first try and the one retry
  EXPECT_EQ(raw.releases(), (std::vector<std::pair<void*, size_t>>{{cached, 1024}}));
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.stats().reserved_bytes, 1024);
  // Once there is room again, allocating works as before.
  raw.set_capacity(8192);
  void* big = pool.allocate(4000);
  EXPECT_EQ(pool.stats().reserved_bytes, 1024 + 4096);
  pool.deallocate(big, 4000);
  pool.deallocate(live, 1024);
}

TEST(CachingPool, UncachedRequestsAlsoRetryAfterReleasingTheCache) {
  FakeMemory raw(262144 + 1000);
  CachingPool pool(raw, host_size_classes(), "cpu");
  void* big = pool.allocate(262144);
  pool.deallocate(big, 262144);       // cached
  void* small = pool.allocate(2000);  // 2048, uncached: fails beside the cached block, then fits
  EXPECT_EQ(raw.failures(), 1);
  EXPECT_EQ(raw.releases(), (std::vector<std::pair<void*, size_t>>{{big, 262144}}));
  EXPECT_EQ(pool.stats().reserved_bytes, 2048);
  pool.deallocate(small, 2000);
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  EXPECT_EQ(raw.held(), 0u);
  const std::string e = runtime_error_of(pool, 300000);
  expect_contains(e,
                  "out of memory on cpu allocating 300000 bytes (a 327680-byte block; 0 bytes live in tensors, "
                  "0 reserved)");
}

TEST(CachingPool, RequestTooLargeForAnyBlockIsRefused) {
  FakeMemory raw;
  CachingPool device(raw, device_size_classes(), "fake:0");
  CachingPool host(raw, host_size_classes(), "cpu");
  const size_t huge = std::numeric_limits<size_t>::max() - 3;
  expect_contains(runtime_error_of(device, huge), "cannot allocate " + std::to_string(huge) + " bytes on fake:0");
  expect_contains(runtime_error_of(host, huge), "cannot allocate " + std::to_string(huge) + " bytes on cpu");
  EXPECT_TRUE(raw.obtains().empty());
}

// ---- threads ----

void hammer(CachingPool& pool, unsigned seed, int iterations, std::mutex& owned_mutex, std::set<void*>& owned) {
  const size_t sizes[] = {100, 1000, 5000, 70000, 262144, 300000, 600000};
  std::mt19937 rng(seed);
  std::vector<std::pair<void*, size_t>> mine;
  for (int i = 0; i < iterations; ++i) {
    if (mine.size() < 6 && (mine.empty() || rng() % 2 == 0)) {
      const size_t n = sizes[rng() % 7];
      void* p = pool.allocate(n);
      {
        std::lock_guard<std::mutex> lock(owned_mutex);
        EXPECT_TRUE(owned.insert(p).second) << "a block was handed to two owners at once";
      }
      mine.emplace_back(p, n);
    } else {
      const size_t k = rng() % mine.size();
      {
        std::lock_guard<std::mutex> lock(owned_mutex);
        owned.erase(mine[k].first);
      }
      pool.deallocate(mine[k].first, mine[k].second);
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (const auto& [p, n] : mine) {
    {
      std::lock_guard<std::mutex> lock(owned_mutex);
      owned.erase(p);
    }
    pool.deallocate(p, n);
  }
}

TEST(CachingPool, TwoThreadsKeepTheCountsRight) {
  for (const SizeClasses& classes : {device_size_classes(), host_size_classes()}) {
    FakeMemory raw;
    CachingPool pool(raw, classes, "fake:0");
    std::mutex owned_mutex;
    std::set<void*> owned;
    const int iterations = 20000;
    std::thread t1(hammer, std::ref(pool), 1u, iterations, std::ref(owned_mutex), std::ref(owned));
    std::thread t2(hammer, std::ref(pool), 2u, iterations, std::ref(owned_mutex), std::ref(owned));
    t1.join();
    t2.join();
    const MemoryStats s = pool.stats();
    EXPECT_EQ(s.live_bytes, 0);
    EXPECT_GT(s.peak_bytes, 0);
    EXPECT_LE(s.peak_bytes, 12 * 600000);  // at most six blocks per thread
    EXPECT_GT(s.allocations, iterations / 2);
    EXPECT_EQ(s.reserved_bytes, pool.cached_bytes());  // nothing live: every reserved byte is cached
    EXPECT_EQ(raw.held(), static_cast<size_t>(s.reserved_bytes));
    EXPECT_LE(raw.obtains().size(), static_cast<size_t>(s.allocations));
    pool.empty_cache();
    EXPECT_EQ(raw.held(), 0u);
    EXPECT_EQ(pool.stats().reserved_bytes, 0);
  }
}

// ---- the host allocator built on the pool ----

TEST(CpuAllocator, CachesLargeBlocksAndReturnsSmallOnesAtOnce) {
  Allocator& a = cpu_allocator();
  cpu_empty_cache();
  const MemoryStats s0 = a.stats();
  void* p = a.allocate(300000);  // a 327680-byte block, cached when freed
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 1, 300000);
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes + 327680);
  EXPECT_EQ(a.stats().live_bytes, s0.live_bytes + 300000);
  a.deallocate(p, 300000);
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes + 327680);
  void* q = a.allocate(290000);  // same class: the same block, no new memory
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes + 327680);
  a.deallocate(q, 290000);
  void* small = a.allocate(1000);  // 1024 bytes from malloc, back to it when freed
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes + 327680 + 1024);
  a.deallocate(small, 1000);
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes + 327680);
  cpu_empty_cache();
  const MemoryStats s1 = a.stats();
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
  EXPECT_EQ(s1.allocations, s0.allocations + 3);
}

}  // namespace
}  // namespace seqlab
