// The cases and inputs that the selective scan's emulation test (tests/selective_scan_emulation_test.cc)
// and GPU test (tests/selective_scan_gpu_test.cc) share: odd shapes, T = 1, T below one chunk, every
// optional input present or absent, Δ from 1e-4 to 10 and decays from ≈ 0 to ≈ 1, with random
// cotangents dy and dfinal.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/slots/ssm/selective_scan.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

struct SelectiveScanCase {
  int64_t B, T, D, N, chunk;
  bool optional;  // D skip, z gate, delta_bias and initial state (all or none)
  double dt_lo = 0.3, dt_hi = 1.3, a_lo = -2.0, a_hi = -0.1;  // Δ = softplus(delta) and A ranges
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " D" + std::to_string(D) + " N" +
           std::to_string(N) + " chunk" + std::to_string(chunk) + (optional ? " all inputs" : " required inputs") +
           " dt [" + std::to_string(dt_lo) + ", " + std::to_string(dt_hi) + "] A [" + std::to_string(a_lo) + ", " +
           std::to_string(a_hi) + "]";
  }
};

inline const std::vector<SelectiveScanCase> kSelectiveScanCases = {
    {2, 11, 5, 3, 4, true},   // T not a multiple of the chunk
    {2, 11, 5, 3, 4, false},
    {1, 1, 3, 4, 4, true},    // one token
    {2, 5, 3, 7, 8, true},    // T below one chunk
    {1, 40, 9, 16, 16, true, 1e-4, 10.0, -1000.0, -1e-6},  // Δ from 1e-4 to 10, decays from e^{−10⁴} to ≈ 1
    {1, 17, 130, 2, 5, true}, // more than one block of 128 threads
};

struct SelectiveScanData {
  kernel::SelectiveScanInputs in;
  Tensor dy, dfinal;
};

// Inputs in `dtype` (raw delta drawn so that softplus(delta) is uniform in [dt_lo, dt_hi]).
inline SelectiveScanData make_selective_scan_data(const SelectiveScanCase& c, DType dtype, Generator& gen) {
  SelectiveScanData x;
  const Tensor dt = Tensor::rand({c.B, c.T, c.D}, gen, DType::f64, c.dt_lo, c.dt_hi);
  std::vector<double> raw = dt.to_doubles();
  for (double& v : raw) v = std::log(std::expm1(v));
  x.in.u = Tensor::randn({c.B, c.T, c.D}, gen, dtype);
  x.in.delta = Tensor::from_vector(raw, {c.B, c.T, c.D}, dtype);
  x.in.A = Tensor::rand({c.D, c.N}, gen, dtype, c.a_lo, c.a_hi);
  x.in.B = Tensor::randn({c.B, c.T, c.N}, gen, dtype);
  x.in.C = Tensor::randn({c.B, c.T, c.N}, gen, dtype);
  if (c.optional) {
    x.in.D = Tensor::randn({c.D}, gen, dtype);
    x.in.z = Tensor::randn({c.B, c.T, c.D}, gen, dtype);
    x.in.delta_bias = Tensor::rand({c.D}, gen, dtype, -0.02, 0.02);
    x.in.initial_state = Tensor::randn({c.B, c.D, c.N}, gen, dtype);
  }
  x.dy = Tensor::randn({c.B, c.T, c.D}, gen, dtype);
  x.dfinal = Tensor::randn({c.B, c.D, c.N}, gen, dtype);
  return x;
}

}  // namespace seqlab::testing
