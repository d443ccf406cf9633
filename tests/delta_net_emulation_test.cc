// The DeltaNet CUDA kernels' exact schedule, run on the CPU. src/cuda/delta/delta_net.cu launches the
// __host__ __device__ functions of src/cuda/delta/delta_net_schedule.h: the forward one thread per
// (b, h, column j); the backward one block per (b, h) whose column threads run phase 1 of a segment,
// then (after a barrier) all kBackwardThreads threads run phase 2, then a barrier, segment by segment
// from the last. Here the same functions run in that order (every thread of a phase before the next
// phase, as the barriers guarantee), each simulated thread with its own local arrays, and the results
// are compared with the CPU kernels of both forms (src/layers/delta/delta_net.cpp) on random inputs.
//
// This is how the CUDA kernels' logic is validated on a machine without a GPU; what it cannot check
// (launch geometry, memory on the device) tests/delta_net_gpu_test.cc checks where a GPU exists.
// Outputs start as NaN so that an element the schedule fails to write shows up. Element types: f64
// (against the f64 CPU kernels, ≤ 1e-11), f32 (against f32, ≤ 2e-5: different summation orders and
// the recurrent against the chunkwise arrangement), and bf16 stored / f32 computed as on the GPU
// (against the f32 CPU kernels on the same bf16 values, ≤ 2e-2). Measured: f64 ≤ 1e-14 (extreme gates
// included), f32 ≤ 3.4e-6, bf16 ≤ 3.9e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda/delta/delta_net_schedule.h"
#include "layers/delta/delta_net.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of variant_cases.h they use.
namespace seqlab::testing {
namespace {

namespace dn = delta_net_cuda;
using Case = DeltaNetCase;
using Data = DeltaNetData;

Data make_data(const Case& c, DType dtype, uint64_t seed, double g_lo, double g_hi) {
  Generator gen(seed);
  return make_delta_net_data(c, dtype, gen, g_lo, g_hi);
}

template <class T>
dn::Inputs<T> inputs_of(const Data& x) {
  return {ptr<T>(x.q), ptr<T>(x.k), ptr<T>(x.v), ptr<T>(x.beta), ptr<T>(x.g), ptr<T>(x.s0)};
}

dn::Dims dims_of(const Case& c) { return {c.B, c.T, c.H, c.dk, c.dv}; }

// The forward kernel's grid: one thread per (b, h, j), each on its own.
template <class T, class A>
void run_forward(const Case& c, const Data& x, DType dtype, Tensor& o, Tensor& fin) {
  o = poisoned({c.B, c.T, c.H, c.dv}, dtype, kCpu);
  fin = poisoned({c.B, c.H, c.dk, c.dv}, dtype, kCpu);
  const dn::Dims d = dims_of(c);
  for (int64_t idx = 0; idx < c.B * c.H * c.dv; ++idx) {
    dn::forward_column(idx, d, inputs_of<T>(x), static_cast<A>(c.resolved_scale()), o.data<T>(), fin.data<T>());
  }
}

// The backward kernel's blocks in the order of their barriers.
template <class T, class A>
kernel::DeltaNetGrads run_backward(const Case& c, const Data& x, DType dtype) {
  kernel::DeltaNetGrads gr;
  gr.dq = poisoned(x.q.shape(), dtype, kCpu);
  gr.dk = poisoned(x.k.shape(), dtype, kCpu);
  gr.dv = poisoned(x.v.shape(), dtype, kCpu);
  gr.dbeta = poisoned(x.beta.shape(), dtype, kCpu);
  if (c.gated) gr.dg = poisoned(x.g.shape(), dtype, kCpu);
  if (c.init) gr.dinitial_state = poisoned(x.s0.shape(), dtype, kCpu);
  const dn::Grads<T> g{mut<T>(gr.dq),    mut<T>(gr.dk), mut<T>(gr.dv),
                       mut<T>(gr.dbeta), mut<T>(gr.dg), mut<T>(gr.dinitial_state)};
  const dn::Dims d = dims_of(c);
  const dn::Inputs<T> in = inputs_of<T>(x);
  const A scale = static_cast<A>(c.resolved_scale());
  // Scratch as the launch allocates it (uninitialised there: NaN here, so a read before a write shows).
  std::vector<A> scratch(static_cast<size_t>(c.B * c.H * dn::scratch_per_head(d)), std::numeric_limits<A>::quiet_NaN());
  // Each simulated thread's local arrays s and ds.
  std::vector<A> s(static_cast<size_t>(dn::kBackwardThreads * dn::kMaxHeadDim)), ds(s.size());
  auto s_of = [&](int64_t j) { return s.data() + j * dn::kMaxHeadDim; };
  auto ds_of = [&](int64_t j) { return ds.data() + j * dn::kMaxHeadDim; };
  for (int64_t bh = 0; bh < c.B * c.H; ++bh) {
    const dn::Scratch<A> w = dn::scratch_of(scratch.data(), d, bh);
    for (int64_t j = 0; j < c.dv; ++j) dn::backward_begin(bh, j, d, in, x.dfinal.data<T>(), w, s_of(j), ds_of(j));
    for (int64_t seg = d.segments() - 1; seg >= 0; --seg) {
      for (int64_t j = 0; j < c.dv; ++j) {
        dn::backward_segment_column(bh, j, seg, d, in, x.dout.data<T>(), scale, w, s_of(j), ds_of(j), g.dv);
      }
      // __syncthreads()
      for (int tid = 0; tid < dn::kBackwardThreads; ++tid) {
        dn::backward_segment_reduce(bh, tid, dn::kBackwardThreads, seg, d, in, x.dout.data<T>(), scale, w, g);
      }
      // __syncthreads()
    }
    for (int64_t j = 0; j < c.dv; ++j) dn::backward_end(bh, j, d, ds_of(j), g);
  }
  return gr;
}

// The CPU kernels' outputs and gradients for form `form`, in dtype `rd`.
struct Reference {
  Tensor o, fin;
  kernel::DeltaNetGrads gr;
};
Reference cpu_reference(const Case& c, const Data& x, DType rd, DeltaNetForm form, int64_t chunk) {
  const kernel::DeltaNetParams p{form, chunk, c.resolved_scale()};
  Reference r;
  const Tensor q = cast_or_none(x.q, rd), k = cast_or_none(x.k, rd), v = cast_or_none(x.v, rd),
               beta = cast_or_none(x.beta, rd), g = cast_or_none(x.g, rd), s0 = cast_or_none(x.s0, rd);
  r.o = Tensor::empty({c.B, c.T, c.H, c.dv}, rd);
  r.fin = Tensor::empty({c.B, c.H, c.dk, c.dv}, rd);
  kernel::delta_net_forward_kernel(kCpu, q, k, v, beta, g, s0, p, r.o, r.fin);
  r.gr.dq = Tensor::empty(q.shape(), rd);
  r.gr.dk = Tensor::empty(k.shape(), rd);
  r.gr.dv = Tensor::empty(v.shape(), rd);
  r.gr.dbeta = Tensor::empty(beta.shape(), rd);
  if (g.defined()) r.gr.dg = Tensor::empty(g.shape(), rd);
  if (s0.defined()) r.gr.dinitial_state = Tensor::empty(s0.shape(), rd);
  kernel::delta_net_backward_kernel(kCpu, cast_or_none(x.dout, rd), cast_or_none(x.dfinal, rd), q, k, v, beta, g, s0, p,
                                    r.gr);
  return r;
}

// The schedule against both CPU forms on every shared case, element by element within tol. Log-gates
// uniform in [g_lo, g_hi], or, where `decay` is given, drawn as it says (testing::draw_log_decays); then
// also the gate gradient norm-wise within gate_tol of the CPU's (elementwise, |x| ≤ tol·max(1, |x|)
// says nothing about a gradient of size e^−30).
template <class T, class A>
void check_all(DType dtype, DType rd, double tol, uint64_t seed, double g_lo = -1.0, double g_hi = -0.02,
               const Decay* decay = nullptr, double gate_tol = 0) {
  for (const Case& c : kDeltaNetCases) {
    Data x = make_data(c, dtype, seed++, g_lo, g_hi);
    if (decay && c.gated) {
      Generator gen(seed);
      x.g = draw_log_decays(*decay, x.g.shape(), gen, dtype);
    }
    Tensor o, fin;
    run_forward<T, A>(c, x, dtype, o, fin);
    const kernel::DeltaNetGrads gr = run_backward<T, A>(c, x, dtype);
    // The CPU chunkwise form with a chunk that does not divide T, and the recurrent form.
    for (auto [form, chunk] : {std::pair{DeltaNetForm::chunkwise, int64_t{7}}, {DeltaNetForm::recurrent, int64_t{5}}}) {
      const std::string what =
          std::string(dtype_name(dtype)) + " " + c.name() + " vs CPU " + delta_net_form_name(form) + " ";
      const Reference r = cpu_reference(c, x, rd, form, chunk);
      expect_schedule_close(o, r.o, tol, what + "o");
      expect_schedule_close(fin, r.fin, tol, what + "final_state");
      expect_schedule_close(gr.dq, r.gr.dq, tol, what + "dq");
      expect_schedule_close(gr.dk, r.gr.dk, tol, what + "dk");
      expect_schedule_close(gr.dv, r.gr.dv, tol, what + "dv");
      expect_schedule_close(gr.dbeta, r.gr.dbeta, tol, what + "dbeta");
      expect_schedule_close(gr.dg, r.gr.dg, tol, what + "dg");
      if (decay && c.gated) {
        EXPECT_LE(norm_rel_error(gr.dg, r.gr.dg), gate_tol) << what << "dg, norm-wise";
      }
      expect_schedule_close(gr.dinitial_state, r.gr.dinitial_state, tol, what + "dinitial_state");
    }
  }
}

TEST(DeltaNetCudaSchedule, F64MatchesCpuKernels) { check_all<double, double>(DType::f64, DType::f64, 1e-11, 100); }

TEST(DeltaNetCudaSchedule, F32MatchesCpuKernels) { check_all<float, float>(DType::f32, DType::f32, 2e-5, 200); }

TEST(DeltaNetCudaSchedule, Bf16StorageF32ComputeMatchesCpuKernels) {
  check_all<bf16, float>(DType::bf16, DType::f32, 2e-2, 300);
}

// Log-gates down to −20 per token: the schedule never divides by a gate, so everything stays finite
// and matches the CPU (f64).
TEST(DeltaNetCudaSchedule, ExtremeGatesStayFinite) {
  check_all<double, double>(DType::f64, DType::f64, 1e-11, 400, -20.0, -1e-6);
}

// Strong decays (every log-gate −20, every one −30, and the bimodal mixture of ≈ −1e-5 and [−30, −10]),
// where the CPU's chunkwise gate gradient once cancelled (docs/reliability.md, "Numerics at every
// decay"): the schedule (the recurrent form on the GPU) against both CPU forms at this file's
// tolerances, and dg norm-wise within 1e-12 (f64) and 1e-5 (f32).
TEST(DeltaNetCudaSchedule, StrongDecaysMatchCpuKernels) {
  uint64_t seed = 500;
  for (Decay d : {Decay::all20, Decay::all30, Decay::bimodal}) {
    check_all<double, double>(DType::f64, DType::f64, 1e-11, seed, 0, 0, &d, 1e-12);
    check_all<float, float>(DType::f32, DType::f32, 2e-5, seed + 50, 0, 0, &d, 1e-5);
    seed += 100;
  }
}

}  // namespace
}  // namespace seqlab::testing
