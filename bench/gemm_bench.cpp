// f32/f64 GEMM through the tensor API (kernel::matmul, which allocates its output and dispatches
// to OpenBLAS single-threaded, split across the OpenMP team) against calling cblas_sgemm/dgemm directly
// on preallocated buffers with OpenBLAS's own threads, in one run.
// Prints GFLOP/s of both and their ratio. Then bf16 against f32, both through the tensor API, at square
// sizes and at gpt_small's projection shapes (B·T = 2048 rows, d 256, 3d, 4d): bf16 on the CPU's bf16
// instructions through oneDNN, and bf16 widened to f32 (SEQLAB_CPU_BF16_GEMM=widened), each timed in
// alternation with f32. Last, the tiles of attention's bf16 kernels (f32 sums, one thread, operands warm in
// cache): seqlab's tile kernel against oneDNN (SEQLAB_CPU_BF16_GEMM=onednn), alternated.
// Usage: gemm_bench [runs]
#include <cblas.h>
#include <omp.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/blas_rows.h"
#include "tensor/kernels.h"

using namespace seqlab;

namespace {

struct Case {
  int64_t n;
  DType dtype;
  Tensor a, b, c;
};

// seqlab's GEMM: OpenBLAS single-threaded, split over the OpenMP team.
void through_tensor(const Case& x) { Tensor y = kernel::matmul(x.a, x.b); }

// The peer: one cblas call with OpenBLAS's own thread pool at the same team size.
void direct(const Case& x) {
  openblas_set_num_threads(omp_get_max_threads());
  const int ni = static_cast<int>(x.n);
  if (x.dtype == DType::f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, x.a.data<float>(), ni,
                x.b.data<float>(), ni, 0.0f, x.c.data<float>(), ni);
  } else {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, x.a.data<double>(), ni,
                x.b.data<double>(), ni, 0.0, x.c.data<double>(), ni);
  }
}

// Runs fn for about `seconds`: OpenBLAS's workers spin (sched_yield) for a while after the library
// loads and after each of its multi-threaded calls; this lets them fall asleep before seqlab is timed.
void settle(const std::function<void()>& fn, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) fn();
}

}  // namespace

int main(int argc, char** argv) {
  int runs = static_cast<int>(bench::positional_counts(argc, argv, {9}, "gemm_bench [runs]")[0]);
  std::printf("# median of %d runs each; ratio = seqlab throughput / direct OpenBLAS throughput\n", runs);
  Generator gen(0);
  std::vector<Case> cases;
  for (auto [n, dtype] : {std::pair<int64_t, DType>{256, DType::f32}, {512, DType::f32}, {1024, DType::f32},
                          {1024, DType::f64}}) {
    cases.push_back({n, dtype, Tensor::randn({n, n}, gen, dtype), Tensor::randn({n, n}, gen, dtype),
                     Tensor::empty({n, n}, dtype)});
  }
  // Not alternated: every seqlab case first, then every peer, so that the peer's spinning workers
  // are never charged to seqlab (and seqlab's idle OpenMP team never to the peer).
  std::vector<double> ours, theirs;
  settle([&] { through_tensor(cases.back()); }, 0.5);
  for (const Case& x : cases) ours.push_back(bench::time_median([&] { through_tensor(x); }, 2, runs));
  for (const Case& x : cases) theirs.push_back(bench::time_median([&] { direct(x); }, 2, runs));
  for (size_t i = 0; i < cases.size(); ++i) {
    const double n = static_cast<double>(cases[i].n), flops = 2.0 * n * n * n;
    std::printf("gemm %-4s %5ldx%-5ldx%-5ld  seqlab %8.1f GFLOP/s   openblas %8.1f GFLOP/s   ratio %.3f\n",
                dtype_name(cases[i].dtype), static_cast<long>(n), static_cast<long>(n), static_cast<long>(n),
                flops / ours[i] * 1e-9, flops / theirs[i] * 1e-9, theirs[i] / ours[i]);
  }

  std::printf("# bf16 against f32 (%s); ratio = bf16 throughput / f32 throughput\n",
              kernel::cpu_bf16_gemm_config().c_str());
  const bool native = kernel::cpu_bf16_gemm_native();
  for (const auto& [m, k, n] : {std::array<int64_t, 3>{256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024},
                               {2048, 256, 768}, {2048, 256, 1024}, {2048, 1024, 256}}) {
    const Tensor a = Tensor::randn({m, k}, gen), b = Tensor::randn({k, n}, gen);
    const Tensor a16 = kernel::to_dtype(a, DType::bf16), b16 = kernel::to_dtype(b, DType::bf16);
    const auto f32 = [&] { Tensor y = kernel::matmul(a, b); };
    const auto bf16 = [&] { Tensor y = kernel::matmul(a16, b16); };
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    const bench::PairTiming fast = bench::time_pair(bf16, f32, 2, runs);
    kernel::set_cpu_bf16_gemm_widened(true);
    const bench::PairTiming wide = bench::time_pair(bf16, f32, 2, runs);
    kernel::set_cpu_bf16_gemm_widened(false);
    std::printf("gemm %5ldx%-5ldx%-5ld  f32 %7.1f GFLOP/s   bf16 %s %7.1f GFLOP/s (%.2fx)   bf16 widened %7.1f GFLOP/s "
                "(%.2fx)\n",
                static_cast<long>(m), static_cast<long>(k), static_cast<long>(n), flops / fast.b_seconds * 1e-9,
                native ? "oneDNN" : "(widened)", flops / fast.a_seconds * 1e-9, fast.b_seconds / fast.a_seconds, flops / wide.a_seconds * 1e-9,
                wide.b_seconds / wide.a_seconds);
  }

  if (!kernel::cpu_bf16_gemm_tiles()) {
    std::printf("# no bf16 tile kernel here (%s)\n", kernel::cpu_bf16_gemm_config().c_str());
    return 0;
  }
  std::printf("# bf16 tiles, f32 sums, one thread: the tile kernel against oneDNN; ratio = tiles / oneDNN throughput\n");
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct Tile {
    bool ta, tb;
    int64_t m, n, k;
    double beta;
    const char* what;
  };
  for (const Tile& t : {Tile{false, true, 128, 128, 64, 0.0, "S = Q Kt"}, Tile{false, true, 64, 64, 64, 0.0, "S = Q Kt"},
                        Tile{false, false, 128, 64, 128, 1.0, "O += P V"}, Tile{false, false, 64, 64, 64, 1.0, "O += P V"},
                        Tile{true, false, 128, 64, 128, 1.0, "dV += Pt dO"}, Tile{true, false, 64, 64, 64, 1.0, "dV += Pt dO"}}) {
    const Tensor a = kernel::to_dtype(Tensor::randn({t.ta ? t.k : t.m, t.ta ? t.m : t.k}, gen), DType::bf16);
    const Tensor b = kernel::to_dtype(Tensor::randn({t.tb ? t.n : t.k, t.tb ? t.k : t.n}, gen), DType::bf16);
    Tensor c = Tensor::zeros({t.m, t.n});
    const auto product = [&] {
      for (int rep = 0; rep < 50; ++rep) {
        cpu::gemm<bf16, float>(t.ta, t.tb, t.m, t.n, t.k, 0.125, a.data<bf16>(), a.size(1), b.data<bf16>(), b.size(1),
                               t.beta, c.data<float>(), t.n);
      }
    };
    const auto tiles = [&] { product(); };
    const auto onednn = [&] {
      kernel::set_cpu_bf16_gemm_tiles(false);
      product();
      kernel::set_cpu_bf16_gemm_tiles(true);
    };
    const bench::PairTiming p = bench::time_pair(tiles, onednn, 2, runs);
    const double flops = 50 * 2.0 * static_cast<double>(t.m) * static_cast<double>(t.n) * static_cast<double>(t.k);
    std::printf("tile %-11s %s%s %4ldx%-4ldx%-4ld  tiles %7.1f GFLOP/s   oneDNN %7.1f GFLOP/s   ratio %.2f\n", t.what,
                t.ta ? "At" : "A ", t.tb ? "Bt" : "B ", static_cast<long>(t.m), static_cast<long>(t.n),
                static_cast<long>(t.k), flops / p.a_seconds * 1e-9, flops / p.b_seconds * 1e-9,
                p.b_seconds / p.a_seconds);
  }
  omp_set_num_threads(threads);
  return 0;
}
