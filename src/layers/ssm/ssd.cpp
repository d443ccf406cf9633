// Mamba-2's SSD: the raw entry points, the CPU kernels of both forms (forward and backward side by
// side), the autograd node and the registry entry. Equations in ssd.h; the derivations in
// docs/variants/mamba2.md.
//
// How the CPU kernels work:
// - One task per (batch, head), OpenMP over B·H; inside a task time is sequential (the state carries),
//   and every product of chunk-sized matrices is a GEMM through the GEMM slot, which runs
//   single-threaded on the calling thread inside the parallel region.
// - A head's rows of x, y ([B, T, H, P]) and of its group's B, C ([B, T, G, N]) are strided (H·P and
//   G·N apart); the GEMMs read and write them in place through the leading dimension.
// - Heads of one group share B and C, so their gradients dB, dC are sums over the group's heads: each
//   task writes its head's share into a [B, T, H, N] buffer and a serial pass sums the shares (tasks
//   never write the same element). dA and dD (sums over batch and time) likewise, through [B, H].
// - Decay factors are always exp(x) with x ≤ 0 (differences of cumulative log-decays taken in the
//   direction of time, kept in double), so nothing overflows for any Δ; they may underflow to 0, which
//   is also what the exact value rounds to.
#include "layers/ssm/ssd.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/variant_inputs.h"
#include "tensor/blas_rows.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {

namespace {

const FormNames<SsdForm>& ssd_forms() {
  static const FormNames<SsdForm> forms{"ssd", {{"chunkwise", SsdForm::chunkwise}, {"recurrent", SsdForm::recurrent}}};
  return forms;
}

}  // namespace

const char* ssd_form_name(SsdForm form) { return ssd_forms().name(form); }
SsdForm parse_ssd_form(const std::string& s) { return ssd_forms().parse(s); }

namespace kernel {

namespace {

struct SsdDims {
  int64_t B, T, H, P, G, N;
};

SsdDims check_inputs(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                     const Tensor& D, const Tensor& h0) {
  const VariantInputs in("ssd",
                         {{"x", x}, {"dt", dt}, {"A", A}, {"B", Bm}, {"C", Cm}, {"D", D}, {"initial_state", h0}},
                         "x [B, T, H, P], dt [B, T, H], A [H], B and C [B, T, G, N] with H a multiple of G, D [H] or "
                         "none, initial_state [B, H, P, N] or none");
  in.given({"x", "dt", "A", "B", "C"});
  if (x.dim() != 4) in.fail("x must have 4 dimensions");
  if (Bm.dim() != 4) in.fail("B must have 4 dimensions");
  const SsdDims d{x.size(0), x.size(1), x.size(2), x.size(3), Bm.size(2), Bm.size(3)};
  if (d.H == 0 || d.P == 0 || d.N == 0) in.fail("the heads H, head dim P and state size N must be positive");
  if (Bm.size(0) != d.B || Bm.size(1) != d.T) in.fail("B differs from x in batch or length");
  if (d.G == 0 || d.H % d.G != 0) in.fail("the heads H must be a multiple of the groups G of B and C");
  in.shaped("C", Bm.shape(), "[B, T, G, N] (B's shape)");
  in.shaped("dt", {d.B, d.T, d.H}, "[B, T, H]");
  in.shaped("A", {d.H}, "[H]");
  in.shaped("D", {d.H}, "[H]");
  in.shaped("initial_state", {d.B, d.H, d.P, d.N}, "[B, H, P, N]");
  const DType dtype = x.dtype();
  if (!is_floating(dtype)) in.fail(std::string("inputs must be f32, f64 or bf16, got ") + dtype_name(dtype));
  const std::pair<const char*, const Tensor*> all[] = {{"dt", &dt}, {"A", &A}, {"B", &Bm}, {"C", &Cm},
                                                       {"D", &D},   {"initial_state", &h0}};
  for (const auto& [name, t] : all) {
    if (!t->defined()) continue;
    if (t->dtype() != dtype) {
      in.fail("inputs must share one dtype, got x " + std::string(dtype_name(dtype)) + " and " + name + " " +
              dtype_name(t->dtype()));
    }
    if (t->device() != x.device()) in.fail(std::string("inputs must be on one device, x's and ") + name + " differ");
  }
  return d;
}

// A chunk is never longer than the sequence (a longer one is the same single chunk), so an absurd chunk
// allocates nothing absurd.
SsdParams resolve(const SsdOptions& opts, const SsdDims& d) {
  if (opts.chunk <= 0) throw std::invalid_argument("ssd: chunk must be positive, got " + std::to_string(opts.chunk));
  return {opts.form, std::min(opts.chunk, std::max<int64_t>(1, d.T))};
}

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (t.defined() && (t.shape() != shape || t.dtype() != dtype)) {
    throw std::invalid_argument(std::string("ssd backward: ") + what + " is " + shape_str(t.shape()) + " " +
                                dtype_name(t.dtype()) + ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

SsdOutput ssd_forward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
                      const Tensor& D, const Tensor& initial_state, const SsdOptions& opts) {
  const SsdDims d = check_inputs(x, dt, A, B, C, D, initial_state);
  const SsdParams p = resolve(opts, d);
  SsdOutput out{Tensor::empty({d.B, d.T, d.H, d.P}, x.dtype(), x.device()),
                Tensor::empty({d.B, d.H, d.P, d.N}, x.dtype(), x.device())};
  ssd_forward_kernel(x.device(), kernel::contiguous(x), kernel::contiguous(dt), kernel::contiguous(A),
                     kernel::contiguous(B), kernel::contiguous(C), contiguous_or_none(D),
                     contiguous_or_none(initial_state), p, out.y, out.final_state);
  return out;
}

SsdGrads ssd_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                      const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& initial_state,
                      const SsdOptions& opts, const std::vector<bool>& need) {
  const SsdDims d = check_inputs(x, dt, A, B, C, D, initial_state);
  const SsdParams p = resolve(opts, d);
  if (need.size() != 7) throw std::invalid_argument("ssd backward: need one flag per input (7)");
  const Shape y_shape{d.B, d.T, d.H, d.P}, s_shape{d.B, d.H, d.P, d.N};
  const DType dtype = x.dtype();
  check_like(dy, y_shape, dtype, "dy");
  check_like(dfinal, s_shape, dtype, "dfinal");
  // The kernels compute dx, ddt, dA, dB, dC in every case (one pass: ddt and dA share the log-decay
  // gradient, dB and dC the chunk's score gradient).
  SsdGrads all;
  all.dx = Tensor::empty(x.shape(), dtype, x.device());
  all.ddt = Tensor::empty(dt.shape(), dtype, x.device());
  all.dA = Tensor::empty(A.shape(), dtype, x.device());
  all.dB = Tensor::empty(B.shape(), dtype, x.device());
  all.dC = Tensor::empty(C.shape(), dtype, x.device());
  if (need[5] && D.defined()) all.dD = Tensor::empty(D.shape(), dtype, x.device());
  if (need[6] && initial_state.defined()) all.dinitial_state = Tensor::empty(s_shape, dtype, x.device());
  const Tensor dY = dy.defined() ? kernel::contiguous(dy) : Tensor::zeros(y_shape, dtype, x.device());
  const Tensor dS = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dtype, x.device());
  ssd_backward_kernel(x.device(), dY, dS, kernel::contiguous(x), kernel::contiguous(dt), kernel::contiguous(A),
                      kernel::contiguous(B), kernel::contiguous(C), contiguous_or_none(D),
                      contiguous_or_none(initial_state), p, all);
  if (!need[0]) all.dx = Tensor();
  if (!need[1]) all.ddt = Tensor();
  if (!need[2]) all.dA = Tensor();
  if (!need[3]) all.dB = Tensor();
  if (!need[4]) all.dC = Tensor();
  return all;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::SsdGrads;
using kernel::SsdParams;

struct Geo {
  int64_t B, T, H, P, G, N;
  bool parallel(int64_t tasks) const { return tasks > 1 && T * P * N > kParallelGrain; }
  int64_t row_x(int64_t b, int64_t h) const { return b * T * H * P + h * P; }              // token 0 of x, y
  int64_t row_dt(int64_t b, int64_t h) const { return b * T * H + h; }                     // token 0 of dt
  int64_t row_bc(int64_t b, int64_t h) const { return b * T * G * N + h / (H / G) * N; }  // token 0 of B, C
  int64_t row_hn(int64_t b, int64_t h) const { return b * T * H * N + h * N; }             // per-head dB, dC
  int64_t state(int64_t b, int64_t h) const { return (b * H + h) * P * N; }
  int64_t ldx() const { return H * P; }
  int64_t ldbc() const { return G * N; }
};

Geo geo_of(const Tensor& x, const Tensor& Bm) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), Bm.size(2), Bm.size(3)};
}

// One (batch, head): base pointers of its rows and of its state, its A and D.
template <class T>
struct Head {
  const T *x, *dt, *B, *C, *h0;
  double A;
  T D;
};

template <class T>
Head<T> head_of(const Geo& G, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                const Tensor& D, const Tensor& h0, int64_t b, int64_t h) {
  return {x.data<T>() + G.row_x(b, h),
          dt.data<T>() + G.row_dt(b, h),
          Bm.data<T>() + G.row_bc(b, h),
          Cm.data<T>() + G.row_bc(b, h),
          h0.defined() ? h0.data<T>() + G.state(b, h) : nullptr,
          static_cast<double>(A.data<T>()[h]),
          D.defined() ? D.data<T>()[h] : T(0)};
}

// ---- recurrent form -----------------------------------------------------------------------------

// One step S ← a S + Δ x Bᵀ with a = exp(Δ A); when `y` is given also y = S C + D x. Touches S [P, N].
template <class T>
void recurrent_step(const Geo& G, const T* x, T dt, double A, const T* Bt, const T* Ct, T D, T* S, T* y) {
  const T a = static_cast<T>(std::exp(static_cast<double>(dt) * A));
  for (int64_t p = 0; p < G.P; ++p) {
    T* row = S + p * G.N;
    const T u = dt * x[p];
#pragma omp simd
    for (int64_t n = 0; n < G.N; ++n) row[n] = a * row[n] + u * Bt[n];
    if (y) y[p] = dot(row, Ct, G.N) + D * x[p];
  }
}

// Forward, step by step: S₀ = initial state (or 0); for t = 0 … T−1: S ← a_t S + Δ_t x_t B_tᵀ,
// y_t = S C_t + D x_t; final_state = S. Memory: reads every input; writes y, final_state (the running
// state lives there).
template <class T>
void recurrent_forward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                       const Tensor& D, const Tensor& h0, const Tensor& y, const Tensor& fs) {
  const Geo G = geo_of(x, Bm);
  const int64_t tasks = G.B * G.H;
#pragma omp parallel for schedule(dynamic) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / G.H, h = task % G.H;
    const Head<T> X = head_of<T>(G, x, dt, A, Bm, Cm, D, h0, b, h);
    T* S = fs.data<T>() + G.state(b, h);
    T* Y = y.data<T>() + G.row_x(b, h);
    if (X.h0) {
      std::copy_n(X.h0, G.P * G.N, S);
    } else {
      std::fill_n(S, G.P * G.N, T(0));
    }
    for (int64_t t = 0; t < G.T; ++t) {
      recurrent_step(G, X.x + t * G.ldx(), X.dt[t * G.H], X.A, X.B + t * G.ldbc(), X.C + t * G.ldbc(), X.D, S,
                     Y + t * G.ldx());
    }
  }
}

// The per-task shares of the gradients that are sums over tasks: dB, dC per head [B, T, H, N] (summed
// over a group's heads afterwards), dA and dD per (batch, head) (summed over the batch).
template <class T>
struct Shares {
  std::vector<T> dB, dC;
  std::vector<double> dA, dD;
  explicit Shares(const Geo& G)
      : dB(static_cast<size_t>(G.B * G.T * G.H * G.N)), dC(dB.size()), dA(static_cast<size_t>(G.B * G.H)),
        dD(dA.size()) {}
};

// dB, dC: sums of the heads of each group; dA, dD: sums over the batch.
template <class T>
void reduce_shares(const Geo& G, const Shares<T>& s, const SsdGrads& grads) {
  const int64_t hg = G.H / G.G;
  T *dB = grads.dB.data<T>(), *dC = grads.dC.data<T>();
  for (int64_t bt = 0; bt < G.B * G.T; ++bt) {
    for (int64_t g = 0; g < G.G; ++g) {
      for (int64_t n = 0; n < G.N; ++n) {
        T sb = 0, sc = 0;
        for (int64_t j = 0; j < hg; ++j) {
          const size_t i = static_cast<size_t>((bt * G.H + g * hg + j) * G.N + n);
          sb += s.dB[i];
          sc += s.dC[i];
        }
        dB[(bt * G.G + g) * G.N + n] = sb;
        dC[(bt * G.G + g) * G.N + n] = sc;
      }
    }
  }
  for (int64_t h = 0; h < G.H; ++h) {
    double a = 0, d = 0;
    for (int64_t b = 0; b < G.B; ++b) {
      a += s.dA[static_cast<size_t>(b * G.H + h)];
      d += s.dD[static_cast<size_t>(b * G.H + h)];
    }
    grads.dA.data<T>()[h] = static_cast<T>(a);
    if (grads.dD.defined()) grads.dD.data<T>()[h] = static_cast<T>(d);
  }
}

// Backward through time. With dS the gradient of the loss w.r.t. S_t (from y_t, S_{t+1} and the final
// state), walking t = T−1 … 0:
//   dS   += dy_t C_tᵀ                       (y_t = S_t C_t + D x_t)
//   dC_t  = S_tᵀ dy_t,   dD += dy_t · x_t
//   u     = dS B_t                           (P)
//   dx_t  = Δ_t u + D dy_t,   dB_t = Δ_t dSᵀ x_t,   dΔ_t = x_t · u      (S_t ∋ Δ_t x_t B_tᵀ)
//   dℓ_t  = a_t Σ dS ⊙ S_{t−1}               (ℓ_t = Δ_t A the log-decay: ∂a_t/∂ℓ_t = a_t)
//   dΔ_t += A dℓ_t,   dA += Δ_t dℓ_t
//   dS    = a_t dS                            (now the gradient w.r.t. S_{t−1})
// and d initial_state = dS at the end. States are recomputed: a first pass keeps S every `chunk` steps;
// then each segment's states are recomputed from its checkpoint before it is walked in reverse. Memory
// per task: ⌈T/chunk⌉ + chunk states of [P, N]; writes dx, ddt, dh0 and the task's Shares.
template <class T>
void recurrent_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                        const Tensor& Bm, const Tensor& Cm, const Tensor& D, const Tensor& h0, const SsdParams& p,
                        const SsdGrads& grads) {
  const Geo G = geo_of(x, Bm);
  const int64_t tasks = G.B * G.H, P = G.P, N = G.N, SZ = P * N;
  const int64_t K = std::min(p.chunk, std::max<int64_t>(G.T, 1)), nseg = (G.T + K - 1) / K;
  Shares<T> sh(G);
#pragma omp parallel for schedule(dynamic) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / G.H, h = task % G.H;
    const Head<T> X = head_of<T>(G, x, dt, A, Bm, Cm, D, h0, b, h);
    const T* dY = dout.data<T>() + G.row_x(b, h);
    T* dX = grads.dx.data<T>() + G.row_x(b, h);
    T* dDT = grads.ddt.data<T>() + G.row_dt(b, h);
    T* dB = sh.dB.data() + G.row_hn(b, h);
    T* dC = sh.dC.data() + G.row_hn(b, h);
    const int64_t ldh = G.H * N;
    std::vector<T> ckpt(static_cast<size_t>(std::max<int64_t>(nseg, 1) * SZ)), seg(static_cast<size_t>(K * SZ));
    std::vector<T> dS(dfinal.data<T>() + G.state(b, h), dfinal.data<T>() + G.state(b, h) + SZ);
    std::vector<T> cur(static_cast<size_t>(SZ), T(0)), u(static_cast<size_t>(P));
    if (X.h0) std::copy_n(X.h0, SZ, cur.begin());
    for (int64_t n = 0; n < nseg; ++n) {  // checkpoints: the state entering each segment
      std::copy(cur.begin(), cur.end(), ckpt.begin() + n * SZ);
      for (int64_t t = n * K; t < std::min(G.T, (n + 1) * K); ++t) {
        recurrent_step<T>(G, X.x + t * G.ldx(), X.dt[t * G.H], X.A, X.B + t * G.ldbc(), nullptr, T(0), cur.data(),
                          nullptr);
      }
    }
    double dA = 0, dD = 0;
    for (int64_t n = nseg - 1; n >= 0; --n) {
      const int64_t t0 = n * K, t1 = std::min(G.T, t0 + K);
      std::copy_n(ckpt.begin() + n * SZ, SZ, cur.begin());
      for (int64_t t = t0; t < t1; ++t) {  // seg[t − t0] = S_t
        recurrent_step<T>(G, X.x + t * G.ldx(), X.dt[t * G.H], X.A, X.B + t * G.ldbc(), nullptr, T(0), cur.data(),
                          nullptr);
        std::copy(cur.begin(), cur.end(), seg.begin() + (t - t0) * SZ);
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const T *St = seg.data() + (t - t0) * SZ, *Sp = t > t0 ? seg.data() + (t - t0 - 1) * SZ : ckpt.data() + n * SZ;
        const T *xt = X.x + t * G.ldx(), *Bt = X.B + t * G.ldbc(), *Ct = X.C + t * G.ldbc(), *dyt = dY + t * G.ldx();
        const T delta = X.dt[t * G.H];
        const T a = static_cast<T>(std::exp(static_cast<double>(delta) * X.A));
        T *dxt = dX + t * G.ldx(), *dBt = dB + t * ldh, *dCt = dC + t * ldh;
        std::fill_n(dCt, N, T(0));
        std::fill_n(dBt, N, T(0));
        double ddelta = 0, dlog = 0;
        for (int64_t q = 0; q < P; ++q) {
          T* ds = dS.data() + q * N;
          const T *st = St + q * N, *sp = Sp + q * N;
          const T dyq = dyt[q], xq = xt[q];
          dD += static_cast<double>(dyq) * xq;
          T uq = 0;
          double dl = 0;  // the log-decay's gradient sums over the whole state: in double
#pragma omp simd reduction(+ : uq, dl)
          for (int64_t k = 0; k < N; ++k) {
            ds[k] += dyq * Ct[k];
            dCt[k] += st[k] * dyq;
            uq += ds[k] * Bt[k];
            dBt[k] += delta * xq * ds[k];
            dl += static_cast<double>(ds[k]) * sp[k];
            ds[k] *= a;
          }
          dxt[q] = delta * uq + X.D * dyq;
          ddelta += static_cast<double>(xq) * uq;
          dlog += dl;
        }
        dlog *= a;
        dDT[t * G.H] = static_cast<T>(ddelta + X.A * dlog);
        dA += static_cast<double>(delta) * dlog;
      }
    }
    sh.dA[static_cast<size_t>(task)] = dA;
    sh.dD[static_cast<size_t>(task)] = dD;
    if (grads.dinitial_state.defined()) std::copy(dS.begin(), dS.end(), grads.dinitial_state.data<T>() + G.state(b, h));
  }
  reduce_shares(G, sh, grads);
}

// ---- chunkwise form -----------------------------------------------------------------------------

// Per-task scratch of the chunkwise kernels, for one chunk of C tokens.
template <class T>
struct ChunkScratch {
  std::vector<double> c;        // [C]: in-chunk cumulative log-decays c_r = Σ_{s ≤ r} Δ_s A (double)
  std::vector<T> W, Wp, dM;     // [C, C]: masked scores (with and without Δ_s), dy xᵀ
  std::vector<T> xs, ys;        // [C, P]: Δ- and decay-scaled rows of x; of dy
  std::vector<T> u, tn;         // [C, P], [C, N]: GEMM results before factors
  ChunkScratch(int64_t C, int64_t P, int64_t N)
      : c(C), W(C * C), Wp(C * C), dM(C * C), xs(C * P), ys(C * P), u(C * P), tn(C * N) {}
};

template <class T>
void cumulative_decays(const Head<T>& X, const Geo& G, int64_t t0, int64_t L, double* c) {
  double run = 0;
  for (int64_t r = 0; r < L; ++r) {
    run += static_cast<double>(X.dt[(t0 + r) * G.H]) * X.A;
    c[r] = run;
  }
}

// The chunk's masked scores: Wp_rs = (C_r · B_s) exp(c_r − c_s) for s ≤ r, 0 above the diagonal, and
// W_rs = Wp_rs Δ_s. One GEMM C Bᵀ, then the mask L in place. Touches W, Wp [L, L].
template <class T>
void masked_scores(const Head<T>& X, const Geo& G, int64_t t0, int64_t L, const double* c, T* W, T* Wp) {
  const T *Cc = X.C + t0 * G.ldbc(), *Bc = X.B + t0 * G.ldbc();
  gemm<T>(false, true, L, L, G.N, 1.0, Cc, G.ldbc(), Bc, G.ldbc(), 0.0, Wp, L);
  for (int64_t r = 0; r < L; ++r) {
    T *wp = Wp + r * L, *w = W + r * L;
    for (int64_t s = 0; s <= r; ++s) {
      wp[s] *= static_cast<T>(std::exp(c[r] - c[s]));
      w[s] = wp[s] * X.dt[(t0 + s) * G.H];
    }
    for (int64_t s = r + 1; s < L; ++s) wp[s] = w[s] = T(0);
  }
}

// Forward, chunk by chunk, with S the state entering the chunk of rows t0 … t0+L−1 (local r):
//   y_r = exp(c_r) S C_r                          (inter-chunk: one GEMM C Sᵀ, rows scaled)
//       + Σ_{s ≤ r} W_rs x_s                        (intra-chunk: the masked scores, one GEMM)
//       + D x_r
//   S  ← exp(c_last) S + Σ_s (exp(c_last − c_s) Δ_s x_s) B_sᵀ   (one GEMM)
// Memory: reads every input; writes y, final_state (the running state lives there); scratch per task:
// ChunkScratch.
template <class T>
void chunk_forward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                   const Tensor& D, const Tensor& h0, const SsdParams& p, const Tensor& y, const Tensor& fs) {
  const Geo G = geo_of(x, Bm);
  const int64_t tasks = G.B * G.H, P = G.P, N = G.N, C = p.chunk;
#pragma omp parallel if (G.parallel(tasks))
  {
    ChunkScratch<T> w(C, P, N);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / G.H, h = task % G.H;
      const Head<T> X = head_of<T>(G, x, dt, A, Bm, Cm, D, h0, b, h);
      T* S = fs.data<T>() + G.state(b, h);
      T* Y = y.data<T>() + G.row_x(b, h);
      if (X.h0) {
        std::copy_n(X.h0, P * N, S);
      } else {
        std::fill_n(S, P * N, T(0));
      }
      for (int64_t t0 = 0; t0 < G.T; t0 += C) {
        const int64_t L = std::min(C, G.T - t0);
        const T *Xc = X.x + t0 * G.ldx(), *Bc = X.B + t0 * G.ldbc(), *Cc = X.C + t0 * G.ldbc();
        T* Yc = Y + t0 * G.ldx();
        double* c = w.c.data();
        cumulative_decays(X, G, t0, L, c);
        // Inter: y = exp(c_r) (C S ᵀ)_r, plus the skip D x.
        gemm<T>(false, true, L, P, N, 1.0, Cc, G.ldbc(), S, N, 0.0, Yc, G.ldx());
        for (int64_t r = 0; r < L; ++r) {
          const T e = static_cast<T>(std::exp(c[r]));
          T* yr = Yc + r * G.ldx();
          const T* xr = Xc + r * G.ldx();
#pragma omp simd
          for (int64_t q = 0; q < P; ++q) yr[q] = e * yr[q] + X.D * xr[q];
        }
        // Intra: y += W x.
        masked_scores(X, G, t0, L, c, w.W.data(), w.Wp.data());
        gemm<T>(false, false, L, P, L, 1.0, w.W.data(), L, Xc, G.ldx(), 1.0, Yc, G.ldx());
        // State: S ← exp(c_last) S + x̂ᵀ B, x̂_s = exp(c_last − c_s) Δ_s x_s.
        const double clast = c[L - 1];
        scal(static_cast<T>(std::exp(clast)), S, P * N);
        for (int64_t s = 0; s < L; ++s) {
          const T f = static_cast<T>(std::exp(clast - c[s])) * X.dt[(t0 + s) * G.H];
          const T* xr = Xc + s * G.ldx();
          T* xs = w.xs.data() + s * P;
#pragma omp simd
          for (int64_t q = 0; q < P; ++q) xs[q] = f * xr[q];
        }
        gemm<T>(true, false, P, N, L, 1.0, w.xs.data(), P, Bc, G.ldbc(), 1.0, S, N);
      }
    }
  }
}

// Backward of the chunkwise form. First the state entering every chunk is recomputed (the forward's
// state recurrence, one GEMM per chunk; [chunks + 1, P, N] per task). Then chunks in reverse, with dS
// the gradient w.r.t. the state leaving the chunk (d final_state at first) and S the state entering it:
//   dM = dy xᵀ [L, L]                                                (one GEMM)
//   dx_s  = Σ_{r ≥ s} W_rs dy_r + Δ_s e^{c_last − c_s} dS B_s + D dy_s   (two GEMMs: Wᵀ dy, B dSᵀ)
//   dZ_rs = dM_rs e^{c_r − c_s} Δ_s (s ≤ r): dC = dZ B + e^{c_r} dy S, dB = dZᵀ C + x̂ dS   (four GEMMs)
//   dΔ_s (direct) = Σ_{r ≥ s} dM_rs Wp_rs + e^{c_last − c_s} x_s · (dS B_s)
//   dS ← e^{c_last} dS + (e^{c} ⊙ dy)ᵀ C                               (one GEMM)
// and d initial_state = dS. The log-decays ℓ_u = Δ_u A: every term carrying a factor e^{c_r − c_s}
// (the exponent Σ_{s < u ≤ r} ℓ_u) adds its value times its gradient to dℓ_u for each u it spans:
//   dℓ_u = e^{c_last} Σ dS ⊙ S                  (the state carried across the whole chunk)
//        + Σ_{r ≥ u} e^{c_r} dy_r · (S C_r)      (the entering state read at r ≥ u)
//        + Σ_{s < u} Δ_s e^{c_last − c_s} x_s · (dS B_s)   (rows written before u, read after the chunk)
//        + Σ_{s < u ≤ r} dM_rs W_rs              (pairs inside the chunk spanning u)
// each a sum of products of bounded factors (never a difference of cumulative sums); then
// dΔ_u += A dℓ_u and dA += Δ_u dℓ_u. Sums in double.
// Memory: reads every input, dy and dfinal; writes dx, ddt, dh0 and the task's Shares.
template <class T>
void chunk_backward(const Tensor& dout, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                    const Tensor& Bm, const Tensor& Cm, const Tensor& D, const Tensor& h0, const SsdParams& p,
                    const SsdGrads& grads) {
  const Geo G = geo_of(x, Bm);
  const int64_t tasks = G.B * G.H, P = G.P, N = G.N, C = p.chunk, SZ = P * N;
  const int64_t nc = (G.T + C - 1) / C, ldh = G.H * N;
  Shares<T> sh(G);
#pragma omp parallel if (G.parallel(tasks))
  {
    ChunkScratch<T> w(C, P, N);
    std::vector<T> states, dS(static_cast<size_t>(SZ));
    std::vector<double> dlog(static_cast<size_t>(C)), ddir(static_cast<size_t>(C)), q_in(static_cast<size_t>(C)),
        r_out(static_cast<size_t>(C));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / G.H, h = task % G.H;
      const Head<T> X = head_of<T>(G, x, dt, A, Bm, Cm, D, h0, b, h);
      const T* dY = dout.data<T>() + G.row_x(b, h);
      T* dX = grads.dx.data<T>() + G.row_x(b, h);
      T* dDT = grads.ddt.data<T>() + G.row_dt(b, h);
      T* dBh = sh.dB.data() + G.row_hn(b, h);
      T* dCh = sh.dC.data() + G.row_hn(b, h);
      double* c = w.c.data();
      // States entering each chunk; states[nc] = S_T.
      states.assign(static_cast<size_t>((nc + 1) * SZ), T(0));
      if (X.h0) std::copy_n(X.h0, SZ, states.begin());
      for (int64_t n = 0; n < nc; ++n) {
        const int64_t t0 = n * C, L = std::min(C, G.T - t0);
        T* S = states.data() + (n + 1) * SZ;
        std::copy_n(states.data() + n * SZ, SZ, S);
        cumulative_decays(X, G, t0, L, c);
        scal(static_cast<T>(std::exp(c[L - 1])), S, SZ);
        for (int64_t s = 0; s < L; ++s) {
          const T f = static_cast<T>(std::exp(c[L - 1] - c[s])) * X.dt[(t0 + s) * G.H];
          const T* xr = X.x + (t0 + s) * G.ldx();
          for (int64_t q = 0; q < P; ++q) w.xs[s * P + q] = f * xr[q];
        }
        gemm<T>(true, false, P, N, L, 1.0, w.xs.data(), P, X.B + t0 * G.ldbc(), G.ldbc(), 1.0, S, N);
      }
      std::copy_n(dfinal.data<T>() + G.state(b, h), SZ, dS.begin());
      double dA = 0, dD = 0;
      for (int64_t n = nc - 1; n >= 0; --n) {
        const int64_t t0 = n * C, L = std::min(C, G.T - t0);
        const T* S = states.data() + n * SZ;
        const T *Xc = X.x + t0 * G.ldx(), *Bc = X.B + t0 * G.ldbc(), *Cc = X.C + t0 * G.ldbc(), *dYc = dY + t0 * G.ldx();
        T *dXc = dX + t0 * G.ldx(), *dBc = dBh + t0 * ldh, *dCc = dCh + t0 * ldh;
        cumulative_decays(X, G, t0, L, c);
        const double clast = c[L - 1];
        masked_scores(X, G, t0, L, c, w.W.data(), w.Wp.data());
        // dM = dy xᵀ; dx = Wᵀ dy + D dy.
        gemm<T>(false, true, L, L, P, 1.0, dYc, G.ldx(), Xc, G.ldx(), 0.0, w.dM.data(), L);
        gemm<T>(true, false, L, P, L, 1.0, w.W.data(), L, dYc, G.ldx(), 0.0, dXc, G.ldx());
        for (int64_t r = 0; r < L; ++r) {
          axpy(X.D, dYc + r * G.ldx(), dXc + r * G.ldx(), P);
          dD += static_cast<double>(dot(dYc + r * G.ldx(), Xc + r * G.ldx(), P));
        }
        // Through the leaving state: u = B dSᵀ (u_s = dS B_s); dx_s += Δ_s e^{c_last − c_s} u_s;
        // dB_s = x̂_s dS with x̂_s = Δ_s e^{c_last − c_s} x_s; r_out_s = x̂_s · u_s; dΔ_s direct x_s · u_s e^{…}.
        gemm<T>(false, true, L, P, N, 1.0, Bc, G.ldbc(), dS.data(), N, 0.0, w.u.data(), P);
        for (int64_t s = 0; s < L; ++s) {
          const double e = std::exp(clast - c[s]), delta = X.dt[(t0 + s) * G.H];
          const T f = static_cast<T>(e * delta);
          const T *us = w.u.data() + s * P, *xr = Xc + s * G.ldx();
          T* xs = w.xs.data() + s * P;
          T* dxs = dXc + s * G.ldx();
          double xu = 0;
          for (int64_t q = 0; q < P; ++q) {
            xs[q] = f * xr[q];
            dxs[q] += f * us[q];
            xu += static_cast<double>(xr[q]) * us[q];
          }
          ddir[s] = e * xu;
          r_out[s] = delta * e * xu;
        }
        gemm<T>(false, false, L, N, P, 1.0, w.xs.data(), P, dS.data(), N, 0.0, dBc, ldh);
        // Inside the chunk: dΔ_s += Σ_r dM_rs Wp_rs; the scores' gradient dZ_rs = dM_rs e^{c_r − c_s} Δ_s
        // (kept in w.W, which is no longer needed).
        for (int64_t r = 0; r < L; ++r) {
          const T *dm = w.dM.data() + r * L, *wp = w.Wp.data() + r * L;
          T* dz = w.W.data() + r * L;
          for (int64_t s = 0; s <= r; ++s) {
            ddir[s] += static_cast<double>(dm[s]) * wp[s];
            dz[s] = dm[s] * static_cast<T>(std::exp(c[r] - c[s])) * X.dt[(t0 + s) * G.H];
          }
        }
        // dℓ_u from the pairs inside the chunk: Σ_{r ≥ u} Σ_{s < u} dM_rs W_rs (W_rs = Wp_rs Δ_s), one
        // running prefix over s per row r.
        std::fill_n(dlog.begin(), L, 0.0);
        for (int64_t r = 1; r < L; ++r) {
          const T *dm = w.dM.data() + r * L, *wp = w.Wp.data() + r * L;
          double run = 0;
          for (int64_t u = 1; u <= r; ++u) {
            run += static_cast<double>(dm[u - 1]) * wp[u - 1] * X.dt[(t0 + u - 1) * G.H];
            dlog[u] += run;
          }
        }
        gemm<T>(false, false, L, N, L, 1.0, w.W.data(), L, Bc, G.ldbc(), 0.0, dCc, ldh);
        gemm<T>(true, false, L, N, L, 1.0, w.W.data(), L, Cc, G.ldbc(), 1.0, dBc, ldh);
        // The entering state: tn = dy S [L, N]; dC_r += e^{c_r} tn_r; q_in_r = e^{c_r} tn_r · C_r.
        gemm<T>(false, false, L, N, P, 1.0, dYc, G.ldx(), S, N, 0.0, w.tn.data(), N);
        for (int64_t r = 0; r < L; ++r) {
          const double e = std::exp(c[r]);
          const T *tr = w.tn.data() + r * N, *cr = Cc + r * G.ldbc();
          T* dcr = dCc + r * ldh;
          axpy(static_cast<T>(e), tr, dcr, N);
          double tc = 0;
          for (int64_t k = 0; k < N; ++k) tc += static_cast<double>(tr[k]) * cr[k];
          q_in[r] = e * tc;
        }
        // The carried state: e^{c_last} Σ dS ⊙ S.
        double carry = 0;
        for (int64_t i = 0; i < SZ; ++i) carry += static_cast<double>(dS[i]) * S[i];
        carry *= std::exp(clast);
        // dℓ_u = carry + Σ_{r ≥ u} q_in_r + Σ_{s < u} r_out_s + pairs.
        double suffix = 0;
        for (int64_t u = L - 1; u >= 0; --u) {
          suffix += q_in[u];
          dlog[u] += carry + suffix;
        }
        double prefix = 0;
        for (int64_t u = 0; u < L; ++u) {
          dlog[u] += prefix;
          prefix += r_out[u];
        }
        for (int64_t u = 0; u < L; ++u) {
          const double delta = X.dt[(t0 + u) * G.H];
          dDT[(t0 + u) * G.H] = static_cast<T>(ddir[u] + X.A * dlog[u]);
          dA += delta * dlog[u];
        }
        // dS ← e^{c_last} dS + (e^{c} ⊙ dy)ᵀ C.
        for (int64_t r = 0; r < L; ++r) {
          const T e = static_cast<T>(std::exp(c[r]));
          const T* dyr = dYc + r * G.ldx();
          for (int64_t q = 0; q < P; ++q) w.ys[r * P + q] = e * dyr[q];
        }
        scal(static_cast<T>(std::exp(clast)), dS.data(), SZ);
        gemm<T>(true, false, P, N, L, 1.0, w.ys.data(), P, Cc, G.ldbc(), 1.0, dS.data(), N);
      }
      sh.dA[static_cast<size_t>(task)] = dA;
      sh.dD[static_cast<size_t>(task)] = dD;
      if (grads.dinitial_state.defined()) {
        std::copy(dS.begin(), dS.end(), grads.dinitial_state.data<T>() + G.state(b, h));
      }
    }
  }
  reduce_shares(G, sh, grads);
}

void forward_cpu(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& Cm,
                 const Tensor& D, const Tensor& h0, const SsdParams& p, const Tensor& y, const Tensor& fs) {
  dispatch_float(x.dtype(), "ssd", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == SsdForm::recurrent) {
      recurrent_forward<T>(x, dt, A, Bm, Cm, D, h0, y, fs);
    } else {
      chunk_forward<T>(x, dt, A, Bm, Cm, D, h0, p, y, fs);
    }
  });
}

void backward_cpu(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& dt, const Tensor& A,
                  const Tensor& Bm, const Tensor& Cm, const Tensor& D, const Tensor& h0, const SsdParams& p,
                  const SsdGrads& grads) {
  dispatch_float(x.dtype(), "ssd backward", [&](auto tag) {
    using T = decltype(tag);
    if (p.form == SsdForm::recurrent) {
      recurrent_backward<T>(dy, dfinal, x, dt, A, Bm, Cm, D, h0, p, grads);
    } else {
      chunk_backward<T>(dy, dfinal, x, dt, A, Bm, Cm, D, h0, p, grads);
    }
  });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(ssd_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(ssd_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the inputs (contiguous); the backward is the kernel of the same form.
SsdOutput ssd(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, const Tensor& D,
              const Tensor& initial_state, const SsdOptions& opts) {
  kernel::resolve(opts, kernel::check_inputs(x, dt, A, B, C, D, initial_state));
  const Tensor xc = kernel::contiguous(x), dtc = kernel::contiguous(dt), Ac = kernel::contiguous(A),
               Bc = kernel::contiguous(B), Cc = kernel::contiguous(C), Dc = kernel::contiguous_or_none(D),
               h0c = kernel::contiguous_or_none(initial_state);
  SsdOutput out = kernel::ssd_forward(xc, dtc, Ac, Bc, Cc, Dc, h0c, opts);
  record("ssd", {x, dt, A, B, C, D, initial_state}, {&out.y, &out.final_state}, {xc, dtc, Ac, Bc, Cc, Dc, h0c},
         [opts](const std::vector<Tensor>& gr, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::SsdGrads d =
               kernel::ssd_backward(gr[0], gr[1], s[0], s[1], s[2], s[3], s[4], s[5], s[6], opts, need);
           return std::vector<Tensor>{d.dx, d.ddt, d.dA, d.dB, d.dC, d.dD, d.dinitial_state};
         });
  return out;
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "ssd";
  s.summary =
      "Mamba-2 SSD: S_t = exp(dt_t A) S_{t−1} + dt_t x_t B_tᵀ, y_t = S_t C_t + D x_t; x [B, T, H, P], dt [B, T, H] "
      "(≥ 0), A [H] (≤ 0), B, C [B, T, G, N] (head h reads group h / (H/G)), D [H] (optional), initial_state "
      "[B, H, P, N] (optional), final_state = S_T";
  s.inputs = {{"x"}, {"dt"}, {"A"}, {"B"}, {"C"}, {"D", OpInputKind::floating, true},
              {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"y", "final_state"};
  s.attrs = {{"form", AttrType::string, "chunkwise", "chunkwise (training, the SSD dual form) or recurrent (step by step)"},
             {"chunk", AttrType::integer, "64", "tokens per chunk (recurrent: steps between backward checkpoints)"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    SsdOptions o{parse_ssd_form(a.get_string("form")), a.get_int("chunk")};
    SsdOutput out = ssd(in[0], in[1], in[2], in[3], in[4], in[5], in[6], o);
    return std::vector<Tensor>{out.y, out.final_state};
  };
  // T = 7 with chunks of 3 (the last partial); H = 4 heads in G = 2 groups; P ≠ N; Δ in [0.05, 1.5],
  // A in [−2, −0.2]; D and an initial state.
  s.example = [](Generator& gen, DType dtype) {
    const int64_t B = 2, T = 7, H = 4, P = 3, G = 2, N = 5;
    return std::vector<Tensor>{Tensor::randn({B, T, H, P}, gen, dtype), Tensor::rand({B, T, H}, gen, dtype, 0.05, 1.5),
                               Tensor::rand({H}, gen, dtype, -2.0, -0.2),  Tensor::randn({B, T, G, N}, gen, dtype),
                               Tensor::randn({B, T, G, N}, gen, dtype),    Tensor::randn({H}, gen, dtype),
                               Tensor::randn({B, H, P, N}, gen, dtype)};
  };
  s.example_attrs = {{"chunk", "3"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
