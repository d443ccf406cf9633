// The kernel layer: raw tensor operations with no autograd recording.
//
// Each entry point below checks its arguments (shapes, dtypes, devices), allocates its outputs on
// the input's device, and calls a kernel slot that the CPU backend (src/tensor/cpu/) and the CUDA
// backend (src/cuda/) fill with the same signature. Slot implementations receive contiguous inputs
// unless their comment says otherwise, and write every element of their outputs.
//
// Differentiable versions of these operations, with their backward passes, are in
// src/autograd/ops.h. Gradients of one operation are computed here by its *_backward kernel.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab::kernel {

// ------------------------------------------------------------------------------------------------
// Shapes and views (no data movement). Dimensions may be negative (counted from the end).
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
Shape broadcast_shapes(const Shape& a, const Shape& b);  // NumPy rules; throws naming both shapes
Shape infer_reshape(const Shape& from, Shape to);        // resolves one -1
Tensor view(const Tensor& x, const Shape& shape);        // x must be contiguous
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast view, stride 0 where expanded
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);

// ------------------------------------------------------------------------------------------------
// Copies and conversions.
void copy_(const Tensor& dst, const Tensor& src);  // strided, converting dtype, across devices
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);                   // x itself when already contiguous
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible, else a copy
Tensor clone(const Tensor& x);
Tensor to_dtype(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// Same-device strided copy with dtype conversion: dst[i] = src[i] over dst's shape.
SEQLAB_DECLARE_KERNEL(copy_kernel, void (*)(const Tensor& dst, const Tensor& src));
// dst[i] = value for every element of a contiguous dst.
SEQLAB_DECLARE_KERNEL(fill_kernel, void (*)(const Tensor& dst, double value));

// ------------------------------------------------------------------------------------------------
// Elementwise. `alpha` is the op's parameter where it has one (elu's α); unused otherwise.
enum class UnaryOp { neg, exp, log, sqrt, rsqrt, square, tanh, sigmoid, silu, gelu, relu, elu, softplus };
const char* unary_name(UnaryOp op);
Tensor unary(UnaryOp op, const Tensor& x, double alpha = 1.0);
// dx = dy ⊙ f'(x), using whichever of x and y = f(x) gives f' most cheaply.
Tensor unary_backward(UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y, double alpha = 1.0);

enum class BinaryOp { add, sub, mul, div };
const char* binary_name(BinaryOp op);
// out = a op b with NumPy broadcasting; a and b share a dtype and a device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);

enum class ScalarOp { add, mul, pow, rsub, rdiv };  // x + s, x * s, x ^ s, s - x, s / x
Tensor scalar_op(ScalarOp op, const Tensor& x, double s);

// out = cond ≠ 0 ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Sums x over its broadcast dimensions so the result has `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

SEQLAB_DECLARE_KERNEL(unary_kernel, void (*)(UnaryOp op, const Tensor& x, double alpha, const Tensor& out));
SEQLAB_DECLARE_KERNEL(unary_backward_kernel, void (*)(UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y,
                                                      double alpha, const Tensor& dx));
// a and b may be strided broadcast views (stride 0) of out's shape; out is contiguous.
SEQLAB_DECLARE_KERNEL(binary_kernel, void (*)(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out));
SEQLAB_DECLARE_KERNEL(scalar_kernel, void (*)(ScalarOp op, const Tensor& x, double s, const Tensor& out));
// cond, a and b are strided broadcast views of out's shape; out is contiguous.
SEQLAB_DECLARE_KERNEL(where_kernel, void (*)(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out));

// ------------------------------------------------------------------------------------------------
// Reductions over a set of dimensions (all when `dims` is empty).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Max over `dims`; also returns, per output element, the flat index of the winner inside the
// reduced block (row-major over the reduced dims in their original order), as i64.
std::pair<Tensor, Tensor> max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Inclusive cumulative sum along `dim`, or from the end when `reverse`.
Tensor cumsum(const Tensor& x, int64_t dim, bool reverse = false);

// x viewed as [outer, inner]: out[o] = Σ_i x[o, i].
SEQLAB_DECLARE_KERNEL(sum_rows_kernel, void (*)(const Tensor& x2d, const Tensor& out));
// x viewed as [outer, inner]: out[o] = max_i x[o, i], index[o] = first argmax.
SEQLAB_DECLARE_KERNEL(max_rows_kernel, void (*)(const Tensor& x2d, const Tensor& out, const Tensor& index));
// dx viewed as [outer, inner], zero-filled by the caller: dx[o, index[o]] = dy[o].
SEQLAB_DECLARE_KERNEL(scatter_rows_kernel, void (*)(const Tensor& dy, const Tensor& index, const Tensor& dx2d));
// x viewed as [outer, n, inner]: out[o, j, i] = Σ_{j' ≤ j} x[o, j', i] (j' ≥ j when reverse).
SEQLAB_DECLARE_KERNEL(cumsum_kernel, void (*)(const Tensor& x3d, bool reverse, const Tensor& out));

// ------------------------------------------------------------------------------------------------
// Matrix products. a: [..., M, K], b: [..., K, N] with broadcast batch dimensions (b may be 2-D).
// trans_a / trans_b use the transpose of the last two dimensions without copying. With `onto` (a
// contiguous tensor of the result's shape, dtype and device), the product is added onto it in
// place by the GEMM itself (β = 1) and `onto` is returned: a bias or residual costs no extra pass.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              const Tensor& onto = Tensor());
// out = op(a) op(b) + beta · out into a contiguous `out` of the product's shape, with a, b and out already
// checked against each other (as matmul checks them); a bf16 product may go into an f32 `out` (its f32 sums).
void matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& out, double beta);

// A linear layer's forward, its bias and activation fused into the GEMM where the device can:
//   pre = x Wᵀ + b,   y = act(pre)   (act: none, or GELU in tanh form as UnaryOp::gelu)
// x [N, in], weight [out, in] (PyTorch's layout), bias [out] or undefined, one floating dtype and device;
// y [N, out], and pre [N, out] with GELU (what its backward needs: dpre = dy ⊙ gelu'(pre); undefined
// without). On CUDA one cuBLASLt call whose epilogue works on the f32 accumulator before it rounds: it
// adds the bias (f32, bf16) and applies GELU (bf16), writing y and pre once each; elsewhere, and where
// cuBLASLt offers no such kernel, the steps of linear_unfused.
enum class Activation { none, gelu };
struct LinearOutput {
  Tensor y, pre;
};
LinearOutput linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);
// The unfused steps: pre = x Wᵀ + b (pre starts as b in every row and the GEMM adds onto it; without a bias
// the GEMM writes it), then y = gelu(pre) by the elementwise kernel; without an activation y is pre.
// Contiguous x, weight, bias (or undefined), pre (with GELU) and y on one device.
void linear_unfused(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& pre,
                    const Tensor& y);
// Slot: contiguous tensors as linear describes; writes every element of y (and of pre, with GELU).
SEQLAB_DECLARE_KERNEL(linear_kernel, void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                              const Tensor& pre, const Tensor& y));

// C[b] = alpha · op(A[b]) · op(B[b]) + beta · C[b] for b < batch, row-major, with element strides
// between batch entries (0 to reuse one matrix) and leading dimensions lda, ldb, ldc.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0, beta = 0.0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  DType dtype = DType::f32;  // of A and B, and of C unless c_is_f32
  bool c_is_f32 = false;     // bf16 A and B only: C is f32 (the f32 sums, not rounded to bf16)
};
SEQLAB_DECLARE_KERNEL(gemm_kernel, void (*)(const GemmArgs& args, Device device));
// The CPU BLAS as it describes itself (OpenBLAS: version, the core picked at run time, thread cap),
// or "" when it has no such call.
std::string cpu_blas_config();
// bf16 GEMMs on the CPU run on its bf16 instructions (AVX512-BF16 or AMX) through oneDNN where the build
// has oneDNN and the CPU has them (cpu_bf16_gemm_native), otherwise on widened f32 operands through
// the f32 GEMM; both give bf16 operands' products summed in f32 and rounded once. Widening can be
// forced (to compare the two, or to rule oneDNN out): here, or with SEQLAB_CPU_BF16_GEMM=widened.
bool cpu_bf16_gemm_native();
void set_cpu_bf16_gemm_widened(bool widened);
std::string cpu_bf16_gemm_config();  // oneDNN's version and which of the two paths bf16 GEMMs take
// On the bf16 instructions, small products with f32 sums (the tiles of the fused kernels) run on seqlab's
// own tile kernel (tensor/cpu/gemm_bf16_tiles.h) where the CPU has AVX512-BF16, the rest through oneDNN;
// the tile kernel can be turned off (every bf16 GEMM through oneDNN) here or with
// SEQLAB_CPU_BF16_GEMM=onednn. cpu_bf16_gemm_tiles says whether it runs.
bool cpu_bf16_gemm_tiles();
void set_cpu_bf16_gemm_tiles(bool on);
// The CPU kernels' AVX-512 loops (tensor/cpu/avx512.h: attention's softmax rows; GELU, SiLU, sigmoid; bf16 rounding),
// which give the plain loops' bits, run where the CPU has AVX512F unless turned off here or by
// SEQLAB_CPU_AVX512=off.
bool cpu_avx512();
void set_cpu_avx512(bool on);

// ------------------------------------------------------------------------------------------------
// Softmax and log-softmax over the last dimension of a contiguous x.
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& dy, const Tensor& y);  // dx = y ⊙ (dy − Σ dy ⊙ y)
Tensor log_softmax(const Tensor& x);
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);  // dx = dy − exp(y) Σ dy
SEQLAB_DECLARE_KERNEL(softmax_kernel, void (*)(const Tensor& x, bool log, const Tensor& y));
SEQLAB_DECLARE_KERNEL(softmax_backward_kernel, void (*)(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx));

// ------------------------------------------------------------------------------------------------
// Normalisation over the last dimension C of x [..., C]; weight and bias are [C] (bias may be
// undefined). Statistics (mean, rstd) are [rows] in accumulate_dtype (f32 for bf16) and saved for the
// backward.
struct NormOutput {
  Tensor y, mean, rstd;
};
struct NormGrads {
  Tensor dx, dweight, dbias;
};
inline auto tensor_fields(NormOutput& o) { return std::tie(o.y, o.mean, o.rstd); }  // see dispatch.h
inline auto tensor_fields(NormGrads& g) { return std::tie(g.dx, g.dweight, g.dbias); }
NormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
NormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps);  // mean is undefined
// With `dsum` defined (x's shape), dx = dnorm + dsum: the gradient that reaches the normalised tensor
// directly, besides through the norm (the residual stream of add_layer_norm / add_rms_norm), is added
// in the same pass. dnorm is rounded to x's dtype before the add, as a separate add would see it.
NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool need_dx, bool need_dweight, bool need_dbias,
                              const Tensor& dsum = Tensor());
NormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, bool need_dx,
                            bool need_dweight, const Tensor& dsum = Tensor());

// Residual add fused with the norm that follows it (the pre-norm block's x = x + f(x); h = norm(x)):
//   s = x + residual          (rounded to the dtype: the new residual stream, returned as `sum`)
//   y = layer_norm(s) or rms_norm(s), with the statistics of s saved in `norm` as above.
// One pass over each row: x and residual are read once, s and y written once (s is re-read from
// cache for the statistics). The arithmetic is that of binary add followed by the norm, so the
// results are the same bits (bf16 on the CPU runs those two steps: src/tensor/cpu/norm.cpp). x and
// residual have the same shape, dtype and device.
// Backward: ds_total = ds + dnorm(dy) at s, and dx = dresidual = ds_total; that is
// layer_norm_backward / rms_norm_backward on (dy, s) with dsum = ds, one pass with no extra kernel.
struct AddNormOutput {
  Tensor sum;       // s = x + residual, x's shape
  NormOutput norm;  // y = norm(s), mean, rstd
};
AddNormOutput add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                             double eps);
AddNormOutput add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps);

SEQLAB_DECLARE_KERNEL(layer_norm_kernel, void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                                  const NormOutput& out));
SEQLAB_DECLARE_KERNEL(rms_norm_kernel,
                      void (*)(const Tensor& x, const Tensor& weight, double eps, const NormOutput& out));
// x, residual and sum are rows [N, C]; sum = x + residual is written, then normalised into out.
SEQLAB_DECLARE_KERNEL(add_layer_norm_kernel,
                      void (*)(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                               double eps, const Tensor& sum, const NormOutput& out));
SEQLAB_DECLARE_KERNEL(add_rms_norm_kernel, void (*)(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                                    double eps, const Tensor& sum, const NormOutput& out));
// Undefined grads are skipped; dsum (rows [N, C], or undefined) is added onto dx.
SEQLAB_DECLARE_KERNEL(layer_norm_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dsum, const NormGrads& grads));
SEQLAB_DECLARE_KERNEL(rms_norm_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                               const Tensor& dsum, const NormGrads& grads));

// ------------------------------------------------------------------------------------------------
// Embedding: out[..., :] = weight[index[...], :]; backward scatter-adds rows into a [V, C] gradient.
Tensor embedding(const Tensor& weight, const Tensor& index);
Tensor embedding_backward(const Tensor& dy, const Tensor& index, int64_t num_embeddings);
SEQLAB_DECLARE_KERNEL(embedding_kernel, void (*)(const Tensor& weight, const Tensor& index, const Tensor& out));
SEQLAB_DECLARE_KERNEL(embedding_backward_kernel,
                      void (*)(const Tensor& dy, const Tensor& index, const Tensor& dweight));

// ------------------------------------------------------------------------------------------------
// Cross-entropy of logits [N, V] against targets [N] (i32/i64), averaged over targets that are not
// `ignore_index`. Fused with log-softmax: the forward saves lse[N] = log Σ_v exp(logits[n, v]); the
// backward computes dlogits = dloss / count · (softmax(logits) − onehot(target)) row by row.
// With weights w [N] (floating, any values): loss = Σ_n w_n ℓ_n / W over counted n, W = Σ_counted w_n
// (0 when W = 0); the backward scales row n by w_n / W instead of 1 / count.
struct CrossEntropyOutput {
  Tensor loss;        // scalar
  Tensor lse;         // [N]
  Tensor losses;      // [N] ℓ_n = lse_n − logits[n, t_n], 0 where ignored
  int64_t count = 0;  // targets that count
  double total_weight = 0;  // W: count without weights
};
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const Tensor& weights = Tensor());
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, double total_weight, const Tensor& weights = Tensor());
// losses[n] = lse[n] − logits[n, target[n]] (0 where ignored)
SEQLAB_DECLARE_KERNEL(cross_entropy_kernel, void (*)(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                                     const Tensor& losses, const Tensor& lse));
SEQLAB_DECLARE_KERNEL(cross_entropy_backward_kernel,
                      void (*)(double scale, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               int64_t ignore_index, const Tensor& dlogits));

}  // namespace seqlab::kernel
