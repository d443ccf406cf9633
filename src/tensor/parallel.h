// CPU helpers shared by the kernels in this folder: OpenMP loops and strided element walks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace seqlab::cpu {

// Below this many elements a loop runs on one thread: spawning costs more than it saves.
constexpr int64_t kParallelGrain = 32768;

int64_t omp_threads();  // threads in the current parallel region
int64_t omp_thread();   // this thread's number in it

// Runs body(begin, end) over [0, n) split into one contiguous range per thread.
template <class Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  if (n <= grain) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    int64_t threads = omp_threads(), tid = omp_thread();
    int64_t chunk = (n + threads - 1) / threads;
    int64_t begin = tid * chunk, end = begin + chunk < n ? begin + chunk : n;
    if (begin < end) body(begin, end);
  }
}

// Walks the elements of `shape` in row-major order, keeping the element offset of each of N
// operands whose strides are given (stride 0 for broadcast dimensions).
template <int N>
class StridedWalker {
 public:
  StridedWalker(const Shape& shape, const std::array<const Shape*, N>& strides, int64_t start)
      : shape_(shape), index_(shape.size(), 0) {
    for (int k = 0; k < N; ++k) {
      strides_[k] = strides[k];
      offset_[k] = 0;
    }
    int64_t rest = start;
    for (size_t d = shape.size(); d-- > 0;) {
      index_[d] = shape[d] == 0 ? 0 : rest % shape[d];
      rest = shape[d] == 0 ? 0 : rest / shape[d];
      for (int k = 0; k < N; ++k) offset_[k] += index_[d] * (*strides_[k])[d];
    }
  }
  int64_t offset(int k) const { return offset_[k]; }
  void next() {
    for (size_t d = shape_.size(); d-- > 0;) {
      for (int k = 0; k < N; ++k) offset_[k] += (*strides_[k])[d];
      if (++index_[d] < shape_[d]) return;
      for (int k = 0; k < N; ++k) offset_[k] -= index_[d] * (*strides_[k])[d];
      index_[d] = 0;
    }
  }

 private:
  const Shape& shape_;
  std::vector<int64_t> index_;
  std::array<const Shape*, N> strides_;
  std::array<int64_t, N> offset_;
};

}  // namespace seqlab::cpu
