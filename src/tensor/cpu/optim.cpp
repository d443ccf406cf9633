// CPU kernels of the optimizer steps and the gradient norm (slots: src/tensor/slots/optim.h).
// Elementwise, so the result does not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
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

// AdamW's per-element constants in the compute type S, and the update of elements [begin, end): the one
// definition both AdamW kernels run, so the per-tensor and the multi-tensor kernel give the same bits
// (GCC contracts a·b + c into FMAs: written twice, two copies could contract differently). P is the
// stored parameter type (S, or bf16 for a bf16 parameter with its master w in f32), G the gradient's.
template <class S>
struct AdamWConstants {
  explicit AdamWConstants(const AdamWStep& s)
      : lr(S(s.lr)), lr_wd(S(s.lr * s.weight_decay)), eps(S(s.eps)), b1(S(s.beta1)), c1(S(1.0 - s.beta1)),
        b2(S(s.beta2)), c2(S(1.0 - s.beta2)), inv_bc1(S(1.0 / s.bias_correction1)),
        inv_bc2(S(1.0 / s.bias_correction2)) {}
  S lr, lr_wd, eps, b1, c1, b2, c2, inv_bc1, inv_bc2;
};

template <class S, class P, class G>
inline void adamw_elements(const AdamWConstants<S>& k, P* pp, S* wp, const G* gp, S* mp, S* vp, int64_t begin,
                           int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const S gi = static_cast<S>(gp[i]);
    S pi = wp[i];
    pi -= k.lr_wd * pi;
    const S mi = k.b1 * mp[i] + k.c1 * gi;
    const S vi = k.b2 * vp[i] + k.c2 * gi * gi;
    mp[i] = mi;
    vp[i] = vi;
    pi -= k.lr * (mi * k.inv_bc1) / (std::sqrt(vi * k.inv_bc2) + k.eps);
    wp[i] = pi;
    pp[i] = P(pi);
  }
}

// SGD's update of one tensor: p is P (S, or bf16 with S = float), g is G (P or S), the momentum buffer b
// and w are S.
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

// Elements [begin, end) of one entry of the multi-tensor step, in its own types.
void adamw_entry_range(const kernel::AdamWTensors& e, int64_t begin, int64_t end) {
  const DType pd = e.p.dtype(), gd = e.g.dtype();
  if (pd == DType::f64) {
    adamw_elements(AdamWConstants<double>(e.step), e.p.data<double>(), e.p.data<double>(), e.g.data<double>(),
                   e.m.data<double>(), e.v.data<double>(), begin, end);
  } else if (pd == DType::f32) {
    float* pp = e.p.data<float>();
    adamw_elements(AdamWConstants<float>(e.step), pp, e.w.defined() ? e.w.data<float>() : pp, e.g.data<float>(),
                   e.m.data<float>(), e.v.data<float>(), begin, end);
  } else if (gd == DType::bf16) {  // a bf16 parameter: its master w in f32, its gradient bf16 ...
    adamw_elements(AdamWConstants<float>(e.step), e.p.data<bf16>(), e.w.data<float>(), e.g.data<bf16>(),
                   e.m.data<float>(), e.v.data<float>(), begin, end);
  } else {  // ... or an f32 sum of micro-batch gradients
    adamw_elements(AdamWConstants<float>(e.step), e.p.data<bf16>(), e.w.data<float>(), e.g.data<float>(),
                   e.m.data<float>(), e.v.data<float>(), begin, end);
  }
}

// One tensor's step: a bf16 parameter with its f32 master, f32 moments and a bf16 or f32 gradient is
// updated as it is; any other mix of a bf16 parameter goes through the f32 stand-ins.
void adamw_step_cpu(const AdamWStep& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                    const Tensor& w) {
  if (p.dtype() == DType::bf16) {
    const bool native = w.defined() && bf16_on_cpu::native_bf16({}, {&w, &m, &v}) &&
                        (g.dtype() == DType::bf16 || g.dtype() == DType::f32);
    if (!native) return bf16_on_cpu::call_on_standins(&adamw_step_cpu, s, p, g, m, v, w);
  } else if (!is_floating(p.dtype())) {
    throw std::invalid_argument(std::string("adamw_step: a ") + dtype_name(p.dtype()) + " parameter");
  }
  const kernel::AdamWTensors entry{s, p, g, m, v, w};
  parallel_for(p.numel(), kParallelGrain / 4,
               [&](int64_t begin, int64_t end) { adamw_entry_range(entry, begin, end); });
}

// One parallel region over the entries' elements laid end to end: thread t takes one contiguous range of
// that sequence, which may span several small tensors or part of a large one. Elementwise, so the split
// changes no bit.
void adamw_multi_step_cpu(const std::vector<kernel::AdamWTensors>& entries) {
  std::vector<int64_t> offset(entries.size() + 1, 0);  // entry j holds elements [offset[j], offset[j + 1])
  for (size_t j = 0; j < entries.size(); ++j) {
    const kernel::AdamWTensors& e = entries[j];
    const bool bf16_param = e.p.dtype() == DType::bf16;
    if (!is_floating(e.p.dtype()) || (bf16_param && !e.w.defined()) ||
        (bf16_param ? (e.g.dtype() != DType::bf16 && e.g.dtype() != DType::f32) : e.g.dtype() != e.p.dtype())) {
      throw std::invalid_argument(std::string("adamw_multi_step: entry ") + std::to_string(j) + " has a " +
                                  dtype_name(e.p.dtype()) + " parameter with a " + dtype_name(e.g.dtype()) +
                                  " gradient" + (bf16_param && !e.w.defined() ? " and no f32 master" : ""));
    }
    offset[j + 1] = offset[j] + e.p.numel();
  }
  const int64_t total = offset.back();
  parallel_for(total, kParallelGrain / 4, [&](int64_t begin, int64_t end) {
    size_t j = static_cast<size_t>(std::upper_bound(offset.begin(), offset.end(), begin) - offset.begin()) - 1;
    for (; j < entries.size() && offset[j] < end; ++j) {
      const int64_t lo = std::max(begin, offset[j]) - offset[j], hi = std::min(end, offset[j + 1]) - offset[j];
      if (lo < hi) adamw_entry_range(entries[j], lo, hi);
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

// Σ x² over elements [begin, end), in order, in double: the one definition both sum-of-squares kernels
// run (a bf16 value reaches double exactly, as its f32 stand-in would).
template <class T>
double sum_squares_range(const T* p, int64_t begin, int64_t end) {
  double acc = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    const double e = convert_scalar<double>(p[i]);
    acc += e * e;
  }
  return acc;
}

// Fixed blocks summed in order: the same bits whatever the thread count.
constexpr int64_t kSquaresBlock = 1 << 15;

void sum_squares_cpu(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel(), blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  dispatch_float_or_bf16(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      partial[static_cast<size_t>(b)] = sum_squares_range(p, b * kSquaresBlock, std::min(n, (b + 1) * kSquaresBlock));
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  out.data<double>()[0] = total;
}

// The blocks of every tensor in one list and one parallel region; each tensor's partial sums are then
// added in its own block order, as sum_squares_cpu adds them.
void sum_squares_multi_cpu(const std::vector<Tensor>& xs, const Tensor& out) {
  struct Block {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Block> blocks;
  for (size_t j = 0; j < xs.size(); ++j) {
    if (!is_floating(xs[j].dtype())) {
      throw std::invalid_argument("sum_squares_multi: tensor " + std::to_string(j) + " is " +
                                  dtype_name(xs[j].dtype()) + ", not a floating tensor");
    }
    const int64_t n = xs[j].numel();
    for (int64_t b = 0; b * kSquaresBlock < n; ++b) blocks.push_back({j, b * kSquaresBlock, std::min(n, (b + 1) * kSquaresBlock)});
  }
  const int64_t count = static_cast<int64_t>(blocks.size());
  std::vector<double> partial(blocks.size(), 0.0);
  int64_t total = 0;
  for (const Tensor& x : xs) total += x.numel();
#pragma omp parallel for schedule(static) if (total > kSquaresBlock)
  for (int64_t b = 0; b < count; ++b) {
    const Block& k = blocks[static_cast<size_t>(b)];
    const Tensor& x = xs[k.tensor];
    double& dst = partial[static_cast<size_t>(b)];
    switch (x.dtype()) {
      case DType::f64: dst = sum_squares_range(x.data<double>(), k.begin, k.end); break;
      case DType::f32: dst = sum_squares_range(x.data<float>(), k.begin, k.end); break;
      default: dst = sum_squares_range(x.data<bf16>(), k.begin, k.end); break;
    }
  }
  double* o = out.data<double>();
  for (size_t j = 0; j < xs.size(); ++j) o[j] = 0.0;
  for (size_t b = 0; b < blocks.size(); ++b) o[blocks[b].tensor] += partial[b];
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

// x ← s·x for every tensor, their elements laid end to end under one parallel region; a bf16 element is
// scaled in f32 and rounded to nearest even, as its stand-in would be.
void scale_inplace_multi_cpu(const std::vector<Tensor>& xs, double s) {
  std::vector<int64_t> offset(xs.size() + 1, 0);
  for (size_t j = 0; j < xs.size(); ++j) {
    if (!is_floating(xs[j].dtype())) {
      throw std::invalid_argument("scale_inplace_multi: tensor " + std::to_string(j) + " is " +
                                  dtype_name(xs[j].dtype()) + ", not a floating tensor");
    }
    offset[j + 1] = offset[j] + xs[j].numel();
  }
  const float k32 = static_cast<float>(s);
  parallel_for(offset.back(), kParallelGrain, [&](int64_t begin, int64_t end) {
    size_t j = static_cast<size_t>(std::upper_bound(offset.begin(), offset.end(), begin) - offset.begin()) - 1;
    for (; j < xs.size() && offset[j] < end; ++j) {
      const int64_t lo = std::max(begin, offset[j]) - offset[j], hi = std::min(end, offset[j + 1]) - offset[j];
      const Tensor& x = xs[j];
      if (x.dtype() == DType::f64) {
        double* p = x.data<double>();
        for (int64_t i = lo; i < hi; ++i) p[i] = s * p[i];
      } else if (x.dtype() == DType::f32) {
        float* p = x.data<float>();
        for (int64_t i = lo; i < hi; ++i) p[i] = k32 * p[i];
      } else {
        bf16* p = x.data<bf16>();
        for (int64_t i = lo; i < hi; ++i) p[i] = bf16(k32 * static_cast<float>(p[i]));
      }
    }
  });
}

}  // namespace
}  // namespace seqlab::cpu

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL_TAKING_BF16(adamw_step_kernel, DeviceType::CPU, &cpu::adamw_step_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(adamw_multi_step_kernel, DeviceType::CPU, &cpu::adamw_multi_step_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sgd_step_kernel, DeviceType::CPU, &cpu::sgd_step_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sum_squares_kernel, DeviceType::CPU, &cpu::sum_squares_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(scale_inplace_kernel, DeviceType::CPU, &cpu::scale_inplace_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(sum_squares_multi_kernel, DeviceType::CPU, &cpu::sum_squares_multi_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(scale_inplace_multi_kernel, DeviceType::CPU, &cpu::scale_inplace_multi_cpu);
}  // namespace seqlab::kernel
