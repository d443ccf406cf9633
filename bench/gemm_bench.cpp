// f32/f64 GEMM through the tensor API (kernel::matmul, which allocates its output and dispatches
// to OpenBLAS) against calling cblas_sgemm/dgemm directly on preallocated buffers, in one run.
// Prints GFLOP/s of both and their ratio. Usage: gemm_bench [runs]
#include <cblas.h>

#include <cstdio>
#include <cstdlib>

#include "bench/bench_util.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

void run(int64_t n, DType dtype, int runs) {
  Generator gen(0);
  Tensor a = Tensor::randn({n, n}, gen, dtype), b = Tensor::randn({n, n}, gen, dtype);
  Tensor c = Tensor::empty({n, n}, dtype);
  const int ni = static_cast<int>(n);
  auto through_tensor = [&] { Tensor y = kernel::matmul(a, b); };
  auto direct = [&] {
    if (dtype == DType::f32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a.data<float>(), ni, b.data<float>(),
                  ni, 0.0f, c.data<float>(), ni);
    } else {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, a.data<double>(), ni,
                  b.data<double>(), ni, 0.0, c.data<double>(), ni);
    }
  };
  bench::PairTiming t = bench::time_pair(through_tensor, direct, 2, runs);
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  std::printf("gemm %-4s %5ldx%-5ldx%-5ld  seqlab %8.1f GFLOP/s   openblas %8.1f GFLOP/s   ratio %.3f\n",
              dtype_name(dtype), static_cast<long>(n), static_cast<long>(n), static_cast<long>(n),
              flops / t.a_seconds * 1e-9, flops / t.b_seconds * 1e-9, t.b_seconds / t.a_seconds);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 9;
  std::printf("# median of %d alternating runs; ratio = seqlab throughput / direct OpenBLAS throughput\n", runs);
  for (int64_t n : {256, 512, 1024}) run(n, DType::f32, runs);
  run(1024, DType::f64, runs);
  return 0;
}
