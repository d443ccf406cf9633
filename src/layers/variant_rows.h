// bf16 in the CPU kernels of the chunkwise variant ops (GLA, retention, linear attention): the kernels
// take bf16 tensors themselves (SEQLAB_REGISTER_KERNEL_TAKING_BF16) instead of the dispatch layer's f32
// stand-ins of whole tensors (tensor/dispatch.h), one (batch, head) at a time.
//
// A kernel is one template on E, the tensors' element type (float, double or bf16), with
//   T = compute_t<E>: the arithmetic (f32 for bf16 tensors, E otherwise),
// one code path for all three; for f32 and f64 it is exactly the kernel it was (the rows are the
// tensors' own, the GEMMs the same calls), so those paths keep their bits. For bf16:
// - TaskRows: the rows of one (batch, head) are read widened to f32 (exact) into per-thread buffers,
//   outputs are kept in f32 buffers and rounded into the bf16 tensors once, when the head is done (round
//   to nearest even, as the CUDA kernels store bf16 and as the stand-ins round). Every recurrence, state,
//   gate and decay stays f32, as on the GPU.
// - Products: the GEMM-shaped products run in f32 on those widened rows, as the stand-ins ran them, so
//   a bf16 result is the f32 kernel's on the same bf16 inputs, rounded once per output. bf16 operands
//   were tried here (docs/perf.md, "CPU: bf16"): at these kernels' sizes (products of at most 64 × 64 × 64
//   per chunk) they were no faster, and rounding the computed operands the GPU keeps in f32 (gate- or
//   decay-scaled rows, scores, states) moved gla_small's validation loss at step 1000 from 1.7151 to
//   1.7381, so the products stay f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/blas_rows.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace seqlab::cpu {

// compute_t<E> (the arithmetic of elements stored as E) and dispatch_float_or_bf16 (the kernels' entry
// on f32, f64 or bf16 tensors) are tensor/bf16_convert.h's.

// The rows of one (batch, head) of a kernel's tensors, as the kernel reads and writes them in T. For
// f32 and f64 they are the tensors' own rows (no copy). For bf16: in() widens the rows into a buffer,
// out() hands a buffer that store() rounds into the tensor; the kernel reads rows `width` apart in
// them (ld()). One TaskRows per thread, reused task after task: begin() at the start of a task, store()
// at its end. Memory for bf16, per thread: an f32 copy of the head's rows of every input and output the
// kernel names (T × dk or T × dv each, and the [dk, dv] states): the stand-ins' copies, one head at a time.
template <class E>
class TaskRows {
 public:
  using T = compute_t<E>;
  static constexpr bool kWidened = !std::is_same_v<E, T>;

  TaskRows() { bufs_.reserve(16); }  // buffers never move while a task holds pointers into them

  // The row stride the kernel sees for rows of `width` that lie `tensor_ld` apart in the tensor.
  static int64_t ld(int64_t tensor_ld, int64_t width) { return kWidened ? width : tensor_ld; }

  void begin() {
    used_ = 0;
    outs_.clear();
  }

  // `rows` rows of `width` elements of t starting at element `offset`, rows `tensor_ld` apart;
  // nullptr for an undefined t (an absent optional input).
  const T* in(const Tensor& t, int64_t offset, int64_t rows, int64_t width, int64_t tensor_ld) {
    if (!t.defined()) return nullptr;
    const E* src = t.data<E>() + offset;
    if constexpr (!kWidened) {
      return src;
    } else {
      T* dst = buffer(rows * width);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < width; ++i) dst[r * width + i] = static_cast<T>(src[r * tensor_ld + i]);
      }
      return dst;
    }
  }

  // The same rows of an output; for bf16 the buffer holds no values until the kernel writes them.
  T* out(const Tensor& t, int64_t offset, int64_t rows, int64_t width, int64_t tensor_ld) {
    if (!t.defined()) return nullptr;
    E* dst = t.data<E>() + offset;
    if constexpr (!kWidened) {
      return dst;
    } else {
      T* buf = buffer(rows * width);
      outs_.push_back({dst, buf, rows, width, tensor_ld});
      return buf;
    }
  }

  // bf16: rounds every out() buffer of this task into its tensor (the one rounding of each output).
  void store() {
    if constexpr (kWidened) {
      for (const Out& o : outs_) {
        for (int64_t r = 0; r < o.rows; ++r) {
          for (int64_t i = 0; i < o.width; ++i) o.dst[r * o.ld + i] = E(o.buf[r * o.width + i]);
        }
      }
      outs_.clear();
    }
  }

 private:
  struct Out {
    E* dst;
    const T* buf;
    int64_t rows, width, ld;
  };
  T* buffer(int64_t n) {
    if (used_ == bufs_.size()) {
      if (bufs_.size() == bufs_.capacity()) throw std::logic_error("TaskRows: more than 16 row sets in one task");
      bufs_.emplace_back();
    }
    std::vector<T>& b = bufs_[used_++];
    if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
    return b.data();
  }
  std::vector<std::vector<T>> bufs_;
  size_t used_ = 0;
  std::vector<Out> outs_;
};

// The GEMM-shaped products of a kernel on T rows (its `mm` calls): C = α op(A) op(B) + β C, row-major with
// leading dimensions, through cpu::gemm in T (f32 for bf16 tensors: see the top of the file).
template <class T>
void mm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a, int64_t lda, const T* b,
        int64_t ldb, double beta, T* c, int64_t ldc) {
  gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace seqlab::cpu
