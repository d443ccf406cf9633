// The S4D CUDA kernels' exact schedule, run on the CPU. src/cuda/ssm/s4.cu launches the __host__ __device__
// functions of src/cuda/ssm/s4_schedule.h, one thread per index; here the same functions run for every
// index, kernel after kernel in the launch order (no kernel has barriers or shared memory, so the order
// of the threads within a kernel cannot matter). Results are compared with the CPU kernels
// (src/layers/ssm/s4.cpp) for both forms and both discretisations, with and without D and the initial
// state, T = 0, T = 1 and odd T, H, N2, and steps from 1e-4 to 10. Outputs and scratch start as NaN, so a missed
// write or a read before a write shows up. Element types: f64 (≤ 1e-11 against the f64 CPU kernels),
// f32 (≤ 1e-5 against the f32 CPU kernels on the same values: both compute in double, so only the
// summation order differs before the same rounding), bf16 stored with double compute (≤ 2e-2 against the
// f32 CPU kernels on the same bf16 values). The diagonal-plus-low-rank form (bilinear, P and Q of size ~0.3)
// likewise, both forms, against the CPU's DPLR kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/ssm/s4_schedule.h"
#include "layers/ssm/s4.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

namespace seqlab::testing {
namespace {

namespace sc = s4_cuda;

struct Case {
  int64_t B, T, H, N2;
  double log_dt_lo, log_dt_hi;
  bool with_d, with_x0;
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " N2" + std::to_string(N2);
  }
};

const Case kCases[] = {
    {2, 13, 3, 3, -2.5, 0.0, true, true},     // odd everything, D and an initial state
    {1, 1, 2, 2, -2.5, 0.0, true, true},      // T = 1: one decode step
    {2, 0, 2, 2, -2.5, 0.0, true, true},      // T = 0: the final state is the initial one
    {2, 9, 1, 5, -2.5, 0.0, false, false},    // no D, zero initial state
    {1, 17, 2, 4, std::log(1e-4), std::log(1.2e-4), true, true},  // Δ ≈ 1e-4 (Ā ≈ 1, zoh's series branch)
    {1, 11, 2, 3, std::log(9.0), std::log(10.0), true, true},     // Δ ≈ 10 (Ā ≈ 0)
};

struct Data {
  Tensor u, log_dt, A, B, C, D, x0, dy, dfinal;
};

Data make_data(const Case& c, DType dtype, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> a = Tensor::rand({c.H, c.N2, 2}, gen, DType::f64, 0, 1).to_doubles();
  for (size_t i = 0; i < a.size(); i += 2) {
    a[i] = -(0.2 + 1.3 * a[i]);
    a[i + 1] = 6 * a[i + 1] - 3;
  }
  Data x;
  x.u = Tensor::randn({c.B, c.T, c.H}, gen, dtype);
  x.log_dt = Tensor::rand({c.H}, gen, dtype, c.log_dt_lo, c.log_dt_hi);
  x.A = kernel::to_dtype(Tensor::from_vector(a, {c.H, c.N2, 2}, DType::f64), dtype);
  x.B = Tensor::randn({c.H, c.N2, 2}, gen, dtype);
  x.C = Tensor::randn({c.H, c.N2, 2}, gen, dtype);
  if (c.with_d) x.D = Tensor::randn({c.H}, gen, dtype);
  if (c.with_x0) x.x0 = Tensor::randn({c.B, c.H, c.N2, 2}, gen, dtype);
  x.dy = Tensor::randn({c.B, c.T, c.H}, gen, dtype);
  x.dfinal = Tensor::randn({c.B, c.H, c.N2, 2}, gen, dtype);
  return x;
}

struct Outputs {
  Tensor y, xT, du, dlog_dt, dA, dB, dC, dD, dx0;
};

template <class T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

std::vector<double> nan_scratch(int64_t n) {
  return std::vector<double>(static_cast<size_t>(std::max<int64_t>(n, 1)), std::numeric_limits<double>::quiet_NaN());
}

// The launches of s4.cu, each kernel's threads one after another.
template <class T>
Outputs run_schedule(const Case& c, const Data& x, DType dtype, const kernel::S4Params& p) {
  const sc::Dims d{c.B, c.T, c.H, c.N2, p.disc == S4Discretisation::zoh};
  const sc::Inputs<T> in{x.u.data<T>(), x.log_dt.data<T>(), x.A.data<T>(), x.B.data<T>(),
                         x.C.data<T>(), ptr_or_null<T>(x.D), ptr_or_null<T>(x.x0)};
  Outputs r{poisoned(x.u.shape(), dtype, kCpu),      poisoned(x.dfinal.shape(), dtype, kCpu),
            poisoned(x.u.shape(), dtype, kCpu),      poisoned(x.log_dt.shape(), dtype, kCpu),
            poisoned(x.A.shape(), dtype, kCpu),      poisoned(x.B.shape(), dtype, kCpu),
            poisoned(x.C.shape(), dtype, kCpu),      x.D.defined() ? poisoned(x.D.shape(), dtype, kCpu) : Tensor(),
            x.x0.defined() ? poisoned(x.x0.shape(), dtype, kCpu) : Tensor()};
  const T *dy = x.dy.data<T>(), *dfinal = x.dfinal.data<T>();
  T* dD = r.dD.defined() ? r.dD.data<T>() : nullptr;
  T* dx0 = r.dx0.defined() ? r.dx0.data<T>() : nullptr;
  std::vector<double> ddt = nan_scratch(c.H * c.N2);
  if (p.form == S4Form::recurrent) {
    std::vector<double> ybuf = nan_scratch(c.B * c.H * c.T);
    for (int64_t i = 0; i < c.B * c.H; ++i) sc::recurrent_forward(i, d, in, ybuf.data() + i * c.T, r.y.data<T>(), r.xT.data<T>());
    std::vector<sc::Cx> xs(static_cast<size_t>(c.B * c.H * c.T),
                           sc::Cx{std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()});
    std::vector<double> dubuf = nan_scratch(c.B * c.H * c.T), partial = nan_scratch(6 * c.B * c.H * c.N2),
                        dd = nan_scratch(c.B * c.H);
    for (int64_t i = 0; i < c.B * c.H; ++i) {
      sc::recurrent_backward(i, d, in, dy, dfinal, xs.data() + i * c.T, dubuf.data() + i * c.T, partial.data(),
                             dd.data(), r.du.data<T>(), dx0);
    }
    for (int64_t i = 0; i < c.H * c.N2; ++i) {
      sc::recurrent_mode_grads(i, d, in, partial.data(), ddt.data(), r.dA.data<T>(), r.dB.data<T>(), r.dC.data<T>());
    }
    for (int64_t h = 0; h < c.H; ++h) sc::channel_grads(h, d, in, dy, ddt.data(), dd.data(), r.dlog_dt.data<T>(), dD);
  } else {
    std::vector<double> K = nan_scratch(c.H * c.T), dK = nan_scratch(c.H * c.T);
    for (int64_t i = 0; i < c.H * c.T; ++i) sc::conv_kernel(i, d, in, K.data());
    for (int64_t i = 0; i < c.B * c.H * c.T; ++i) sc::conv_forward(i, d, in, K.data(), r.y.data<T>());
    for (int64_t i = 0; i < c.B * c.H * c.N2; ++i) sc::conv_final_state(i, d, in, r.xT.data<T>());
    for (int64_t i = 0; i < c.H * c.T; ++i) sc::conv_kernel(i, d, in, K.data());  // the backward's own launch
    for (int64_t i = 0; i < c.H * c.T; ++i) sc::conv_dkernel(i, d, in, dy, dK.data());
    for (int64_t i = 0; i < c.B * c.H * c.T; ++i) sc::conv_du(i, d, in, dy, dfinal, K.data(), r.du.data<T>());
    for (int64_t i = 0; i < c.H * c.N2; ++i) {
      sc::conv_mode_grads(i, d, in, dy, dfinal, dK.data(), ddt.data(), r.dA.data<T>(), r.dB.data<T>(), r.dC.data<T>(),
                          dx0);
    }
    for (int64_t h = 0; h < c.H; ++h) sc::channel_grads(h, d, in, dy, ddt.data(), nullptr, r.dlog_dt.data<T>(), dD);
  }
  return r;
}

Tensor to(const Tensor& t, DType d) { return t.defined() ? kernel::to_dtype(t, d) : t; }

Outputs cpu_reference(const Data& x, DType rd, const kernel::S4Params& p) {
  Outputs r{Tensor::empty(x.u.shape(), rd), Tensor::empty(x.dfinal.shape(), rd), Tensor::empty(x.u.shape(), rd),
            Tensor::empty(x.log_dt.shape(), rd), Tensor::empty(x.A.shape(), rd), Tensor::empty(x.B.shape(), rd),
            Tensor::empty(x.C.shape(), rd), x.D.defined() ? Tensor::empty(x.D.shape(), rd) : Tensor(),
            x.x0.defined() ? Tensor::empty(x.x0.shape(), rd) : Tensor()};
  const Tensor u = to(x.u, rd), log_dt = to(x.log_dt, rd), A = to(x.A, rd), B = to(x.B, rd), C = to(x.C, rd),
               D = to(x.D, rd), x0 = to(x.x0, rd);
  kernel::s4_forward_kernel(kCpu, u, log_dt, A, B, C, D, x0, p, r.y, r.xT);
  kernel::S4Grads g{r.du, r.dlog_dt, r.dA, r.dB, r.dC, r.dD, r.dx0};
  kernel::s4_backward_kernel(kCpu, to(x.dy, rd), to(x.dfinal, rd), u, log_dt, A, B, C, D, x0, p, g);
  return r;
}

template <class T>
void check(DType dtype, DType rd, double tol, uint64_t seed) {
  for (const Case& c : kCases) {
    const Data x = make_data(c, dtype, seed++);
    for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
      for (S4Discretisation disc : {S4Discretisation::zoh, S4Discretisation::bilinear}) {
        const kernel::S4Params p{form, disc};
        const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " " + s4_form_name(form) + " " +
                                 s4_discretisation_name(disc) + " ";
        const Outputs got = run_schedule<T>(c, x, dtype, p), want = cpu_reference(x, rd, p);
        expect_schedule_close(got.y, want.y, tol, what + "y");
        expect_schedule_close(got.xT, want.xT, tol, what + "final_state");
        expect_schedule_close(got.du, want.du, tol, what + "du");
        expect_schedule_close(got.dlog_dt, want.dlog_dt, tol, what + "dlog_dt");
        expect_schedule_close(got.dA, want.dA, tol, what + "dA");
        expect_schedule_close(got.dB, want.dB, tol, what + "dB");
        expect_schedule_close(got.dC, want.dC, tol, what + "dC");
        expect_schedule_close(got.dD, want.dD, tol, what + "dD");
        expect_schedule_close(got.dx0, want.dx0, tol, what + "dinitial_state");
      }
    }
  }
}

TEST(S4CudaSchedule, F64MatchesCpuKernels) { check<double>(DType::f64, DType::f64, 1e-11, 10); }
TEST(S4CudaSchedule, F32MatchesCpuKernels) { check<float>(DType::f32, DType::f32, 1e-5, 20); }
TEST(S4CudaSchedule, Bf16StorageMatchesCpuKernels) { check<bf16>(DType::bf16, DType::f32, 2e-2, 30); }

// ---- the diagonal-plus-low-rank form (bilinear only): one thread per channel, forward then backward ----

const Case kDplrCases[] = {
    {2, 13, 3, 3, -2.5, 0.0, true, true},     // odd everything, D and an initial state
    {1, 1, 2, 2, -2.5, 0.0, true, true},      // T = 1: one decode step
    {2, 0, 2, 2, -2.5, 0.0, true, true},      // T = 0: the final state is the initial one
    {2, 9, 1, 5, -2.5, 0.0, false, false},    // no D, zero initial state
    {2, 7, 2, 2, -2.5, 0.0, true, false},     // D without an initial state
    {1, 11, 2, 4, std::log(1e-4), std::log(1.2e-4), false, true},  // Δ ≈ 1e-4, initial state without D
    {1, 9, 2, 3, std::log(9.0), std::log(10.0), true, true},        // Δ ≈ 10
};

struct DplrData {
  Data base;
  Tensor P, Q;
};

DplrData make_dplr_data(const Case& c, DType dtype, uint64_t seed) {
  DplrData x{make_data(c, dtype, seed), Tensor(), Tensor()};
  Generator gen(seed + 1000);
  // A rank-one correction of size ~0.3 per entry: the matrix is dense, its spectrum stays in Re < 0.
  for (Tensor* t : {&x.P, &x.Q}) {
    std::vector<double> v = Tensor::randn({c.H, c.N2, 2}, gen, DType::f64).to_doubles();
    for (double& e : v) e *= 0.3;
    *t = kernel::to_dtype(Tensor::from_vector(v, {c.H, c.N2, 2}, DType::f64), dtype);
  }
  return x;
}

struct DplrOutputs {
  Tensor y, xT, du, dlog_dt, dA, dP, dQ, dB, dC, dD, dx0;
};

DplrOutputs dplr_outputs(const DplrData& x, DType dt, bool poison) {
  auto make = [&](const Tensor& like) {
    if (!like.defined()) return Tensor();
    return poison ? poisoned(like.shape(), dt, kCpu) : Tensor::empty(like.shape(), dt);
  };
  const Data& b = x.base;
  return {make(b.u), make(b.dfinal), make(b.u), make(b.log_dt), make(b.A), make(x.P),
          make(x.Q), make(b.B),      make(b.C), make(b.D),      make(b.x0)};
}

// The launches of s4.cu's DPLR entry points: the forward's channels, then the backward's.
template <class T>
DplrOutputs run_dplr_schedule(const Case& c, const DplrData& x, DType dtype, bool recurrent) {
  const sc::Dims d{c.B, c.T, c.H, c.N2, false};
  const Data& b = x.base;
  const sc::DplrInputs<T> in{b.u.data<T>(), b.log_dt.data<T>(), b.A.data<T>(), x.P.data<T>(),    x.Q.data<T>(),
                             b.B.data<T>(), b.C.data<T>(),      ptr_or_null<T>(b.D), ptr_or_null<T>(b.x0)};
  DplrOutputs r = dplr_outputs(x, dtype, true);
  std::vector<double> cwork = nan_scratch(2 * c.H * sc::dplr_work_cx(d)), fwork = nan_scratch(c.H * sc::dplr_work_f64(d));
  auto* cw = reinterpret_cast<sc::Cx*>(cwork.data());
  for (int64_t h = 0; h < c.H; ++h) sc::dplr_forward(h, d, in, recurrent, cw, fwork.data(), r.y.data<T>(), r.xT.data<T>());
  cwork = nan_scratch(2 * c.H * sc::dplr_work_cx(d)), fwork = nan_scratch(c.H * sc::dplr_work_f64(d));
  cw = reinterpret_cast<sc::Cx*>(cwork.data());
  for (int64_t h = 0; h < c.H; ++h) {
    sc::dplr_backward(h, d, in, recurrent, b.dy.data<T>(), b.dfinal.data<T>(), cw, fwork.data(), r.du.data<T>(),
                      r.dlog_dt.data<T>(), r.dA.data<T>(), r.dP.data<T>(), r.dQ.data<T>(), r.dB.data<T>(),
                      r.dC.data<T>(), r.dD.defined() ? r.dD.data<T>() : nullptr,
                      r.dx0.defined() ? r.dx0.data<T>() : nullptr);
  }
  return r;
}

DplrOutputs dplr_cpu_reference(const DplrData& x, DType rd, const kernel::S4Params& p) {
  DplrOutputs r = dplr_outputs(x, rd, false);
  const Data& b = x.base;
  const Tensor u = to(b.u, rd), log_dt = to(b.log_dt, rd), A = to(b.A, rd), P = to(x.P, rd), Q = to(x.Q, rd),
               B = to(b.B, rd), C = to(b.C, rd), D = to(b.D, rd), x0 = to(b.x0, rd);
  kernel::s4_dplr_forward_kernel(kCpu, u, log_dt, A, P, Q, B, C, D, x0, p, r.y, r.xT);
  kernel::S4DplrGrads g{r.du, r.dlog_dt, r.dA, r.dP, r.dQ, r.dB, r.dC, r.dD, r.dx0};
  kernel::s4_dplr_backward_kernel(kCpu, to(b.dy, rd), to(b.dfinal, rd), u, log_dt, A, P, Q, B, C, D, x0, p, g);
  return r;
}

template <class T>
void check_dplr(DType dtype, DType rd, double tol, uint64_t seed) {
  for (const Case& c : kDplrCases) {
    const DplrData x = make_dplr_data(c, dtype, seed++);
    for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
      const kernel::S4Params p{form, S4Discretisation::bilinear};
      const std::string what = std::string(dtype_name(dtype)) + " dplr " + c.name() + " " + s4_form_name(form) + " ";
      const DplrOutputs got = run_dplr_schedule<T>(c, x, dtype, form == S4Form::recurrent),
                        want = dplr_cpu_reference(x, rd, p);
      const Tensor DplrOutputs::*fields[] = {&DplrOutputs::y,  &DplrOutputs::xT, &DplrOutputs::du, &DplrOutputs::dlog_dt,
                                            &DplrOutputs::dA, &DplrOutputs::dP, &DplrOutputs::dQ, &DplrOutputs::dB,
                                            &DplrOutputs::dC, &DplrOutputs::dD, &DplrOutputs::dx0};
      const char* const names[] = {"y", "final_state", "du", "dlog_dt", "dA", "dP", "dQ", "dB", "dC", "dD",
                                   "dinitial_state"};
      for (size_t i = 0; i < 11; ++i) expect_schedule_close(got.*fields[i], want.*fields[i], tol, what + names[i]);
    }
  }
}

TEST(S4CudaSchedule, DplrF64MatchesCpuKernels) { check_dplr<double>(DType::f64, DType::f64, 1e-11, 110); }
TEST(S4CudaSchedule, DplrF32MatchesCpuKernels) { check_dplr<float>(DType::f32, DType::f32, 1e-5, 120); }
TEST(S4CudaSchedule, DplrBf16StorageMatchesCpuKernels) { check_dplr<bf16>(DType::bf16, DType::f32, 2e-2, 130); }

}  // namespace
}  // namespace seqlab::testing
