// The S4D CUDA kernels' exact schedule, run on the CPU. src/cuda/ssm/s4.cu launches the __host__ __device__
// functions of src/cuda/ssm/s4_schedule.h, one thread per index; here the same functions run for every
// index, kernel after kernel in the launch order (no kernel has barriers or shared memory, so the order
// of the threads within a kernel cannot matter). Results are compared with the CPU kernels
// (src/layers/ssm/s4.cpp) for both forms and both discretisations, with and without D and the initial
// state, T = 0, T = 1 and odd T, H, N2, and steps from 1e-4 to 10. Outputs and scratch start as NaN, so a missed
// write or a read before a write shows up. Element types: f64 (≤ 1e-11 against the f64 CPU kernels),
// f32 (≤ 1e-5 against the f32 CPU kernels on the same values: both compute in double, so only the
// summation order differs before the same rounding), bf16 stored with double compute (≤ 2e-2 against the
// f32 CPU kernels on the same bf16 values).
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

}  // namespace
}  // namespace seqlab::testing
