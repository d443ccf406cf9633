// S4D: the raw entry points, the discretisation and its derivatives, the CPU kernels of both forms
// (forward and backward side by side), the diagonal-plus-low-rank form (S4: dense bilinear Ā per channel),
// the autograd nodes, HiPPO-LegS and the registry entry. Equations in s4.h; the derivations in
// docs/variants/s4.md.
//
// How the CPU kernels work:
// - Everything is computed in double whatever the tensors' dtype (inputs widened on reading, outputs
//   rounded on writing): the work per channel is small, and the powers Ā^j of the convolution form and
//   the long products of the scan then agree to f64 round-off in both dtypes.
// - One task per channel h (OpenMP over H), the batch looped inside it, so that the gradients of the
//   channel's parameters (summed over the batch) are written by one task without a reduction.
// - Complex gradients are "∂L/∂re + i·∂L/∂im". For w = f(z) holomorphic, g_z = conj(f'(z)) g_w; for a
//   real r with w = w(r), ∂L/∂r = Re(conj(∂w/∂r) g_w).
#include "layers/ssm/s4.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {

using cplx = std::complex<double>;

namespace {

const FormNames<S4Form>& s4_forms() {
  static const FormNames<S4Form> forms{"s4", {{"convolution", S4Form::convolution}, {"recurrent", S4Form::recurrent}}};
  return forms;
}

}  // namespace

const char* s4_form_name(S4Form form) { return s4_forms().name(form); }
S4Form parse_s4_form(const std::string& s) { return s4_forms().parse(s); }

const char* s4_discretisation_name(S4Discretisation d) { return d == S4Discretisation::zoh ? "zoh" : "bilinear"; }
S4Discretisation parse_s4_discretisation(const std::string& s) {
  if (s == "zoh") return S4Discretisation::zoh;
  if (s == "bilinear") return S4Discretisation::bilinear;
  throw std::invalid_argument("s4: unknown discretisation '" + s + "' (expected zoh or bilinear)");
}

namespace kernel {
namespace {

struct Dims {
  int64_t B, T, H, N2;
};

Dims check_inputs(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                  const Tensor& D, const Tensor& x0) {
  const VariantInputs in("s4",
                         {{"u", u}, {"log_dt", log_dt}, {"A", A}, {"B", Bm}, {"C", C}, {"D", D}, {"initial_state", x0}},
                         "u [B, T, H], log_dt [H], A, B, C [H, N2, 2] (complex as (re, im)), D [H] or none, "
                         "initial_state [B, H, N2, 2] or none");
  in.given({"u", "log_dt", "A", "B", "C"});
  if (u.dim() != 3) in.fail("u must be [B, T, H]");
  if (A.dim() != 3 || A.size(2) != 2 || A.size(0) != u.size(2)) in.fail("A must be [H, N2, 2] with u's H");
  const Dims d{u.size(0), u.size(1), u.size(2), A.size(1)};
  if (d.N2 < 1) in.fail("A needs at least one mode (N2 ≥ 1)");
  in.shaped("log_dt", {d.H}, "[H]");
  in.shaped("B", A.shape(), "[H, N2, 2] (A's shape)");
  in.shaped("C", A.shape(), "[H, N2, 2] (A's shape)");
  in.shaped("D", {d.H}, "[H]");
  in.shaped("initial_state", {d.B, d.H, d.N2, 2}, "[B, H, N2, 2]");
  // VariantInputs::same_dtype_and_device compares with q; the SSM's reference input is u.
  if (!is_floating(u.dtype())) in.fail(std::string("inputs must be f32, f64 or bf16, got ") + dtype_name(u.dtype()));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"log_dt", log_dt}, {"A", A}, {"B", Bm},
                                {"C", C}, {"D", D}, {"initial_state", x0}}) {
    if (!t.defined()) continue;
    if (t.dtype() != u.dtype()) {
      in.fail(std::string("inputs must share one dtype, got u ") + dtype_name(u.dtype()) + " and " + name + " " +
              dtype_name(t.dtype()));
    }
    if (t.device() != u.device()) {
      in.fail("inputs are on different devices (u on " + u.device().str() + ", " + name + " on " + t.device().str() + ")");
    }
  }
  return d;
}

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

S4Params params_of(const S4Options& o) { return {o.form, o.discretisation}; }

}  // namespace

S4Output s4_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
                    const Tensor& D, const Tensor& initial_state, const S4Options& opts) {
  const Dims d = check_inputs(u, log_dt, A, B, C, D, initial_state);
  S4Output out{Tensor::empty({d.B, d.T, d.H}, u.dtype(), u.device()),
               Tensor::empty({d.B, d.H, d.N2, 2}, u.dtype(), u.device())};
  s4_forward_kernel(u.device(), kernel::contiguous(u), kernel::contiguous(log_dt), kernel::contiguous(A),
                    kernel::contiguous(B), kernel::contiguous(C), contiguous_or_none(D),
                    contiguous_or_none(initial_state), params_of(opts), out.y, out.final_state);
  return out;
}

S4Grads s4_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                    const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                    const S4Options& opts, const std::vector<bool>& need) {
  const Dims d = check_inputs(u, log_dt, A, B, C, D, initial_state);
  if (need.size() != 7) throw std::invalid_argument("s4 backward: need one flag per input (7)");
  const Shape y_shape{d.B, d.T, d.H}, s_shape{d.B, d.H, d.N2, 2};
  const DType dt = u.dtype();
  for (const auto& [t, shape, what] : {std::tuple<const Tensor&, const Shape&, const char*>{dy, y_shape, "dy"},
                                       {dfinal, s_shape, "dfinal"}}) {
    if (t.defined() && (t.shape() != shape || t.dtype() != dt)) {
      throw std::invalid_argument(std::string("s4 backward: ") + what + " is " + shape_str(t.shape()) + " " +
                                  dtype_name(t.dtype()) + ", expected " + shape_str(shape) + " " + dtype_name(dt));
    }
  }
  // The kernels form every gradient but dD and d initial_state in one pass (the parameters' come from
  // the same sums as du's), so those are always allocated.
  S4Grads all;
  all.du = Tensor::empty(u.shape(), dt, u.device());
  all.dlog_dt = Tensor::empty(log_dt.shape(), dt, u.device());
  all.dA = Tensor::empty(A.shape(), dt, u.device());
  all.dB = Tensor::empty(B.shape(), dt, u.device());
  all.dC = Tensor::empty(C.shape(), dt, u.device());
  if (need[5] && D.defined()) all.dD = Tensor::empty(D.shape(), dt, u.device());
  if (need[6] && initial_state.defined()) all.dinitial_state = Tensor::empty(s_shape, dt, u.device());
  const Tensor dY = dy.defined() ? kernel::contiguous(dy) : Tensor::zeros(y_shape, dt, u.device());
  const Tensor dS = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dt, u.device());
  s4_backward_kernel(u.device(), dY, dS, kernel::contiguous(u), kernel::contiguous(log_dt), kernel::contiguous(A),
                     kernel::contiguous(B), kernel::contiguous(C), contiguous_or_none(D),
                     contiguous_or_none(initial_state), params_of(opts), all);
  if (!need[0]) all.du = Tensor();
  if (!need[1]) all.dlog_dt = Tensor();
  if (!need[2]) all.dA = Tensor();
  if (!need[3]) all.dB = Tensor();
  if (!need[4]) all.dC = Tensor();
  return all;
}

namespace {

// The low-rank factors of the DPLR form: both given, shaped as A, A's dtype and device, and the bilinear
// discretisation.
void check_low_rank(const Tensor& u, const Tensor& A, const Tensor& P, const Tensor& Q, const S4Options& opts) {
  const VariantInputs in("s4", {{"u", u}, {"A", A}, {"P", P}, {"Q", Q}},
                         "the diagonal-plus-low-rank form: A, P, Q [H, N2, 2], A = diag(Λ) − P Q*");
  in.given({"P", "Q"});
  in.shaped("P", A.shape(), "[H, N2, 2] (A's shape)");
  in.shaped("Q", A.shape(), "[H, N2, 2] (A's shape)");
  for (const Tensor* t : {&P, &Q}) {
    if (t->dtype() != u.dtype() || t->device() != u.device()) in.fail("P and Q must have u's dtype and device");
  }
  if (opts.discretisation != S4Discretisation::bilinear) {
    in.fail("the diagonal-plus-low-rank form is discretised bilinearly (zoh would need a matrix exponential)");
  }
}

}  // namespace

S4Output s4_dplr_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                         const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                         const S4Options& opts) {
  const Dims d = check_inputs(u, log_dt, A, B, C, D, initial_state);
  check_low_rank(u, A, P, Q, opts);
  S4Output out{Tensor::empty({d.B, d.T, d.H}, u.dtype(), u.device()),
               Tensor::empty({d.B, d.H, d.N2, 2}, u.dtype(), u.device())};
  s4_dplr_forward_kernel(u.device(), kernel::contiguous(u), kernel::contiguous(log_dt), kernel::contiguous(A),
                         kernel::contiguous(P), kernel::contiguous(Q), kernel::contiguous(B), kernel::contiguous(C),
                         contiguous_or_none(D), contiguous_or_none(initial_state), params_of(opts), out.y,
                         out.final_state);
  return out;
}

S4DplrGrads s4_dplr_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt,
                             const Tensor& A, const Tensor& P, const Tensor& Q, const Tensor& B, const Tensor& C,
                             const Tensor& D, const Tensor& initial_state, const S4Options& opts,
                             const std::vector<bool>& need) {
  const Dims d = check_inputs(u, log_dt, A, B, C, D, initial_state);
  check_low_rank(u, A, P, Q, opts);
  if (need.size() != 9) throw std::invalid_argument("s4 backward: need one flag per input (9)");
  const Shape y_shape{d.B, d.T, d.H}, s_shape{d.B, d.H, d.N2, 2};
  const DType dt = u.dtype();
  S4DplrGrads all;
  all.du = Tensor::empty(u.shape(), dt, u.device());
  all.dlog_dt = Tensor::empty(log_dt.shape(), dt, u.device());
  all.dA = Tensor::empty(A.shape(), dt, u.device());
  all.dP = Tensor::empty(A.shape(), dt, u.device());
  all.dQ = Tensor::empty(A.shape(), dt, u.device());
  all.dB = Tensor::empty(B.shape(), dt, u.device());
  all.dC = Tensor::empty(C.shape(), dt, u.device());
  if (need[7] && D.defined()) all.dD = Tensor::empty(D.shape(), dt, u.device());
  if (need[8] && initial_state.defined()) all.dinitial_state = Tensor::empty(s_shape, dt, u.device());
  const Tensor dY = dy.defined() ? kernel::contiguous(dy) : Tensor::zeros(y_shape, dt, u.device());
  const Tensor dS = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dt, u.device());
  s4_dplr_backward_kernel(u.device(), dY, dS, kernel::contiguous(u), kernel::contiguous(log_dt), kernel::contiguous(A),
                          kernel::contiguous(P), kernel::contiguous(Q), kernel::contiguous(B), kernel::contiguous(C),
                          contiguous_or_none(D), contiguous_or_none(initial_state), params_of(opts), all);
  Tensor* fields[] = {&all.du, &all.dlog_dt, &all.dA, &all.dP, &all.dQ, &all.dB, &all.dC};
  for (size_t i = 0; i < 7; ++i) {
    if (!need[i]) *fields[i] = Tensor();
  }
  return all;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::S4Grads;
using kernel::S4Params;

// e^z − 1 without cancellation for small |z|: Re = expm1(a) cos b − 2 sin²(b/2), Im = e^a sin b.
cplx expm1c(cplx z) {
  const double a = z.real(), b = z.imag(), s = std::sin(0.5 * b);
  return {std::expm1(a) * std::cos(b) - 2 * s * s, std::exp(a) * std::sin(b)};
}

// One mode's discretisation and the derivatives the backward chains through (z = ΔΛ, B̄ = φ·B):
//   zoh       Ā = e^z,  φ = Δ ψ(z), ψ = (e^z − 1)/z;   ∂Ā/∂Λ = Δ e^z, ∂Ā/∂Δ = Λ e^z,
//             ∂φ/∂Λ = Δ² χ(z), χ = (e^z − ψ)/z,  ∂φ/∂Δ = e^z
//   bilinear  w = 1/(1 − z/2), Ā = (1 + z/2) w,  φ = Δ w;  ∂Ā/∂Λ = Δ w², ∂Ā/∂Δ = Λ w²,
//             ∂φ/∂Λ = Δ² w²/2,  ∂φ/∂Δ = w²
// ψ and χ take their Taylor series below |z| = 1e-3 (the quotients cancel there; the series' first
// omitted term is below 1e-18).
struct Mode {
  cplx Abar, phi, Bbar, C, lambda;
  cplx dA_dL, dA_dDt, dphi_dL, dphi_dDt;
};

Mode discretise(cplx lambda, double dt, cplx B, cplx C, kernel::S4Params p) {
  Mode m;
  m.lambda = lambda;
  m.C = C;
  const cplx z = dt * lambda;
  if (p.disc == S4Discretisation::zoh) {
    const cplx ez = std::exp(z);
    cplx psi, chi;
    if (std::abs(z) < 1e-3) {
      psi = 1.0 + z * (1.0 / 2 + z * (1.0 / 6 + z * (1.0 / 24 + z * (1.0 / 120 + z * (1.0 / 720)))));
      chi = 1.0 / 2 + z * (1.0 / 3 + z * (1.0 / 8 + z * (1.0 / 30 + z * (1.0 / 144 + z * (1.0 / 840)))));
    } else {
      psi = expm1c(z) / z;
      chi = (ez - psi) / z;
    }
    m.Abar = ez;
    m.phi = dt * psi;
    m.dA_dL = dt * ez;
    m.dA_dDt = lambda * ez;
    m.dphi_dL = dt * dt * chi;
    m.dphi_dDt = ez;
  } else {
    const cplx w = 1.0 / (1.0 - 0.5 * z), w2 = w * w;
    m.Abar = (1.0 + 0.5 * z) * w;
    m.phi = dt * w;
    m.dA_dL = dt * w2;
    m.dA_dDt = lambda * w2;
    m.dphi_dL = 0.5 * dt * dt * w2;
    m.dphi_dDt = w2;
  }
  m.Bbar = m.phi * B;
  return m;
}

template <class T>
cplx pair_at(const T* p, int64_t i) {
  return {static_cast<double>(p[2 * i]), static_cast<double>(p[2 * i + 1])};
}
template <class T>
void put_pair(T* p, int64_t i, cplx v) {
  p[2 * i] = static_cast<T>(v.real());
  p[2 * i + 1] = static_cast<T>(v.imag());
}

struct Geo {
  int64_t B, T, H, N2;
  bool parallel() const { return H > 1 && B * T * N2 * std::max<int64_t>(1, std::min<int64_t>(T, 64)) > kParallelGrain; }
};

Geo geo_of(const Tensor& u, const Tensor& A) { return {u.size(0), u.size(1), u.size(2), A.size(1)}; }

// Channel h's modes.
template <class T>
std::vector<Mode> modes_of(const Geo& G, const Tensor& log_dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                           int64_t h, const S4Params& p) {
  std::vector<Mode> modes(static_cast<size_t>(G.N2));
  const double dt = std::exp(static_cast<double>(log_dt.data<T>()[h]));
  const T *a = A.data<T>() + h * G.N2 * 2, *b = Bm.data<T>() + h * G.N2 * 2, *c = C.data<T>() + h * G.N2 * 2;
  for (int64_t n = 0; n < G.N2; ++n) modes[n] = discretise(pair_at(a, n), dt, pair_at(b, n), pair_at(c, n), p);
  return modes;
}

// The chain from the discrete gradients (g_Ā, g_B̄, g_C per mode) to the parameters of channel h:
//   g_B = conj(φ) g_B̄,  g_φ = conj(B) g_B̄,
//   g_Λ = conj(∂Ā/∂Λ) g_Ā + conj(∂φ/∂Λ) g_φ,
//   ∂L/∂Δ = Re(conj(∂Ā/∂Δ) g_Ā + conj(∂φ/∂Δ) g_φ),  ∂L/∂log_dt = Δ ∂L/∂Δ (summed over the modes).
template <class T>
void write_parameter_grads(const Geo& G, const Tensor& log_dt, const Tensor& Bm, const std::vector<Mode>& modes,
                           const std::vector<cplx>& gA, const std::vector<cplx>& gB, const std::vector<cplx>& gC,
                           const S4Grads& grads, int64_t h) {
  const double dt = std::exp(static_cast<double>(log_dt.data<T>()[h]));
  const T* b = Bm.data<T>() + h * G.N2 * 2;
  T *dA = grads.dA.data<T>() + h * G.N2 * 2, *dB = grads.dB.data<T>() + h * G.N2 * 2,
    *dC = grads.dC.data<T>() + h * G.N2 * 2;
  double d_dt = 0;
  for (int64_t n = 0; n < G.N2; ++n) {
    const Mode& m = modes[n];
    const cplx gphi = std::conj(pair_at(b, n)) * gB[n];
    put_pair(dB, n, std::conj(m.phi) * gB[n]);
    put_pair(dA, n, std::conj(m.dA_dL) * gA[n] + std::conj(m.dphi_dL) * gphi);
    put_pair(dC, n, gC[n]);
    d_dt += (std::conj(m.dA_dDt) * gA[n] + std::conj(m.dphi_dDt) * gphi).real();
  }
  grads.dlog_dt.data<T>()[h] = static_cast<T>(dt * d_dt);
}

// ---- recurrent form ----------------------------------------------------------------------------

// Forward, step by step per (batch, channel): x = x_{−1}; for t: x_n ← Ā_n x_n + B̄_n u_t,
// y_t = 2·Re(Σ_n C_n x_n) + D u_t; final_state = x. Reads u, parameters, x_{−1}; writes y, final_state;
// scratch: the N2 modes and one state [N2] per task.
template <class T>
void recurrent_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                       const Tensor& D, const Tensor& x0, const S4Params& p, const Tensor& y, const Tensor& xT) {
  const Geo G = geo_of(u, A);
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const std::vector<Mode> modes = modes_of<T>(G, log_dt, A, Bm, C, h, p);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    std::vector<cplx> x(static_cast<size_t>(G.N2));
    for (int64_t b = 0; b < G.B; ++b) {
      const T* ub = u.data<T>() + b * G.T * G.H + h;
      T* yb = y.data<T>() + b * G.T * G.H + h;
      const int64_t s = (b * G.H + h) * G.N2;
      for (int64_t n = 0; n < G.N2; ++n) x[n] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, n) : cplx(0);
      for (int64_t t = 0; t < G.T; ++t) {
        const double ut = static_cast<double>(ub[t * G.H]);
        double acc = 0;
        for (int64_t n = 0; n < G.N2; ++n) {
          x[n] = modes[n].Abar * x[n] + modes[n].Bbar * ut;
          acc += (modes[n].C * x[n]).real();
        }
        yb[t * G.H] = static_cast<T>(2 * acc + dskip * ut);
      }
      for (int64_t n = 0; n < G.N2; ++n) put_pair(xT.data<T>() + 2 * s, n, x[n]);
    }
  }
}

// Backward through time, per channel, the batch inside. States x_t are recomputed into a [T, N2]
// scratch; then with g = ∂L/∂x_t (from dfinal at t = T−1), walking t = T−1 … 0:
//   g    += conj(C) · 2 dy_t                 (y_t = 2·Re(C x_t))
//   g_C  += conj(x_t) · 2 dy_t
//   g_Ā  += conj(x_{t−1}) g,   g_B̄ += u_t g   (x_t = Ā x_{t−1} + B̄ u_t)
//   du_t  = Re(Σ_n conj(g_n) B̄_n) + D dy_t,   dD += u_t dy_t
//   g     = conj(Ā) g                         (now ∂L/∂x_{t−1})
// and d initial_state = g at the end; then write_parameter_grads. Memory per task: T·N2 complex.
template <class T>
void recurrent_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                        const Tensor& Bm, const Tensor& C, const Tensor& D, const Tensor& x0, const S4Params& p,
                        const S4Grads& grads) {
  const Geo G = geo_of(u, A);
  const int64_t N2 = G.N2;
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const std::vector<Mode> modes = modes_of<T>(G, log_dt, A, Bm, C, h, p);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    std::vector<cplx> gA(N2), gB(N2), gC(N2), g(N2), xs(static_cast<size_t>(G.T * N2)), xinit(N2);
    double dD = 0;
    for (int64_t b = 0; b < G.B; ++b) {
      const T* ub = u.data<T>() + b * G.T * G.H + h;
      const T* dyb = dy.data<T>() + b * G.T * G.H + h;
      T* dub = grads.du.data<T>() + b * G.T * G.H + h;
      const int64_t s = (b * G.H + h) * N2;
      for (int64_t n = 0; n < N2; ++n) xinit[n] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, n) : cplx(0);
      for (int64_t t = 0; t < G.T; ++t) {
        const double ut = static_cast<double>(ub[t * G.H]);
        for (int64_t n = 0; n < N2; ++n) {
          xs[t * N2 + n] = modes[n].Abar * (t ? xs[(t - 1) * N2 + n] : xinit[n]) + modes[n].Bbar * ut;
        }
      }
      for (int64_t n = 0; n < N2; ++n) g[n] = pair_at(dfinal.data<T>() + 2 * s, n);
      for (int64_t t = G.T - 1; t >= 0; --t) {
        const double ut = static_cast<double>(ub[t * G.H]), r = 2 * static_cast<double>(dyb[t * G.H]);
        double du = 0;
        for (int64_t n = 0; n < N2; ++n) {
          const Mode& m = modes[n];
          g[n] += std::conj(m.C) * r;
          gC[n] += std::conj(xs[t * N2 + n]) * r;
          gA[n] += std::conj(t ? xs[(t - 1) * N2 + n] : xinit[n]) * g[n];
          gB[n] += ut * g[n];
          du += (std::conj(g[n]) * m.Bbar).real();
          g[n] = std::conj(m.Abar) * g[n];
        }
        dub[t * G.H] = static_cast<T>(du + 0.5 * r * dskip);
        dD += 0.5 * r * ut;
      }
      if (grads.dinitial_state.defined()) {
        for (int64_t n = 0; n < N2; ++n) put_pair(grads.dinitial_state.data<T>() + 2 * s, n, g[n]);
      }
    }
    if (grads.dD.defined()) grads.dD.data<T>()[h] = static_cast<T>(dD);
    write_parameter_grads<T>(G, log_dt, Bm, modes, gA, gB, gC, grads, h);
  }
}

// ---- convolution form --------------------------------------------------------------------------

// P[j·N2 + n] = Ā_n^j for j = 0 … T, by repeated multiplication (|Ā| < 1: no overflow, and no
// negative power is ever formed).
void powers(const std::vector<Mode>& modes, int64_t T, std::vector<cplx>& P) {
  const int64_t N2 = static_cast<int64_t>(modes.size());
  P.assign(static_cast<size_t>((T + 1) * N2), cplx(1));
  for (int64_t j = 1; j <= T; ++j) {
    for (int64_t n = 0; n < N2; ++n) P[j * N2 + n] = P[(j - 1) * N2 + n] * modes[n].Abar;
  }
}

// Forward per channel: K_j = 2·Re(Σ_n C_n Ā_n^j B̄_n) for j < T, then per batch entry
//   y_t = Σ_{j ≤ t} K_j u_{t−j} + D u_t + 2·Re(Σ_n C_n Ā_n^{t+1} x_{−1,n}),
//   x_T = Ā^T x_{−1} + Σ_s Ā^{T−1−s} B̄ u_s.
// Memory per task: the powers [(T+1), N2] complex and K [T].
template <class T>
void convolution_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                         const Tensor& D, const Tensor& x0, const S4Params& p, const Tensor& y, const Tensor& xT) {
  const Geo G = geo_of(u, A);
  const int64_t N2 = G.N2, Tn = G.T;
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const std::vector<Mode> modes = modes_of<T>(G, log_dt, A, Bm, C, h, p);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    std::vector<cplx> P, xi(N2);
    powers(modes, Tn, P);
    std::vector<double> K(static_cast<size_t>(Tn)), ud(static_cast<size_t>(Tn));
    for (int64_t j = 0; j < Tn; ++j) {
      double acc = 0;
      for (int64_t n = 0; n < N2; ++n) acc += (modes[n].C * P[j * N2 + n] * modes[n].Bbar).real();
      K[j] = 2 * acc;
    }
    for (int64_t b = 0; b < G.B; ++b) {
      const T* ub = u.data<T>() + b * Tn * G.H + h;
      T* yb = y.data<T>() + b * Tn * G.H + h;
      const int64_t s = (b * G.H + h) * N2;
      for (int64_t t = 0; t < Tn; ++t) ud[t] = static_cast<double>(ub[t * G.H]);
      for (int64_t n = 0; n < N2; ++n) xi[n] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, n) : cplx(0);
      for (int64_t t = 0; t < Tn; ++t) {
        double acc = dskip * ud[t];
        for (int64_t j = 0; j <= t; ++j) acc += K[j] * ud[t - j];
        if (x0.defined()) {
          double init = 0;
          for (int64_t n = 0; n < N2; ++n) init += (modes[n].C * P[(t + 1) * N2 + n] * xi[n]).real();
          acc += 2 * init;
        }
        yb[t * G.H] = static_cast<T>(acc);
      }
      for (int64_t n = 0; n < N2; ++n) {
        cplx x = P[Tn * N2 + n] * xi[n], sum = 0;
        for (int64_t s2 = 0; s2 < Tn; ++s2) sum += P[(Tn - 1 - s2) * N2 + n] * ud[s2];
        put_pair(xT.data<T>() + 2 * s, n, x + modes[n].Bbar * sum);
      }
    }
  }
}

// Backward per channel, with r_t = 2 dy_t and G_n = ∂L/∂x_T (dfinal) of each batch entry:
//   dK_j  = Σ_b Σ_{t ≥ j} dy_t u_{t−j}
//   du_s  = Σ_{t ≥ s} K_{t−s} dy_t + D dy_s + Re(Σ_n conj(G_n) Ā_n^{T−1−s} B̄_n),   dD = Σ u dy
//   from K_j = 2·Re(Σ_n C_n Ā_n^j B̄_n):
//     g_C += Σ_j conj(Ā^j B̄) 2dK_j,  g_B̄ += Σ_j conj(C Ā^j) 2dK_j,  g_Ā += Σ_{j≥1} conj(j C Ā^{j−1} B̄) 2dK_j
//   from the initial state's term 2·Re(C Ā^{t+1} x_{−1}) and x_T's Ā^T x_{−1}:
//     g_C += Σ_t conj(Ā^{t+1} x_{−1}) r_t,  g_{x−1} = Σ_t conj(C Ā^{t+1}) r_t + conj(Ā^T) G,
//     g_Ā += Σ_t conj((t+1) C Ā^t x_{−1}) r_t + conj(T Ā^{T−1} x_{−1}) G
//   from x_T's Σ_s Ā^{T−1−s} B̄ u_s:
//     g_B̄ += Σ_s u_s conj(Ā^{T−1−s}) G,  g_Ā += Σ_{s < T−1} conj((T−1−s) Ā^{T−2−s} B̄ u_s) G
template <class T>
void convolution_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt,
                          const Tensor& A, const Tensor& Bm, const Tensor& C, const Tensor& D, const Tensor& x0,
                          const S4Params& p, const S4Grads& grads) {
  const Geo G = geo_of(u, A);
  const int64_t N2 = G.N2, Tn = G.T;
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const std::vector<Mode> modes = modes_of<T>(G, log_dt, A, Bm, C, h, p);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    std::vector<cplx> P, gA(N2), gB(N2), gC(N2), xi(N2), gT(N2), gx(N2), Ub(N2), Ua(N2);
    powers(modes, Tn, P);
    std::vector<double> K(static_cast<size_t>(Tn)), dK(static_cast<size_t>(Tn), 0.0), ud(Tn), dyd(Tn);
    for (int64_t j = 0; j < Tn; ++j) {
      double acc = 0;
      for (int64_t n = 0; n < N2; ++n) acc += (modes[n].C * P[j * N2 + n] * modes[n].Bbar).real();
      K[j] = 2 * acc;
    }
    double dD = 0;
    for (int64_t b = 0; b < G.B; ++b) {
      const T* ub = u.data<T>() + b * Tn * G.H + h;
      const T* dyb = dy.data<T>() + b * Tn * G.H + h;
      T* dub = grads.du.data<T>() + b * Tn * G.H + h;
      const int64_t s = (b * G.H + h) * N2;
      for (int64_t t = 0; t < Tn; ++t) {
        ud[t] = static_cast<double>(ub[t * G.H]);
        dyd[t] = static_cast<double>(dyb[t * G.H]);
      }
      for (int64_t n = 0; n < N2; ++n) {
        gT[n] = pair_at(dfinal.data<T>() + 2 * s, n);
        xi[n] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, n) : cplx(0);
        Ub[n] = Ua[n] = 0;
      }
      for (int64_t j = 0; j < Tn; ++j) {
        double acc = 0;
        for (int64_t t = j; t < Tn; ++t) acc += dyd[t] * ud[t - j];
        dK[j] += acc;
      }
      for (int64_t s2 = 0; s2 < Tn; ++s2) {
        double acc = dskip * dyd[s2];
        for (int64_t t = s2; t < Tn; ++t) acc += K[t - s2] * dyd[t];
        const int64_t e = Tn - 1 - s2;  // the power of Ā that carries u_s to x_T
        double fin = 0;
        for (int64_t n = 0; n < N2; ++n) {
          fin += (std::conj(gT[n]) * P[e * N2 + n] * modes[n].Bbar).real();
          Ub[n] += P[e * N2 + n] * ud[s2];                                  // Σ_s u_s Ā^{T−1−s}
          if (e >= 1) Ua[n] += static_cast<double>(e) * P[(e - 1) * N2 + n] * ud[s2];  // Σ_s (T−1−s) Ā^{T−2−s} u_s
        }
        dub[s2 * G.H] = static_cast<T>(acc + fin);
        dD += ud[s2] * dyd[s2];
      }
      for (int64_t n = 0; n < N2; ++n) {
        const Mode& m = modes[n];
        gB[n] += std::conj(Ub[n]) * gT[n];
        gA[n] += std::conj(Ua[n] * m.Bbar) * gT[n];
        if (!x0.defined()) continue;
        cplx sC = 0, sA = 0;  // Σ_t r_t Ā^{t+1},  Σ_t r_t (t+1) Ā^t
        for (int64_t t = 0; t < Tn; ++t) {
          const double r = 2 * dyd[t];
          sC += r * P[(t + 1) * N2 + n];
          sA += r * static_cast<double>(t + 1) * P[t * N2 + n];
        }
        gC[n] += std::conj(sC * xi[n]);
        gx[n] = std::conj(m.C * sC) + std::conj(P[Tn * N2 + n]) * gT[n];
        gA[n] += std::conj(m.C * sA * xi[n]);
        if (Tn >= 1) gA[n] += std::conj(static_cast<double>(Tn) * P[(Tn - 1) * N2 + n] * xi[n]) * gT[n];
      }
      if (grads.dinitial_state.defined()) {
        for (int64_t n = 0; n < N2; ++n) put_pair(grads.dinitial_state.data<T>() + 2 * s, n, gx[n]);
      }
    }
    for (int64_t n = 0; n < N2; ++n) {
      const Mode& m = modes[n];
      cplx sK = 0, sKA = 0;  // Σ_j 2dK_j Ā^j,  Σ_{j≥1} 2dK_j j Ā^{j−1}
      for (int64_t j = 0; j < Tn; ++j) {
        sK += 2 * dK[j] * P[j * N2 + n];
        if (j >= 1) sKA += 2 * dK[j] * static_cast<double>(j) * P[(j - 1) * N2 + n];
      }
      gC[n] += std::conj(sK * m.Bbar);
      gB[n] += std::conj(m.C * sK);
      gA[n] += std::conj(m.C * sKA * m.Bbar);
    }
    if (grads.dD.defined()) grads.dD.data<T>()[h] = static_cast<T>(dD);
    write_parameter_grads<T>(G, log_dt, Bm, modes, gA, gB, gC, grads, h);
  }
}

// ---- diagonal-plus-low-rank form -----------------------------------------------------------------

using Mat = std::vector<cplx>;  // n × n, row-major

// The inverse of a complex n × n matrix by Gauss–Jordan elimination with partial pivoting. M = I − ΔA/2
// has eigenvalues 1 − Δλ/2 with real part ≥ 1 when Re λ ≤ 0, so it is never singular there.
Mat inverse(Mat M, int64_t n) {
  Mat R(static_cast<size_t>(n * n), cplx(0));
  for (int64_t i = 0; i < n; ++i) R[i * n + i] = 1;
  for (int64_t c = 0; c < n; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r) {
      if (std::abs(M[r * n + c]) > std::abs(M[piv * n + c])) piv = r;
    }
    if (std::abs(M[piv * n + c]) == 0) throw std::invalid_argument("s4: I − ΔA/2 is singular (is Re Λ > 0?)");
    for (int64_t k = 0; k < n; ++k) {
      std::swap(M[c * n + k], M[piv * n + k]);
      std::swap(R[c * n + k], R[piv * n + k]);
    }
    const cplx inv = 1.0 / M[c * n + c];
    for (int64_t k = 0; k < n; ++k) {
      M[c * n + k] *= inv;
      R[c * n + k] *= inv;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c || M[r * n + c] == cplx(0)) continue;
      const cplx f = M[r * n + c];
      for (int64_t k = 0; k < n; ++k) {
        M[r * n + k] -= f * M[c * n + k];
        R[r * n + k] -= f * R[c * n + k];
      }
    }
  }
  return R;
}

// y = M x, or M* x with `adjoint`.
void matvec(const Mat& M, const cplx* x, cplx* y, int64_t n, bool adjoint = false) {
  for (int64_t i = 0; i < n; ++i) {
    cplx acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += adjoint ? std::conj(M[j * n + i]) * x[j] : M[i * n + j] * x[j];
    y[i] = acc;
  }
}
// G += a b* (an outer product).
void add_outer(Mat& G, const cplx* a, const cplx* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) G[i * n + j] += a[i] * std::conj(b[j]);
  }
}
cplx dotc(const std::vector<cplx>& C, const cplx* x) {  // Σ_n C_n x_n (no conjugate: y = 2·Re(C x))
  cplx acc = 0;
  for (size_t i = 0; i < C.size(); ++i) acc += C[i] * x[i];
  return acc;
}

// One channel of the DPLR form: A = diag(Λ) − P Q*, M = I − ΔA/2, R = M⁻¹, Ā = (I − ΔA/2)⁻¹(I + ΔA/2) = 2R − I
// (since I + ΔA/2 = 2I − M), B̄ = Δ R B.
struct Dplr {
  int64_t n = 0;
  double dt = 0;
  Mat A, R, Abar;
  std::vector<cplx> B, C, P, Q, Bbar;
};

template <class T>
Dplr dplr_of(const Geo& G, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q, const Tensor& Bm,
             const Tensor& C, int64_t h) {
  Dplr c;
  const int64_t n = G.N2, off = h * n * 2;
  c.n = n;
  c.dt = std::exp(static_cast<double>(log_dt.data<T>()[h]));
  c.B.resize(n), c.C.resize(n), c.P.resize(n), c.Q.resize(n), c.Bbar.assign(n, cplx(0));
  for (int64_t i = 0; i < n; ++i) {
    c.B[i] = pair_at(Bm.data<T>() + off, i);
    c.C[i] = pair_at(C.data<T>() + off, i);
    c.P[i] = pair_at(P.data<T>() + off, i);
    c.Q[i] = pair_at(Q.data<T>() + off, i);
  }
  c.A.assign(static_cast<size_t>(n * n), cplx(0));
  Mat M(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      c.A[i * n + j] = (i == j ? pair_at(A.data<T>() + off, i) : cplx(0)) - c.P[i] * std::conj(c.Q[j]);
      M[i * n + j] = (i == j ? 1.0 : 0.0) - 0.5 * c.dt * c.A[i * n + j];
    }
  }
  c.R = inverse(M, n);
  c.Abar = c.R;
  for (int64_t i = 0; i < n * n; ++i) c.Abar[i] = 2.0 * c.R[i] - (i % (n + 1) == 0 ? 1.0 : 0.0);
  matvec(c.R, c.B.data(), c.Bbar.data(), n);
  for (cplx& b : c.Bbar) b *= c.dt;
  return c;
}

// Forward per channel, batch inside. recurrent: x ← Ā x + B̄ u_t, y_t = 2·Re(C x) + D u_t. convolution:
// v_j = Ā^j B̄ by v ← Ā v, K_j = 2·Re(C v_j); the initial state's term 2·Re(C w_t) with w_t = Ā^{t+1} x_{−1};
// x_T by Horner's rule. Memory per task: Ā, R [n, n], K [T].
template <class T>
void dplr_forward(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                  const Tensor& Bm, const Tensor& C, const Tensor& D, const Tensor& x0, const S4Params& p,
                  const Tensor& y, const Tensor& xT) {
  const Geo G = geo_of(u, A);
  const int64_t n = G.N2, Tn = G.T;
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const Dplr c = dplr_of<T>(G, log_dt, A, P, Q, Bm, C, h);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    std::vector<cplx> x(n), tmp(n), v = c.Bbar;
    std::vector<double> K(static_cast<size_t>(Tn));
    if (p.form == S4Form::convolution) {
      for (int64_t j = 0; j < Tn; ++j) {
        K[j] = 2 * dotc(c.C, v.data()).real();
        matvec(c.Abar, v.data(), tmp.data(), n);
        v.swap(tmp);
      }
    }
    for (int64_t b = 0; b < G.B; ++b) {
      const T* ub = u.data<T>() + b * Tn * G.H + h;
      T* yb = y.data<T>() + b * Tn * G.H + h;
      const int64_t s = (b * G.H + h) * n;
      for (int64_t i = 0; i < n; ++i) x[i] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, i) : cplx(0);
      if (p.form == S4Form::recurrent) {
        for (int64_t t = 0; t < Tn; ++t) {
          const double ut = static_cast<double>(ub[t * G.H]);
          matvec(c.Abar, x.data(), tmp.data(), n);
          for (int64_t i = 0; i < n; ++i) x[i] = tmp[i] + c.Bbar[i] * ut;
          yb[t * G.H] = static_cast<T>(2 * dotc(c.C, x.data()).real() + dskip * ut);
        }
      } else {
        std::vector<cplx> w = x;  // w ← Ā w: Ā^{t+1} x_{−1}
        for (int64_t t = 0; t < Tn; ++t) {
          double acc = dskip * static_cast<double>(ub[t * G.H]);
          for (int64_t j = 0; j <= t; ++j) acc += K[j] * static_cast<double>(ub[(t - j) * G.H]);
          if (x0.defined()) {
            matvec(c.Abar, w.data(), tmp.data(), n);
            w.swap(tmp);
            acc += 2 * dotc(c.C, w.data()).real();
          }
          yb[t * G.H] = static_cast<T>(acc);
        }
        for (int64_t t = 0; t < Tn; ++t) {  // Horner: x ← Ā x + B̄ u_s from x_{−1}
          matvec(c.Abar, x.data(), tmp.data(), n);
          for (int64_t i = 0; i < n; ++i) x[i] = tmp[i] + c.Bbar[i] * static_cast<double>(ub[t * G.H]);
        }
      }
      for (int64_t i = 0; i < n; ++i) put_pair(xT.data<T>() + 2 * s, i, x[i]);
    }
  }
}

// Backward per channel. Both forms gather g_Ā [n, n], g_B̄, g_C (and du, dD, d initial_state):
// recurrent, walking t back with g = ∂L/∂x_t (from dfinal), r_t = 2 dy_t:
//   g += conj(C) r_t,  g_C += conj(x_t) r_t,  g_Ā += g x_{t−1}*,  g_B̄ += u_t g,
//   du_t = Re(Σ conj(g) B̄) + D dy_t,  g ← Ā* g;   d initial_state = g.
// convolution, the same sums grouped by what they pass through:
//   the kernel v_j = Ā v_{j−1}, v_0 = B̄ (λ = ∂L/∂v_j walking j back):
//     λ += conj(C) 2dK_j,  g_C += conj(v_j) 2dK_j,  g_Ā += λ v_{j−1}* (j ≥ 1),  λ ← Ā* λ;  g_B̄ += λ at j = 0;
//   x_T's sum z_s = Ā z_{s−1} + B̄ u_s (ν = ∂L/∂z_s from G = dfinal):
//     g_B̄ += u_s ν,  du_s += Re(Σ conj(ν) B̄),  g_Ā += ν z_{s−1}* (s ≥ 1),  ν ← Ā* ν;
//   the initial state's w_t = Ā w_{t−1}, w_{−1} = x_{−1} (μ = ∂L/∂w_t, from G at t = T−1):
//     μ += conj(C) r_t,  g_C += conj(w_t) r_t,  g_Ā += μ w_{t−1}*,  μ ← Ā* μ;  d initial_state = μ;
//   and du_s = Σ_{t≥s} K_{t−s} dy_t + D dy_s, dK_j = Σ_b Σ_{t≥j} dy_t u_{t−j}.
// Then, through Ā = 2R − I, B̄ = Δ R B, R = M⁻¹, M = I − (Δ/2)(diag(Λ) − P Q*):
//   g_R = 2 g_Ā + Δ g_B̄ B*,  g_B = Δ R* g_B̄,  g_M = −R* g_R R*,
//   g_Λ = −(Δ/2) diag(g_M),  g_P = (Δ/2) g_M Q,  g_Q = (Δ/2) g_M* P,
//   ∂L/∂Δ = −½ Re tr(g_M* A) + Re((R B)* g_B̄),  d log_dt = Δ ∂L/∂Δ.
template <class T>
void dplr_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                   const Tensor& P, const Tensor& Q, const Tensor& Bm, const Tensor& C, const Tensor& D,
                   const Tensor& x0, const S4Params& p, const kernel::S4DplrGrads& grads) {
  const Geo G = geo_of(u, A);
  const int64_t n = G.N2, Tn = G.T;
#pragma omp parallel for schedule(dynamic) if (G.parallel())
  for (int64_t h = 0; h < G.H; ++h) {
    const Dplr c = dplr_of<T>(G, log_dt, A, P, Q, Bm, C, h);
    const double dskip = D.defined() ? static_cast<double>(D.data<T>()[h]) : 0.0;
    Mat gA(static_cast<size_t>(n * n), cplx(0));
    std::vector<cplx> gB(n), gC(n), g(n), tmp(n), xi(n), seq(static_cast<size_t>((Tn + 1) * n));
    std::vector<double> K(static_cast<size_t>(Tn)), dK(static_cast<size_t>(Tn), 0.0);
    double dD = 0;
    auto row = [&](int64_t t) { return seq.data() + (t + 1) * n; };  // row(−1) is the starting vector
    if (p.form == S4Form::convolution) {
      if (Tn > 0) std::copy(c.Bbar.begin(), c.Bbar.end(), row(0));  // v_j = row(j); T = 0 has no row 0
      for (int64_t j = 0; j < Tn; ++j) {
        K[j] = 2 * dotc(c.C, row(j)).real();
        if (j + 1 < Tn) matvec(c.Abar, row(j), row(j + 1), n);
      }
      for (int64_t b = 0; b < G.B; ++b) {
        const T *ub = u.data<T>() + b * Tn * G.H + h, *dyb = dy.data<T>() + b * Tn * G.H + h;
        for (int64_t j = 0; j < Tn; ++j) {
          double acc = 0;
          for (int64_t t = j; t < Tn; ++t) acc += static_cast<double>(dyb[t * G.H]) * static_cast<double>(ub[(t - j) * G.H]);
          dK[j] += acc;
        }
      }
      std::fill(g.begin(), g.end(), cplx(0));  // λ
      for (int64_t j = Tn - 1; j >= 0; --j) {
        for (int64_t i = 0; i < n; ++i) {
          g[i] += std::conj(c.C[i]) * (2 * dK[j]);
          gC[i] += std::conj(row(j)[i]) * (2 * dK[j]);
        }
        if (j >= 1) {
          add_outer(gA, g.data(), row(j - 1), n);
          matvec(c.Abar, g.data(), tmp.data(), n, true);
          g.swap(tmp);
        } else {
          for (int64_t i = 0; i < n; ++i) gB[i] += g[i];
        }
      }
    }
    for (int64_t b = 0; b < G.B; ++b) {
      const T *ub = u.data<T>() + b * Tn * G.H + h, *dyb = dy.data<T>() + b * Tn * G.H + h;
      T* dub = grads.du.data<T>() + b * Tn * G.H + h;
      const int64_t s = (b * G.H + h) * n;
      for (int64_t i = 0; i < n; ++i) xi[i] = x0.defined() ? pair_at(x0.data<T>() + 2 * s, i) : cplx(0);
      std::vector<double> du(static_cast<size_t>(Tn));
      for (int64_t t = 0; t < Tn; ++t) {
        du[t] = dskip * static_cast<double>(dyb[t * G.H]);
        dD += static_cast<double>(ub[t * G.H]) * static_cast<double>(dyb[t * G.H]);
      }
      auto step = [&](const cplx* prev, cplx* next, double ut) {  // next = Ā prev + B̄ u_t
        matvec(c.Abar, prev, next, n);
        for (int64_t i = 0; i < n; ++i) next[i] += c.Bbar[i] * ut;
      };
      if (p.form == S4Form::recurrent) {
        std::copy(xi.begin(), xi.end(), row(-1));
        for (int64_t t = 0; t < Tn; ++t) step(row(t - 1), row(t), static_cast<double>(ub[t * G.H]));
        for (int64_t i = 0; i < n; ++i) g[i] = pair_at(dfinal.data<T>() + 2 * s, i);
        for (int64_t t = Tn - 1; t >= 0; --t) {
          const double r = 2 * static_cast<double>(dyb[t * G.H]), ut = static_cast<double>(ub[t * G.H]);
          for (int64_t i = 0; i < n; ++i) {
            g[i] += std::conj(c.C[i]) * r;
            gC[i] += std::conj(row(t)[i]) * r;
            gB[i] += ut * g[i];
            du[t] += (std::conj(g[i]) * c.Bbar[i]).real();
          }
          add_outer(gA, g.data(), row(t - 1), n);
          matvec(c.Abar, g.data(), tmp.data(), n, true);
          g.swap(tmp);
        }
      } else {
        for (int64_t s2 = 0; s2 < Tn; ++s2) {
          for (int64_t t = s2; t < Tn; ++t) du[s2] += K[t - s2] * static_cast<double>(dyb[t * G.H]);
        }
        // x_T's sum: z_s into seq (z_{−1} = 0), then ν walking back.
        std::fill(row(-1), row(-1) + n, cplx(0));
        for (int64_t t = 0; t < Tn; ++t) step(row(t - 1), row(t), static_cast<double>(ub[t * G.H]));
        for (int64_t i = 0; i < n; ++i) g[i] = pair_at(dfinal.data<T>() + 2 * s, i);  // ν
        for (int64_t t = Tn - 1; t >= 0; --t) {
          const double ut = static_cast<double>(ub[t * G.H]);
          for (int64_t i = 0; i < n; ++i) {
            gB[i] += ut * g[i];
            du[t] += (std::conj(g[i]) * c.Bbar[i]).real();
          }
          if (t >= 1) add_outer(gA, g.data(), row(t - 1), n);
          matvec(c.Abar, g.data(), tmp.data(), n, true);
          g.swap(tmp);
        }
        if (x0.defined()) {  // w_t = Ā^{t+1} x_{−1} into seq, then μ walking back
          std::copy(xi.begin(), xi.end(), row(-1));
          for (int64_t t = 0; t < Tn; ++t) matvec(c.Abar, row(t - 1), row(t), n);
          for (int64_t i = 0; i < n; ++i) g[i] = pair_at(dfinal.data<T>() + 2 * s, i);  // μ
          for (int64_t t = Tn - 1; t >= 0; --t) {
            const double r = 2 * static_cast<double>(dyb[t * G.H]);
            for (int64_t i = 0; i < n; ++i) {
              g[i] += std::conj(c.C[i]) * r;
              gC[i] += std::conj(row(t)[i]) * r;
            }
            add_outer(gA, g.data(), row(t - 1), n);
            matvec(c.Abar, g.data(), tmp.data(), n, true);
            g.swap(tmp);
          }
        } else {
          std::fill(g.begin(), g.end(), cplx(0));
        }
      }
      for (int64_t t = 0; t < Tn; ++t) dub[t * G.H] = static_cast<T>(du[t]);
      if (grads.dinitial_state.defined()) {
        for (int64_t i = 0; i < n; ++i) put_pair(grads.dinitial_state.data<T>() + 2 * s, i, g[i]);
      }
    }
    if (grads.dD.defined()) grads.dD.data<T>()[h] = static_cast<T>(dD);
    // The chain through R = M⁻¹.
    Mat gR(static_cast<size_t>(n * n)), tmpM(static_cast<size_t>(n * n), cplx(0)), gM(static_cast<size_t>(n * n), cplx(0));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) gR[i * n + j] = 2.0 * gA[i * n + j] + c.dt * gB[i] * std::conj(c.B[j]);
    }
    for (int64_t i = 0; i < n; ++i) {  // tmpM = R* g_R
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t k = 0; k < n; ++k) tmpM[i * n + j] += std::conj(c.R[k * n + i]) * gR[k * n + j];
      }
    }
    for (int64_t i = 0; i < n; ++i) {  // g_M = −(R* g_R) R*
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t k = 0; k < n; ++k) gM[i * n + j] -= tmpM[i * n + k] * std::conj(c.R[j * n + k]);
      }
    }
    std::vector<cplx> RB(n);
    matvec(c.R, c.B.data(), RB.data(), n);
    double d_dt = 0;
    for (int64_t i = 0; i < n; ++i) {
      d_dt += (std::conj(RB[i]) * gB[i]).real();
      for (int64_t j = 0; j < n; ++j) d_dt -= 0.5 * (std::conj(gM[i * n + j]) * c.A[i * n + j]).real();
    }
    grads.dlog_dt.data<T>()[h] = static_cast<T>(c.dt * d_dt);
    const int64_t off = h * n * 2;
    std::vector<cplx> gBin(n);
    matvec(c.R, gB.data(), gBin.data(), n, true);
    for (int64_t i = 0; i < n; ++i) {
      cplx gp = 0, gq = 0;
      for (int64_t j = 0; j < n; ++j) {
        gp += gM[i * n + j] * c.Q[j];
        gq += std::conj(gM[j * n + i]) * c.P[j];
      }
      put_pair(grads.dA.data<T>() + off, i, -0.5 * c.dt * gM[i * n + i]);
      put_pair(grads.dP.data<T>() + off, i, 0.5 * c.dt * gp);
      put_pair(grads.dQ.data<T>() + off, i, 0.5 * c.dt * gq);
      put_pair(grads.dB.data<T>() + off, i, c.dt * gBin[i]);
      put_pair(grads.dC.data<T>() + off, i, gC[i]);
    }
  }
}

void dplr_forward_cpu(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                      const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& x0, const S4Params& p,
                      const Tensor& y, const Tensor& xT) {
  dispatch_float(u.dtype(), "s4", [&](auto tag) {
    dplr_forward<decltype(tag)>(u, log_dt, A, P, Q, B, C, D, x0, p, y, xT);
  });
}

void dplr_backward_cpu(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                       const Tensor& P, const Tensor& Q, const Tensor& B, const Tensor& C, const Tensor& D,
                       const Tensor& x0, const S4Params& p, const kernel::S4DplrGrads& grads) {
  dispatch_float(u.dtype(), "s4 backward", [&](auto tag) {
    dplr_backward<decltype(tag)>(dy, dfinal, u, log_dt, A, P, Q, B, C, D, x0, p, grads);
  });
}

void forward_cpu(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
                 const Tensor& D, const Tensor& x0, const S4Params& p, const Tensor& y, const Tensor& xT) {
  dispatch_float(u.dtype(), "s4", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == S4Form::recurrent) {
      recurrent_forward<T>(u, log_dt, A, B, C, D, x0, p, y, xT);
    } else {
      convolution_forward<T>(u, log_dt, A, B, C, D, x0, p, y, xT);
    }
  });
}

void backward_cpu(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                  const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& x0, const S4Params& p,
                  const S4Grads& grads) {
  dispatch_float(u.dtype(), "s4 backward", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == S4Form::recurrent) {
      recurrent_backward<T>(dy, dfinal, u, log_dt, A, B, C, D, x0, p, grads);
    } else {
      convolution_backward<T>(dy, dfinal, u, log_dt, A, B, C, D, x0, p, grads);
    }
  });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(s4_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(s4_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
SEQLAB_REGISTER_KERNEL(s4_dplr_forward_kernel, DeviceType::CPU, &cpu::dplr_forward_cpu);
SEQLAB_REGISTER_KERNEL(s4_dplr_backward_kernel, DeviceType::CPU, &cpu::dplr_backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the (contiguous) inputs; the backward recomputes the modes and states.
S4Output s4(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& D,
            const Tensor& initial_state, const S4Options& opts) {
  S4Output out = kernel::s4_forward(u, log_dt, A, B, C, D, initial_state, opts);
  record("s4", {u, log_dt, A, B, C, D, initial_state}, {&out.y, &out.final_state},
         {u, log_dt, A, B, C, D, initial_state},
         [opts](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::S4Grads r = kernel::s4_backward(g[0], g[1], s[0], s[1], s[2], s[3], s[4], s[5], s[6], opts, need);
           return std::vector<Tensor>{r.du, r.dlog_dt, r.dA, r.dB, r.dC, r.dD, r.dinitial_state};
         });
  return out;
}

S4Output s4_dplr(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                 const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state, const S4Options& opts) {
  S4Output out = kernel::s4_dplr_forward(u, log_dt, A, P, Q, B, C, D, initial_state, opts);
  record("s4", {u, log_dt, A, P, Q, B, C, D, initial_state}, {&out.y, &out.final_state},
         {u, log_dt, A, P, Q, B, C, D, initial_state},
         [opts](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::S4DplrGrads r =
               kernel::s4_dplr_backward(g[0], g[1], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], opts, need);
           return std::vector<Tensor>{r.du, r.dlog_dt, r.dA, r.dP, r.dQ, r.dB, r.dC, r.dD, r.dinitial_state};
         });
  return out;
}

// ------------------------------------------------------------------------------------------------
// HiPPO-LegS

std::vector<double> hippo_legs_matrix(int64_t N) {
  std::vector<double> A(static_cast<size_t>(N * N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < n; ++k) A[n * N + k] = -std::sqrt(2.0 * n + 1) * std::sqrt(2.0 * k + 1);
    A[n * N + n] = -static_cast<double>(n + 1);
  }
  return A;
}

namespace {

// Eigen-decomposition of a symmetric matrix M [n, n] by cyclic Jacobi rotations: on return M's diagonal
// holds the eigenvalues and the columns of V the eigenvectors. Converges quadratically; a sweep costs
// O(n³), and 30 sweeps are far more than the sizes used here (n ≤ a few hundred) need.
void jacobi_eigen(std::vector<double>& M, std::vector<double>& V, int64_t n) {
  V.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) V[i * n + i] = 1;
  for (int sweep = 0; sweep < 30; ++sweep) {
    double off = 0, total = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) (i == j ? total : off) += M[i * n + j] * M[i * n + j];
    }
    if (off <= 1e-30 * (total + off)) break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = M[p * n + q];
        if (apq == 0) continue;
        // The rotation (c, s) that zeroes M_pq: t = sign(θ)/(|θ| + √(θ² + 1)), θ = (M_qq − M_pp)/(2 M_pq).
        const double theta = (M[q * n + q] - M[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double mkp = M[k * n + p], mkq = M[k * n + q];
          M[k * n + p] = c * mkp - s * mkq;
          M[k * n + q] = s * mkp + c * mkq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double mpk = M[p * n + k], mqk = M[q * n + k];
          M[p * n + k] = c * mpk - s * mqk;
          M[q * n + k] = s * mpk + c * mqk;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double vkp = V[k * n + p], vkq = V[k * n + q];
          V[k * n + p] = c * vkp - s * vkq;
          V[k * n + q] = s * vkp + c * vkq;
        }
      }
    }
  }
}

}  // namespace

// S = A + P Pᵀ = −½ I + M with M skew-symmetric. M's eigenvalues are ±iμ; −M² = MᵀM is symmetric with
// eigenvalues μ², each twice. For a unit eigenvector v of MᵀM (μ > 0), Mv ⟂ v and |Mv| = μ, and
// w = (v − i Mv/μ)/√2 is a unit eigenvector of M for iμ (M w = Mv + iμ v = iμ w), so of S for −½ + iμ.
// The eigenvalues μ² are sorted and every other one taken (one per pair).
HippoNplr hippo_legs_nplr(int64_t N) {
  if (N < 2 || N % 2 != 0) {
    throw std::invalid_argument("s4: HiPPO-LegS needs an even state size N ≥ 2, got " + std::to_string(N));
  }
  HippoNplr r;
  r.N = N;
  const std::vector<double> A = hippo_legs_matrix(N);
  r.P.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) r.P[n] = std::sqrt(n + 0.5);
  r.S = A;
  std::vector<double> M(static_cast<size_t>(N * N));
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      r.S[i * N + j] += r.P[i] * r.P[j];
      M[i * N + j] = r.S[i * N + j] + (i == j ? 0.5 : 0.0);
    }
  }
  std::vector<double> MtM(static_cast<size_t>(N * N), 0.0), V;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < N; ++k) acc += M[k * N + i] * M[k * N + j];
      MtM[i * N + j] = acc;
    }
  }
  jacobi_eigen(MtM, V, N);
  std::vector<int64_t> order(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return MtM[a * N + a] < MtM[b * N + b]; });
  const int64_t N2 = N / 2;
  r.lambda.resize(static_cast<size_t>(N2));
  r.V.assign(static_cast<size_t>(N * N2), cplx(0));
  for (int64_t m = 0; m < N2; ++m) {
    const int64_t col = order[2 * m];
    const double mu = std::sqrt(std::max(0.0, MtM[col * N + col]));
    if (!(mu > 0)) throw std::logic_error("s4: HiPPO-LegS's normal part has a zero eigenvalue");
    r.lambda[m] = cplx(-0.5, mu);
    for (int64_t i = 0; i < N; ++i) {
      double mv = 0;
      for (int64_t k = 0; k < N; ++k) mv += M[i * N + k] * V[k * N + col];
      r.V[i * N2 + m] = cplx(V[i * N + col], -mv / mu) / std::sqrt(2.0);
    }
  }
  return r;
}

// ------------------------------------------------------------------------------------------------
// The registry entry
namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "s4";
  s.summary =
      "S4D: x_t = Ā x_{t-1} + B̄ u_t, y_t = 2·Re(C x_t) + D u_t per channel, Ā, B̄ from Λ = A and Δ = exp(log_dt) by "
      "zoh or bilinear; u [B, T, H], log_dt [H], A, B, C [H, N2, 2] (re, im), D [H], initial_state [B, H, N2, 2]; with "
      "P, Q [H, N2, 2] the diagonal-plus-low-rank form A = diag(Λ) − P Q* (bilinear)";
  s.inputs = {{"u"},
              {"log_dt"},
              {"A"},
              {"B"},
              {"C"},
              {"D", OpInputKind::floating, true},
              {"initial_state", OpInputKind::floating, true},
              {"P", OpInputKind::floating, true},
              {"Q", OpInputKind::floating, true}};
  s.outputs = {"y", "final_state"};
  s.attrs = {{"form", AttrType::string, "convolution", "convolution (direct causal convolution) or recurrent"},
             {"discretisation", AttrType::string, "zoh", "zoh or bilinear"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    S4Options o;
    o.form = parse_s4_form(a.get_string("form"));
    o.discretisation = parse_s4_discretisation(a.get_string("discretisation"));
    // P and Q given: the diagonal-plus-low-rank form A = diag(Λ) − P Q* (bilinear only).
    S4Output out = in[7].defined() || in[8].defined()
                       ? s4_dplr(in[0], in[1], in[2], in[7], in[8], in[3], in[4], in[5], in[6], o)
                       : s4(in[0], in[1], in[2], in[3], in[4], in[5], in[6], o);
    return std::vector<Tensor>{out.y, out.final_state};
  };
  // T = 7, H = 3, N2 = 2 modes, an initial state; Re Λ in [−1.3, −0.3], Δ in [0.1, 0.8] so decays matter.
  s.example = [](Generator& gen, DType dtype) {
    const int64_t H = 3, N2 = 2;
    Tensor A = Tensor::randn({H, N2, 2}, gen, dtype);
    std::vector<double> a = A.to_doubles();
    for (size_t i = 0; i < a.size(); i += 2) a[i] = -0.3 - std::abs(a[i]) * 0.5;
    return std::vector<Tensor>{Tensor::randn({2, 7, H}, gen, dtype), Tensor::rand({H}, gen, dtype, -2.3, -0.2),
                               Tensor::from_vector(a, {H, N2, 2}, dtype), Tensor::randn({H, N2, 2}, gen, dtype),
                               Tensor::randn({H, N2, 2}, gen, dtype), Tensor::randn({H}, gen, dtype),
                               Tensor::randn({2, H, N2, 2}, gen, dtype), Tensor(), Tensor()};
  };
  return s;
}()));

}  // namespace
}  // namespace seqlab
