// Gradient checking by central finite differences in float64.
//
// For outputs y_o = f(inputs) and fixed random cotangents r_o, the scalar L = Σ_o ⟨r_o, y_o⟩ is
// differentiated two ways: analytically by the backward pass seeded with r_o, and numerically by
// (L(x + εe_i) − L(x − εe_i)) / 2ε for every element i of every floating input. The relative error
// of an element is |analytic − numeric| / max(|analytic|, |numeric|, floor).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace seqlab {

struct GradcheckOptions {
  double eps = 1e-6;
  double tolerance = 1e-6;
  double floor = 1e-2;  // below this magnitude errors are measured absolutely
  uint64_t seed = 1234;
  std::vector<bool> check;  // per input: whether to check it (default: every floating input)
};

struct GradcheckResult {
  bool ok = true;
  double max_error = 0;      // worst relative error over all checked elements
  std::string worst;         // where it happened: input, element, analytic and numeric values
  int64_t elements_checked = 0;
};

using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Inputs must be f64 CPU tensors (integer inputs pass through unchecked).
GradcheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace seqlab
