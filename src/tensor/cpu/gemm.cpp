// CPU GEMM through OpenBLAS (cblas, row-major): C_i = α op(A_i) op(B_i) + β C_i for each batch entry i.
//
// One thread pool, not two. Debian's OpenBLAS is a pthread build with its own worker threads,
// which spin (sched_yield) for a while after every call; our elementwise and attention loops run
// on OpenMP threads, which also spin after every region. With both pools alive, each steals the
// cores the other needs (measured: a third of a GPT training step's CPU time went to spinning and
// rescheduling on 2 cores). So OpenBLAS runs single-threaded and the GEMM is split across the
// OpenMP team here: by batch entry when there are enough of them, otherwise by blocks of rows of
// C (or of columns, when C is wider than tall), each block one independent single-threaded sgemm.
// Called from inside a parallel region (e.g. per-tile GEMMs of a fused kernel), it runs on the
// calling thread alone.
//
// bf16 GEMMs (bf16 operands, f32 sums, C rounded once) run on the CPU's bf16 instructions where it has
// them: a small product with f32 sums (a fused kernel's tile) on the tile kernel (gemm_bf16_tiles.cpp),
// any other through oneDNN (gemm_onednn.cpp); otherwise on widened f32 operands here.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm_bf16_tiles.h"
#include "tensor/cpu/gemm_onednn.h"
#include "tensor/kernels.h"

namespace seqlab::cpu {
namespace {

// Below this many multiply-adds a GEMM runs on one thread (about 10 µs of work here).
constexpr int64_t kSplitMacs = int64_t{1} << 20;
// Split points are multiples of this, so each block keeps whole micro-kernel tiles.
constexpr int64_t kSplitAlign = 16;

// One single-threaded call on raw pointers.
template <class T>
void gemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opa, opb, mi, ni, ki, alpha, a, la, b, lb, beta, c, lc);
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, mi, ni, ki, alpha, a, la, b, lb, beta, c, lc);
  }
}

// Rows [m0, m1) of C need rows m0.. of op(A): row m0 of A, or column m0 when A is transposed.
// Columns [n0, n1) of C need columns n0.. of op(B): column n0 of B, or row n0 when B is transposed.
template <class T>
void gemm_block(const kernel::GemmArgs& g, int64_t i, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const T* a = static_cast<const T*>(g.a) + i * g.stride_a + (g.trans_a ? m0 : m0 * g.lda);
  const T* b = static_cast<const T*>(g.b) + i * g.stride_b + (g.trans_b ? n0 * g.ldb : n0);
  T* c = static_cast<T*>(g.c) + i * g.stride_c + m0 * g.ldc + n0;
  gemm_one<T>(g.trans_a, g.trans_b, m1 - m0, n1 - n0, g.k, static_cast<T>(g.alpha), a, g.lda, b, g.ldb,
              static_cast<T>(g.beta), c, g.ldc);
}

template <class T>
void gemm_typed(const kernel::GemmArgs& g) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || g.m * g.n * g.k * g.batch < kSplitMacs) {
    for (int64_t i = 0; i < g.batch; ++i) gemm_block<T>(g, i, 0, g.m, 0, g.n);
    return;
  }
  if (g.batch >= threads) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < g.batch; ++i) gemm_block<T>(g, i, 0, g.m, 0, g.n);
    return;
  }
  // Few large products: split each one along its longer side of C.
  const bool by_rows = g.m >= g.n;
  const int64_t extent = by_rows ? g.m : g.n;
  const int64_t chunk = std::max<int64_t>(
      kSplitAlign, (extent + threads - 1) / threads + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  const int64_t blocks = (extent + chunk - 1) / chunk;
  for (int64_t i = 0; i < g.batch; ++i) {
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t lo = blk * chunk, hi = std::min(extent, lo + chunk);
      if (by_rows) {
        gemm_block<T>(g, i, lo, hi, 0, g.n);
      } else {
        gemm_block<T>(g, i, 0, g.m, lo, hi);
      }
    }
  }
}

// Elements from the first of a batch of row-major matrices (rows × cols, leading dimension ld,
// `stride` apart) to the last element of the last one.
int64_t span(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

template <class To, class From>
std::vector<To> converted(const From* x, int64_t n) {
  std::vector<To> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = convert_scalar<To>(x[i]);
  return out;
}

// bf16 by widening (where the CPU has no bf16 instructions, or oneDNN is not in the build): the
// operands' spans are widened to f32 with the same layout, multiplied by sgemm in f32 and C's span is
// rounded back to bf16 (or kept, for an f32 C). The same numbers as the CUDA backend computes (bf16
// operands, f32 accumulation, C rounded once); only the order of the sums differs.
void gemm_bf16_widened(const kernel::GemmArgs& g) {
  const int64_t na = span(g.batch, g.stride_a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda);
  const int64_t nb = span(g.batch, g.stride_b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb);
  const int64_t nc = span(g.batch, g.stride_c, g.m, g.n, g.ldc);
  const std::vector<float> a = converted<float>(static_cast<const bf16*>(g.a), na);
  const std::vector<float> b = converted<float>(static_cast<const bf16*>(g.b), nb);
  kernel::GemmArgs wide = g;
  wide.a = a.data();
  wide.b = b.data();
  wide.dtype = DType::f32;
  if (g.c_is_f32) {
    gemm_typed<float>(wide);
    return;
  }
  std::vector<float> c = converted<float>(static_cast<const bf16*>(g.c), nc);
  wide.c = c.data();
  gemm_typed<float>(wide);
  bf16* out = static_cast<bf16*>(g.c);
  for (int64_t i = 0; i < nc; ++i) out[i] = bf16(c[static_cast<size_t>(i)]);
}

// Up to this many multiply-adds a bf16 product with f32 sums runs on the tile kernel, on one thread: the
// tiles of attention's kernels (64 or 128 rows and columns, k 64 or 128) are two to eight times under it.
constexpr int64_t kTileMacs = int64_t{1} << 21;

bool tile_sized(const kernel::GemmArgs& g) {
  const int64_t macs = g.m * g.n * g.k;
  const bool one_thread = omp_in_parallel() || omp_get_max_threads() == 1;  // else a large one is split
  return g.batch == 1 && g.c_is_f32 && macs <= kTileMacs && (macs < kSplitMacs || one_thread);
}

void gemm_bf16(const kernel::GemmArgs& g) {
  if (g.k > 0 && bf16_gemm_native() && ((tile_sized(g) && tile_gemm_bf16(g)) || onednn_bf16_gemm(g))) return;
  gemm_bf16_widened(g);
}

void gemm_cpu(const kernel::GemmArgs& g, Device) {
  // Keep OpenBLAS single-threaded (see the top of the file). Someone else (a benchmark's peer)
  // may have raised its thread count since the last call; setting it is only safe outside a
  // parallel region.
  if (!omp_in_parallel() && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  if (g.dtype == DType::f32) {
    gemm_typed<float>(g);
  } else if (g.dtype == DType::f64) {
    gemm_typed<double>(g);
  } else if (g.dtype == DType::bf16) {
    gemm_bf16(g);
  } else {
    throw std::invalid_argument(std::string("matmul on the CPU supports f32, f64 and bf16, got ") +
                                dtype_name(g.dtype));
  }
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(gemm_kernel, DeviceType::CPU, &cpu::gemm_cpu);
}  // namespace seqlab::kernel

namespace seqlab::kernel {

std::string cpu_blas_config() {
#ifdef OPENBLAS_VERSION
  std::string config = openblas_get_config();
  while (!config.empty() && (config.back() == ' ' || config.back() == '\n')) config.pop_back();
  return config;
#else
  return "";
#endif
}

}  // namespace seqlab::kernel
