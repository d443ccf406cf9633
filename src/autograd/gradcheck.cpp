#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {

// L = Σ_o ⟨r_o, y_o⟩ over the differentiable outputs
double project(const std::vector<Tensor>& outputs, const std::vector<std::vector<double>>& cotangents,
               const std::vector<bool>& differentiable) {
  double total = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!differentiable[o]) continue;
    std::vector<double> y = outputs[o].to_doubles();
    for (size_t i = 0; i < y.size(); ++i) total += y[i] * cotangents[o][i];
  }
  return total;
}

}  // namespace

GradcheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  // Private contiguous copies: perturbing them never touches the caller's tensors.
  std::vector<Tensor> xs;
  std::vector<bool> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    bool floating = in.defined() && is_floating(in.dtype());
    bool check = floating && (options.check.empty() || (i < options.check.size() && options.check[i]));
    if (check && (in.dtype() != DType::f64 || !in.device().is_cpu())) {
      throw std::invalid_argument("gradcheck: input " + std::to_string(i) + " must be a f64 CPU tensor");
    }
    xs.push_back(in.defined() ? kernel::clone(in) : in);
    checked.push_back(check);
  }

  // Analytic: one backward pass seeded with the cotangents.
  for (size_t i = 0; i < xs.size(); ++i) {
    if (checked[i]) set_requires_grad(xs[i], true);
  }
  std::vector<Tensor> outputs = fn(xs);
  Generator gen(options.seed);
  std::vector<std::vector<double>> cotangents;
  std::vector<Tensor> roots, seeds;
  std::vector<bool> differentiable;
  for (const Tensor& y : outputs) {
    differentiable.push_back(y.defined() && requires_grad(y));
    std::vector<double> r(static_cast<size_t>(y.defined() ? y.numel() : 0));
    for (double& v : r) v = gen.normal();
    if (y.defined() && requires_grad(y)) {
      roots.push_back(y);
      seeds.push_back(Tensor::from_vector(r, y.shape(), y.dtype(), y.device()));
    }
    cotangents.push_back(std::move(r));
  }
  if (roots.empty()) throw std::invalid_argument("gradcheck: no output depends on a checked input");
  backward(roots, seeds);
  std::vector<std::vector<double>> analytic(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!checked[i]) continue;
    Tensor g = grad_of(xs[i]);
    analytic[i] = g.defined() ? g.to_doubles() : std::vector<double>(static_cast<size_t>(xs[i].numel()), 0.0);
    set_requires_grad(xs[i], false);
  }

  // Numeric: central differences, element by element, with no graph recorded.
  NoGradGuard no_grad;
  GradcheckResult result;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!checked[i]) continue;
    double* p = xs[i].data<double>();
    for (int64_t e = 0; e < xs[i].numel(); ++e) {
      const double saved = p[e];
      p[e] = saved + options.eps;
      double plus = project(fn(xs), cotangents, differentiable);
      p[e] = saved - options.eps;
      double minus = project(fn(xs), cotangents, differentiable);
      p[e] = saved;
      double numeric = (plus - minus) / (2 * options.eps);
      double a = analytic[i][static_cast<size_t>(e)];
      double scale = std::max({std::fabs(a), std::fabs(numeric), options.floor});
      double err = std::fabs(a - numeric) / scale;
      if (!(err <= result.max_error) || std::isnan(err)) {
        result.max_error = std::isnan(err) ? INFINITY : err;
        std::ostringstream where;
        where << "input " << i << " element " << e << ": analytic " << a << ", numeric " << numeric;
        result.worst = where.str();
      }
      ++result.elements_checked;
    }
  }
  result.ok = result.max_error <= options.tolerance;
  return result;
}

}  // namespace seqlab
