// The device code of src/cuda/ssm/conv1d.cu (read its header comment first: the launches and their
// memory). A header of its own, needing only CUDA's built-ins and host code of src/tensor, so that
// tests/conv1d_emulation_test.cc runs these same kernels on the CPU over tests/cuda_emulation.h.
//
// Notation as in src/layers/ssm/conv1d.h: x [B, T, C], w [W, C], b [C], h0 [B, W−1, C], the padded
// input p = h0 ++ x [B, W−1+T, C] (never materialised: p_u reads h0 for u < W−1, x after it, 0 when no
// h0 is given), z_t = Σ_{j<W} w_j p_{t+W−1−j} (+ b), y = silu(z) or z. Every kernel computes in
// A = compute_t<T> (f32 for bf16) and takes a product through rounded_product, so that a product is
// rounded on its own before its add — the CPU kernel's arithmetic (no FMA), summed in the same order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device_common.cuh"
#include "tensor/elementwise_math.h"
#include "tensor/slots/ssm/conv1d.h"

namespace seqlab::cuda::conv1d {

// a·b rounded to A, never contracted with a following add into an FMA (nvcc contracts a plain a·b + c
// by default; __fmul_rn and __dmul_rn are exempt). On the host (the emulation) a plain product: the
// tests compile for the baseline x86-64, which has no FMA to contract into.
template <class A>
__device__ __forceinline__ A rounded_product(A a, A b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<A, float>) {
    return __fmul_rn(a, b);
  } else {
    return __dmul_rn(a, b);
  }
#else
  return a * b;
#endif
}

// The sizes every kernel reads. halo = W − 1.
struct Geometry {
  int64_t B, T, C;
  int W;
};

// p_u of batch entry b, channel c, in A.
template <class T>
__device__ __forceinline__ compute_t<T> padded(const Geometry& g, const T* x, const T* h0, int64_t b, int64_t u,
                                               int64_t c) {
  using A = compute_t<T>;
  const int64_t halo = g.W - 1;
  if (u >= halo) return convert<A>(x[(b * g.T + u - halo) * g.C + c]);
  return h0 != nullptr ? convert<A>(h0[(b * halo + u) * g.C + c]) : A(0);
}

// z_t for batch entry b, channel c: the products in the order j = 0 … W−1, each rounded, then the bias.
template <class T>
__device__ __forceinline__ compute_t<T> preactivation(const Geometry& g, const T* x, const T* w, const T* bias,
                                                      const T* h0, int64_t b, int64_t t, int64_t c) {
  using A = compute_t<T>;
  A z = A(0);
  for (int j = 0; j < g.W; ++j) {
    const A term = rounded_product(padded(g, x, h0, b, t + g.W - 1 - j, c), convert<A>(w[j * g.C + c]));
    z = j == 0 ? term : z + term;
  }
  if (bias != nullptr) z = z + convert<A>(bias[c]);
  return z;
}

// y[i] = act(z) for every i = (b·T + t)·C + c < B·T·C, one element per thread in a grid-stride loop.
// Reads W inputs and W taps per element (neighbouring threads share them through the cache: the inputs
// of channel c at t are read again by the threads of t + 1 … t + W − 1); writes y once.
template <class T>
__global__ void __launch_bounds__(kThreads)
    conv1d_forward(Geometry g, const T* x, const T* w, const T* bias, const T* h0, bool silu, T* y) {
  using A = compute_t<T>;
  const int64_t n = g.B * g.T * g.C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = i % g.C, bt = i / g.C, t = bt % g.T, b = bt / g.T;
    A z = preactivation(g, x, w, bias, h0, b, t, c);
    if (silu) z = math::unary_forward(kernel::UnaryOp::silu, z, A(0));
    y[i] = convert<T>(z);
  }
}

// final_state[b, i, c] = p_{T+i} for i < W − 1: the last W − 1 inputs, reaching into h0 when T < W − 1.
// One element per thread; reads and writes B·(W−1)·C elements once.
template <class T>
__global__ void __launch_bounds__(kThreads) conv1d_final_state(Geometry g, const T* x, const T* h0, T* final_state) {
  using A = compute_t<T>;
  const int64_t halo = g.W - 1, n = g.B * halo * g.C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = i % g.C, bi = i / g.C, k = bi % halo, b = bi / halo;
    const int64_t u = g.T + k;
    // A copy: the stored value itself (through A, exact for every T).
    final_state[i] = u >= halo ? x[(b * g.T + u - halo) * g.C + c]
                               : (h0 != nullptr ? h0[(b * halo + u) * g.C + c] : convert<T>(A(0)));
  }
}

// dz[i] = dy_i · act'(z_i) in A for every element of [B, T, C] (z recomputed; without silu dz = dy).
// Reads dy once and the W inputs of each element; writes the A scratch dz once.
template <class T>
__global__ void __launch_bounds__(kThreads) conv1d_dz(Geometry g, const T* dy, const T* x, const T* w, const T* bias,
                                                      const T* h0, bool silu, compute_t<T>* dz) {
  using A = compute_t<T>;
  const int64_t n = g.B * g.T * g.C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const A d = convert<A>(dy[i]);
    if (silu) {
      const int64_t c = i % g.C, bt = i / g.C, t = bt % g.T, b = bt / g.T;
      const A z = preactivation(g, x, w, bias, h0, b, t, c);
      dz[i] = math::unary_backward(kernel::UnaryOp::silu, d, z, A(0), A(0));
    } else {
      dz[i] = d;
    }
  }
}

// dp_u = Σ_j w_j dz_{u−(W−1)+j} over the outputs that read p_u, from j = W−1 down to 0 (the CPU's order),
// each product rounded, then + dfinal_{u−T} for u ≥ T; row u < W−1 goes to dh0 (when not null), the
// others to dx (when not null). One element of [B, W−1+T, C] per thread: reads W elements of dz and W
// taps, writes one gradient element.
template <class T>
__global__ void __launch_bounds__(kThreads)
    conv1d_dinput(Geometry g, const compute_t<T>* dz, const T* w, const T* dfinal, T* dx, T* dh0) {
  using A = compute_t<T>;
  const int64_t halo = g.W - 1, U = halo + g.T, n = g.B * U * g.C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = i % g.C, bu = i / g.C, u = bu % U, b = bu / U;
    T* out = u < halo ? (dh0 != nullptr ? dh0 + (b * halo + u) * g.C + c : nullptr)
                      : (dx != nullptr ? dx + (b * g.T + u - halo) * g.C + c : nullptr);
    if (out == nullptr) continue;
    A acc = A(0);
    bool first = true;
    for (int j = g.W - 1; j >= 0; --j) {
      const int64_t t = u - halo + j;
      if (t < 0 || t >= g.T) continue;
      const A term = rounded_product(dz[(b * g.T + t) * g.C + c], convert<A>(w[j * g.C + c]));
      acc = first ? term : acc + term;
      first = false;
    }
    if (dfinal != nullptr && u >= g.T) acc = acc + convert<A>(dfinal[(b * halo + u - g.T) * g.C + c]);
    *out = convert<T>(acc);
  }
}

// dw_j[c] = Σ_{b,t} dz_t p_{t+W−1−j} for i = j·C + c < W·C, and db[c] = Σ_{b,t} dz_t for i = W·C + c: one
// sum per thread, over b then t, in double (as the CPU kernel sums them). Each thread reads a column of
// dz and of p with stride C — coalesced across the threads of neighbouring channels — and writes one
// element. dweight or dbias null: those sums are skipped.
template <class T>
__global__ void __launch_bounds__(kThreads)
    conv1d_dparams(Geometry g, const compute_t<T>* dz, const T* x, const T* h0, T* dweight, T* dbias) {
  const int64_t n = (g.W + 1) * g.C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = i % g.C, j = i / g.C;
    const bool is_bias = j == g.W;
    if ((is_bias && dbias == nullptr) || (!is_bias && dweight == nullptr)) continue;
    double acc = 0;
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t t = 0; t < g.T; ++t) {
        const double d = static_cast<double>(dz[(b * g.T + t) * g.C + c]);
        acc += is_bias ? d : d * static_cast<double>(padded(g, x, h0, b, t + g.W - 1 - j, c));
      }
    }
    if (is_bias) {
      dbias[c] = convert<T>(acc);
    } else {
      dweight[i] = convert<T>(acc);
    }
  }
}

}  // namespace seqlab::cuda::conv1d
