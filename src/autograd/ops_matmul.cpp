// Matrix products.
#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

// Y = A B (batched, broadcasting);  dA = Σ_broadcast dY Bᵀ,  dB = Σ_broadcast Aᵀ dY
Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor y = kernel::matmul(a, b);
  record("matmul", {a, b}, {&y}, {a, b}, [](const Grads& g, const Grads& s, const Needs& need) {
    const Tensor &dy = g[0], &A = s[0], &B = s[1];
    Tensor da, db;
    if (need[0]) da = kernel::sum_to(kernel::matmul(dy, B, false, true), A.shape());
    if (need[1]) {
      if (B.dim() == 2) {
        // Shared weight: fold every batch row into one GEMM, dB = A_flatᵀ dY_flat.
        const int64_t k = A.size(-1), n = dy.size(-1);
        db = kernel::matmul(kernel::reshape(A, {-1, k}), kernel::reshape(dy, {-1, n}), true, false);
      } else {
        db = kernel::sum_to(kernel::matmul(A, dy, true, false), B.shape());
      }
    }
    return Grads{da, db};
  });
  return y;
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "matmul";
  s.summary = "y = a @ b over the last two dimensions, batch dimensions broadcast";
  s.inputs = {{"a"}, {"b"}};
  s.outputs = {"y"};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs&) { return Grads{matmul(in[0], in[1])}; };
  s.example = [](Generator& gen, DType dtype) {
    return Grads{Tensor::randn({2, 1, 3, 5}, gen, dtype), Tensor::randn({3, 5, 4}, gen, dtype)};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
