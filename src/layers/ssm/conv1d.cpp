// The causal depthwise convolution: the raw entry points, the CPU kernels (forward and backward side
// by side), the autograd node and the registry entry. Equations in conv1d.h; the derivation in
// docs/variants/conv1d.md.
//
// How the CPU kernels work:
// - The padded input p = initial_state ++ x is never materialised: row u of p is read from
//   initial_state (u < W−1), from x (u ≥ W−1), or from a row of zeros when no initial state is given.
// - Forward and dx: one pass over the rows of the output, OpenMP over B·T rows, each row a few
//   contiguous loops over the C channels. Every product is stored to a scratch row before it is
//   added, so that the compiler (which contracts a·b + c into an FMA under -march=x86-64-v3) rounds
//   the product on its own, as the primitive mul and add kernels do (conv1d.h, "Arithmetic").
// - dweight and dbias: sums over B·T, OpenMP over blocks of channels (each block's sums in one
//   thread, in the order of time, in double): deterministic whatever the thread count.
// - silu: dz = dy σ(z)(1 + z(1 − σ(z))) with z recomputed row by row, through the same scalar
//   formulas as the primitive silu op (tensor/elementwise_math.h).
#include "layers/ssm/conv1d.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {
namespace kernel {

namespace {

struct Dims {
  int64_t B, T, C, W;
};

Dims check_inputs(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& h0) {
  const VariantInputs in("causal_conv1d", {{"x", x}, {"weight", weight}, {"bias", bias}, {"initial_state", h0}},
                         "x [B, T, C], weight [W, C] with 1 ≤ W ≤ " + std::to_string(kMaxConv1dWidth) +
                             ", bias [C] or none, initial_state [B, W−1, C] or none");
  in.given({"x", "weight"});
  if (x.dim() != 3) in.fail("x must have 3 dimensions [B, T, C]");
  if (weight.dim() != 2) in.fail("weight must have 2 dimensions [W, C]");
  const Dims d{x.size(0), x.size(1), x.size(2), weight.size(0)};
  if (d.W < 1 || d.W > kMaxConv1dWidth) {
    // The bound is the op's (tensor/slots/ssm/conv1d.h, kMaxConv1dWidth): a short convolution, whose taps
    // the CUDA kernels hold in registers.
    in.fail("the width W = " + std::to_string(d.W) + " is not in 1 … " + std::to_string(kMaxConv1dWidth) +
            " (a short convolution; a wider one needs another algorithm)");
  }
  if (weight.size(1) != d.C) in.fail("weight must have one column per channel of x (C = " + std::to_string(d.C) + ")");
  in.shaped("bias", {d.C}, "[C]");
  in.shaped("initial_state", {d.B, d.W - 1, d.C}, "[B, W−1, C] (the W − 1 inputs before x_0)");
  const DType dt = x.dtype();
  if (!is_floating(dt)) in.fail(std::string("inputs must be f32, f64 or bf16, got x ") + dtype_name(dt));
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"weight", &weight}, {"bias", &bias}, {"initial_state", &h0}}) {
    if (!t->defined()) continue;
    if (t->dtype() != dt) {
      in.fail(std::string("inputs must share one dtype, got x ") + dtype_name(dt) + " and " + name + " " +
              dtype_name(t->dtype()));
    }
    if (t->device() != x.device()) {
      in.fail("inputs are on different devices (x on " + x.device().str() + ", " + name + " on " + t->device().str() +
              ")");
    }
  }
  return d;
}

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? kernel::contiguous(t) : t; }

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (t.defined() && (t.shape() != shape || t.dtype() != dtype)) {
    throw std::invalid_argument(std::string("causal_conv1d backward: ") + what + " is " + shape_str(t.shape()) + " " +
                                dtype_name(t.dtype()) + ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

Conv1dOutput conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                            bool silu) {
  const Dims d = check_inputs(x, weight, bias, initial_state);
  Conv1dOutput out{Tensor::empty({d.B, d.T, d.C}, x.dtype(), x.device()),
                   Tensor::empty({d.B, d.W - 1, d.C}, x.dtype(), x.device())};
  if (out.y.numel() > 0 || out.final_state.numel() > 0) {
    conv1d_forward_kernel(x.device(), kernel::contiguous(x), kernel::contiguous(weight), contiguous_or_none(bias),
                          contiguous_or_none(initial_state), silu, out.y, out.final_state);
  }
  return out;
}

Conv1dGrads conv1d_backward(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& initial_state, bool silu, const std::vector<bool>& need) {
  const Dims d = check_inputs(x, weight, bias, initial_state);
  if (need.size() != 4) throw std::invalid_argument("causal_conv1d backward: need one flag per input (4)");
  const Shape y_shape{d.B, d.T, d.C}, s_shape{d.B, d.W - 1, d.C};
  const DType dt = x.dtype();
  check_like(dy, y_shape, dt, "dy");
  check_like(dfinal, s_shape, dt, "dfinal");
  Conv1dGrads g;
  if (need[0]) g.dx = Tensor::empty(x.shape(), dt, x.device());
  if (need[1]) g.dweight = Tensor::empty(weight.shape(), dt, x.device());
  if (need[2] && bias.defined()) g.dbias = Tensor::empty(bias.shape(), dt, x.device());
  if (need[3] && initial_state.defined()) g.dinitial_state = Tensor::empty(s_shape, dt, x.device());
  if (!g.dx.defined() && !g.dweight.defined() && !g.dbias.defined() && !g.dinitial_state.defined()) return g;
  const Tensor dY = dy.defined() ? kernel::contiguous(dy) : Tensor::zeros(y_shape, dt, x.device());
  const Tensor dF = dfinal.defined() ? kernel::contiguous(dfinal) : Tensor::zeros(s_shape, dt, x.device());
  conv1d_backward_kernel(x.device(), dY, dF, kernel::contiguous(x), kernel::contiguous(weight),
                         contiguous_or_none(bias), contiguous_or_none(initial_state), silu, g);
  return g;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

// Rows of the padded input p = initial_state ++ x of one batch entry: row u < W−1 from initial_state
// (or zeros), row u ≥ W−1 is x_{u−(W−1)}.
template <class T>
struct Padded {
  const T* x;      // [B, T, C]
  const T* h0;     // [B, W−1, C] or null
  const T* zeros;  // [C]
  int64_t T_, C, halo;

  const T* row(int64_t b, int64_t u) const {
    if (u >= halo) return x + (b * T_ + u - halo) * C;
    return h0 != nullptr ? h0 + (b * halo + u) * C : zeros;
  }
};

// z = Σ_{j<W} w_j ⊙ p_{t+W−1−j} (+ b) for one row of C channels, in the order j = 0 … W−1, each
// product rounded through the scratch row `prod` before its add (no FMA: conv1d.h, "Arithmetic").
template <class T>
void conv_row(const Padded<T>& P, int64_t b, int64_t t, const T* w, const T* bias, int64_t W, T* z, T* prod) {
  const int64_t C = P.C;
  const T* p0 = P.row(b, t + W - 1);
  for (int64_t c = 0; c < C; ++c) z[c] = p0[c] * w[c];
  for (int64_t j = 1; j < W; ++j) {
    const T* pj = P.row(b, t + W - 1 - j);
    const T* wj = w + j * C;
    for (int64_t c = 0; c < C; ++c) prod[c] = pj[c] * wj[c];
    for (int64_t c = 0; c < C; ++c) z[c] = z[c] + prod[c];
  }
  if (bias != nullptr) {
    for (int64_t c = 0; c < C; ++c) z[c] = z[c] + bias[c];
  }
}

// Memory: reads x (and initial_state) W times from cache, writes y and final_state once.
template <class T>
void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& h0, bool silu, const Tensor& y,
             const Tensor& final_state) {
  const int64_t B = x.size(0), Tn = x.size(1), C = x.size(2), W = weight.size(0), halo = W - 1;
  const std::vector<T> zeros(static_cast<size_t>(C), T(0));
  const Padded<T> P{x.data<T>(), h0.defined() ? h0.data<T>() : nullptr, zeros.data(), Tn, C, halo};
  const T* w = weight.data<T>();
  const T* bs = bias.defined() ? bias.data<T>() : nullptr;
  T* Y = y.data<T>();
  parallel_for(B * Tn, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C * W)), [&](int64_t r0, int64_t r1) {
    std::vector<T> prod(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      T* z = Y + r * C;
      conv_row(P, r / Tn, r % Tn, w, bs, W, z, prod.data());
      if (silu) {
        for (int64_t c = 0; c < C; ++c) z[c] = math::unary_forward(kernel::UnaryOp::silu, z[c], T(0));
      }
    }
  });
  // final_state_i = p_{T+i}: the last W − 1 rows of the padded input.
  T* F = final_state.numel() > 0 ? final_state.data<T>() : nullptr;
  for (int64_t b = 0; F != nullptr && b < B; ++b) {
    for (int64_t i = 0; i < halo; ++i) std::copy_n(P.row(b, Tn + i), C, F + (b * halo + i) * C);
  }
}

// Channels per task of the weight and bias gradients: their sums over B·T run in one thread each.
constexpr int64_t kChannelBlock = 64;

// Memory: reads dy (and dfinal), x, initial_state; writes dz [B, T, C] as scratch when silu (else dz is
// dy itself), then dx, dinitial_state, dweight and dbias once each.
template <class T>
void backward(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Tensor& h0, bool silu, const kernel::Conv1dGrads& g) {
  const int64_t B = x.size(0), Tn = x.size(1), C = x.size(2), W = weight.size(0), halo = W - 1;
  const std::vector<T> zeros(static_cast<size_t>(C), T(0));
  const Padded<T> P{x.data<T>(), h0.defined() ? h0.data<T>() : nullptr, zeros.data(), Tn, C, halo};
  const T* w = weight.data<T>();
  const T* bs = bias.defined() ? bias.data<T>() : nullptr;
  const int64_t row_grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C * W));

  // dz_t = dy_t ⊙ silu'(z_t), z_t recomputed; without silu dz = dy.
  std::vector<T> dz_buf;
  const T* dz = dy.data<T>();
  if (silu) {
    dz_buf.resize(static_cast<size_t>(B * Tn * C));
    const T* dY = dy.data<T>();
    parallel_for(B * Tn, row_grain, [&](int64_t r0, int64_t r1) {
      std::vector<T> z(static_cast<size_t>(C)), prod(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) {
        conv_row(P, r / Tn, r % Tn, w, bs, W, z.data(), prod.data());
        T* d = dz_buf.data() + r * C;
        for (int64_t c = 0; c < C; ++c) {
          d[c] = math::unary_backward(kernel::UnaryOp::silu, dY[r * C + c], z[c], T(0), T(0));
        }
      }
    });
    dz = dz_buf.data();
  }

  // dp_u = Σ_j w_j ⊙ dz_{u−(W−1)+j} over the outputs that read row u, summed from j = W−1 down to 0
  // (the order in which the autograd engine accumulated the shifted products of the composed
  // convolution), each product rounded before its add; then + dfinal_{u−T} for u ≥ T. Rows u < W−1 are
  // dinitial_state, the others dx.
  T* dX = g.dx.defined() ? g.dx.data<T>() : nullptr;
  T* dH = g.dinitial_state.defined() ? g.dinitial_state.data<T>() : nullptr;
  const T* dF = dfinal.numel() > 0 ? dfinal.data<T>() : nullptr;
  const int64_t U = halo + Tn;
  if (dX != nullptr || dH != nullptr) {
    parallel_for(B * U, row_grain, [&](int64_t r0, int64_t r1) {
      std::vector<T> prod(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / U, u = r % U;
        T* out = u < halo ? (dH != nullptr ? dH + (b * halo + u) * C : nullptr)
                          : (dX != nullptr ? dX + (b * Tn + u - halo) * C : nullptr);
        if (out == nullptr) continue;
        bool first = true;
        for (int64_t j = W - 1; j >= 0; --j) {
          const int64_t t = u - halo + j;
          if (t < 0 || t >= Tn) continue;
          const T* d = dz + (b * Tn + t) * C;
          const T* wj = w + j * C;
          if (first) {
            for (int64_t c = 0; c < C; ++c) out[c] = d[c] * wj[c];
            first = false;
          } else {
            for (int64_t c = 0; c < C; ++c) prod[c] = d[c] * wj[c];
            for (int64_t c = 0; c < C; ++c) out[c] = out[c] + prod[c];
          }
        }
        if (first) std::fill_n(out, C, T(0));
        if (dF != nullptr && u >= Tn) {
          const T* f = dF + (b * halo + u - Tn) * C;
          for (int64_t c = 0; c < C; ++c) out[c] = out[c] + f[c];
        }
      }
    });
  }

  // dw_j = Σ_{b,t} dz_t ⊙ p_{t+W−1−j},  db = Σ_{b,t} dz_t: per block of channels, in double.
  T* dWt = g.dweight.defined() ? g.dweight.data<T>() : nullptr;
  T* dB = g.dbias.defined() ? g.dbias.data<T>() : nullptr;
  if (dWt == nullptr && dB == nullptr) return;
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const int64_t block_work = std::max<int64_t>(1, B * Tn * (W + 1) * std::min(C, kChannelBlock));
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / block_work), [&](int64_t k0, int64_t k1) {
    std::vector<double> acc_w(static_cast<size_t>(W * kChannelBlock)), acc_b(static_cast<size_t>(kChannelBlock));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t c0 = k * kChannelBlock, n = std::min(kChannelBlock, C - c0);
      std::fill(acc_w.begin(), acc_w.end(), 0.0);
      std::fill(acc_b.begin(), acc_b.end(), 0.0);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < Tn; ++t) {
          const T* d = dz + (b * Tn + t) * C + c0;
          for (int64_t j = 0; j < W; ++j) {
            const T* p = P.row(b, t + halo - j) + c0;
            double* a = acc_w.data() + j * kChannelBlock;
            for (int64_t c = 0; c < n; ++c) a[c] += static_cast<double>(d[c]) * static_cast<double>(p[c]);
          }
          for (int64_t c = 0; c < n; ++c) acc_b[static_cast<size_t>(c)] += static_cast<double>(d[c]);
        }
      }
      for (int64_t j = 0; dWt != nullptr && j < W; ++j) {
        for (int64_t c = 0; c < n; ++c)
          dWt[j * C + c0 + c] = static_cast<T>(acc_w[static_cast<size_t>(j * kChannelBlock + c)]);
      }
      for (int64_t c = 0; dB != nullptr && c < n; ++c) dB[c0 + c] = static_cast<T>(acc_b[static_cast<size_t>(c)]);
    }
  });
}

void forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& h0, bool silu,
                 const Tensor& y, const Tensor& final_state) {
  dispatch_float(x.dtype(), "causal_conv1d",
                 [&](auto tag) { forward<decltype(tag)>(x, weight, bias, h0, silu, y, final_state); });
}

void backward_cpu(const Tensor& dy, const Tensor& dfinal, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& h0, bool silu, const kernel::Conv1dGrads& g) {
  dispatch_float(x.dtype(), "causal_conv1d backward",
                 [&](auto tag) { backward<decltype(tag)>(dy, dfinal, x, weight, bias, h0, silu, g); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(conv1d_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(conv1d_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves the inputs (contiguous); the backward recomputes z from them.
Conv1dOutput causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                           bool silu) {
  kernel::check_inputs(x, weight, bias, initial_state);
  const Tensor xc = kernel::contiguous(x), wc = kernel::contiguous(weight), bc = kernel::contiguous_or_none(bias),
               h0c = kernel::contiguous_or_none(initial_state);
  Conv1dOutput out = kernel::conv1d_forward(xc, wc, bc, h0c, silu);
  record("causal_conv1d", {x, weight, bias, initial_state}, {&out.y, &out.final_state}, {xc, wc, bc, h0c},
         [silu](const std::vector<Tensor>& gr, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::Conv1dGrads d = kernel::conv1d_backward(gr[0], gr[1], s[0], s[1], s[2], s[3], silu, need);
           return std::vector<Tensor>{d.dx, d.dweight, d.dbias, d.dinitial_state};
         });
  return out;
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "causal_conv1d";
  s.summary =
      "y_t = act(Σ_{j<W} w_j ⊙ x_{t−j} + b), x_{t−j<0} from initial_state; x [B, T, C], weight [W, C] (W ≤ 4), "
      "bias [C] (optional), initial_state [B, W−1, C] (optional), final_state = the last W−1 inputs; "
      "act = silu or identity";
  s.inputs = {{"x"}, {"weight"}, {"bias", OpInputKind::floating, true}, {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"y", "final_state"};
  s.attrs = {{"silu", AttrType::boolean, "false", "apply SiLU to the output (y = z σ(z))"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    Conv1dOutput out = causal_conv1d(in[0], in[1], in[2], in[3], a.get_bool("silu"));
    return std::vector<Tensor>{out.y, out.final_state};
  };
  // W = 4 over T = 5 (the first three outputs reach into the initial state), C = 3, with a bias and SiLU.
  s.example = [](Generator& gen, DType dtype) {
    const int64_t B = 2, T = 5, C = 3, W = 4;
    return std::vector<Tensor>{Tensor::randn({B, T, C}, gen, dtype), Tensor::randn({W, C}, gen, dtype, 0.5),
                               Tensor::randn({C}, gen, dtype), Tensor::randn({B, W - 1, C}, gen, dtype)};
  };
  s.example_attrs = {{"silu", "true"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
