// The device code of src/cuda/norm.cu (read its header comment first: equations, statistics, the
// fused residual add, the deterministic dw/db sums), and the slice count of the dw/db partial sums. A
// header of its own, needing only CUDA's built-ins, so that tests/rows_emulation_test.cc runs
// these same kernels on the CPU over tests/cuda_emulation.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/block_reduce.cuh"

namespace seqlab::cuda::rows {

// One block per row r of x [n, c]: mean[r] = μ (layer only), rstd[r], y[r, :] = x̂ ⊙ w (+ b).
// Reads the row three times (μ, variance, output; the second and third from cache), w and b once per
// row; writes c + 2 values per row. mean is null for rms; bias is null when undefined.
// Fused (residual and sum non-null): the first pass reads x and residual once, writes
// sum[r, :] = s = x + residual rounded to T, and the later passes read s back; each thread reads only
// the elements it wrote itself, so no barrier is needed, and they come from cache. The row
// normalised is then s, so y, μ and rstd are those of the stored (rounded) s that the backward reads.
template <class T, bool kCentered>
__global__ void __launch_bounds__(kMaxThreads)
    norm_forward_rows(const T* x, const T* residual, T* sum, const T* w, const T* b, T* y, compute_t<T>* mean,
                      compute_t<T>* rstd, int64_t n, int64_t c, double eps) {
  using A = compute_t<T>;
  __shared__ A scratch[kMaxWarps];
  const A inv_c = A(1) / static_cast<A>(c);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * c;
    A mu = 0;
    if (residual != nullptr) {
      const T* rr = residual + r * c;
      T* sr = sum + r * c;
      A acc = 0;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
        const T v = convert<T>(convert<A>(xr[i]) + convert<A>(rr[i]));
        sr[i] = v;
        acc += convert<A>(v);
      }
      xr = sr;
      if (kCentered) mu = block_sum(acc, scratch) * inv_c;
    } else if (kCentered) {
      A s = 0;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += convert<A>(xr[i]);
      mu = block_sum(s, scratch) * inv_c;
    }
    A ss = 0;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const A d = convert<A>(xr[i]) - mu;
      ss += d * d;
    }
    const A rs = rsqrt_of(block_sum(ss, scratch) * inv_c + static_cast<A>(eps));
    if (threadIdx.x == 0) {
      if (kCentered) mean[r] = mu;
      rstd[r] = rs;
    }
    T* yr = y + r * c;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      A v = (convert<A>(xr[i]) - mu) * rs * convert<A>(w[i]);
      if (b != nullptr) v += convert<A>(b[i]);
      yr[i] = convert<T>(v);
    }
  }
}

// One block per row r: dx[r, :] = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)) (+ dsum[r, :]), mean(g)
// dropped for rms. Reads dy, x and w twice per row (the second time from cache), dsum once where
// given, mean and rstd once; writes dx.
template <class T, bool kCentered>
__global__ void __launch_bounds__(kMaxThreads)
    norm_backward_dx_rows(const T* dy, const T* x, const T* w, const compute_t<T>* mean, const compute_t<T>* rstd,
                          const T* dsum, T* dx, int64_t n, int64_t c) {
  using A = compute_t<T>;
  __shared__ A scratch[kMaxWarps];
  const A inv_c = A(1) / static_cast<A>(c);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T *gr = dy + r * c, *xr = x + r * c;
    const A mu = kCentered ? mean[r] : A(0);
    const A rs = rstd[r];
    A sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const A g = convert<A>(gr[i]) * convert<A>(w[i]);
      sum_g += g;
      sum_gx += g * ((convert<A>(xr[i]) - mu) * rs);
    }
    const A mean_g = kCentered ? block_sum(sum_g, scratch) * inv_c : A(0);
    const A mean_gx = block_sum(sum_gx, scratch) * inv_c;
    T* dr = dx + r * c;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const A g = convert<A>(gr[i]) * convert<A>(w[i]);
      const A xhat = (convert<A>(xr[i]) - mu) * rs;
      const T d = convert<T>(rs * (g - mean_g - xhat * mean_gx));
      dr[i] = dsum != nullptr ? convert<T>(convert<A>(d) + convert<A>(dsum[r * c + i])) : d;
    }
  }
}

// Pass 1 of dw/db. Thread (slice s = blockIdx.y, column j) sums rows [s·per, min((s+1)·per, n)):
//   part_w[s, j] = Σ dy[r, j] · x̂[r, j],  part_b[s, j] = Σ dy[r, j]   (either may be null)
// Consecutive threads take consecutive columns, so every row is read coalesced. Reads dy and x once
// (plus mean and rstd per row, shared by the warp); writes chunks · c partials per output.
template <class T, bool kCentered>
__global__ void __launch_bounds__(kMaxThreads)
    norm_param_partials(const T* dy, const T* x, const compute_t<T>* mean, const compute_t<T>* rstd,
                        compute_t<T>* part_w, compute_t<T>* part_b, int64_t n, int64_t c, int64_t per) {
  using A = compute_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int64_t s = blockIdx.y, r0 = s * per, r1 = r0 + per < n ? r0 + per : n;
  A acc_w = 0, acc_b = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const A g = convert<A>(dy[r * c + j]);
    const A mu = kCentered ? mean[r] : A(0);
    acc_w += g * ((convert<A>(x[r * c + j]) - mu) * rstd[r]);
    acc_b += g;
  }
  if (part_w != nullptr) part_w[s * c + j] = acc_w;
  if (part_b != nullptr) part_b[s * c + j] = acc_b;
}

// Pass 2: out[j] = Σ_s part[s, j] in slice order. Reads chunks · c partials, writes c values.
template <class T>
struct SumPartialsFn {
  const compute_t<T>* part;
  T* out;
  int64_t chunks, c;
  __device__ void operator()(int64_t j) const {
    compute_t<T> acc = 0;
    for (int64_t s = 0; s < chunks; ++s) acc += part[s * c + j];
    out[j] = convert<T>(acc);
  }
};

// Row slices for the dw/db partial sums on a GPU with `multiprocessors` multiprocessors: enough slices
// to give every multiprocessor work, few enough that the partial buffer stays small (at most 1024 · C
// values) and every slice has at least 16 rows.
inline int64_t param_chunks(int64_t n, int64_t c, int multiprocessors) {
  const int64_t column_blocks = (c + kMaxThreads - 1) / kMaxThreads;
  const int64_t wanted = std::max<int64_t>(1, int64_t{multiprocessors} * 8 / column_blocks);
  return std::clamp<int64_t>(std::min(wanted, (n + 15) / 16), 1, 1024);
}

}  // namespace seqlab::cuda::rows
