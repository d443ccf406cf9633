// The rotary-embedding cases shared by the two checks of the CUDA rope kernels — the GPU test
// (tests/optim_gpu_test.cc, the slot of src/cuda/attention/rope.cu) and the emulation test
// (tests/rope_emulation_test.cc, src/cuda/attention/rope_kernels.cuh run on the CPU). Each program runs
// the forward and the inverse rotation of each case, on x ~ N(0, 1) drawn in the dtype under test.
#pragma once

#include <cstdint>
#include <string>

#include "layers/attention/rope.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// x [B, T, H, D] rotated from position `start` with frequencies base^(−2i/D).
struct RopeCase {
  Shape shape;
  double base;
  int64_t start;
};
inline const RopeCase kRopeCases[] = {
    {{2, 7, 3, 10}, 10000.0, 0},        // odd T and H, D/2 odd
    {{1, 33, 5, 64}, 10000.0, 123457},  // far positions: the angle must be formed in double
    {{3, 1, 1, 2}, 500.0, 9},           // one pair per head
    {{2, 129, 4, 34}, 10000.0, 17},     // 35088 pairs: not a multiple of the block, more than one stride
                                        // of the emulation's 32-block grid
};

inline RopeOptions rope_options(const RopeCase& c) {
  RopeOptions opts;
  opts.base = c.base;
  opts.start = c.start;
  return opts;
}
inline std::string rope_name(DType dtype, const RopeCase& c, bool inverse) {
  return std::string("rope ") + dtype_name(dtype) + " " + shape_str(c.shape) + " start=" + std::to_string(c.start) +
         (inverse ? " inverse" : "");
}

}  // namespace seqlab::testing
