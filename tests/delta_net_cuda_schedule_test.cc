// The DeltaNet CUDA kernels' exact schedule, run on the CPU. src/cuda/delta_net.cu launches the
// __host__ __device__ functions of src/cuda/delta_net_schedule.h: the forward one thread per
// (b, h, column j); the backward one block per (b, h) whose column threads run phase 1 of a segment,
// then (after a barrier) all kBackwardThreads threads run phase 2, then a barrier, segment by segment
// from the last. Here the same functions run in that order (every thread of a phase before the next
// phase, as the barriers guarantee), each simulated thread with its own local arrays, and the results
// are compared with the CPU kernels of both forms (src/layers/delta_net.cpp) on random inputs.
//
// This is how the CUDA kernels' logic is validated on a machine without a GPU; what it cannot check
// (launch geometry, memory on the device) tests/cuda_delta_net_gpu_test.cc checks where a GPU exists.
// Outputs start as NaN so that an element the schedule fails to write shows up. Element types: f64
// (against the f64 CPU kernels, ≤ 1e-11), f32 (against f32, ≤ 2e-5: different summation orders and
// the recurrent against the chunkwise arrangement), and bf16 stored / f32 computed as on the GPU
// (against the f32 CPU kernels on the same bf16 values, ≤ 2e-2). Measured: f64 ≤ 1e-14 (extreme gates
// included), f32 ≤ 3.4e-6, bf16 ≤ 3.9e-3.
#include "cuda/delta_net_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "layers/delta_net.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

namespace dn = delta_net_cuda;
using testing::max_rel_error;

const Device kCpu = cpu_device();

Tensor nan_like(const Shape& shape, DType dtype) {
  return Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), dtype);
}

// Rows of unit L2 norm (the DeltaNet layer normalises its keys).
Tensor unit_rows(const Shape& shape, Generator& gen, DType dtype) {
  std::vector<double> x = Tensor::randn(shape, gen, DType::f64).to_doubles();
  const size_t d = static_cast<size_t>(shape.back());
  for (size_t r = 0; r < x.size(); r += d) {
    double n2 = 0;
    for (size_t i = 0; i < d; ++i) n2 += x[r + i] * x[r + i];
    for (size_t i = 0; i < d; ++i) x[r + i] /= std::sqrt(n2);
  }
  return Tensor::from_vector(x, shape, dtype);
}

struct Case {
  int64_t B, T, H, dk, dv;
  bool gated, init;
  double scale;  // ≤ 0: 1/√dk
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) + (gated ? " gated" : "") +
           (init ? " initial_state" : "");
  }
  double resolved_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk)); }
};

// Shapes: T not a multiple of the 32-step segment (70, 33), exactly one and two segments (32, 64),
// T = 1, T below one segment, dk ≠ dv both ways, head dims 1 and 128 (every block thread a column).
const Case kCases[] = {
    {2, 70, 3, 16, 24, true, true, 0},   {1, 1, 2, 5, 7, true, true, 0},      {2, 33, 2, 8, 8, false, true, 0},
    {1, 32, 2, 12, 4, true, false, 0.7}, {1, 64, 1, 6, 10, false, false, 0}, {2, 9, 2, 1, 3, true, true, 0},
    {1, 40, 1, 128, 128, true, true, 0}, {1, 35, 2, 32, 96, true, true, 0},   {1, 20, 1, 100, 3, false, true, 0},
};

struct Data {
  Tensor q, k, v, beta, g, s0, dout, dfinal;
};

Data make_data(const Case& c, DType dtype, uint64_t seed, double g_lo = -1.0, double g_hi = -0.02) {
  Generator gen(seed);
  Data x;
  x.q = Tensor::randn({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.k = unit_rows({c.B, c.T, c.H, c.dk}, gen, dtype);
  x.v = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.beta = Tensor::rand({c.B, c.T, c.H}, gen, dtype, 0.05, 0.95);
  if (c.gated) x.g = Tensor::rand({c.B, c.T, c.H}, gen, dtype, g_lo, g_hi);
  if (c.init) x.s0 = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  x.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, dtype);
  x.dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, dtype, 0.5);
  return x;
}

template <class T>
const T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* mut(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

template <class T>
dn::Inputs<T> inputs_of(const Data& x) {
  return {ptr<T>(x.q), ptr<T>(x.k), ptr<T>(x.v), ptr<T>(x.beta), ptr<T>(x.g), ptr<T>(x.s0)};
}

dn::Dims dims_of(const Case& c) { return {c.B, c.T, c.H, c.dk, c.dv}; }

// The forward kernel's grid: one thread per (b, h, j), each on its own.
template <class T, class A>
void run_forward(const Case& c, const Data& x, DType dtype, Tensor& o, Tensor& fin) {
  o = nan_like({c.B, c.T, c.H, c.dv}, dtype);
  fin = nan_like({c.B, c.H, c.dk, c.dv}, dtype);
  const dn::Dims d = dims_of(c);
  for (int64_t idx = 0; idx < c.B * c.H * c.dv; ++idx) {
    dn::forward_column(idx, d, inputs_of<T>(x), static_cast<A>(c.resolved_scale()), o.data<T>(), fin.data<T>());
  }
}

// The backward kernel's blocks in the order of their barriers.
template <class T, class A>
kernel::DeltaNetGrads run_backward(const Case& c, const Data& x, DType dtype) {
  kernel::DeltaNetGrads gr;
  gr.dq = nan_like(x.q.shape(), dtype);
  gr.dk = nan_like(x.k.shape(), dtype);
  gr.dv = nan_like(x.v.shape(), dtype);
  gr.dbeta = nan_like(x.beta.shape(), dtype);
  if (c.gated) gr.dg = nan_like(x.g.shape(), dtype);
  if (c.init) gr.dinitial_state = nan_like(x.s0.shape(), dtype);
  const dn::Grads<T> g{mut<T>(gr.dq), mut<T>(gr.dk), mut<T>(gr.dv), mut<T>(gr.dbeta), mut<T>(gr.dg),
                       mut<T>(gr.dinitial_state)};
  const dn::Dims d = dims_of(c);
  const dn::Inputs<T> in = inputs_of<T>(x);
  const A scale = static_cast<A>(c.resolved_scale());
  // Scratch as the launch allocates it (uninitialised there: NaN here, so a read before a write shows).
  std::vector<A> scratch(static_cast<size_t>(c.B * c.H * dn::scratch_per_head(d)),
                         std::numeric_limits<A>::quiet_NaN());
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

Tensor maybe_to(const Tensor& t, DType dtype) { return t.defined() ? kernel::to_dtype(t, dtype) : t; }

// The CPU kernels' outputs and gradients for form `form`, in dtype `rd`.
struct Reference {
  Tensor o, fin;
  kernel::DeltaNetGrads gr;
};
Reference cpu_reference(const Case& c, const Data& x, DType rd, DeltaNetForm form, int64_t chunk) {
  const kernel::DeltaNetParams p{form, chunk, c.resolved_scale()};
  Reference r;
  const Tensor q = maybe_to(x.q, rd), k = maybe_to(x.k, rd), v = maybe_to(x.v, rd), beta = maybe_to(x.beta, rd),
               g = maybe_to(x.g, rd), s0 = maybe_to(x.s0, rd);
  r.o = Tensor::empty({c.B, c.T, c.H, c.dv}, rd);
  r.fin = Tensor::empty({c.B, c.H, c.dk, c.dv}, rd);
  kernel::delta_net_forward_kernel(kCpu, q, k, v, beta, g, s0, p, r.o, r.fin);
  r.gr.dq = Tensor::empty(q.shape(), rd);
  r.gr.dk = Tensor::empty(k.shape(), rd);
  r.gr.dv = Tensor::empty(v.shape(), rd);
  r.gr.dbeta = Tensor::empty(beta.shape(), rd);
  if (g.defined()) r.gr.dg = Tensor::empty(g.shape(), rd);
  if (s0.defined()) r.gr.dinitial_state = Tensor::empty(s0.shape(), rd);
  kernel::delta_net_backward_kernel(kCpu, maybe_to(x.dout, rd), maybe_to(x.dfinal, rd), q, k, v, beta, g, s0, p,
                                    r.gr);
  return r;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  for (double x : got.to_doubles()) ASSERT_FALSE(std::isnan(x)) << what << ": an element was not written";
  const double err = max_rel_error(got, want);
  EXPECT_LE(err, tol) << what;
}

template <class T, class A>
void check_all(DType dtype, DType rd, double tol, uint64_t seed, double g_lo = -1.0, double g_hi = -0.02) {
  for (const Case& c : kCases) {
    const Data x = make_data(c, dtype, seed++, g_lo, g_hi);
    Tensor o, fin;
    run_forward<T, A>(c, x, dtype, o, fin);
    const kernel::DeltaNetGrads gr = run_backward<T, A>(c, x, dtype);
    // The CPU chunkwise form with a chunk that does not divide T, and the recurrent form.
    for (auto [form, chunk] : {std::pair{DeltaNetForm::chunkwise, int64_t{7}}, {DeltaNetForm::recurrent, int64_t{5}}}) {
      const std::string what =
          std::string(dtype_name(dtype)) + " " + c.name() + " vs CPU " + delta_net_form_name(form) + " ";
      const Reference r = cpu_reference(c, x, rd, form, chunk);
      expect_close(o, r.o, tol, what + "o");
      expect_close(fin, r.fin, tol, what + "final_state");
      expect_close(gr.dq, r.gr.dq, tol, what + "dq");
      expect_close(gr.dk, r.gr.dk, tol, what + "dk");
      expect_close(gr.dv, r.gr.dv, tol, what + "dv");
      expect_close(gr.dbeta, r.gr.dbeta, tol, what + "dbeta");
      expect_close(gr.dg, r.gr.dg, tol, what + "dg");
      expect_close(gr.dinitial_state, r.gr.dinitial_state, tol, what + "dinitial_state");
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

}  // namespace
}  // namespace seqlab
