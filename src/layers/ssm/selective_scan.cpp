// The Mamba selective scan: the raw entry points, the CPU kernels (forward and backward side by side),
// the autograd node and the registry entry. Equations in selective_scan.h; the derivations in
// docs/variants/mamba.md.
//
// How the CPU kernels work:
// - Every channel d of every batch entry b is its own recurrence over an N-vector state, so the
//   forward is one task per (b, group of 16 channels), OpenMP over the tasks, time sequential inside.
// - Chunk-major loops: a task walks the chunks and, inside each, its channels, so that the chunk's rows
//   of B, C (and of the backward's dB, dC partials) stay in cache across channels at any T — time then
//   grows linearly with T (bench/selective_scan_bench.cpp checks it).
// - The backward's dB and dC sum over the channels (B_t and C_t are shared by all of them). Channels
//   are cut into kGroups fixed groups; task (b, group) walks its channels and adds into its own [T, N]
//   partials, which are then summed over the groups in group order — no atomics,
//   and the same bits for any thread count. dA, dD and d delta_bias sum over the batch the same way
//   (per-b partials, summed in b order).
// - Memory: the chunked forward saves ⌈T/chunk⌉ states per channel; the backward holds, per task,
//   one chunk of recomputed states and decays ((2·chunk + 1)·N) and the running gradients dh of its
//   channels (D/8·N). Every buffer comes
//   from the tensor allocator, so tests/selective_scan_test.cc measures the op's peak there.
// - Decays are exp(Δ·A) with Δ ≥ 0 and A < 0: factors in (0, 1] that never overflow; a state is never
//   recovered by dividing by a decay (it is recomputed from a checkpoint).
#include "layers/ssm/selective_scan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/variant_inputs.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {

namespace {

const FormNames<SelectiveScanForm>& scan_forms() {
  static const FormNames<SelectiveScanForm> forms{
      "selective_scan", {{"chunked", SelectiveScanForm::chunked}, {"recurrent", SelectiveScanForm::recurrent}}};
  return forms;
}

}  // namespace

const char* selective_scan_form_name(SelectiveScanForm form) { return scan_forms().name(form); }
SelectiveScanForm parse_selective_scan_form(const std::string& s) { return scan_forms().parse(s); }

namespace kernel {

namespace {

struct Dims {
  int64_t B, T, D, N;
};

constexpr const char* kLayout =
    "u, delta [B, T, D], A [D, N], B, C [B, T, N], D [D] or none, z [B, T, D] or none, delta_bias [D] or none, "
    "initial_state [B, D, N] or none";

Dims check_inputs(const SelectiveScanInputs& x) {
  const VariantInputs in("selective_scan",
                         {{"u", x.u},
                          {"delta", x.delta},
                          {"A", x.A},
                          {"B", x.B},
                          {"C", x.C},
                          {"D", x.D},
                          {"z", x.z},
                          {"delta_bias", x.delta_bias},
                          {"initial_state", x.initial_state}},
                         kLayout);
  in.given({"u", "delta", "A", "B", "C"});
  if (x.u.dim() != 3) in.fail("u must have 3 dimensions [B, T, D]");
  if (x.A.dim() != 2) in.fail("A must have 2 dimensions [D, N]");
  const Dims d{x.u.size(0), x.u.size(1), x.u.size(2), x.A.size(1)};
  if (d.D == 0 || d.N == 0) in.fail("the channels D and the state size N must be positive");
  in.shaped("delta", x.u.shape(), "[B, T, D] (u's shape)");
  in.shaped("A", {d.D, d.N}, "[D, N] (D = u's last dim)");
  in.shaped("B", {d.B, d.T, d.N}, "[B, T, N] (N = A's last dim)");
  in.shaped("C", {d.B, d.T, d.N}, "[B, T, N] (N = A's last dim)");
  in.shaped("D", {d.D}, "[D]");
  in.shaped("z", x.u.shape(), "[B, T, D] (u's shape)");
  in.shaped("delta_bias", {d.D}, "[D]");
  in.shaped("initial_state", {d.B, d.D, d.N}, "[B, D, N]");
  const DType dt = x.u.dtype();
  if (!is_floating(dt)) in.fail(std::string("inputs must be f32, f64 or bf16, got u ") + dtype_name(dt));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"delta", &x.delta}, {"A", &x.A}, {"B", &x.B},
                                {"C", &x.C}, {"D", &x.D}, {"z", &x.z}, {"delta_bias", &x.delta_bias},
                                {"initial_state", &x.initial_state}}) {
    if (!t->defined()) continue;
    if (t->dtype() != dt) {
      in.fail(std::string("inputs must share one dtype, got u ") + dtype_name(dt) + " and " + name + " " +
              dtype_name(t->dtype()));
    }
    if (t->device() != x.u.device()) {
      in.fail("inputs are on different devices (u on " + x.u.device().str() + ", " + name + " on " +
              t->device().str() + ")");
    }
  }
  return d;
}

// A chunk is never longer than the sequence (a longer one is the same single chunk).
SelectiveScanParams resolve(const SelectiveScanOptions& opts, const Dims& d) {
  if (opts.chunk <= 0) {
    throw std::invalid_argument("selective_scan: chunk must be positive, got " + std::to_string(opts.chunk));
  }
  return {opts.form, std::min(opts.chunk, std::max<int64_t>(1, d.T)), opts.delta_softplus};
}

int64_t chunks_of(const Dims& d, const SelectiveScanParams& p) { return (d.T + p.chunk - 1) / p.chunk; }

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

SelectiveScanInputs contiguous_inputs(const SelectiveScanInputs& x) {
  return {kernel::contiguous(x.u), kernel::contiguous(x.delta), kernel::contiguous(x.A),
          kernel::contiguous(x.B), kernel::contiguous(x.C), contiguous_or_none(x.D),
          contiguous_or_none(x.z), contiguous_or_none(x.delta_bias), contiguous_or_none(x.initial_state)};
}

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (t.defined() && (t.shape() != shape || t.dtype() != dtype)) {
    throw std::invalid_argument(std::string("selective_scan backward: ") + what + " is " + shape_str(t.shape()) +
                                " " + dtype_name(t.dtype()) + ", expected " + shape_str(shape) + " " +
                                dtype_name(dtype));
  }
}

}  // namespace

SelectiveScanRaw selective_scan_forward(const SelectiveScanInputs& in, const SelectiveScanOptions& opts) {
  const Dims d = check_inputs(in);
  const SelectiveScanParams p = resolve(opts, d);
  const DType dt = in.u.dtype();
  const Device dev = in.u.device();
  SelectiveScanRaw out{Tensor::empty({d.B, d.T, d.D}, dt, dev), Tensor::empty({d.B, d.D, d.N}, dt, dev), Tensor()};
  if (p.form == SelectiveScanForm::chunked) out.checkpoints = Tensor::empty({d.B, chunks_of(d, p), d.D, d.N}, dt, dev);
  selective_scan_forward_kernel(dev, contiguous_inputs(in), p, out.y, out.final_state, out.checkpoints);
  return out;
}

SelectiveScanGrads selective_scan_backward(const Tensor& dy, const Tensor& dfinal, const SelectiveScanInputs& in,
                                           const Tensor& checkpoints, const SelectiveScanOptions& opts,
                                           const std::vector<bool>& need) {
  const Dims d = check_inputs(in);
  const SelectiveScanParams p = resolve(opts, d);
  if (need.size() != 9) throw std::invalid_argument("selective_scan backward: need one flag per input (9)");
  const DType dt = in.u.dtype();
  const Device dev = in.u.device();
  const Shape y_shape{d.B, d.T, d.D}, s_shape{d.B, d.D, d.N};
  check_like(dy, y_shape, dt, "dy");
  check_like(dfinal, s_shape, dt, "dfinal");
  check_like(checkpoints, {d.B, chunks_of(d, p), d.D, d.N}, dt, "checkpoints");
  // du, ddelta, dA, dB, dC come out of one pass in every case; the optional inputs' gradients only
  // where asked for.
  SelectiveScanGrads g;
  g.du = Tensor::empty(y_shape, dt, dev);
  g.ddelta = Tensor::empty(y_shape, dt, dev);
  g.dA = Tensor::empty(in.A.shape(), dt, dev);
  g.dB = Tensor::empty(in.B.shape(), dt, dev);
  g.dC = Tensor::empty(in.C.shape(), dt, dev);
  if (need[5] && in.D.defined()) g.dD = Tensor::empty({d.D}, dt, dev);
  if (need[6] && in.z.defined()) g.dz = Tensor::empty(y_shape, dt, dev);
  if (need[7] && in.delta_bias.defined()) g.ddelta_bias = Tensor::empty({d.D}, dt, dev);
  if (need[8] && in.initial_state.defined()) g.dinitial_state = Tensor::empty(s_shape, dt, dev);
  const Tensor dY = dy.defined() ? kernel::contiguous(dy) : Tensor::zeros(y_shape, dt, dev);
  const Tensor dF = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dt, dev);
  selective_scan_backward_kernel(dev, dY, dF, contiguous_inputs(in), contiguous_or_none(checkpoints), p, g);
  if (!need[0]) g.du = Tensor();
  if (!need[1]) g.ddelta = Tensor();
  if (!need[2]) g.dA = Tensor();
  if (!need[3]) g.dB = Tensor();
  if (!need[4]) g.dC = Tensor();
  return g;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::SelectiveScanGrads;
using kernel::SelectiveScanInputs;
using kernel::SelectiveScanParams;

// Channel groups of the backward: fixed, so the order of every sum is the same on any thread count.
constexpr int64_t kGroups = 8;
// Channels per forward task (the forward sums nothing across channels: any split gives the same bits).
constexpr int64_t kForwardChannels = 16;

template <class T>
inline T softplus(T x) {
  return (x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::fabs(x)));  // log(1 + eˣ), stable at both ends
}

// One channel's view of the inputs: pointers at (b, 0, d) of the [B, T, D] tensors (stride D per
// step), at (b, 0, 0) of B and C (stride N), at row d of A, and the channel's scalars.
template <class T>
struct Channel {
  const T *u, *delta, *z, *A, *B, *C, *h0;
  T D, bias;
  int64_t ld;  // D: the step stride of u, delta, z, y
};

struct Geo {
  int64_t B, T, D, N;
  bool parallel(int64_t tasks) const { return tasks > 1 && B * T * D * N > kParallelGrain; }
};

Geo geo_of(const SelectiveScanInputs& in) { return {in.u.size(0), in.u.size(1), in.u.size(2), in.A.size(1)}; }

template <class T>
Channel<T> channel_of(const Geo& G, const SelectiveScanInputs& in, int64_t b, int64_t d) {
  const int64_t row = b * G.T * G.D + d;
  return {in.u.data<T>() + row,
          in.delta.data<T>() + row,
          in.z.defined() ? in.z.data<T>() + row : nullptr,
          in.A.data<T>() + d * G.N,
          in.B.data<T>() + b * G.T * G.N,
          in.C.data<T>() + b * G.T * G.N,
          in.initial_state.defined() ? in.initial_state.data<T>() + (b * G.D + d) * G.N : nullptr,
          in.D.defined() ? in.D.data<T>()[d] : T(0),
          in.delta_bias.defined() ? in.delta_bias.data<T>()[d] : T(0),
          G.D};
}

// Δ_t of a channel and, for the backward, dΔ/d delta = σ(delta + bias) (1 without softplus).
template <class T>
inline T step_of(const Channel<T>& X, int64_t t, bool sp, T* slope = nullptr) {
  const T x = X.delta[t * X.ld] + X.bias;
  if (slope) *slope = sp ? math::sigmoid(x) : T(1);
  return sp ? softplus(x) : x;
}

// One step h ← exp(Δ A) ⊙ h + Δ u B_t for one channel; returns C_t · h (the new state's readout). The
// decays go to `a` where given (the backward reuses them). Vectorised over N (math::exp_vec: a polynomial
// for f32, libm for f64).
template <class T>
inline T scan_step(const Channel<T>& X, int64_t t, int64_t N, T dt, T* h, T* a = nullptr) {
  const T du = dt * X.u[t * X.ld];
  const T *Bt = X.B + t * N, *Ct = X.C + t * N, *A = X.A;
  T acc = 0;
  if (a) {
#pragma omp simd reduction(+ : acc)
    for (int64_t n = 0; n < N; ++n) {
      a[n] = math::exp_vec(dt * A[n]);
      h[n] = a[n] * h[n] + du * Bt[n];
      acc += Ct[n] * h[n];
    }
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t n = 0; n < N; ++n) {
      h[n] = math::exp_vec(dt * A[n]) * h[n] + du * Bt[n];
      acc += Ct[n] * h[n];
    }
  }
  return acc;
}

// Forward. Task (b, group of kForwardChannels channels) walks the chunks in order and, inside a chunk,
// its channels one after another (chunk-major, so that the chunk's rows of B and C stay in cache across
// the channels, whatever T): per channel, [checkpoint h at the chunk start], then for each step of the
// chunk h ← exp(Δ A) ⊙ h + Δ u B_t, y_t = (C_t·h + D u_t) ⊙ silu(z_t). The states live in final_state.
// Memory: reads the inputs, writes y, final_state and the checkpoints; no scratch.
template <class T>
void forward(const SelectiveScanInputs& in, const SelectiveScanParams& p, const Tensor& y, const Tensor& fs,
             const Tensor& ckpt) {
  const Geo G = geo_of(in);
  const int64_t K = p.chunk, nc = (G.T + K - 1) / K, N = G.N;
  const int64_t groups = (G.D + kForwardChannels - 1) / kForwardChannels, tasks = G.B * groups;
#pragma omp parallel for schedule(static) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / groups, d0 = (task % groups) * kForwardChannels;
    const int64_t d1 = std::min(G.D, d0 + kForwardChannels);
    for (int64_t d = d0; d < d1; ++d) {
      const Channel<T> X = channel_of<T>(G, in, b, d);
      T* h = fs.data<T>() + (b * G.D + d) * N;
      if (X.h0) {
        std::copy_n(X.h0, N, h);
      } else {
        std::fill_n(h, N, T(0));
      }
    }
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t t0 = c * K, t1 = std::min(G.T, t0 + K);
      for (int64_t d = d0; d < d1; ++d) {
        const Channel<T> X = channel_of<T>(G, in, b, d);
        T* h = fs.data<T>() + (b * G.D + d) * N;
        T* Y = y.data<T>() + b * G.T * G.D + d;
        if (ckpt.defined()) std::copy_n(h, N, ckpt.data<T>() + ((b * nc + c) * G.D + d) * N);
        for (int64_t t = t0; t < t1; ++t) {
          const T dt = step_of(X, t, p.delta_softplus);
          T out = scan_step(X, t, N, dt, h) + X.D * X.u[t * X.ld];
          if (X.z) out *= X.z[t * X.ld] * math::sigmoid(X.z[t * X.ld]);
          Y[t * X.ld] = out;
        }
      }
    }
  }
}

// Backward. Task (b, group) walks the chunks from the last and, inside a chunk, the group's channels one
// after another (chunk-major, as the forward: the chunk's rows of B, C and of the task's dB, dC partials
// stay in cache whatever T). Per channel: the chunk's states are recomputed from its checkpoint into S
// (S[0] the entering state, S[i + 1] the state after step t0 + i; the decays into `dec`), then the steps
// are walked in reverse with the channel's running dh = ∂L/∂h_t (the equations in selective_scan.h).
// Without checkpoints (the recurrent form) the task first runs its channels forward to make them, into
// its `ck`. Writes du, ddelta, dz, d initial_state per channel; adds dB, dC into the task's partials
// [T, N] and dA, dD, d delta_bias into per-b partials.
template <class T>
void backward(const Tensor& dy, const Tensor& dfinal, const SelectiveScanInputs& in, const Tensor& ckpt,
              const SelectiveScanParams& p, const SelectiveScanGrads& g) {
  const Geo G = geo_of(in);
  const int64_t N = G.N, K = p.chunk, nc = (G.T + K - 1) / K;
  const int64_t groups = std::min(kGroups, G.D), per = (G.D + groups - 1) / groups, tasks = G.B * groups;
  const DType dt = in.u.dtype();
  // Partials: dB, dC per (b, group) [T, N]; dA [B, D, N], dD and d delta_bias [B, D] per b.
  const Tensor pB = Tensor::zeros({G.B, groups, G.T, N}, dt), pC = Tensor::zeros({G.B, groups, G.T, N}, dt);
  const Tensor pA = Tensor::zeros({G.B, G.D, N}, dt), pD = Tensor::zeros({G.B, G.D}, dt),
               pbias = Tensor::zeros({G.B, G.D}, dt);
  const bool has_z = in.z.defined();
#pragma omp parallel for schedule(dynamic) if (G.parallel(tasks))
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / groups, grp = task % groups;
    const int64_t d0 = std::min(G.D, grp * per), d1 = std::min(G.D, d0 + per), P = d1 - d0;
    // The task's scratch: S [(K + 1)·N], the chunk's decays [K·N], every channel's dh [P·N], and the
    // recurrent form's checkpoints [P·nc·N].
    const Tensor scratch = Tensor::empty({(2 * K + 1) * N + P * N + (ckpt.defined() ? 0 : P * nc * N)}, dt);
    T *S = scratch.data<T>(), *dec = S + (K + 1) * N, *dhs = dec + K * N, *ck = dhs + P * N;
    T* dBp = pB.data<T>() + (b * groups + grp) * G.T * N;
    T* dCp = pC.data<T>() + (b * groups + grp) * G.T * N;
    for (int64_t d = d0; d < d1; ++d) {
      const Channel<T> X = channel_of<T>(G, in, b, d);
      std::copy_n(dfinal.data<T>() + (b * G.D + d) * N, N, dhs + (d - d0) * N);
      if (ckpt.defined()) continue;
      T* own = ck + (d - d0) * nc * N;  // this channel's checkpoints
      if (X.h0) {
        std::copy_n(X.h0, N, S);
      } else {
        std::fill_n(S, N, T(0));
      }
      for (int64_t t = 0; t < G.T; ++t) {
        if (t % K == 0) std::copy_n(S, N, own + (t / K) * N);
        scan_step(X, t, N, step_of(X, t, p.delta_softplus), S);
      }
    }
    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t t0 = c * K, L = std::min(K, G.T - t0);
      for (int64_t d = d0; d < d1; ++d) {
        const Channel<T> X = channel_of<T>(G, in, b, d);
        const int64_t row = b * G.T * G.D + d;
        const T* dY = dy.data<T>() + row;
        T *dU = g.du.data<T>() + row, *dDel = g.ddelta.data<T>() + row;
        T* dZ = g.dz.defined() ? g.dz.data<T>() + row : nullptr;
        T* dA = pA.data<T>() + (b * G.D + d) * N;
        T* dh = dhs + (d - d0) * N;
        // Running sums over the channel's steps (from the last), kept in the per-b partials.
        T& dD = pD.data<T>()[b * G.D + d];
        T& dbias = pbias.data<T>()[b * G.D + d];
        std::copy_n(ckpt.defined() ? ckpt.data<T>() + ((b * nc + c) * G.D + d) * N : ck + ((d - d0) * nc + c) * N, N,
                    S);
        for (int64_t i = 0; i < L; ++i) {
          std::copy_n(S + i * N, N, S + (i + 1) * N);
          scan_step(X, t0 + i, N, step_of(X, t0 + i, p.delta_softplus), S + (i + 1) * N, dec + i * N);
        }
        for (int64_t i = L - 1; i >= 0; --i) {
          const int64_t t = t0 + i;
          const T *hp = S + i * N, *hc = S + (i + 1) * N, *at = dec + i * N, *Bt = X.B + t * N, *Ct = X.C + t * N;
          const T* A = X.A;
          T slope;
          const T delta_t = step_of(X, t, p.delta_softplus, &slope), ut = X.u[t * X.ld];
          T gy = dY[t * X.ld];
          if (has_z) {
            // ŷ_t recomputed from the state; d silu(z)/dz = σ(z)(1 + z(1 − σ(z))).
            T yhat = 0;
#pragma omp simd reduction(+ : yhat)
            for (int64_t n = 0; n < N; ++n) yhat += Ct[n] * hc[n];
            yhat += X.D * ut;
            const T zt = X.z[t * X.ld], s = math::sigmoid(zt);
            if (dZ) dZ[t * X.ld] = gy * yhat * s * (T(1) + zt * (T(1) - s));
            gy *= zt * s;
          }
          dD += gy * ut;
          T du = 0, ddt = 0;
          T *dBt = dBp + t * N, *dCt = dCp + t * N;
          const T dtu = delta_t * ut;
#pragma omp simd reduction(+ : du, ddt)
          for (int64_t n = 0; n < N; ++n) {
            const T dhn = dh[n] + gy * Ct[n];
            dCt[n] += gy * hc[n];
            const T ahp = at[n] * hp[n];
            ddt += dhn * (A[n] * ahp + ut * Bt[n]);
            dA[n] += dhn * delta_t * ahp;
            dBt[n] += dhn * dtu;
            du += dhn * Bt[n];
            dh[n] = dhn * at[n];
          }
          dU[t * X.ld] = X.D * gy + delta_t * du;
          const T ddel = ddt * slope;
          dDel[t * X.ld] = ddel;
          dbias += ddel;
        }
      }
    }
    if (g.dinitial_state.defined()) {
      for (int64_t d = d0; d < d1; ++d) {
        std::copy_n(dhs + (d - d0) * N, N, g.dinitial_state.data<T>() + (b * G.D + d) * N);
      }
    }
  }
  // The sums over channel groups (dB, dC) and over the batch (dA, dD, d delta_bias), in a fixed order.
  parallel_for(G.B * G.T * N, kParallelGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / (G.T * N), r = i % (G.T * N);
      T sb = 0, sc = 0;
      for (int64_t k = 0; k < groups; ++k) {
        sb += pB.data<T>()[(b * groups + k) * G.T * N + r];
        sc += pC.data<T>()[(b * groups + k) * G.T * N + r];
      }
      g.dB.data<T>()[i] = sb;
      g.dC.data<T>()[i] = sc;
    }
  });
  for (int64_t i = 0; i < G.D * N; ++i) {
    T s = 0;
    for (int64_t b = 0; b < G.B; ++b) s += pA.data<T>()[b * G.D * N + i];
    g.dA.data<T>()[i] = s;
  }
  for (int64_t d = 0; d < G.D; ++d) {
    T sd = 0, sb = 0;
    for (int64_t b = 0; b < G.B; ++b) {
      sd += pD.data<T>()[b * G.D + d];
      sb += pbias.data<T>()[b * G.D + d];
    }
    if (g.dD.defined()) g.dD.data<T>()[d] = sd;
    if (g.ddelta_bias.defined()) g.ddelta_bias.data<T>()[d] = sb;
  }
}

void forward_cpu(const SelectiveScanInputs& in, const SelectiveScanParams& p, const Tensor& y, const Tensor& fs,
                 const Tensor& ckpt) {
  dispatch_float(in.u.dtype(), "selective_scan", [&](auto tag) { forward<decltype(tag)>(in, p, y, fs, ckpt); });
}

void backward_cpu(const Tensor& dy, const Tensor& dfinal, const SelectiveScanInputs& in, const Tensor& ckpt,
                  const SelectiveScanParams& p, const SelectiveScanGrads& g) {
  dispatch_float(in.u.dtype(), "selective_scan backward",
                 [&](auto tag) { backward<decltype(tag)>(dy, dfinal, in, ckpt, p, g); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(selective_scan_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(selective_scan_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the inputs (contiguous) and, in the chunked form, the checkpoints — the
// only state the backward gets from the forward. The backward is the kernel above.
SelectiveScanOutput selective_scan(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                   const Tensor& C, const Tensor& D, const Tensor& z, const Tensor& delta_bias,
                                   const Tensor& initial_state, const SelectiveScanOptions& opts) {
  const std::vector<Tensor> inputs{u, delta, A, B, C, D, z, delta_bias, initial_state};
  kernel::SelectiveScanInputs in{u, delta, A, B, C, D, z, delta_bias, initial_state};
  kernel::resolve(opts, kernel::check_inputs(in));
  in = kernel::contiguous_inputs(in);
  // Without a graph to record (decoding, no_grad) nothing needs the checkpoints.
  SelectiveScanOptions run = opts;
  if (!any_requires_grad(inputs)) run.form = SelectiveScanForm::recurrent;
  kernel::SelectiveScanRaw raw = kernel::selective_scan_forward(in, run);
  SelectiveScanOutput out{raw.y, raw.final_state};
  record("selective_scan", inputs, {&out.y, &out.final_state},
         {in.u, in.delta, in.A, in.B, in.C, in.D, in.z, in.delta_bias, in.initial_state, raw.checkpoints},
         [opts](const std::vector<Tensor>& gr, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           const kernel::SelectiveScanInputs x{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]};
           kernel::SelectiveScanGrads d = kernel::selective_scan_backward(gr[0], gr[1], x, s[9], opts, need);
           return std::vector<Tensor>{d.du, d.ddelta, d.dA, d.dB, d.dC, d.dD, d.dz, d.ddelta_bias, d.dinitial_state};
         });
  return out;
}

Tensor selective_scan_decay(const Tensor& delta, const Tensor& A, const Tensor& delta_bias, bool delta_softplus) {
  if (delta.dim() != 3 || A.dim() != 2 || A.size(0) != delta.size(2) ||
      (delta_bias.defined() && delta_bias.shape() != Shape{A.size(0)})) {
    throw std::invalid_argument("selective_scan_decay: expected delta [B, T, D], A [D, N], delta_bias [D] or none; got "
                                "delta " + shape_or_undefined(delta) + ", A " + shape_or_undefined(A) +
                                ", delta_bias " + shape_or_undefined(delta_bias));
  }
  Tensor x = delta_bias.defined() ? add(delta, delta_bias) : delta;
  if (delta_softplus) x = softplus(x);
  return exp(mul(unsqueeze(sum(x, {1}), -1), A));  // [B, D, 1] ⊙ [D, N] → [B, D, N]
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "selective_scan";
  s.summary =
      "Δ_t = softplus(delta_t + delta_bias), h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t u_t B_t, y_t = (C_t·h_t + D u_t) ⊙ "
      "silu(z_t); u, delta, z [B, T, D], A [D, N], B, C [B, T, N], D, delta_bias [D], initial_state [B, D, N] "
      "(D, z, delta_bias, initial_state optional), final_state = h_T";
  s.inputs = {{"u"},
              {"delta"},
              {"A"},
              {"B"},
              {"C"},
              {"D", OpInputKind::floating, true},
              {"z", OpInputKind::floating, true},
              {"delta_bias", OpInputKind::floating, true},
              {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"y", "final_state"};
  s.attrs = {{"form", AttrType::string, "chunked", "chunked (training: checkpoints every chunk) or recurrent"},
             {"chunk", AttrType::integer, "64", "steps per chunk (the backward's checkpoint spacing)"},
             {"delta_softplus", AttrType::boolean, "true", "Δ = softplus(delta + delta_bias); false: delta + delta_bias"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    SelectiveScanOptions o{parse_selective_scan_form(a.get_string("form")), a.get_int("chunk"),
                           a.get_bool("delta_softplus")};
    SelectiveScanOutput out = selective_scan(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], o);
    return std::vector<Tensor>{out.y, out.final_state};
  };
  // T = 7 with chunks of 3 (the last partial); D = 3 channels, N = 5 states; every optional input; A
  // negative, delta around 0 (Δ ≈ 0.3 … 1.3).
  s.example = [](Generator& gen, DType dtype) {
    const int64_t B = 2, T = 7, D = 3, N = 5;
    return std::vector<Tensor>{Tensor::randn({B, T, D}, gen, dtype),
                               Tensor::rand({B, T, D}, gen, dtype, -1.0, 1.0),
                               Tensor::rand({D, N}, gen, dtype, -1.5, -0.2),
                               Tensor::randn({B, T, N}, gen, dtype),
                               Tensor::randn({B, T, N}, gen, dtype),
                               Tensor::randn({D}, gen, dtype),
                               Tensor::randn({B, T, D}, gen, dtype),
                               Tensor::rand({D}, gen, dtype, -0.5, 0.5),
                               Tensor::randn({B, D, N}, gen, dtype)};
  };
  s.example_attrs = {{"chunk", "3"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
