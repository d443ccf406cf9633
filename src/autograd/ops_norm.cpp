// Layer norm and RMS norm over the last dimension, plain and fused with the residual add before them,
// with hand-derived backwards (the formulas are stated in src/tensor/cpu/norm.cpp). The forward saves
// the row statistics, not x̂, so the backward's memory is x (or the sum) plus two numbers per row.
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

// s = x + r,  y = norm(s).  The two outputs' gradients meet at s: ds_total = ds + dnorm(dy), and
// since ∂s/∂x = ∂s/∂r = I, dx = dr = ds_total. The norm backward adds ds in its dx pass (dsum), so
// the fused backward costs what layer_norm's does; dw and db are layer_norm's at s.
AddNormResult add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                             double eps) {
  kernel::AddNormOutput out = kernel::add_layer_norm(x, residual, weight, bias, eps);
  AddNormResult r{out.sum, out.norm.y};
  record("add_layer_norm", {x, residual, weight, bias}, {&r.sum, &r.y}, {out.sum, weight, out.norm.mean, out.norm.rstd},
         [](const Grads& g, const Grads& s, const Needs& need) {
           const bool need_ds = need[0] || need[1];
           kernel::NormGrads d =
               kernel::layer_norm_backward(g[1], s[0], s[1], s[2], s[3], need_ds, need[2], need[3], g[0]);
           return Grads{need[0] ? d.dx : Tensor(), need[1] ? d.dx : Tensor(), d.dweight, d.dbias};
         });
  return r;
}

// s = x + r,  y = s · rstd ⊙ w;  dx = dr = ds + dnorm(dy) at s,  dw = Σ_rows dy ⊙ ŝ
AddNormResult add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  kernel::AddNormOutput out = kernel::add_rms_norm(x, residual, weight, eps);
  AddNormResult r{out.sum, out.norm.y};
  record("add_rms_norm", {x, residual, weight}, {&r.sum, &r.y}, {out.sum, weight, out.norm.rstd},
         [](const Grads& g, const Grads& s, const Needs& need) {
           const bool need_ds = need[0] || need[1];
           kernel::NormGrads d = kernel::rms_norm_backward(g[1], s[0], s[1], s[2], need_ds, need[2], g[0]);
           return Grads{need[0] ? d.dx : Tensor(), need[1] ? d.dx : Tensor(), d.dweight};
         });
  return r;
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

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "add_layer_norm";
  s.summary = "sum = x + residual, y = layer_norm(sum) over the last dimension, in one pass; bias optional";
  s.inputs = {{"x"}, {"residual"}, {"weight"}, {"bias", OpInputKind::floating, true}};
  s.outputs = {"sum", "y"};
  s.attrs = {{"eps", AttrType::number, "1e-5", "added to the variance"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    AddNormResult r = add_layer_norm(in[0], in[1], in[2], in[3], a.get_number("eps"));
    return Grads{r.sum, r.y};
  };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 7}, gen, dtype), Tensor::randn({2, 3, 7}, gen, dtype),
                 Tensor::randn({7}, gen, dtype), Tensor::randn({7}, gen, dtype)};
  };
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "add_rms_norm";
  s.summary = "sum = x + residual, y = rms_norm(sum) over the last dimension, in one pass";
  s.inputs = {{"x"}, {"residual"}, {"weight"}};
  s.outputs = {"sum", "y"};
  s.attrs = {{"eps", AttrType::number, "1e-6", "added to the mean square"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    AddNormResult r = add_rms_norm(in[0], in[1], in[2], a.get_number("eps"));
    return Grads{r.sum, r.y};
  };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 3, 7}, gen, dtype), Tensor::randn({2, 3, 7}, gen, dtype),
                 Tensor::randn({7}, gen, dtype)};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
