// The linear attention and Performer CUDA kernels' exact schedule, run on the CPU. src/cuda/linear/linear_attention.cu
// launches the __host__ __device__ functions of src/cuda/linear/linear_attention_schedule.h; here the same
// functions run in the kernels' order: the forward one thread per (b, h, j); the backward one block per
// (b, h) whose phases (column threads, then all threads, then row threads) run for every simulated
// thread before the next phase, as the kernel's barriers guarantee, each simulated thread with its own
// local arrays; the Performer kernels one index after another, launch after launch. Results are compared
// with the CPU kernels (src/layers/linear/linear_attention.cpp) for every form, normalised or not, with and
// without an initial state. Outputs and scratch start as NaN, so a missed write or a read before a
// write shows up. Element types: f64 (≤ 1e-11 against the f64 CPU kernels), f32, and bf16 stored / f32
// computed as on the GPU (≤ 2e-2 against the f32 CPU kernels on the same bf16 values). Linear attention
// in f32 is compared with the f64 CPU kernels on the same f32 values (≤ 1e-4·max(1, √(T/64)); measured
// 3.1e-5 at the non-causal dfk with dk = 128, whose sums cancel, and 1.5e-4 at T = 300, the GPU test's
// training-like shape, where sums of 300 steps round in f32): against the f32 CPU kernels the two roundings add up
// to 9e-5 at dk = 128 (the chunkwise GEMMs round differently), which says nothing about the schedule.
// Performer f32 against f32 (≤ 2e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/linear/linear_attention_schedule.h"
#include "layers/linear/linear_attention.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of variant_cases.h they use.
namespace seqlab::testing {
namespace {

namespace la = linear_attention_cuda;
using Case = LinearAttentionCase;
using Data = LinearAttentionData;

Tensor to(const Tensor& t, DType dtype) { return kernel::to_dtype(t, dtype); }

Data make_data(const Case& c, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return make_linear_attention_data(c, dtype, gen);
}

template <class T>
la::Inputs<T> inputs_of(const Data& x) {
  return {x.fq.data<T>(), x.fk.data<T>(), x.v.data<T>(), x.s0.data<T>(), x.z0.data<T>()};
}

struct Outputs {
  Tensor o, s, z, dfq, dfk, dv, ds0, dz0;
};

template <class T, class A>
Outputs run_schedule(const Case& c, const Data& x, DType dtype, const kernel::LinearAttentionParams& p) {
  const la::Dims d{c.B, c.T, c.H, c.dk, c.dv, p.form != LinearAttentionForm::noncausal, p.normalize};
  const la::Inputs<T> in = inputs_of<T>(x);
  const A eps = static_cast<A>(p.eps);
  Outputs r{poisoned(x.dout.shape(), dtype, kCpu), poisoned(x.s0.shape(), dtype, kCpu),
            poisoned(x.z0.shape(), dtype, kCpu),   poisoned(x.fq.shape(), dtype, kCpu),
            poisoned(x.fk.shape(), dtype, kCpu),   poisoned(x.v.shape(), dtype, kCpu),
            poisoned(x.s0.shape(), dtype, kCpu),   poisoned(x.z0.shape(), dtype, kCpu)};
  for (int64_t idx = 0; idx < c.B * c.H * c.dv; ++idx) {
    la::forward_column(idx, d, in, eps, r.o.data<T>(), r.s.data<T>(), r.z.data<T>());
  }
  std::vector<A> scratch(static_cast<size_t>(c.B * c.H * la::scratch_per_head(d)), std::numeric_limits<A>::quiet_NaN());
  const int nt = la::kBackwardThreads;
  const size_t local = static_cast<size_t>(nt * la::kMaxHeadDim);
  std::vector<A> s(local), z(local), g(local), gz(static_cast<size_t>(nt));
  auto at = [](std::vector<A>& v, int64_t j) { return v.data() + j * la::kMaxHeadDim; };
  const T *dO = x.dout.data<T>(), *dS = x.ds.data<T>(), *dZ = x.dz.data<T>();
  for (int64_t bh = 0; bh < c.B * c.H; ++bh) {
    const la::Scratch<A> w = la::scratch_of(scratch.data(), d, bh);
    for (int64_t j = 0; j < c.dv; ++j) la::backward_begin(bh, j, d, in, dO, dS, eps, w, at(s, j), at(z, j), at(g, j));
    for (int64_t t = 0; t < d.tiles(); ++t) {
      for (int64_t j = 0; j < c.dv; ++j) la::forward_tile_column(bh, j, t, d, in, eps, w, at(s, j), at(z, j));
      for (int tid = 0; tid < nt; ++tid) la::forward_tile_delta(bh, tid, nt, t, d, dO, w);
      for (int tid = 0; tid < nt; ++tid) la::forward_tile_dfq(bh, tid, nt, t, d, dO, w, r.dfq.data<T>());
    }
    for (int64_t a = 0; a < c.dk; ++a) gz[static_cast<size_t>(a)] = la::reverse_begin_row(bh, a, d, in, dZ, w);
    for (int64_t t = d.tiles() - 1; t >= 0; --t) {
      for (int64_t j = 0; j < c.dv; ++j) la::reverse_tile_column(bh, j, t, d, in, dO, w, at(g, j), r.dv.data<T>());
      for (int64_t a = 0; a < c.dk; ++a)
        la::reverse_tile_row(bh, a, t, d, in, w, gz[static_cast<size_t>(a)], r.dfk.data<T>());
    }
    for (int64_t j = 0; j < c.dv; ++j) la::backward_end_column(bh, j, d, at(g, j), r.ds0.data<T>());
    for (int64_t a = 0; a < c.dk; ++a) la::backward_end_row(bh, a, d, gz[static_cast<size_t>(a)], r.dz0.data<T>());
  }
  return r;
}

Outputs cpu_reference(const Data& x, DType rd, const kernel::LinearAttentionParams& p) {
  Outputs r{Tensor::empty(x.dout.shape(), rd), Tensor::empty(x.s0.shape(), rd), Tensor::empty(x.z0.shape(), rd),
            Tensor::empty(x.fq.shape(), rd),   Tensor::empty(x.fk.shape(), rd), Tensor::empty(x.v.shape(), rd),
            Tensor::empty(x.s0.shape(), rd),   Tensor::empty(x.z0.shape(), rd)};
  const Tensor fq = to(x.fq, rd), fk = to(x.fk, rd), v = to(x.v, rd), s0 = to(x.s0, rd), z0 = to(x.z0, rd);
  kernel::linear_attention_forward_kernel(kCpu, fq, fk, v, s0, z0, p, r.o, r.s, r.z);
  kernel::linear_attention_backward_kernel(kCpu, fq, fk, v, s0, z0, to(x.dout, rd), to(x.ds, rd), to(x.dz, rd), p,
                                           r.dfq, r.dfk, r.dv, r.ds0, r.dz0);
  return r;
}

template <class T, class A>
void check_linear_attention(DType dtype, DType rd, double tol_all, uint64_t seed) {
  // The shared cases, and the GPU test's training-like shape, where f32 sums run over 300 steps.
  for (const Case& c : cases_and(kLinearAttentionCases, {{4, 300, 4, 64, 64, true}})) {
    const Data x = make_data(c, dtype, seed++);
    // f32: the bound that grows with T (tol_all, 1e-4, is its value up to T = 64).
    const double tol = dtype == DType::f32 ? linear_attention_f32_rtol(c.T) : tol_all;
    for (LinearAttentionForm form :
         {LinearAttentionForm::chunkwise, LinearAttentionForm::recurrent, LinearAttentionForm::noncausal}) {
      for (bool normalize : {true, false}) {
        const kernel::LinearAttentionParams p{form, normalize, 1e-6, 7};
        const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " form " +
                                 std::to_string(static_cast<int>(form)) + (normalize ? " normalized " : " ");
        const Outputs got = run_schedule<T, A>(c, x, dtype, p), want = cpu_reference(x, rd, p);
        expect_schedule_close(got.o, want.o, tol, what + "o");
        expect_schedule_close(got.s, want.s, tol, what + "final_state");
        expect_schedule_close(got.z, want.z, tol, what + "final_normalizer");
        expect_schedule_close(got.dfq, want.dfq, tol, what + "dfq");
        expect_schedule_close(got.dfk, want.dfk, tol, what + "dfk");
        expect_schedule_close(got.dv, want.dv, tol, what + "dv");
        expect_schedule_close(got.ds0, want.ds0, tol, what + "ds0");
        expect_schedule_close(got.dz0, want.dz0, tol, what + "dz0");
      }
    }
  }
}

TEST(LinearAttentionCudaSchedule, F64MatchesCpuKernels) {
  check_linear_attention<double, double>(DType::f64, DType::f64, 1e-11, 10);
}
TEST(LinearAttentionCudaSchedule, F32MatchesCpuKernels) {
  check_linear_attention<float, float>(DType::f32, DType::f64, 1e-4, 20);
}
TEST(LinearAttentionCudaSchedule, Bf16StorageF32ComputeMatchesCpuKernels) {
  check_linear_attention<bf16, float>(DType::bf16, DType::f32, 2e-2, 30);
}

// ---- Performer ----
struct PCase {
  int64_t B, L, H, d, m;  // x [B, L, H, d], ω [m, d]
};

template <class T, class A>
void check_performer(DType dtype, DType rd, double tol, uint64_t seed) {
  // N = 280 rows spans two 256-row blocks of the dω sums; m < d, m = d, m > d; d = 1.
  for (PCase pc : {PCase{2, 70, 2, 8, 16}, PCase{1, 5, 3, 16, 16}, PCase{1, 3, 1, 12, 5}, PCase{1, 1, 1, 1, 3},
                   PCase{1, 300, 2, 4, 32}}) {
    for (bool stabilize : {false, true}) {
      Generator gen(seed++);
      const Tensor x = Tensor::randn({pc.B, pc.L, pc.H, pc.d}, gen, dtype, 0.5);
      const Tensor omega = Tensor::randn({pc.m, pc.d}, gen, dtype);
      const Tensor dy = Tensor::randn({pc.B, pc.L, pc.H, pc.m}, gen, dtype);
      const std::string what = std::string(dtype_name(dtype)) + " N=" + std::to_string(pc.B * pc.L * pc.H) +
                               " d=" + std::to_string(pc.d) + " m=" + std::to_string(pc.m) +
                               (stabilize ? " stabilized " : " ");
      const la::PerformerDims p{pc.B * pc.L * pc.H, pc.d, pc.m, stabilize};
      // Forward: the row-shift launch, then the element launch.
      std::vector<A> shift(static_cast<size_t>(p.N), std::numeric_limits<A>::quiet_NaN());
      Tensor y = poisoned(dy.shape(), dtype, kCpu);
      for (int64_t n = 0; n < p.N; ++n) la::performer_row_shift(n, p, x.data<T>(), omega.data<T>(), shift.data());
      const A inv_sqrt_m = static_cast<A>(1.0 / std::sqrt(static_cast<double>(p.m)));
      for (int64_t e = 0; e < p.N * p.m; ++e) {
        la::performer_element(e, p, x.data<T>(), omega.data<T>(), shift.data(), inv_sqrt_m, y.data<T>());
      }
      Tensor y_ref = Tensor::empty(dy.shape(), rd);
      kernel::performer_forward_kernel(kCpu, to(x, rd), to(omega, rd), stabilize, y_ref);
      expect_schedule_close(y, y_ref, tol, what + "y");
      // Backward on the same y (the CPU forward's, in the dtype under test): four launches.
      const Tensor y_saved = to(y_ref, dtype);
      const T *dY = dy.data<T>(), *X = x.data<T>(), *W = omega.data<T>(), *Y = y_saved.data<T>();
      std::vector<A> rowsum(static_cast<size_t>(p.N), std::numeric_limits<A>::quiet_NaN());
      std::vector<int64_t> arg(static_cast<size_t>(p.N), -1);
      const int64_t blocks = (p.N + la::kRowBlock - 1) / la::kRowBlock;
      std::vector<A> partial(static_cast<size_t>(blocks * p.m * p.d), std::numeric_limits<A>::quiet_NaN());
      Tensor dx = poisoned(x.shape(), dtype, kCpu), domega = poisoned(omega.shape(), dtype, kCpu);
      for (int64_t n = 0; n < p.N; ++n) la::performer_backward_row(n, p, dY, X, W, Y, rowsum.data(), arg.data());
      for (int64_t e = 0; e < p.N * p.d; ++e)
        la::performer_dx(e, p, dY, X, W, Y, rowsum.data(), arg.data(), dx.data<T>());
      for (int64_t k = 0; k < blocks; ++k) {
        for (int64_t e = 0; e < p.m * p.d; ++e) {
          la::performer_domega_partial(k, e, p, dY, X, Y, rowsum.data(), arg.data(), partial.data());
        }
      }
      for (int64_t e = 0; e < p.m * p.d; ++e) la::performer_domega_final<T, A>(e, p, partial.data(), domega.data<T>());
      Tensor dx_ref = Tensor::empty(x.shape(), rd), dw_ref = Tensor::empty(omega.shape(), rd);
      kernel::performer_backward_kernel(kCpu, to(dy, rd), to(x, rd), to(omega, rd), to(y_saved, rd), stabilize, dx_ref,
                                        dw_ref);
      expect_schedule_close(dx, dx_ref, tol, what + "dx");
      expect_schedule_close(domega, dw_ref, tol, what + "domega");
    }
  }
}

TEST(PerformerCudaSchedule, F64MatchesCpuKernels) {
  check_performer<double, double>(DType::f64, DType::f64, 1e-11, 50);
}
TEST(PerformerCudaSchedule, F32MatchesCpuKernels) { check_performer<float, float>(DType::f32, DType::f32, 2e-5, 60); }
TEST(PerformerCudaSchedule, Bf16StorageF32ComputeMatchesCpuKernels) {
  check_performer<bf16, float>(DType::bf16, DType::f32, 2e-2, 70);
}

}  // namespace
}  // namespace seqlab::testing
