// Layer norm and RMS norm over the last dimension, with hand-derived backwards (the formulas are
// stated in src/tensor/cpu/norm.cpp). The forward saves the row statistics, not x̂, so the
// backward's memory is x plus two numbers per row.
#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

// y = (x − μ) · rstd ⊙ w + b,  rstd = 1 / √(var + eps);  with x̂ = (x − μ)·rstd and g = dy ⊙ w:
// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)),  dw = Σ_rows dy ⊙ x̂,  db = Σ_rows dy
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  kernel::NormOutput out = kernel::layer_norm(x, weight, bias, eps);
  Tensor y = out.y;
  record("layer_norm", {x, weight, bias}, {&y}, {x, weight, out.mean, out.rstd},
         [](const Grads& g, const Grads& s, const Needs& need) {
           kernel::NormGrads d = kernel::layer_norm_backward(g[0], s[0], s[1], s[2], s[3], need[0], need[1], need[2]);
           return Grads{d.dx, d.dweight, d.dbias};
         });
  return y;
}

// y = x · rstd ⊙ w,  rstd = 1 / √(mean(x²) + eps);  with x̂ = x·rstd and g = dy ⊙ w:
// dx = rstd · (g − x̂ · mean(g ⊙ x̂)),  dw = Σ_rows dy ⊙ x̂
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  kernel::NormOutput out = kernel::rms_norm(x, weight, eps);
  Tensor y = out.y;
  record("rms_norm", {x, weight}, {&y}, {x, weight, out.rstd}, [](const Grads& g, const Grads& s, const Needs& need) {
    kernel::NormGrads d = kernel::rms_norm_backward(g[0], s[0], s[1], s[2], need[0], need[1]);
    return Grads{d.dx, d.dweight};
  });
  return y;
}

// ---- registry entries ----
namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "layer_norm";
  s.summary = "y = (x − mean) / √(var + eps) ⊙ weight + bias over the last dimension; bias optional";
  s.inputs = {{"x"}, {"weight"}, {"bias", OpInputKind::floating, true}};
  s.outputs = {"y"};
  s.attrs = {{"eps", AttrType::number, "1e-5", "added to the variance"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return Grads{layer_norm(in[0], in[1], in[2], a.get_number("eps"))};
  };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 7}, gen, dtype), Tensor::randn({7}, gen, dtype), Tensor::randn({7}, gen, dtype)};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "rms_norm";
  s.summary = "y = x / √(mean(x²) + eps) ⊙ weight over the last dimension";
  s.inputs = {{"x"}, {"weight"}};
  s.outputs = {"y"};
  s.attrs = {{"eps", AttrType::number, "1e-6", "added to the mean square"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return Grads{rms_norm(in[0], in[1], a.get_number("eps"))};
  };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 7}, gen, dtype), Tensor::randn({7}, gen, dtype)};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
