// Rotary position embedding: the raw entry point, the CPU kernel (forward and backward are the
// same rotation with the angle's sign flipped), the autograd node, the naive reference and the
// registry entry. The equations are in rope.h.
#include "layers/attention/rope.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/sequence_parallel.h"
#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace kernel {

namespace {

void check_input(const Tensor& x, const RopeOptions& opts) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("rope: " + why + " (got x " +
                                (x.defined() ? shape_str(x.shape()) : std::string("undefined")) +
                                "; expected x [B, T, H, D] with D even)");
  };
  if (!x.defined()) fail("x must be given");
  if (x.dim() != 4) fail("x must have 4 dimensions");
  if (x.size(3) % 2 != 0) fail("the head dim D must be even: dims are rotated in pairs");
  if (!is_floating(x.dtype())) {
    fail(std::string("x must be f32, f64 or bf16, got ") + dtype_name(x.dtype()));
  }
  if (!(opts.base > 0)) fail("base must be positive, got " + std::to_string(opts.base));
  if (opts.start < 0) fail("start must be ≥ 0, got " + std::to_string(opts.start));
}

}  // namespace

Tensor rope_rotate(const Tensor& x, const RopeOptions& opts, bool inverse) {
  check_input(x, opts);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel() > 0) rope_kernel(x.device(), kernel::contiguous(x), opts, inverse, y);
  return y;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernel
namespace cpu {
namespace {

// θ_i = base^(−2i/D) for i < D/2, in double: positions reach 1e5 and more, where an f32 angle
// p·θ_i would already be off by a sizeable fraction of a radian.
std::vector<double> inverse_frequencies(double base, int64_t D) {
  std::vector<double> theta(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    theta[static_cast<size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  }
  return theta;
}

// y_{2i} = x_{2i} c − x_{2i+1} s,  y_{2i+1} = x_{2i} s + x_{2i+1} c  with c = cos φ, s = ±sin φ,
// φ = (start + t) θ_i (s = −sin φ for the inverse rotation, the backward).
// First a table of cos φ and sin φ over [T, D/2], computed once per (t, i) in double and stored
// in T, not once per batch entry and head; then one parallel pass over the B·T rows of H·D
// elements applies it to every head.
// Memory: reads x, writes y (both [B, T, H, D]); scratch: the [T, D/2] cos and sin tables.
template <class T>
void rotate(const Tensor& x, const RopeOptions& opts, bool inverse, const Tensor& y) {
  const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3), P = D / 2;
  const std::vector<double> theta = inverse_frequencies(opts.base, D);
  std::vector<T> cos_t(static_cast<size_t>(Tn * P)), sin_t(cos_t.size());
  const double sign = inverse ? -1.0 : 1.0;
  parallel_for(Tn, std::max<int64_t>(1, kParallelGrain / 32 / std::max<int64_t>(1, P)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = static_cast<double>(opts.start + t);
      for (int64_t i = 0; i < P; ++i) {
        const double phi = pos * theta[static_cast<size_t>(i)];
        cos_t[static_cast<size_t>(t * P + i)] = static_cast<T>(std::cos(phi));
        sin_t[static_cast<size_t>(t * P + i)] = static_cast<T>(sign * std::sin(phi));
      }
    }
  });
  const T* X = x.data<T>();
  T* Y = y.data<T>();
  const int64_t row = H * D;
  parallel_for(B * Tn, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, row)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % Tn;
      const T *c = cos_t.data() + t * P, *s = sin_t.data() + t * P;
      for (int64_t h = 0; h < H; ++h) {
        const T* xh = X + r * row + h * D;
        T* yh = Y + r * row + h * D;
#pragma omp simd
        for (int64_t i = 0; i < P; ++i) {
          const T x0 = xh[2 * i], x1 = xh[2 * i + 1];
          yh[2 * i] = x0 * c[i] - x1 * s[i];
          yh[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
      }
    }
  });
}

void rotate_cpu(const Tensor& x, const RopeOptions& opts, bool inverse, const Tensor& y) {
  dispatch_float(x.dtype(), "rope", [&](auto tag) { rotate<decltype(tag)>(x, opts, inverse, y); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(rope_kernel, DeviceType::CPU, &cpu::rotate_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op. Forward y = R(φ) x; backward dx = R(−φ) dy. Nothing is saved.
Tensor rope(const Tensor& x, const RopeOptions& opts) {
  Tensor y = kernel::rope_rotate(x, opts, false);
  record("rope", {x}, {&y}, {}, [opts](const std::vector<Tensor>& g, const std::vector<Tensor>&, const std::vector<bool>&) {
    return std::vector<Tensor>{kernel::rope_rotate(g[0], opts, true)};
  });
  return y;
}

// cos φ and sin φ as [T, 1, D/2] tables (broadcast over B and H); x viewed as [B, T, H, D/2, 2]
// split into its even and odd lanes; the rotated lanes stacked back into pairs.
Tensor rope_reference(const Tensor& x, const RopeOptions& opts) {
  kernel::check_input(x, opts);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), P = D / 2;
  std::vector<double> c(static_cast<size_t>(T * P)), s(c.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < P; ++i) {
      const double phi = static_cast<double>(opts.start + t) *
                         std::pow(opts.base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      c[static_cast<size_t>(t * P + i)] = std::cos(phi);
      s[static_cast<size_t>(t * P + i)] = std::sin(phi);
    }
  }
  const Tensor cos_phi = Tensor::from_vector(c, {T, 1, P}, x.dtype(), x.device());
  const Tensor sin_phi = Tensor::from_vector(s, {T, 1, P}, x.dtype(), x.device());
  Tensor pairs = reshape(x, {B, T, H, P, 2});
  Tensor even = squeeze(narrow(pairs, 4, 0, 1), 4), odd = squeeze(narrow(pairs, 4, 1, 1), 4);
  Tensor y_even = even * cos_phi - odd * sin_phi;
  Tensor y_odd = even * sin_phi + odd * cos_phi;
  return reshape(stack({y_even, y_odd}, 4), {B, T, H, D});
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "rope";
  s.summary =
      "y = R(p·θ_i) x on pairs (x_{2i}, x_{2i+1}), θ_i = base^(−2i/D), p = start + t; x [B, T, H, D], D even";
  s.inputs = {{"x"}};
  s.outputs = {"y"};
  s.attrs = {{"base", AttrType::number, "10000", "base of the rotary frequencies θ_i = base^(−2i/D)"},
             {"start", AttrType::integer, "0", "position of the first token (its offset in a KV cache)"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return std::vector<Tensor>{rope(in[0], {a.get_number("base"), a.get_int("start")})};
  };
  // D = 6: three frequencies; a small base and an offset so that the angles are far from 0.
  s.example = [](Generator& gen, DType dtype) { return std::vector<Tensor>{Tensor::randn({2, 5, 3, 6}, gen, dtype)}; };
  s.example_attrs = {{"base", "100"}, {"start", "3"}};
  return s;
}()));

}  // namespace
// Rotary embedding under sequence parallelism: each of the rank's two chunks at its global start.
Tensor sequence_rope(const Tensor& x, double base, const SequenceGroup& g) {
  const int64_t c = sequence_chunk_len(x.size(1), "sequence_rope");
  RopeOptions a{base, g.chunk(0) * c}, b{base, g.chunk(1) * c};
  return concat({rope(narrow(x, 1, 0, c), a), rope(narrow(x, 1, c, c), b)}, 1);
}


}  // namespace seqlab
