// CUDA against CPU for the S4D slots (src/cuda/ssm/s4.cu against the CPU kernels in
// src/layers/ssm/s4.cpp), through the op's raw entry points (kernel::s4_forward, kernel::s4_backward) on
// device tensors. Skipped where no GPU is usable.
//
// Every output and gradient (y, final_state, du, dlog_dt, dA, dB, dC, dD, d initial_state) for both forms
// and both discretisations, with and without D and the initial state, at odd shapes, T = 1, Δ ≈ 1e-4 and
// Δ ≈ 10, and a training-like shape (T = 300, H = 16, N2 = 32). Both sides compute in double, so the
// tolerance is that of the element type's rounding: |got − want| ≤ rtol · max(|want|, 1), f64 1e-10, f32
// 1e-5 against the f32 CPU kernels on the same values, bf16 2e-2 against the f32 CPU kernels on the same
// bf16 values. The backward is checked to write the same bits twice (no atomics). The diagonal-plus-low-rank
// form (kernel::s4_dplr_forward, kernel::s4_dplr_backward) likewise, at the small cases.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/ssm/s4.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

namespace seqlab::testing {
namespace {

struct Case {
  int64_t B, T, H, N2;
  double log_dt_lo, log_dt_hi;
  bool with_d, with_x0;
};

const Case kCases[] = {
    {2, 13, 3, 3, -2.5, 0.0, true, true},
    {1, 1, 2, 2, -2.5, 0.0, true, true},
    {2, 9, 1, 5, -2.5, 0.0, false, false},
    {1, 17, 2, 4, std::log(1e-4), std::log(1.2e-4), true, true},
    {1, 11, 2, 3, std::log(9.0), std::log(10.0), true, true},
    {4, 300, 16, 32, std::log(1e-3), std::log(1e-1), true, true},  // training-like
};

struct Data {
  Tensor u, log_dt, A, B, C, D, x0, dy, dfinal;
};

Data make_data(const Case& c, DType dtype, Generator& gen) {
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

std::vector<Tensor> run(const Data& x, const S4Options& o, Tensor (*place)(const Tensor&)) {
  const std::vector<bool> need(7, true);
  const Tensor u = place(x.u), log_dt = place(x.log_dt), A = place(x.A), B = place(x.B), C = place(x.C),
               D = place(x.D), x0 = place(x.x0);
  S4Output out = kernel::s4_forward(u, log_dt, A, B, C, D, x0, o);
  kernel::S4Grads g = kernel::s4_backward(place(x.dy), place(x.dfinal), u, log_dt, A, B, C, D, x0, o, need);
  return {out.y, out.final_state, g.du, g.dlog_dt, g.dA, g.dB, g.dC, g.dD, g.dinitial_state};
}

const char* const kNames[] = {"y", "final_state", "du", "dlog_dt", "dA", "dB", "dC", "dD", "dinitial_state"};

using CudaS4VsCpu = VariantGpuTest<241>;

TEST_F(CudaS4VsCpu, EveryFormForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    const double tol = gpu_rtol(dtype);
    for (const Case& c : kCases) {
      const Data x = make_data(c, dtype, gen_);
      for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
        for (S4Discretisation disc : {S4Discretisation::zoh, S4Discretisation::bilinear}) {
          const S4Options o{form, disc};
          const std::string what = std::string(dtype_name(dtype)) + " T" + std::to_string(c.T) + " N2 " +
                                   std::to_string(c.N2) + " " + s4_form_name(form) + " " + s4_discretisation_name(disc);
          const std::vector<Tensor> got = run(x, o, on_gpu), want = run(x, o, as_reference);
          for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], tol, what + " " + kNames[i]);
        }
      }
    }
  }
}

TEST_F(CudaS4VsCpu, BackwardIsDeterministic) {
  const Data x = make_data({2, 77, 3, 8, -2.5, 0.0, true, true}, DType::f32, gen_);
  for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
    expect_same_bits_twice([&] { return run(x, S4Options{form, S4Discretisation::zoh}, on_gpu); },
                           std::string("s4 ") + s4_form_name(form), false);
  }
}

// The diagonal-plus-low-rank form (bilinear; P, Q of size ~0.3): both forms, every output and gradient
// including dP and dQ, against the CPU's DPLR kernels, at the odd cases above (the training-like shape left
// out: its dense Ā makes one thread per channel walk N2² per step), and a deterministic backward.
std::vector<Tensor> run_dplr(const Data& x, const Tensor& P, const Tensor& Q, const S4Options& o,
                             Tensor (*place)(const Tensor&)) {
  const std::vector<bool> need(9, true);
  const Tensor u = place(x.u), log_dt = place(x.log_dt), A = place(x.A), p = place(P), q = place(Q), B = place(x.B),
               C = place(x.C), D = place(x.D), x0 = place(x.x0);
  S4Output out = kernel::s4_dplr_forward(u, log_dt, A, p, q, B, C, D, x0, o);
  kernel::S4DplrGrads g =
      kernel::s4_dplr_backward(place(x.dy), place(x.dfinal), u, log_dt, A, p, q, B, C, D, x0, o, need);
  return {out.y, out.final_state, g.du, g.dlog_dt, g.dA, g.dP, g.dQ, g.dB, g.dC, g.dD, g.dinitial_state};
}

const char* const kDplrNames[] = {"y",  "final_state", "du", "dlog_dt", "dA", "dP", "dQ", "dB", "dC", "dD",
                                  "dinitial_state"};

Tensor low_rank(const Case& c, DType dtype, Generator& gen) {
  std::vector<double> v = Tensor::randn({c.H, c.N2, 2}, gen, DType::f64).to_doubles();
  for (double& e : v) e *= 0.3;
  return kernel::to_dtype(Tensor::from_vector(v, {c.H, c.N2, 2}, DType::f64), dtype);
}

TEST_F(CudaS4VsCpu, DplrEveryFormForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    const double tol = gpu_rtol(dtype);
    for (const Case& c : kCases) {
      if (c.T > 100) continue;
      const Data x = make_data(c, dtype, gen_);
      const Tensor P = low_rank(c, dtype, gen_), Q = low_rank(c, dtype, gen_);
      for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
        const S4Options o{form, S4Discretisation::bilinear};
        const std::string what = std::string(dtype_name(dtype)) + " dplr T" + std::to_string(c.T) + " N2 " +
                                 std::to_string(c.N2) + " " + s4_form_name(form);
        const std::vector<Tensor> got = run_dplr(x, P, Q, o, on_gpu), want = run_dplr(x, P, Q, o, as_reference);
        for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], tol, what + " " + kDplrNames[i]);
      }
    }
  }
}

TEST_F(CudaS4VsCpu, DplrBackwardIsDeterministic) {
  const Case c{2, 37, 3, 4, -2.5, 0.0, true, true};
  const Data x = make_data(c, DType::f32, gen_);
  const Tensor P = low_rank(c, DType::f32, gen_), Q = low_rank(c, DType::f32, gen_);
  for (S4Form form : {S4Form::convolution, S4Form::recurrent}) {
    expect_same_bits_twice([&] { return run_dplr(x, P, Q, S4Options{form, S4Discretisation::bilinear}, on_gpu); },
                           std::string("s4 dplr ") + s4_form_name(form), false);
  }
}

}  // namespace
}  // namespace seqlab::testing
