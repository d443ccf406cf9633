// CPU kernels of the optimizer steps and the gradient norm (slots: src/tensor/slots/optim.h).
// Elementwise, so the result does not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/bf16_convert.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"
#include "tensor/slots/optim.h"

namespace seqlab::cpu {
using kernel::AdamWStep;
using kernel::SgdStep;

namespace {

// The update of one parameter element in its compute type S (f32 or f64). With a master w (f32, for
// a bf16 parameter) the update reads and writes w[i], and p[i] gets the same value, rounded to p's
// dtype. AdamW takes bf16 itself (tensor/bf16_convert.h): a bf16 p with its f32 master, f32 moments
// and a gradient in bf16 or f32 (an F32GradAccumulator's sum) is updated in place, p is never read,
// and each p[i] is bf16(w[i]), the bits of the dispatch layer's f32 stand-ins without their copies.
// SGD the same; the gradient norm's sum of squares and the clipping scale take bf16 gradients too.

// p is P (S, or bf16 with S = float), g is G (P or S); m, v and w are S.
template <class P, class G>
void adamw_update(const AdamWStep& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                  const Tensor& w) {
  using S = compute_t<P>;
  P* pp = p.data<P>();
  S* wp = nullptr;
  if constexpr (std::is_same_v<P, S>) {
    wp = w.defined() ? w.data<S>() : pp;
  } else {
    wp = w.data<S>();
  }
  const G* gp = g.data<G>();
  S* mp = m.data<S>();
  S* vp = v.data<S>();
  const S lr = S(s.lr), lr_wd = S(s.lr * s.weight_decay), eps = S(s.eps);
  const S b1 = S(s.beta1), c1 = S(1.0 - s.beta1), b2 = S(s.beta2), c2 = S(1.0 - s.beta2);
  const S inv_bc1 = S(1.0 / s.bias_correction1), inv_bc2 = S(1.0 / s.bias_correction2);
  parallel_for(p.numel(), kParallelGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const S gi = from_storage(gp[i]);
      S pi = wp[i];
      pi -= lr_wd * pi;
      const S mi = b1 * mp[i] + c1 * gi;
      const S vi = b2 * vp[i] + c2 * gi * gi;
      mp[i] = mi;
      vp[i] = vi;
      pi -= lr * (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
      wp[i] = pi;
      pp[i] = to_storage<P>(pi);
    }
  });
}

void adamw_step_cpu(const AdamWStep& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                    const Tensor& w) {
  if (p.dtype() == DType::bf16) {
    const bool native = w.defined() && bf16_on_cpu::native_bf16({}, {&w, &m, &v}) &&
                        (g.dtype() == DType::bf16 || g.dtype() == DType::f32);
    if (!native) return bf16_on_cpu::call_on_standins(&adamw_step_cpu, s, p, g, m, v, w);
    if (g.dtype() == DType::bf16) return adamw_update<bf16, bf16>(s, p, g, m, v, w);
    return adamw_update<bf16, float>(s, p, g, m, v, w);
  }
  dispatch_float(p.dtype(), "adamw_step", [&](auto tag) {
    using S = decltype(tag);
    adamw_update<S, S>(s, p, g, m, v, w);
  });
}

// As adamw_update: p is P, g is G (P or S), the momentum buffer b and w are S.
template <class P, class G>
void sgd_update(const SgdStep& s, const Tensor& p, const Tensor& g, const Tensor& b, const Tensor& w) {
  using S = compute_t<P>;
  P* pp = p.data<P>();
  S* wp = nullptr;
  if constexpr (std::is_same_v<P, S>) {
    wp = w.defined() ? w.data<S>() : pp;
  } else {
    wp = w.data<S>();
  }
  const G* gp = g.data<G>();
  S* bp = b.defined() ? b.data<S>() : nullptr;
  const S lr = S(s.lr), lr_wd = S(s.lr * s.weight_decay), mu = S(s.momentum);
  const bool nesterov = s.nesterov;
  parallel_for(p.numel(), kParallelGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const S gi = from_storage(gp[i]);
      S pi = wp[i];
      pi -= lr_wd * pi;
      S d = gi;
      if (bp) {
        const S bi = mu * bp[i] + gi;
        bp[i] = bi;
        d = nesterov ? gi + mu * bi : bi;
      }
      pi -= lr * d;
      wp[i] = pi;
      pp[i] = to_storage<P>(pi);
    }
  });
}

void sgd_step_cpu(const SgdStep& s, const Tensor& p, const Tensor& g, const Tensor& b, const Tensor& w) {
  if (p.dtype() == DType::bf16) {
    const bool native = w.defined() && bf16_on_cpu::native_bf16({}, {&w, &b}) &&
                        (g.dtype() == DType::bf16 || g.dtype() == DType::f32);
    if (!native) return bf16_on_cpu::call_on_standins(&sgd_step_cpu, s, p, g, b, w);
    if (g.dtype() == DType::bf16) return sgd_update<bf16, bf16>(s, p, g, b, w);
    return sgd_update<bf16, float>(s, p, g, b, w);
  }
  dispatch_float(p.dtype(), "sgd_step", [&](auto tag) {
    using S = decltype(tag);
    sgd_update<S, S>(s, p, g, b, w);
  });
}

// Fixed blocks summed in order: the same bits whatever the thread count. A bf16 x is read as it is
// (bf16 -> float -> double is exact, the value its f32 stand-in would give).
void sum_squares_cpu(const Tensor& x, const Tensor& out) {
  constexpr int64_t kBlock = 1 << 15;
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  dispatch_float_or_bf16(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      double acc = 0.0;
      const int64_t end = std::min(n, (b + 1) * kBlock);
      for (int64_t i = b * kBlock; i < end; ++i) {
        const double e = convert_scalar<double>(p[i]);
        acc += e * e;
      }
      partial[static_cast<size_t>(b)] = acc;
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  out.data<double>()[0] = total;
}

// x ← s·x, computed in compute_t<T> and rounded once (bf16).
void scale_inplace_cpu(const Tensor& x, double s) {
  dispatch_float_or_bf16(x.dtype(), "scale_inplace", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    T* p = x.data<T>();
    const S k = S(s);
    parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = to_storage<T>(k * from_storage(p[i]));
    });
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(adamw_step_kernel, DeviceType::CPU, &cpu::adamw_step_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sgd_step_kernel, DeviceType::CPU, &cpu::sgd_step_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sum_squares_kernel, DeviceType::CPU, &cpu::sum_squares_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(scale_inplace_kernel, DeviceType::CPU, &cpu::scale_inplace_cpu);
}  // namespace seqlab::kernel
