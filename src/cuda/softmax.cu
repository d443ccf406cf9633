// CUDA softmax, log-softmax and cross-entropy fused with log-softmax, over the rows of a contiguous
// [rows, cols] view (cols = last dim): the CUDA side of the slots that src/tensor/cpu/softmax.cpp and
// src/tensor/cpu/cross_entropy.cpp fill, with the same equations.
//
// The row passes are one block per row (row_kernels.cuh): a block max, a block sum of exp(x − max),
// then a pass that writes the outputs. Subtracting the row max keeps every exponent ≤ 0, so nothing
// overflows whatever the logits' scale. Cross-entropy never stores a probability: the forward keeps
// only lse per row, and the backward recomputes exp(x − lse) element by element.
#include <cmath>

#include "cuda/row_kernels.cuh"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

using namespace rows;

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
    A m = -INFINITY;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) m = MaxOp{}(m, convert<A>(xr[i]));
    m = block_max(m, scratch);
    A s = 0;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += exp_of(convert<A>(xr[i]) - m);
    s = block_sum(s, scratch);
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
    A m = -INFINITY;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) m = MaxOp{}(m, convert<A>(xr[i]));
    m = block_max(m, scratch);
    A s = 0;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) s += exp_of(convert<A>(xr[i]) - m);
    s = block_sum(s, scratch);
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

void check_rows(const char* op, const Tensor& x, const Tensor& other) {
  if (other.shape() != x.shape()) {
    throw std::logic_error(std::string(op) + " on CUDA: shapes " + shape_str(x.shape()) + " and " +
                           shape_str(other.shape()) + " differ");
  }
}

void softmax_cuda(const Tensor& x, bool log, const Tensor& y) {
  const int device = x.device().index;
  require_contiguous("softmax", device, {&x, &y});
  check_rows("softmax", x, y);
  const int64_t c = x.dim() == 0 ? 1 : x.size(-1), n = c == 0 ? 0 : x.numel() / c;
  if (n == 0) return;
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(row_blocks(n, device)), block(row_threads(c));
    if (log) {
      softmax_rows<T, true><<<grid, block, 0, stream(device)>>>(cptr<T>(x), mptr<T>(y), n, c);
    } else {
      softmax_rows<T, false><<<grid, block, 0, stream(device)>>>(cptr<T>(x), mptr<T>(y), n, c);
    }
    SEQLAB_CUDA_CHECK_LAUNCH(log ? "log_softmax forward" : "softmax forward");
  });
}

void softmax_backward_cuda(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  const int device = y.device().index;
  require_contiguous("softmax backward", device, {&dy, &y, &dx});
  check_rows("softmax backward", y, dy);
  check_rows("softmax backward", y, dx);
  const int64_t c = y.dim() == 0 ? 1 : y.size(-1), n = c == 0 ? 0 : y.numel() / c;
  if (n == 0) return;
  DeviceGuard guard(device);
  dispatch_floating(y.dtype(), "softmax backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(row_blocks(n, device)), block(row_threads(c));
    if (log) {
      softmax_backward_rows<T, true><<<grid, block, 0, stream(device)>>>(cptr<T>(dy), cptr<T>(y), mptr<T>(dx), n, c);
    } else {
      softmax_backward_rows<T, false><<<grid, block, 0, stream(device)>>>(cptr<T>(dy), cptr<T>(y), mptr<T>(dx), n, c);
    }
    SEQLAB_CUDA_CHECK_LAUNCH(log ? "log_softmax backward" : "softmax backward");
  });
}

// lse (and the losses) are [N] in accumulate_dtype(logits' dtype).
void check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& lse) {
  if (logits.dim() != 2 || targets.numel() != logits.size(0) || lse.numel() != logits.size(0) ||
      lse.dtype() != accumulate_dtype(logits.dtype())) {
    throw std::logic_error(std::string(op) + " on CUDA: expected logits [N, V], targets [N] and lse [N] " +
                           dtype_name(accumulate_dtype(logits.dtype())) + ", got " + shape_str(logits.shape()) + ", " +
                           shape_str(targets.shape()) + " and " + shape_str(lse.shape()) + " " +
                           dtype_name(lse.dtype()));
  }
}

void cross_entropy_cuda(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                        const Tensor& lse) {
  const int device = logits.device().index;
  require_contiguous("cross_entropy", device, {&logits, &targets, &losses, &lse});
  check_cross_entropy("cross_entropy", logits, targets, lse);
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  if (v == 0) throw std::logic_error("cross_entropy on CUDA: logits " + shape_str(logits.shape()) + " have no classes");
  DeviceGuard guard(device);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index_type(targets.dtype(), "cross_entropy", [&](auto itag) {
      using I = typename decltype(itag)::type;
      cross_entropy_rows<T, I><<<row_blocks(n, device), row_threads(v), 0, stream(device)>>>(
          cptr<T>(logits), cptr<I>(targets), ignore_index, mptr<compute_t<T>>(losses), mptr<compute_t<T>>(lse), n, v);
      SEQLAB_CUDA_CHECK_LAUNCH("cross_entropy forward");
    });
  });
}

void cross_entropy_backward_cuda(double scale, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 int64_t ignore_index, const Tensor& dlogits) {
  const int device = logits.device().index;
  require_contiguous("cross_entropy backward", device, {&logits, &targets, &lse, &dlogits});
  check_cross_entropy("cross_entropy backward", logits, targets, lse);
  check_rows("cross_entropy backward", logits, dlogits);
  DeviceGuard guard(device);
  dispatch_floating(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index_type(targets.dtype(), "cross_entropy backward", [&](auto itag) {
      using I = typename decltype(itag)::type;
      launch_elements(
          "cross_entropy backward", device, logits.numel(),
          CrossEntropyBackwardFn<T, I>{cptr<T>(logits), cptr<compute_t<T>>(lse), cptr<I>(targets), mptr<T>(dlogits),
                                       logits.size(1), ignore_index, static_cast<compute_t<T>>(scale)});
    });
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(softmax_kernel, DeviceType::CUDA, &cuda::softmax_cuda);
SEQLAB_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CUDA, &cuda::softmax_backward_cuda);
SEQLAB_REGISTER_KERNEL(cross_entropy_kernel, DeviceType::CUDA, &cuda::cross_entropy_cuda);
SEQLAB_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CUDA, &cuda::cross_entropy_backward_cuda);
}  // namespace seqlab::kernel
