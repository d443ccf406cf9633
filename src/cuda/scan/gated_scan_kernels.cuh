// The CUDA kernels and host launchers that run the schedule of gated_scan.h (the column-parallel gated
// linear recurrence shared by gla.cu and retention.cu; the equations, work split, shared and scratch
// memory are described there). nvcc only.
//
// Launches: forward_kernel, grid (column tiles, H, B), 32·⌈dk/8⌉ threads; backward_kernel, the same grid,
// then sum_tiles_kernel once per gradient of q, k (and g) to add the column tiles' partial sums.
// Every kernel and launcher takes the calling op's tag type (Op: an empty struct of gla.cu or
// retention.cu) as its first template argument, so each op has its own kernels — distinct symbols in
// each translation unit, and the op's name in a profiler's kernel list.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda/scan/gated_scan_schedule.h"
#include "cuda/runtime.h"
#include "tensor/tensor.h"

namespace seqlab::cuda::scan {

// One GPU thread of a block: its registers (State) and the block barrier. The members are
// __host__ __device__ only so that the schedule's __host__ __device__ drivers compile for the host too;
// they do nothing there (the host runs the schedule through HostExec).
template <class State>
struct BlockExec {
  State st;
  SEQLAB_HD void sync() {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  template <class F>
  SEQLAB_HD void each(F&& f) {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x), st);
#else
    (void)f;
#endif
  }
};

template <class Op, class E, class A>
__global__ void __launch_bounds__(kMaxThreads, 1) forward_kernel(Problem<E, A> pb, E* o, E* final_state) {
  extern __shared__ __align__(16) unsigned char scan_smem[];
  BlockExec<ForwardThread<A>> ex;
  forward_block(ex, pb, blockIdx.z, blockIdx.y, blockIdx.x, reinterpret_cast<A*>(scan_smem), o, final_state);
}

template <class Op, class E, class A>
__global__ void __launch_bounds__(kMaxThreads, 1) backward_kernel(Problem<E, A> pb, BackwardIO<E, A> io) {
  extern __shared__ __align__(16) unsigned char scan_smem[];
  BlockExec<BackwardThread<A>> ex;
  backward_block(ex, pb, io, blockIdx.z, blockIdx.y, blockIdx.x, reinterpret_cast<A*>(scan_smem));
}

// out[x] = Σ_tile part[kind][tile][x] for x < N (grid-stride; each element written by one thread).
template <class Op, class E, class A>
__global__ void __launch_bounds__(kThreads)
    sum_tiles_kernel(const A* __restrict__ part, int kind, int64_t tiles, int64_t N, E* __restrict__ out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < N; x += step) {
    out[x] = cvt<E>(sum_tiles(part, kind, tiles, N, x));
  }
}

// Shared memory a block may use: the device's opt-in limit (227 KiB on sm_90, 163 KiB on sm_80).
inline int64_t shared_budget(int device) {
  int optin = 0;
  SEQLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin;
}
// The backward's reduction batch grows while the block stays within kSharedCap (so that two blocks of the
// larger configurations fit on a multiprocessor); one step per batch may go up to the device's limit.
constexpr int64_t kSharedCap = 112 * 1024;

template <class Kernel>
void allow_shared(Kernel kernel_fn, size_t bytes) {
  SEQLAB_CUDA_CHECK(
      cudaFuncSetAttribute(kernel_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Throws std::invalid_argument naming the op unless 1 ≤ dk, dv ≤ kMaxHeadDim.
inline void check_head_dims(const char* op, int64_t dk, int64_t dv) {
  if (dk < 1 || dv < 1 || dk > kMaxHeadDim || dv > kMaxHeadDim) {
    throw std::invalid_argument(std::string(op) + " on CUDA: head dims up to " + std::to_string(kMaxHeadDim) +
                                " are supported, got dk = " + std::to_string(dk) + ", dv = " + std::to_string(dv));
  }
}

// A problem's sizes, scale and q, k, v from contiguous q, k [B, T, H, dk] and v [B, T, H, dv] of element
// type E; the op then points it at its gates or decays and its initial state.
template <class E, class A>
Problem<E, A> qkv_problem(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  Problem<E, A> pb;
  pb.nb = q.size(0);
  pb.nt = q.size(1);
  pb.nh = q.size(2);
  pb.dk = q.size(3);
  pb.dv = v.size(3);
  pb.scale = static_cast<A>(scale);
  pb.q = static_cast<const E*>(q.raw_data());
  pb.k = static_cast<const E*>(k.raw_data());
  pb.v = static_cast<const E*>(v.raw_data());
  return pb;
}

template <class E, class A>
dim3 grid_of(const char* what, const Problem<E, A>& pb) {
  if (pb.nh > 65535 || pb.nb > 65535) {
    throw std::invalid_argument(std::string(what) + ": at most 65535 heads and batch entries, got H = " +
                                std::to_string(pb.nh) + ", B = " + std::to_string(pb.nb));
  }
  return dim3(static_cast<unsigned>(pb.tiles()), static_cast<unsigned>(pb.nh), static_cast<unsigned>(pb.nb));
}

// Writes o [B, T, H, dv] and final_state [B, H, dk, dv]. The caller holds a DeviceGuard for `device`.
template <class Op, class E, class A>
void launch_forward(const char* what, int device, const Problem<E, A>& pb, E* o, E* final_state) {
  if (pb.nb == 0 || pb.nh == 0) return;
  const dim3 grid = grid_of(what, pb);
  const size_t smem = sizeof(A) * static_cast<size_t>(forward_shared_elems(pb));
  if (static_cast<int64_t>(smem) > shared_budget(device)) {
    throw std::runtime_error(std::string(what) + ": needs " + std::to_string(smem) +
                             " bytes of shared memory per block, more than this device allows");
  }
  allow_shared(forward_kernel<Op, E, A>, smem);
  forward_kernel<Op, E, A><<<grid, pb.threads(), smem, stream(device)>>>(pb, o, final_state);
  SEQLAB_CUDA_CHECK_LAUNCH(what);
}

// Writes dq, dk [B, T, H, dk] (and dg when not null) and what io names: dv (and dgv, dh0 when not
// null). Allocates the scratch (part, ckpt, segs) on `dev`; it returns to the allocator's cache at exit,
// which is safe because every later user of those blocks is queued after these kernels on the same
// stream. The caller holds a DeviceGuard for the device.
template <class Op, class E, class A>
void launch_backward(const char* what, const Device& dev, const Problem<E, A>& pb, BackwardIO<E, A> io, E* dq, E* dk,
                     E* dg) {
  if (pb.nb == 0 || pb.nh == 0) return;
  const int device = dev.index;
  const dim3 grid = grid_of(what, pb);
  io.batch = backward_batch(pb, std::min(shared_budget(device), kSharedCap));
  if (io.batch < 1) io.batch = std::min(backward_batch(pb, shared_budget(device)), 1);
  if (io.batch < 1) {
    throw std::runtime_error(std::string(what) + ": dk = " + std::to_string(pb.dk) +
                             " needs more shared memory per block than this device allows");
  }
  io.want_dg = dg != nullptr;
  const DType acc = dtype_of_compute<A>();
  const int64_t N = pb.nb * pb.nt * pb.nh * pb.dk, tiles = pb.tiles(), blocks = pb.nb * pb.nh * tiles;
  const int64_t per_block = int64_t{kRows} * pb.threads();
  const int64_t part_n = (io.want_dg ? 3 : 2) * tiles * N, ckpt_n = blocks * pb.segments() * per_block,
                segs_n = blocks * kSegment * per_block;
  Tensor part = Tensor::empty(Shape{part_n}, acc, dev);
  Tensor ckpt = Tensor::empty(Shape{ckpt_n}, acc, dev);
  Tensor segs = Tensor::empty(Shape{segs_n}, acc, dev);
  io.part = static_cast<A*>(part.raw_data());
  io.ckpt = static_cast<A*>(ckpt.raw_data());
  io.segs = static_cast<A*>(segs.raw_data());
  const size_t smem = sizeof(A) * static_cast<size_t>(backward_shared_elems(pb, io.batch));
  cudaStream_t st = stream(device);
  allow_shared(backward_kernel<Op, E, A>, smem);
  backward_kernel<Op, E, A><<<grid, pb.threads(), smem, st>>>(pb, io);
  SEQLAB_CUDA_CHECK_LAUNCH(what);
  if (N == 0) return;
  E* outs[3] = {dq, dk, dg};
  for (int kind = 0; kind < (io.want_dg ? 3 : 2); ++kind) {
    sum_tiles_kernel<Op, E, A><<<blocks_for(N, device), kThreads, 0, st>>>(io.part, kind, tiles, N, outs[kind]);
    SEQLAB_CUDA_CHECK_LAUNCH(what);
  }
}

}  // namespace seqlab::cuda::scan
