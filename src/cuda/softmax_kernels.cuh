// The device code of src/cuda/softmax.cu (read its header comment first): softmax and log-softmax
// rows forward and backward, cross-entropy rows forward and the element-wise backward. A header of its
// own, needing only CUDA's built-ins, so that tests/rows_emulation_test.cc runs these same
// kernels on the CPU over tests/cuda_emulation.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/block_reduce.cuh"

namespace seqlab::cuda::rows {

// The two reductions of a row xr[0, c) that softmax and cross-entropy share, in the compute type A,
// by the whole block (every thread calls it; each gets both results):
//   m = max_i x_i,   s = Σ_i exp(x_i − m).
// Reads the row twice (the second time from cache).
template <class A>
struct MaxAndSumExp {
  A m, s;
};
template <class T, class A = compute_t<T>>
__device__ __forceinline__ MaxAndSumExp<A> row_max_and_sum_exp(const T* xr, int64_t c, A* scratch) {
  A m = -INFINITY;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) m = MaxOp{}(m, convert<A>(xr[i]));
  m = block_max(m, scratch);
  A s = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += exp_of(convert<A>(xr[i]) - m);
  s = block_sum(s, scratch);
  return {m, s};
}

// One block per row r of x [n, c]:
//   m = max_j x_j,  s = Σ_j exp(x_j − m);  y_i = exp(x_i − m) / s,  or  log y_i = (x_i − m) − log s
// ((x_i − m) − log s, not x_i − (m + log s): m + log s would round to m's ulp). Reads the row three
// times (the last two from cache), writes it once.
template <class T, bool kLog>
__global__ void __launch_bounds__(kMaxThreads) softmax_rows(const T* x, T* y, int64_t n, int64_t c) {
  using A = compute_t<T>;
  __shared__ A scratch[kMaxWarps];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * c;
    const auto [m, s] = row_max_and_sum_exp<T>(xr, c, scratch);
    T* yr = y + r * c;
    if (kLog) {
      const A log_s = log_of(s);
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) yr[i] = convert<T>((convert<A>(xr[i]) - m) - log_s);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) yr[i] = convert<T>(exp_of(convert<A>(xr[i]) - m) * inv);
    }
  }
}

// One block per row r:
//   softmax:      dx_i = y_i (dy_i − Σ_j dy_j y_j)
//   log-softmax:  dx_i = dy_i − exp(y_i) Σ_j dy_j
// Reads dy and y twice per row (the second time from cache), writes dx once.
template <class T, bool kLog>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_backward_rows(const T* dy, const T* y, T* dx, int64_t n, int64_t c) {
  using A = compute_t<T>;
  __shared__ A scratch[kMaxWarps];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T *gr = dy + r * c, *yr = y + r * c;
    A dot = 0;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      dot += kLog ? convert<A>(gr[i]) : convert<A>(gr[i]) * convert<A>(yr[i]);
    }
    const A s = block_sum(dot, scratch);
    T* dr = dx + r * c;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const A g = convert<A>(gr[i]), yi = convert<A>(yr[i]);
      dr[i] = convert<T>(kLog ? g - exp_of(yi) * s : yi * (g - s));
    }
  }
}

// One block per row r of logits [n, v]:
//   lse_r = m + log Σ_j exp(x_rj − m) with m = max_j x_rj,  loss_r = lse_r − x_r,target (0 if ignored)
// The final per-row arithmetic is in f64 as on the CPU, so lse − x_target loses nothing to the f32
// rounding of lse. lse and the losses are stored in the compute type (f32 for bf16 logits). Reads the
// row twice (the second time from cache) and the target; writes lse, loss.
template <class T, class I>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_rows(const T* x, const I* targets, int64_t ignore_index, compute_t<T>* losses, compute_t<T>* lse,
                       int64_t n, int64_t v) {
  using A = compute_t<T>;
  __shared__ A scratch[kMaxWarps];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * v;
    const auto [m, s] = row_max_and_sum_exp<T>(xr, v, scratch);
    if (threadIdx.x == 0) {
      const double lse_r = static_cast<double>(m) + log(static_cast<double>(s));
      lse[r] = static_cast<A>(lse_r);
      const int64_t t = static_cast<int64_t>(targets[r]);
      losses[r] = t == ignore_index ? A(0) : static_cast<A>(lse_r - convert<double>(xr[t]));
    }
  }
}

// dlogits[r, j] = k · exp(x[r, j] − lse[r]) − k·[j = target_r], with k = dloss / count; the whole row 0
// where the target is ignored. One thread per element: reads x once and lse and the target per
// element (cached across the row), writes dlogits once.
template <class T, class I>
struct CrossEntropyBackwardFn {
  const T* x;
  const compute_t<T>* lse;
  const I* targets;
  T* dx;
  int64_t v, ignore_index;
  compute_t<T> k;
  __device__ void operator()(int64_t i) const {
    using A = compute_t<T>;
    const int64_t r = i / v, j = i - r * v, t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) {
      dx[i] = convert<T>(A(0));
      return;
    }
    A d = k * exp_of(convert<A>(x[i]) - lse[r]);
    if (j == t) d -= k;
    dx[i] = convert<T>(d);
  }
};

}  // namespace seqlab::cuda::rows
