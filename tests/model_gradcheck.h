// A model's parameter gradients against central differences of its float64 loss, shared by the model
// tests (decoder_test, model_kinds_test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "layers/module.h"

namespace seqlab {

// For each named parameter, the listed elements (every parameter's middle element when `checked` is
// empty): backward's gradient of loss() against (L(w + h) − L(w − h)) / 2h, h = 1e-5, relative error
// |n − a| / max(|n|, |a|, 1e-3) ≤ 1e-6. The model's parameters are float64; `loss` recomputes the loss from
// the model as it is (replaying dropout masks, where there are any, so every evaluation draws the same).
inline void expect_parameter_gradients_match(Module& model, const std::function<Tensor()>& loss,
                                             std::vector<std::pair<std::string, std::vector<int64_t>>> checked,
                                             const std::string& what) {
  backward(loss());
  if (checked.empty()) {
    for (const Parameter& p : model.parameters()) checked.push_back({p.name, {p.tensor->numel() / 2}});
  }
  for (const auto& [name, elements] : checked) {
    Tensor* p = nullptr;
    for (const Parameter& q : model.parameters()) {
      if (q.name == name) p = q.tensor;
    }
    ASSERT_NE(p, nullptr) << what << ": " << name;
    ASSERT_EQ(p->dtype(), DType::f64);
    const std::vector<double> grad = grad_of(*p).to_doubles();
    double* w = p->data<double>();
    const double h = 1e-5;
    for (int64_t idx : elements) {
      NoGradGuard no_grad;
      const double saved = w[idx];
      w[idx] = saved + h;
      const double up = loss().item();
      w[idx] = saved - h;
      const double down = loss().item();
      w[idx] = saved;
      const double numeric = (up - down) / (2 * h), analytic = grad[static_cast<size_t>(idx)];
      const double rel = std::abs(numeric - analytic) / std::max({std::abs(numeric), std::abs(analytic), 1e-3});
      EXPECT_LE(rel, 1e-6) << what << ": " << name << " element " << idx << " numeric " << numeric << " analytic "
                           << analytic;
    }
  }
}

}  // namespace seqlab
