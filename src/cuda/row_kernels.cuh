// Shared host side of the row-wise CUDA kernels (src/cuda/{norm,softmax,index}.cu): index dtype
// dispatch, pointers and contiguity checks, and launch helpers. The device side (launch shape, block
// reductions: the "one block per row" design) is in block_reduce.cuh, included here.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/block_reduce.cuh"
#include "cuda/common.cuh"
#include "cuda/runtime.h"
#include "tensor/tensor.h"

namespace seqlab::cuda::rows {

// Calls fn(Tag<I>{}) with I the C++ type of an index dtype (i32, i64); throws for others.
template <class Fn>
void dispatch_index_type(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::i32:
      return fn(Tag<int32_t>{});
    case DType::i64:
      return fn(Tag<int64_t>{});
    default:
      throw std::invalid_argument(std::string(op) + " on CUDA: expected an i32 or i64 index tensor, got " +
                                  dtype_name(d));
  }
}

// Throws std::logic_error unless every tensor is defined, contiguous and on `device`: the slots'
// callers promise this, and a kernel would read garbage if one did not.
inline void require_contiguous(const char* op, int device, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!t->defined() || !t->is_contiguous() || !t->device().is_cuda() || t->device().index != device) {
      throw std::logic_error(
          std::string(op) + " on CUDA: expected contiguous tensors on cuda:" + std::to_string(device) + ", got " +
          (t->defined() ? shape_str(t->shape()) + " on " + t->device().str() + (t->is_contiguous() ? "" : " (strided)")
                        : std::string("an undefined tensor")));
    }
  }
}

// ---- launching -----------------------------------------------------------------------------------

// Blocks for one block per row on `device` (row_grid).
inline int row_blocks(int64_t rows, int device) { return row_grid(rows, multiprocessor_count(device)); }

// Runs f(i) for i in [0, n) on the stream of `device` (the caller holds a DeviceGuard for it).
template <class F>
void launch_elements(const char* what, int device, int64_t n, const F& f) {
  if (n == 0) return;
  grid_stride_loop<<<blocks_for(n, device), kThreads, 0, stream(device)>>>(n, f);
  SEQLAB_CUDA_CHECK_LAUNCH(what);
}

}  // namespace seqlab::cuda::rows
