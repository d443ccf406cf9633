// Matrix products with broadcast batch dimensions, lowered onto one strided-batched GEMM.
#include <stdexcept>
#include <string>

#include "tensor/kernels.h"

namespace seqlab::kernel {

namespace {

// The operand as a contiguous [batch, rows, cols] block, or as one [rows, cols] matrix reused for
// every batch entry (stride 0) when it has no batch dimensions of its own.
struct GemmOperand {
  Tensor data;
  int64_t stride = 0;
};

GemmOperand as_batched(const Tensor& x, const Shape& batch) {
  Shape last2(x.shape().end() - 2, x.shape().end());
  Shape own_batch(x.shape().begin(), x.shape().end() - 2);
  if (shape_numel(own_batch) == 1) return {contiguous(reshape(x, last2)), 0};
  Shape full = batch;
  full.insert(full.end(), last2.begin(), last2.end());
  return {contiguous(expand(x, full)), last2[0] * last2[1]};
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& onto) {
  if (a.dim() < 2 || b.dim() < 2) {
    throw std::invalid_argument("matmul: operands must have at least 2 dimensions, got " + shape_str(a.shape()) +
                                " and " + shape_str(b.shape()));
  }
  if (a.dtype() != b.dtype() || !is_floating(a.dtype())) {
    throw std::invalid_argument(std::string("matmul: operands must share a floating dtype, got ") +
                                dtype_name(a.dtype()) + " and " + dtype_name(b.dtype()));
  }
  if (a.device() != b.device()) throw std::invalid_argument("matmul: operands are on different devices");
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  if (k != kb) {
    throw std::invalid_argument("matmul: inner dimensions differ: " + shape_str(a.shape()) + (trans_a ? "ᵀ" : "") +
                                " @ " + shape_str(b.shape()) + (trans_b ? "ᵀ" : ""));
  }
  Shape batch =
      broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2), Shape(b.shape().begin(), b.shape().end() - 2));
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  if (onto.defined() && (onto.shape() != out_shape || onto.dtype() != a.dtype() || onto.device() != a.device() ||
                         !onto.is_contiguous())) {
    throw std::invalid_argument("matmul: cannot add the product " + shape_str(out_shape) + " " + dtype_name(a.dtype()) +
                                " onto " + shape_str(onto.shape()) + " " + dtype_name(onto.dtype()) +
                                (onto.is_contiguous() ? "" : " (not contiguous)"));
  }
  Tensor out = onto.defined() ? onto : Tensor::empty(out_shape, a.dtype(), a.device());
  matmul_into(a, b, trans_a, trans_b, out, onto.defined() ? 1.0 : 0.0);
  return out;
}

void matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& out, double beta) {
  if (out.numel() == 0) return;
  const int64_t m = out.size(-2), n = out.size(-1), k = trans_a ? a.size(-2) : a.size(-1);
  if (k == 0) {
    if (beta == 0.0) fill_(out, 0.0);
    return;
  }
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  GemmArgs g;
  g.dtype = a.dtype();
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  g.c_is_f32 = a.dtype() == DType::bf16 && out.dtype() == DType::f32;
  g.batch = shape_numel(batch);
  GemmOperand A = as_batched(a, batch), B = as_batched(b, batch);
  if (B.stride == 0 && !trans_a && g.batch > 1 && A.stride != 0) {
    // [batch·M, K] @ [K, N]: one large GEMM instead of many small ones.
    g.m = m * g.batch;
    g.batch = 1;
    A.stride = 0;
  }
  g.a = A.data.raw_data();
  g.lda = A.data.size(-1);
  g.stride_a = A.stride;
  g.b = B.data.raw_data();
  g.ldb = B.data.size(-1);
  g.stride_b = B.stride;
  g.c = out.raw_data();
  g.ldc = n;
  g.stride_c = m * n;
  gemm_kernel(a.device(), g, a.device());
}

void linear_unfused(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                    const Tensor& y) {
  const Tensor& sum = act == Activation::gelu ? pre : y;  // where x Wᵀ + b goes
  if (bias.defined()) copy_(sum, expand(bias, sum.shape()));
  matmul_into(x, weight, false, true, sum, bias.defined() ? 1.0 : 0.0);
  if (act == Activation::gelu) unary_kernel(pre.device(), UnaryOp::gelu, pre, 1.0, y);
}

LinearOutput linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  const bool bias_fits = !bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                                             bias.dtype() == weight.dtype() && bias.device() == weight.device());
  if (x.dim() != 2 || weight.dim() != 2 || x.size(1) != weight.size(1) || x.dtype() != weight.dtype() ||
      !is_floating(x.dtype()) || x.device() != weight.device() || !bias_fits) {
    throw std::invalid_argument(
        "linear: expected x [N, in], weight [out, in] and bias [out] (or none) of one "
        "floating dtype on one device, got x " +
        shape_str(x.shape()) + " " + dtype_name(x.dtype()) + ", weight " + shape_str(weight.shape()) + " " +
        dtype_name(weight.dtype()) +
        (bias.defined() ? ", bias " + shape_str(bias.shape()) + " " + dtype_name(bias.dtype()) : std::string()));
  }
  const Shape shape{x.size(0), weight.size(0)};
  LinearOutput o;
  o.y = Tensor::empty(shape, x.dtype(), x.device());
  if (act == Activation::gelu) o.pre = Tensor::empty(shape, x.dtype(), x.device());
  if (o.y.numel() == 0) return o;
  linear_kernel(x.device(), contiguous(x), contiguous(weight), bias.defined() ? contiguous(bias) : bias, act, o.pre,
                o.y);
  return o;
}

}  // namespace seqlab::kernel
