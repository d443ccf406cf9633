// The CUDA emulation of tests/cuda_emulation.h itself: the built-in variables over a grid and a block
// with a partial last warp, every shuffle against CUDA's documented lane rule (with `width`), barriers
// with threads that return early, dynamic shared memory (aligned, poisoned before every block), the
// deadlock message, and that its scheduler does expose a missing barrier both ways (a read before the
// write it needs, and a write before the last read of the value it replaces). The kernel emulation
// tests (*_emulation_test.cc) rely on all of this.
#include "cuda_emulation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

TEST(CudaEmulation, BuiltInVariablesCoverTheGrid) {
  const dim3 grid(3, 2, 1), block(40, 2, 1);  // 80 threads: two warps and half of a third
  const unsigned threads = 80, blocks = 6;
  std::vector<int> hits(threads * blocks, 0);
  std::vector<unsigned> seen(threads * blocks, 0);
  emu::launch(grid, block, 0, [&] {
    EXPECT_EQ(blockDim.x, 40u);
    EXPECT_EQ(blockDim.y, 2u);
    EXPECT_EQ(gridDim.x, 3u);
    EXPECT_EQ(gridDim.y, 2u);
    const unsigned t = threadIdx.x + blockDim.x * threadIdx.y, b = blockIdx.x + gridDim.x * blockIdx.y;
    ++hits[b * threads + t];
    seen[b * threads + t] = threadIdx.z * 1000 + blockIdx.z;
  });
  for (unsigned i = 0; i < hits.size(); ++i) {
    EXPECT_EQ(hits[i], 1) << "thread " << i % threads << " of block " << i / threads;
    EXPECT_EQ(seen[i], 0u);
  }
}

// Each lane offers 100·warp + lane; the lane each shuffle reads from, by CUDA's rule for `width`.
TEST(CudaEmulation, ShufflesFollowTheLaneRule) {
  for (int width : {32, 8}) {
    std::vector<int64_t> got_sync(64), got_xor(64), got_up(64), got_down(64);
    std::vector<double> got_double(64);
    emu::launch(dim3(1), dim3(64), 0, [&] {
      const unsigned t = threadIdx.x;
      const int64_t mine = 100 * (t / 32) + t % 32;
      got_sync[t] = __shfl_sync(0xffffffffu, mine, 5, width);
      got_xor[t] = __shfl_xor_sync(0xffffffffu, mine, 3, width);
      got_up[t] = __shfl_up_sync(0xffffffffu, mine, 2u, width);
      got_down[t] = __shfl_down_sync(0xffffffffu, mine, 6u, width);
      got_double[t] = __shfl_xor_sync(0xffffffffu, 0.5 * static_cast<double>(mine), 16, width);
    });
    for (unsigned t = 0; t < 64; ++t) {
      const unsigned lane = t % 32, base = lane / width * width;
      const auto value = [&](unsigned l) { return static_cast<int64_t>(100 * (t / 32) + l); };
      EXPECT_EQ(got_sync[t], value(base + 5 % width)) << "width " << width << " thread " << t;
      EXPECT_EQ(got_xor[t], value(lane ^ 3u)) << "width " << width << " thread " << t;
      EXPECT_EQ(got_up[t], value(lane % width >= 2 ? lane - 2 : lane)) << "width " << width << " thread " << t;
      EXPECT_EQ(got_down[t], value(lane % width + 6 < static_cast<unsigned>(width) ? lane + 6 : lane))
          << "width " << width << " thread " << t;
      // lane ^ 16 leaves a segment of 8: the own value.
      EXPECT_EQ(got_double[t], 0.5 * static_cast<double>(value(width == 32 ? lane ^ 16u : lane)));
    }
  }
}

TEST(CudaEmulation, ThreadsThatReturnNoLongerCountAtBarriers) {
  std::vector<int> sums(4, -1);
  emu::launch(dim3(4), dim3(96), 0, [&] {
    __shared__ int count[96];
    count[threadIdx.x] = 0;
    if (threadIdx.x % 3 == 0) return;  // a third of every warp leaves before the barriers
    count[threadIdx.x] = 1;
    __syncthreads();
    __syncwarp();
    if (threadIdx.x == 1) {
      int s = 0;
      for (int c : count) s += c;
      sums[blockIdx.x] = s;
    }
    __syncthreads();
  });
  for (int s : sums) EXPECT_EQ(s, 64);
}

TEST(CudaEmulation, DynamicSharedMemoryIsAlignedAndPoisonedPerBlock) {
  std::vector<int> poisoned_at_start(3, 0);
  emu::launch(dim3(3), dim3(32), 1000, [&] {
    float* shared = reinterpret_cast<float*>(emu::dynamic_shared());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(shared) % 128, 0u);
    __syncthreads();
    if (threadIdx.x == 0) {
      int nans = 0;
      for (int i = 0; i < 250; ++i) nans += std::isnan(shared[i]) ? 1 : 0;
      poisoned_at_start[blockIdx.x] = nans;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 250; i += 32) shared[i] = 1.0f;  // the next block must not see this
  });
  for (int n : poisoned_at_start) EXPECT_EQ(n, 250);
}

TEST(CudaEmulationDeathTest, ADeadlockEndsTheProgramWithAMessage) {
  const auto mismatched = [] {
    emu::launch(dim3(1), dim3(32), 0, [] {
      if (threadIdx.x == 0) {
        __syncthreads();  // waits for the others, who wait for it at the warp barrier
      } else {
        __syncwarp();
      }
    });
  };
  EXPECT_DEATH(mismatched(), "deadlock");
}

// The scheduler interleaves so that both kinds of missing barrier change a result in some block:
// readers that run before the writer (read-after-write), and a writer that overwrites a value before
// a lagging reader of another warp got to it (write-after-read), though the writer's warp passed ten
// warp barriers first (which a uniformly random order almost never lets it do).
TEST(CudaEmulation, AMissingBarrierShowsUp) {
  const int blocks = 16;
  std::vector<int> early_reads(blocks, 0), late_reads(blocks, 0);
  emu::launch(dim3(blocks), dim3(128), 0, [&] {
    __shared__ int value;
    if (threadIdx.x == 0) value = 1;
    __syncthreads();
    if (threadIdx.x == 0) value = 2;  // no barrier before the others read: some see 1, some 2
    if (value != 2) ++early_reads[blockIdx.x];
    __syncthreads();
    const int seen = value;  // 2, unless warp 3 already overwrote it below (no barrier between)
    if (threadIdx.x / 32 == 3) {
      for (int i = 0; i < 10; ++i) __syncwarp();  // as a warp reduction's shuffles would
      if (threadIdx.x == 96) value = 3;
    }
    if (seen != 2) ++late_reads[blockIdx.x];
    __syncthreads();
  });
  int early = 0, late = 0;
  for (int b = 0; b < blocks; ++b) {
    early += early_reads[b] > 0;
    late += late_reads[b] > 0;
  }
  EXPECT_GT(early, 0) << "no block read before the write";
  EXPECT_GT(late, 0) << "no block overwrote before a lagging read";
}

}  // namespace
