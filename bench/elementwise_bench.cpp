// Elementwise kernels through the tensor API against a plain OpenMP loop over preallocated
// buffers (the peer: what a hand-written loop achieves on this machine), in one run.
// Reports effective bandwidth (bytes read + written per second) and the ratio.
// Usage: elementwise_bench [elements] [runs]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

void report(const char* name, double bytes, const bench::PairTiming& t) {
  std::printf("%-22s seqlab %7.2f GB/s   plain loop %7.2f GB/s   ratio %.3f\n", name, bytes / t.a_seconds * 1e-9,
              bytes / t.b_seconds * 1e-9, t.b_seconds / t.a_seconds);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> args =
      bench::positional_counts(argc, argv, {int64_t{1} << 24, 9}, "elementwise_bench [elements] [runs]");
  const int64_t n = args[0];
  const int runs = static_cast<int>(args[1]);
  Generator gen(0);
  Tensor x = Tensor::randn({n}, gen, DType::f32), y = Tensor::randn({n}, gen, DType::f32);
  Tensor out = Tensor::empty({n}, DType::f32);
  const float *px = x.data<float>(), *py = y.data<float>();
  float* po = out.data<float>();
  const double three = 3.0 * 4.0 * static_cast<double>(n), two = 2.0 * 4.0 * static_cast<double>(n);
  std::printf("# %ld f32 elements, median of %d alternating runs; ratio = seqlab / plain loop throughput\n",
              static_cast<long>(n), runs);

  report("add", three,
         bench::time_pair([&] { kernel::binary(kernel::BinaryOp::add, x, y); },
                          [&] {
#pragma omp parallel for
                            for (int64_t i = 0; i < n; ++i) po[i] = px[i] + py[i];
                          },
                          2, runs));
  report("mul (broadcast row)", two,
         bench::time_pair([&] { kernel::binary(kernel::BinaryOp::mul, kernel::view(x, {n / 1024, 1024}),
                                               kernel::view(kernel::narrow(y, 0, 0, 1024), {1024})); },
                          [&] {
#pragma omp parallel for
                            for (int64_t i = 0; i < n; ++i) po[i] = px[i] * py[i % 1024];
                          },
                          2, runs));
  report("exp", two,
         bench::time_pair([&] { kernel::unary(kernel::UnaryOp::exp, x); },
                          [&] {
#pragma omp parallel for
                            for (int64_t i = 0; i < n; ++i) po[i] = std::exp(px[i]);
                          },
                          2, runs));
  report("gelu", two,
         bench::time_pair([&] { kernel::unary(kernel::UnaryOp::gelu, x); },
                          [&] {
#pragma omp parallel for
                            for (int64_t i = 0; i < n; ++i) {
                              float v = px[i];
                              po[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
                            }
                          },
                          2, runs));
  report("sum (rows of 1024)", 4.0 * static_cast<double>(n),
         bench::time_pair([&] { kernel::sum(kernel::view(x, {n / 1024, 1024}), {1}, false); },
                          [&] {
#pragma omp parallel for
                            for (int64_t r = 0; r < n / 1024; ++r) {
                              double acc = 0;
                              for (int64_t i = 0; i < 1024; ++i) acc += px[r * 1024 + i];
                              po[r] = static_cast<float>(acc);
                            }
                          },
                          2, runs));
  // The same kernels on bf16 tensors against f32 ones (both seqlab): bf16 moves half the bytes, so a
  // ratio below 1 means its conversions cost more than the bytes they save.
  std::printf("\n# bf16 against f32, both seqlab (ratio = f32 time / bf16 time)\n");
  const Tensor xh = kernel::to_dtype(x, DType::bf16), yh = kernel::to_dtype(y, DType::bf16);
  auto versus_f32 = [&](const char* name, const std::function<void(const Tensor&, const Tensor&)>& fn) {
    const bench::PairTiming t = bench::time_pair([&] { fn(x, y); }, [&] { fn(xh, yh); }, 2, runs);
    std::printf("%-22s f32 %8.2f ms   bf16 %8.2f ms   ratio %.3f\n", name, t.a_seconds * 1e3, t.b_seconds * 1e3,
                t.a_seconds / t.b_seconds);
  };
  versus_f32("add", [](const Tensor& a, const Tensor& b) { kernel::binary(kernel::BinaryOp::add, a, b); });
  versus_f32("mul", [](const Tensor& a, const Tensor& b) { kernel::binary(kernel::BinaryOp::mul, a, b); });
  for (kernel::UnaryOp op : {kernel::UnaryOp::exp, kernel::UnaryOp::sigmoid, kernel::UnaryOp::silu,
                             kernel::UnaryOp::softplus, kernel::UnaryOp::gelu}) {
    const std::string name = kernel::unary_name(op);
    versus_f32(name.c_str(), [op](const Tensor& a, const Tensor&) { kernel::unary(op, a); });
    versus_f32((name + " backward").c_str(), [op](const Tensor& a, const Tensor& b) {
      kernel::unary_backward(op, b, a, a);
    });
  }
  return 0;
}
