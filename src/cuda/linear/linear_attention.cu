// CUDA side of the linear attention and Performer feature slots declared in src/tensor/slots/linear/linear_attention.h
// (entry points, CPU kernels and equations: src/layers/linear/linear_attention.cpp,
// docs/variants/linear_attention.md). Inputs are contiguous: fq = φ(q), fk = φ(k) [B, T, H, dk],
// v [B, T, H, dv], s0 [B, H, dk, dv], z0 [B, H, dk]; Performer x [B, T, H, d] (N = B·T·H rows), ω [m, d].
//
// The per-thread math is in src/cuda/linear/linear_attention_schedule.h as __host__ __device__ functions;
// tests/linear_attention_emulation_test.cc runs that exact schedule on the CPU against the CPU
// kernels. This file only launches it.
//
// Linear attention. The recurrent and chunkwise forms are the same function of the inputs and run one
// causal schedule; the non-causal form differs only in reading S_T, z_T (and G_1, gz_1) at every step.
// - Forward (linear_attention_fwd): one thread per (b, h, value column j), B·H·dv threads in blocks of
//   128; the thread carries S[:, j] and its own copy of z in local arrays (every thread forms den_t with
//   the same operations) and writes o_t[j], final_state[:, j] and (j = 0) final_normalizer.
// - Backward (linear_attention_bwd): one block of 128 threads per (b, h); tiles of 32 steps forwards
//   (column threads: S_t, num_t[j], den_t into global scratch; barrier; δ_t; barrier; dfq_t with each
//   element summed over j by one thread; barrier), then backwards (column threads: G_t and dv_t[j];
//   barrier; row threads a < dk: gz[a] and dfk_t[a]; barrier). Deterministic (no atomics).
// Performer features: forward = per-row shift ‖x‖²/2 (+ max_i x·ω_i) then one thread per element;
// backward = per-row Σ_i dy y and arg-max, one thread per dx element, dω as partial sums over fixed
// blocks of 256 rows and their sum in block order (deterministic).
// f32 and bf16 compute in f32 (bf16 rounded on store), f64 in f64. dk, dv ≤ 128 for linear attention
// (a clear error beyond); Performer has no limit on d or m. Compiled for sm_80/sm_90; not yet run on a
// GPU (tests/linear_attention_gpu_test.cc checks it against the CPU there).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/linear/linear_attention_schedule.h"
#include "tensor/slots/linear/linear_attention.h"

namespace seqlab::cuda {
namespace {

namespace la = linear_attention_cuda;

constexpr int kBlock = 128;  // threads per block of the per-column and per-element kernels

template <class T>
__global__ void __launch_bounds__(kBlock)
    linear_attention_fwd(int64_t n, la::Dims d, la::Inputs<T> in, compute_t<T> eps, T* o, T* s, T* z) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) la::forward_column(idx, d, in, eps, o, s, z);
}

// Block bh = blockIdx.x: the phases of linear_attention_schedule.h with the barriers between them.
template <class T>
__global__ void __launch_bounds__(la::kBackwardThreads)
    linear_attention_bwd(la::Dims d, la::Inputs<T> in, const T* dout, const T* dS, const T* dz, compute_t<T> eps,
                         compute_t<T>* scratch, T* dfq, T* dfk, T* dv, T* ds0, T* dz0) {
  using A = compute_t<T>;
  const int64_t bh = blockIdx.x, j = threadIdx.x;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const bool column = j < d.dv, row = j < d.dk;
  const la::Scratch<A> w = la::scratch_of(scratch, d, bh);
  A s[la::kMaxHeadDim], z[la::kMaxHeadDim], g[la::kMaxHeadDim];
  if (column) la::backward_begin(bh, j, d, in, dout, dS, eps, w, s, z, g);
  for (int64_t c = 0; c < d.tiles(); ++c) {
    if (column) la::forward_tile_column(bh, j, c, d, in, eps, w, s, z);
    __syncthreads();
    la::forward_tile_delta(bh, tid, nthreads, c, d, dout, w);
    __syncthreads();
    la::forward_tile_dfq(bh, tid, nthreads, c, d, dout, w, dfq);
    __syncthreads();
  }
  A gz = row ? la::reverse_begin_row(bh, j, d, in, dz, w) : A(0);
  for (int64_t c = d.tiles() - 1; c >= 0; --c) {
    if (column) la::reverse_tile_column(bh, j, c, d, in, dout, w, g, dv);
    __syncthreads();
    if (row) la::reverse_tile_row(bh, j, c, d, in, w, gz, dfk);
    __syncthreads();
  }
  if (column) la::backward_end_column(bh, j, d, g, ds0);
  if (row) la::backward_end_row(bh, j, d, gz, dz0);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    performer_shift(la::PerformerDims p, const T* x, const T* omega, compute_t<T>* shift) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n < p.N) la::performer_row_shift(n, p, x, omega, shift);
}

template <class T>
__global__ void __launch_bounds__(kBlock) performer_fwd(la::PerformerDims p, const T* x, const T* omega,
                                                        const compute_t<T>* shift, compute_t<T> inv_sqrt_m, T* y) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < p.N * p.m) la::performer_element(e, p, x, omega, shift, inv_sqrt_m, y);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    performer_bwd_rows(la::PerformerDims p, const T* dy, const T* x, const T* omega, const T* y,
                       compute_t<T>* rowsum, int64_t* arg) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n < p.N) la::performer_backward_row(n, p, dy, x, omega, y, rowsum, arg);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    performer_bwd_dx(la::PerformerDims p, const T* dy, const T* x, const T* omega, const T* y,
                     const compute_t<T>* rowsum, const int64_t* arg, T* dx) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < p.N * p.d) la::performer_dx(e, p, dy, x, omega, y, rowsum, arg, dx);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    performer_bwd_domega_partial(la::PerformerDims p, const T* dy, const T* x, const T* y,
                                 const compute_t<T>* rowsum, const int64_t* arg, compute_t<T>* partial) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, md = p.m * p.d;
  const int64_t blocks = (p.N + la::kRowBlock - 1) / la::kRowBlock;
  if (idx < blocks * md) la::performer_domega_partial(idx / md, idx % md, p, dy, x, y, rowsum, arg, partial);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    performer_bwd_domega_final(la::PerformerDims p, const compute_t<T>* partial, T* domega) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < p.m * p.d) la::performer_domega_final(e, p, partial, domega);
}

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

void check_tensor(const Tensor& t, const Tensor& like, const char* op, const char* what) {
  if (!t.defined() || !t.is_contiguous() || t.dtype() != like.dtype() || !t.device().is_cuda() ||
      t.device() != like.device()) {
    throw std::logic_error(std::string(op) + " on CUDA: " + what + " must be a contiguous " +
                           dtype_name(like.dtype()) + " tensor on " + like.device().str() + ", got " +
                           (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) + " on " + t.device().str()
                                        : std::string("undefined")));
  }
}

la::Dims dims_of(const Tensor& fq, const Tensor& v, const kernel::LinearAttentionParams& p) {
  const la::Dims d{fq.size(0), fq.size(1), fq.size(2), fq.size(3), v.size(3),
                   p.form != LinearAttentionForm::noncausal, p.normalize};
  if (d.dk > la::kMaxHeadDim || d.dv > la::kMaxHeadDim) {
    throw std::invalid_argument("linear_attention on CUDA: head dims up to " + std::to_string(la::kMaxHeadDim) +
                                " are supported, got dk = " + std::to_string(d.dk) + ", dv = " + std::to_string(d.dv));
  }
  return d;
}

void forward_cuda(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                  const kernel::LinearAttentionParams& p, const Tensor& o, const Tensor& s, const Tensor& z) {
  for (auto [t, what] : {std::pair{&fq, "fq"}, {&fk, "fk"}, {&v, "v"}, {&s0, "s0"}, {&z0, "z0"}, {&o, "o"},
                         {&s, "final_state"}, {&z, "final_normalizer"}}) {
    check_tensor(*t, fq, "linear_attention", what);
  }
  const la::Dims d = dims_of(fq, v, p);
  const int64_t n = d.B * d.H * d.dv;
  if (n == 0) return;
  dispatch_floating(fq.dtype(), "linear_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const la::Inputs<T> in{cptr<T>(fq), cptr<T>(fk), cptr<T>(v), cptr<T>(s0), cptr<T>(z0)};
    const int device = fq.device().index;
    DeviceGuard guard(device);
    linear_attention_fwd<T><<<blocks_of(n), kBlock, 0, stream(device)>>>(n, d, in, static_cast<A>(p.eps), mptr<T>(o),
                                                                        mptr<T>(s), mptr<T>(z));
    SEQLAB_CUDA_CHECK_LAUNCH("linear_attention forward kernel");
  });
}

void backward_cuda(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                   const Tensor& dout, const Tensor& ds, const Tensor& dz, const kernel::LinearAttentionParams& p,
                   const Tensor& dfq, const Tensor& dfk, const Tensor& dv, const Tensor& ds0, const Tensor& dz0) {
  for (auto [t, what] : {std::pair{&fq, "fq"}, {&fk, "fk"}, {&v, "v"}, {&s0, "s0"}, {&z0, "z0"}, {&dout, "dout"},
                         {&ds, "dfinal_state"}, {&dz, "dfinal_normalizer"}, {&dfq, "dfq"}, {&dfk, "dfk"}, {&dv, "dv"},
                         {&ds0, "ds0"}, {&dz0, "dz0"}}) {
    check_tensor(*t, fq, "linear_attention backward", what);
  }
  const la::Dims d = dims_of(fq, v, p);
  if (d.B * d.H == 0) return;
  dispatch_floating(fq.dtype(), "linear_attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const la::Inputs<T> in{cptr<T>(fq), cptr<T>(fk), cptr<T>(v), cptr<T>(s0), cptr<T>(z0)};
    // Scratch returned to the allocator's cache at exit: safe, later users queue on the same stream.
    Tensor scratch = Tensor::empty({d.B * d.H * la::scratch_per_head(d)}, dtype_of_compute<A>(), fq.device());
    const int device = fq.device().index;
    DeviceGuard guard(device);
    linear_attention_bwd<T><<<static_cast<unsigned>(d.B * d.H), la::kBackwardThreads, 0, stream(device)>>>(
        d, in, cptr<T>(dout), cptr<T>(ds), cptr<T>(dz), static_cast<A>(p.eps), mptr<A>(scratch), mptr<T>(dfq),
        mptr<T>(dfk), mptr<T>(dv), mptr<T>(ds0), mptr<T>(dz0));
    SEQLAB_CUDA_CHECK_LAUNCH("linear_attention backward kernel");
  });
}

la::PerformerDims performer_dims(const Tensor& x, const Tensor& omega, bool stabilize) {
  const int64_t d = x.size(3);
  return {d > 0 ? x.numel() / d : 0, d, omega.size(0), stabilize};
}

void performer_forward_cuda(const Tensor& x, const Tensor& omega, bool stabilize, const Tensor& y) {
  for (auto [t, what] : {std::pair{&x, "x"}, {&omega, "omega"}, {&y, "y"}}) {
    check_tensor(*t, x, "performer_features", what);
  }
  const la::PerformerDims p = performer_dims(x, omega, stabilize);
  if (p.N * p.m == 0) return;
  dispatch_floating(x.dtype(), "performer_features", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    Tensor shift = Tensor::empty({p.N}, dtype_of_compute<A>(), x.device());
    const A inv_sqrt_m = static_cast<A>(1.0 / std::sqrt(static_cast<double>(p.m)));
    const int device = x.device().index;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    performer_shift<T><<<blocks_of(p.N), kBlock, 0, st>>>(p, cptr<T>(x), cptr<T>(omega), mptr<A>(shift));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features row shift kernel");
    performer_fwd<T><<<blocks_of(p.N * p.m), kBlock, 0, st>>>(p, cptr<T>(x), cptr<T>(omega), cptr<A>(shift),
                                                             inv_sqrt_m, mptr<T>(y));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features forward kernel");
  });
}

void performer_backward_cuda(const Tensor& dy, const Tensor& x, const Tensor& omega, const Tensor& y, bool stabilize,
                             const Tensor& dx, const Tensor& domega) {
  for (auto [t, what] : {std::pair{&dy, "dy"}, {&x, "x"}, {&omega, "omega"}, {&y, "y"}, {&dx, "dx"},
                         {&domega, "domega"}}) {
    check_tensor(*t, x, "performer_features backward", what);
  }
  const la::PerformerDims p = performer_dims(x, omega, stabilize);
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t st = stream(device);
  if (p.N == 0 || p.m == 0 || p.d == 0) {  // no rows or no features: every gradient is zero
    if (dx.numel() > 0) SEQLAB_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), st));
    if (domega.numel() > 0) SEQLAB_CUDA_CHECK(cudaMemsetAsync(domega.raw_data(), 0, domega.nbytes(), st));
    return;
  }
  dispatch_floating(x.dtype(), "performer_features backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const DType cd = dtype_of_compute<A>();
    const int64_t blocks = (p.N + la::kRowBlock - 1) / la::kRowBlock, md = p.m * p.d;
    Tensor rowsum = Tensor::empty({p.N}, cd, x.device()), arg = Tensor::empty({p.N}, DType::i64, x.device());
    Tensor partial = Tensor::empty({blocks * md}, cd, x.device());
    performer_bwd_rows<T><<<blocks_of(p.N), kBlock, 0, st>>>(p, cptr<T>(dy), cptr<T>(x), cptr<T>(omega), cptr<T>(y),
                                                            mptr<A>(rowsum), mptr<int64_t>(arg));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features backward row kernel");
    performer_bwd_dx<T><<<blocks_of(p.N * p.d), kBlock, 0, st>>>(p, cptr<T>(dy), cptr<T>(x), cptr<T>(omega),
                                                                cptr<T>(y), cptr<A>(rowsum), cptr<int64_t>(arg),
                                                                mptr<T>(dx));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features backward dx kernel");
    performer_bwd_domega_partial<T><<<blocks_of(blocks * md), kBlock, 0, st>>>(
        p, cptr<T>(dy), cptr<T>(x), cptr<T>(y), cptr<A>(rowsum), cptr<int64_t>(arg), mptr<A>(partial));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features backward domega partial kernel");
    performer_bwd_domega_final<T><<<blocks_of(md), kBlock, 0, st>>>(p, cptr<A>(partial), mptr<T>(domega));
    SEQLAB_CUDA_CHECK_LAUNCH("performer_features backward domega kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(linear_attention_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(linear_attention_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
SEQLAB_REGISTER_KERNEL(performer_forward_kernel, DeviceType::CUDA, &cuda::performer_forward_cuda);
SEQLAB_REGISTER_KERNEL(performer_backward_kernel, DeviceType::CUDA, &cuda::performer_backward_cuda);
}  // namespace seqlab::kernel
