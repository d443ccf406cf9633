// CPU GEMM through OpenBLAS (cblas, row-major), one call per batch entry.
#include <cblas.h>

#include <stdexcept>

#include "tensor/kernels.h"

namespace seqlab::cpu {
namespace {

void gemm_cpu(const kernel::GemmArgs& g, Device) {
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  for (int64_t i = 0; i < g.batch; ++i) {
    if (g.dtype == DType::f32) {
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha),
                  static_cast<const float*>(g.a) + i * g.stride_a, lda, static_cast<const float*>(g.b) + i * g.stride_b,
                  ldb, static_cast<float>(g.beta), static_cast<float*>(g.c) + i * g.stride_c, ldc);
    } else if (g.dtype == DType::f64) {
      cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, static_cast<const double*>(g.a) + i * g.stride_a, lda,
                  static_cast<const double*>(g.b) + i * g.stride_b, ldb, g.beta,
                  static_cast<double*>(g.c) + i * g.stride_c, ldc);
    } else {
      throw std::invalid_argument(std::string("matmul on the CPU supports f32 and f64, got ") + dtype_name(g.dtype));
    }
  }
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(gemm_kernel, DeviceType::CPU, &cpu::gemm_cpu);
}  // namespace seqlab::kernel
