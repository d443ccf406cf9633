// A small emulation of CUDA for the host compiler, so that the real kernel source of src/cuda (the
// device code kept in headers: *_kernels.cuh, block_reduce.cuh, device_common.cuh) runs on the CPU in
// tests, against the CPU kernels, on machines without a GPU. Include this header before the kernel
// headers. What it provides:
//
//   emu::launch(grid, block, shared_bytes, kernel, args...)
//       runs kernel(args...) as every thread of every block of `grid` (dim3), like
//       kernel<<<grid, block, shared_bytes>>>(args...). Kernel arguments are copied, as CUDA copies
//       them. `kernel` may be a __global__ function (template instance) or any callable, e.g. a lambda
//       with no arguments. The blocks run one after another. A block's threads are fibers (ucontext,
//       one stack each) of the launching OS thread: one runs at a time, until it reaches a barrier or
//       returns, and then the scheduler picks the next (seeded per launch, so every run of a program is
//       the same): in half the blocks at random among the runnable threads, in the other half by a
//       random priority per thread (whole warps ranked), so that some warps run ahead as far as the
//       barriers let them while others lag. A missing barrier then shows up as a read that comes
//       before the write it needed, or after the write that replaced it — reproducibly. (Fibers
//       rather than one OS thread per CUDA thread: waking 256 OS threads at every barrier on a
//       two-core machine cost ~3 ms per __syncthreads, twenty times more.)
//   threadIdx, blockIdx, blockDim, gridDim (set by the launch), warpSize, dim3, uint4.
//   __syncthreads(), __syncwarp(): barriers of the block's and the warp's threads. A thread that
//       returns from the kernel no longer counts at later barriers, as on the hardware. Threads that
//       wait at a barrier the others never reach end the program with a deadlock message.
//   __shfl_sync, __shfl_xor_sync, __shfl_up_sync, __shfl_down_sync for any trivially copyable type of
//       at most 8 bytes (float, double, int, int64_t, ...), with `width`: through a per-warp buffer
//       between two warp barriers. Only the full mask 0xffffffff is emulated.
//   __shared__ arrays declared in a kernel (`__shared__ float scratch[8];`) are `static`: one copy
//       per kernel instantiation, which is exactly one per block because the blocks of a launch run
//       one after another (and launches one after another). They start zeroed and keep what the
//       previous block left, so a missing barrier shows up as a stale value rather than a NaN.
//   emu::dynamic_shared(): the block's dynamic shared memory (shared_bytes of the launch, 128-byte
//       aligned), filled with 0xff bytes (NaN in bf16, f32 and f64) before every block, so a read of
//       anything the block did not write shows up. Kernels reach it through a macro of their own
//       header that the includer defines, e.g.
//         #define SEQLAB_TC_SHARED_MEMORY(name) unsigned char* name = emu::dynamic_shared()
//       (`extern __shared__` itself cannot be emulated).
//   __nv_bfloat16 (= seqlab::bf16, bit-identical), __nv_bfloat162, __bfloat162float,
//       __float2bfloat16 / __float2bfloat16_rn (round to nearest even, as CUDA's),
//       __floats2bfloat162_rn. No arithmetic operators on __nv_bfloat16: kernels convert explicitly.
//   Math: the <math.h> names (expf, logf, sqrtf, exp, log, isnan, INFINITY, ...) plus rsqrtf, rsqrt,
//       __expf, __logf, __fdividef, __ldg; atomicAdd; __trap() (aborts); min and max of two integers.
//   __global__, __device__, __host__, __forceinline__, __launch_bounds__(...), __align__(n) as the
//       host compiler understands them.
//   emu::kMultiprocessors: the emulated GPU's multiprocessor count, for the launchers' grid helpers
//       (row_grid, grid_stride_blocks, ...): 1, so grids stop at 32 blocks and more rows or elements
//       take the kernels' grid-stride loops.
//   seqlab::testing::GuardedOutput: an output buffer for an emulated kernel, poisoned, with guard
//       bands that show writes outside it; compare its value() with expect_values_close
//       (cuda_test_util.h).
//
// What this cannot check: the real compiler, the hardware's scheduling and memory system (here a
// thread runs alone from barrier to barrier, so races finer than that, e.g. two threads adding to one
// value without an atomic, never show), per-lane divergence rules of the independent thread
// scheduling, and performance.
#pragma once

#include <math.h>  // the global math names device code uses: expf, logf, sqrtf, isnan, INFINITY, ...
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

// ---- keywords -----------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

// ---- built-in types and variables ---------------------------------------------------------------
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

struct uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

// ---- bf16 ---------------------------------------------------------------------------------------
using __nv_bfloat16 = seqlab::bf16;
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 x) { return static_cast<float>(x); }
inline __nv_bfloat16 __float2bfloat16(float x) { return __nv_bfloat16(x); }  // round to nearest even
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16(x); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }

namespace emu {

constexpr int kMultiprocessors = 1;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emulated CUDA: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// The threads of the running block, as fibers (ucontext) of the launching OS thread, and the barriers
// they wait at. Only one fiber runs at a time; it runs until it reaches a barrier (or returns), then
// the scheduler resumes a runnable fiber picked by a random rule (seeded per launch, so a run is
// reproducible; see run()). A barrier releases its waiters once every thread it counts has arrived; a thread that
// returned from the kernel no longer counts, as on the hardware.
class Block {
 public:
  static constexpr size_t kStackBytes = 256 * 1024;  // per fiber; the pages are touched only as used

  Block(unsigned threads, size_t shared_bytes, uint64_t seed)
      : threads_(threads),
        warp_count_((threads + 31) / 32),
        fibers_(threads),
        warps_(warp_count_),
        shuffle_(warp_count_),
        shared_bytes_((shared_bytes + 127) / 128 * 128),
        rng_(seed) {
    for (Fiber& f : fibers_) f.stack.reset(new char[kStackBytes]);
    if (shared_bytes_ > 0) shared_.reset(static_cast<unsigned char*>(std::aligned_alloc(128, shared_bytes_)));
  }

  // Runs body() as every thread of the block whose index is `block_index`, to completion.
  void run(dim3 block_dim, dim3 block_index, const std::function<void()>& body) {
    body_ = &body;
    block_dim_ = block_dim;
    block_index_ = block_index;
    all_.reset(threads_);
    for (unsigned w = 0; w < warp_count_; ++w) {
      warps_[w].reset(std::min(32u, threads_ - 32 * w));
      std::memset(shuffle_[w].data(), 0xff, sizeof(shuffle_[w]));
    }
    if (shared_) std::memset(shared_.get(), 0xff, shared_bytes_);
    runnable_.clear();
    for (unsigned t = 0; t < threads_; ++t) {
      Fiber& f = fibers_[t];
      if (getcontext(&f.context) != 0) fail("getcontext failed");
      f.context.uc_stack.ss_sp = f.stack.get();
      f.context.uc_stack.ss_size = kStackBytes;
      f.context.uc_link = &scheduler_;
      makecontext(&f.context, &Block::entry, 0);
      f.done = false;
      runnable_.push_back(t);
    }
    Block* const outer = running_;
    running_ = this;
    // The order: half the blocks pick uniformly at random among the runnable fibers, so the threads
    // advance roughly together in a random interleaving; the other half always run the runnable fiber
    // of highest priority (warps ranked at random, lanes at random within them), so some warps run
    // as far ahead as the barriers let them while others lag: that exposes a missing barrier before
    // a shared buffer is overwritten (the lagging thread has not read it yet), which a uniform order
    // almost never does.
    const bool uniform = rng_() % 2 == 0;
    if (!uniform) {
      std::vector<unsigned> warp_rank(warp_count_);
      for (unsigned w = 0; w < warp_count_; ++w) warp_rank[w] = w;
      std::shuffle(warp_rank.begin(), warp_rank.end(), rng_);
      for (unsigned t = 0; t < threads_; ++t) fibers_[t].priority = warp_rank[t / 32] * 64 + rng_() % 64;
    }
    while (!runnable_.empty()) {
      size_t pick = 0;
      if (uniform) {
        pick = rng_() % runnable_.size();
      } else {
        for (size_t i = 1; i < runnable_.size(); ++i) {
          if (fibers_[runnable_[i]].priority > fibers_[runnable_[pick]].priority) pick = i;
        }
      }
      current_ = runnable_[pick];
      runnable_[pick] = runnable_.back();
      runnable_.pop_back();
      enter(current_);
      if (swapcontext(&scheduler_, &fibers_[current_].context) != 0) fail("swapcontext failed");
    }
    running_ = outer;
    for (const Fiber& f : fibers_) {
      if (!f.done) fail("deadlock: threads wait at a barrier that other threads of the block or warp never reach");
    }
  }

  static Block& running() { return *running_; }
  unsigned thread() const { return current_; }  // linear index of the running thread
  unsigned char* shared() const { return shared_.get(); }
  std::array<uint64_t, 32>& shuffle_slots(unsigned warp) { return shuffle_[warp]; }
  void sync_block() { wait(all_); }
  void sync_warp() { wait(warps_[current_ / 32]); }

 private:
  struct Fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    bool done = false;
    uint64_t priority = 0;
  };
  struct Barrier {
    unsigned expected = 0;
    std::vector<unsigned> waiting;
    void reset(unsigned n) {
      expected = n;
      waiting.clear();
    }
  };

  // The built-in variables as the fiber about to run sees them.
  void enter(unsigned t) const {
    blockDim = block_dim_;
    blockIdx = block_index_;
    threadIdx = dim3(t % block_dim_.x, t / block_dim_.x % block_dim_.y, t / (block_dim_.x * block_dim_.y));
  }
  // The running fiber arrives at b and yields; once every thread b counts has arrived, all its
  // waiters become runnable again.
  void wait(Barrier& b) {
    b.waiting.push_back(current_);
    if (b.waiting.size() == b.expected) release(b);
    yield();
  }
  // The running fiber no longer counts at b (it returned from the kernel).
  void leave(Barrier& b) {
    --b.expected;
    if (b.expected > 0 && b.waiting.size() == b.expected) release(b);
  }
  void release(Barrier& b) {
    runnable_.insert(runnable_.end(), b.waiting.begin(), b.waiting.end());
    b.waiting.clear();
  }
  // Back to the scheduler; resumed by it later, with current_ and the built-in variables set back.
  void yield() {
    if (swapcontext(&fibers_[current_].context, &scheduler_) != 0) fail("swapcontext failed");
  }
  static void entry() {
    Block& b = running();
    (*b.body_)();
    b.fibers_[b.current_].done = true;
    b.leave(b.all_);
    b.leave(b.warps_[b.current_ / 32]);
  }  // returns to scheduler_ through uc_link

  static inline thread_local Block* running_ = nullptr;
  const unsigned threads_, warp_count_;
  std::vector<Fiber> fibers_;
  Barrier all_;
  std::vector<Barrier> warps_;
  std::vector<std::array<uint64_t, 32>> shuffle_;  // per warp, one slot per lane
  const size_t shared_bytes_;
  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, FreeDeleter> shared_;
  std::vector<unsigned> runnable_;  // fibers that may run, in no order
  std::mt19937_64 rng_;
  ucontext_t scheduler_;
  const std::function<void()>* body_ = nullptr;
  dim3 block_dim_, block_index_;
  unsigned current_ = 0;
};

inline unsigned linear_thread() { return Block::running().thread(); }
inline unsigned char* dynamic_shared() { return Block::running().shared(); }

// The scheduling seed of the next launch: the launches of a program are seeded 0, 1, 2, ... in order.
inline uint64_t next_seed() {
  static std::atomic<uint64_t> launches{0};
  return launches++;
}

template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block_dim, size_t shared_bytes, Kernel kernel, Args... args) {
  const uint64_t threads = uint64_t{block_dim.x} * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024) fail("a launch needs 1 to 1024 threads per block");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) fail("a launch needs a grid of at least one block");
  Block block(static_cast<unsigned>(threads), shared_bytes, next_seed());
  const dim3 saved_grid = gridDim;
  gridDim = grid;
  const std::function<void()> body = [&] { kernel(args...); };
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) block.run(block_dim, dim3(x, y, z), body);
    }
  }
  gridDim = saved_grid;
}

// Lane `lane`'s value of `value` in the caller's warp, once every lane of the warp has offered its own:
// what every shuffle below reduces to.
template <class T>
T exchange(unsigned mask, T value, unsigned lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
  if (mask != 0xffffffffu) fail("shuffles with a partial mask are not emulated");
  Block& b = Block::running();
  std::array<uint64_t, 32>& slots = b.shuffle_slots(b.thread() / 32);
  std::memcpy(&slots[b.thread() % 32], &value, sizeof(T));
  b.sync_warp();
  T out;
  std::memcpy(&out, &slots[lane], sizeof(T));
  b.sync_warp();
  return out;
}

}  // namespace emu

// ---- synchronisation and warp shuffles ----------------------------------------------------------
inline void __syncthreads() { emu::Block::running().sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::fail("__syncwarp with a partial mask is not emulated");
  emu::Block::running().sync_warp();
}
// Within segments of `width` lanes: from lane srcLane of the segment; from lane ^ laneMask (own value
// if that leaves the segment); from lane − delta / lane + delta (own value past the segment's ends).
template <class T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  const unsigned lane = emu::linear_thread() % 32, base = lane / width * width;
  return emu::exchange(mask, var, base + static_cast<unsigned>(srcLane) % width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  const unsigned lane = emu::linear_thread() % 32, src = lane ^ static_cast<unsigned>(laneMask);
  return emu::exchange(mask, var, src / width == lane / width ? src : lane);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const unsigned lane = emu::linear_thread() % 32;
  return emu::exchange(mask, var, lane % width >= delta ? lane - delta : lane);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const unsigned lane = emu::linear_thread() % 32;
  return emu::exchange(mask, var, lane % width + delta < static_cast<unsigned>(width) ? lane + delta : lane);
}

// ---- math and memory intrinsics -----------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
template <class T>
T __ldg(const T* p) {
  return *p;
}
// *address += val, returning the old value (one fiber runs at a time, so this is atomic).
template <class T>
T atomicAdd(T* address, T val) {
  const T old = *address;
  *address = old + val;
  return old;
}
[[noreturn]] inline void __trap() { emu::fail("__trap() in a kernel"); }
// CUDA's global min and max for two integers of one type (device code calls them unqualified, e.g.
// min(static_cast<int64_t>(kTile), T - i0) in attention_kernels.cuh). Floating-point min/max (fminf's
// NaN rules) are not emulated: a kernel that needs them gets a compile error here, not a silent
// difference.
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
T min(T a, T b) {
  return b < a ? b : a;
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
T max(T a, T b) {
  return a < b ? b : a;
}

// ---- outputs of emulated kernels ----------------------------------------------------------------
namespace seqlab::testing {

// `shape` elements of `dtype` with kGuard more on either side, all poison_value (NaN, or a sentinel for
// integers) at first. The kernel gets data<T>(), the first element of the shape; value() is what it
// wrote there, and expect_guards_intact() fails the test if it wrote anything outside.
class GuardedOutput {
 public:
  static constexpr int64_t kGuard = 64;
  GuardedOutput(const Shape& shape, DType dtype)
      : shape_(shape), buffer_(poisoned({shape_numel(shape) + 2 * kGuard}, dtype, kCpu)) {}

  template <class T>
  T* data() const {
    return buffer_.data<T>() + kGuard;
  }
  Tensor value() const {
    return Tensor::make_view(buffer_.storage(), shape_, contiguous_strides(shape_), kGuard, buffer_.dtype());
  }
  void expect_guards_intact(const std::string& what) const {
    const std::vector<double> all = buffer_.to_doubles();
    const double poison = poison_value(buffer_.dtype());
    const size_t n = all.size(), guard = static_cast<size_t>(kGuard);
    for (size_t i = 0; i < n; ++i) {
      if (i >= guard && i < n - guard) continue;
      if (!(std::isnan(poison) ? std::isnan(all[i]) : all[i] == poison)) {
        ADD_FAILURE() << what << ": the kernel wrote " << all[i] << " at element " << static_cast<int64_t>(i) - kGuard
                      << " of an output of " << shape_str(shape_);
        return;
      }
    }
  }

 private:
  Shape shape_;
  Tensor buffer_;
};

}  // namespace seqlab::testing
