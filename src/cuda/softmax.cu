// CUDA softmax, log-softmax and cross-entropy fused with log-softmax, over the rows of a contiguous
// [rows, cols] view (cols = last dim): the CUDA side of the slots that src/tensor/cpu/softmax.cpp and
// src/tensor/cpu/cross_entropy.cpp fill, with the same equations.
//
// The row passes are one block per row (block_reduce.cuh): a block max, a block sum of exp(x − max),
// then a pass that writes the outputs. Subtracting the row max keeps every exponent ≤ 0, so nothing
// overflows whatever the logits' scale. Cross-entropy never stores a probability: the forward keeps
// only lse per row, and the backward recomputes exp(x − lse) element by element.
// The kernels are in softmax_kernels.cuh (a header of their own so that
// tests/rows_emulation_test.cc runs the same source on the CPU); this file holds the checks
// and launches.
#include <cmath>

#include "cuda/row_kernels.cuh"
#include "cuda/softmax_kernels.cuh"
#include "tensor/kernels.h"

namespace seqlab::cuda {
namespace {

using namespace rows;

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
