// Device dispatch: one function-pointer slot per device for each kernel family.
//
// A kernel family is declared once, in src/tensor (SEQLAB_DECLARE_KERNEL: the primitives in
// src/tensor/kernels.h, the fused variant ops and the optimizer steps in src/tensor/slots/); its CPU
// implementation registers itself from src/tensor/cpu/*.cpp or the op's room in src/layers, and its
// CUDA implementation from src/cuda with the same signature. Op code calls `stub(device, args...)` and never sees an
// #ifdef. The slots are zero-initialised constants, so registration from any translation unit's
// static initialiser is safe regardless of initialisation order.
//
// bf16 on the CPU: a CPU kernel computes in f32 or f64. When a kernel is called with bf16 tensors,
// the slot hands it f32 stand-ins (exact: every bf16 value is an f32 value) and afterwards rounds the
// stand-ins back into the bf16 originals (round to nearest even, as the CUDA kernels store bf16).
// So a bf16 tensor is rounded exactly where the CUDA kernels round it, at each kernel's outputs, and
// the CPU stays the reference for bf16 training. That definition is the semantics of every bf16 CPU
// kernel. Tensors inside struct arguments (NormOutput, AttentionGrads, ...) are reached through an
// ADL function `tensor_fields(S&)` declared next to the struct. Kernels that handle bf16 themselves
// are registered with SEQLAB_REGISTER_KERNEL_TAKING_BF16: copies and fills (which the conversion
// itself uses) and the kernels a training step runs most (elementwise, norms, softmax,
// cross-entropy, embedding, row sums, AdamW), which load bf16 to f32, compute the f32 kernel's
// arithmetic and round once on store, the same bits without the stand-ins' copies
// (tensor/bf16_convert.h; tests/bf16_cpu_test.cc holds each to the stand-in path bit for bit).
//
// The step profile (profile.h) times CPU calls here, the one place every kernel passes: off, it costs the
// slot one relaxed atomic load.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/device.h"
#include "tensor/profile.h"
#include "tensor/tensor.h"

namespace seqlab {

namespace bf16_on_cpu {

// The f32 stand-ins of the bf16 tensors of one CPU kernel call: one per distinct view, so a tensor
// passed twice (in place) has one stand-in.
class Widening {
 public:
  Tensor widen(const Tensor& t);  // t itself unless t is a defined bf16 tensor
  void narrow_back();             // rounds every stand-in back into its original (not into broadcasts)
 private:
  std::vector<std::pair<Tensor, Tensor>> originals_and_standins_;
};

inline bool is_bf16(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16; }

template <class T, class = void>
struct has_tensor_fields : std::false_type {};
template <class T>
struct has_tensor_fields<T, std::void_t<decltype(tensor_fields(std::declval<T&>()))>> : std::true_type {};

template <class A>
bool carries_bf16(const A& a) {
  if constexpr (std::is_same_v<A, Tensor>) {
    return is_bf16(a);
  } else if constexpr (has_tensor_fields<A>::value) {
    A copy = a;
    return std::apply([](const auto&... t) { return (is_bf16(t) || ...); }, tensor_fields(copy));
  } else {
    return false;
  }
}

template <class A>
A widened(const A& a, Widening& w) {
  if constexpr (std::is_same_v<A, Tensor>) {
    return w.widen(a);
  } else if constexpr (has_tensor_fields<A>::value) {
    A copy = a;
    std::apply([&](auto&... t) { ((t = w.widen(t)), ...); }, tensor_fields(copy));
    return copy;
  } else {
    return a;
  }
}

// f(args...) with every bf16 tensor replaced by its f32 stand-in, rounded back afterwards.
template <class R, class... Args>
R call_widened(R (*f)(Args...), Args... args) {
  Widening w;
  std::optional<profile::StandinConversion> timed;  // the conversions, apart from the kernel (profile.h)
  if (profile::enabled()) timed.emplace(false);
  std::tuple<std::decay_t<Args>...> wide{widened(args, w)...};  // braced: widened left to right
  timed.reset();
  auto narrow_back = [&] {
    if (profile::enabled()) timed.emplace(true);
    w.narrow_back();
    timed.reset();
  };
  if constexpr (std::is_void_v<R>) {
    std::apply(f, wide);
    narrow_back();
  } else {
    R r = std::apply(f, wide);
    narrow_back();
    return r;
  }
}

}  // namespace bf16_on_cpu

template <class Fn>
struct KernelSlot;

template <class R, class... Args>
struct KernelSlot<R (*)(Args...)> {
  using Fn = R (*)(Args...);
  const char* name;
  Fn impl[2];
  bool cpu_takes_bf16;      // the CPU kernel handles bf16 tensors itself
  const char* declared_in;  // the header that declares the slot (the profile's category reads it)

  R operator()(Device d, Args... args) const {
    Fn f = impl[static_cast<int>(d.type)];
    if (!f) {
      throw std::runtime_error(std::string("kernel '") + name + "' has no implementation on " + d.str() +
                               (d.is_cuda() ? " (this build has no CUDA backend)" : ""));
    }
    if (profile::enabled() && d.is_cpu()) return timed_cpu_call(f, args...);
    if (d.is_cpu() && !cpu_takes_bf16 && (bf16_on_cpu::carries_bf16<std::decay_t<Args>>(args) || ...)) {
      return bf16_on_cpu::call_widened<R, Args...>(f, args...);
    }
    return f(args...);
  }
  // The CPU call of operator() under the step profile.
  R timed_cpu_call(Fn f, Args... args) const {
    profile::SlotCall timed(name, declared_in);
    if (!cpu_takes_bf16 && (bf16_on_cpu::carries_bf16<std::decay_t<Args>>(args) || ...)) {
      return bf16_on_cpu::call_widened<R, Args...>(f, args...);
    }
    return f(args...);
  }
  bool has(DeviceType t) const { return impl[static_cast<int>(t)] != nullptr; }
};

template <class Slot>
struct KernelRegistration {
  KernelRegistration(Slot& slot, DeviceType t, typename Slot::Fn fn, bool takes_bf16 = false) {
    slot.impl[static_cast<int>(t)] = fn;
    if (t == DeviceType::CPU) slot.cpu_takes_bf16 = takes_bf16;
  }
};

}  // namespace seqlab

// Declares and defines a slot in a header: an inline variable, so every shared library of the
// program (tensor, cuda, layers) reads and fills the one instance the dynamic linker keeps (GCC emits
// it as a unique symbol), and its constant initialiser runs before any registration.
#define SEQLAB_DECLARE_KERNEL(slot, signature) \
  using slot##_fn = signature;                 \
  inline ::seqlab::KernelSlot<slot##_fn> slot = {#slot, {nullptr, nullptr}, false, __FILE__}

#define SEQLAB_CONCAT_INNER(a, b) a##b
#define SEQLAB_CONCAT(a, b) SEQLAB_CONCAT_INNER(a, b)
#define SEQLAB_REGISTER_KERNEL(slot, device_type, fn)                                                   \
  static ::seqlab::KernelRegistration<::seqlab::KernelSlot<slot##_fn>> SEQLAB_CONCAT(slot##_reg_, __LINE__)( \
      slot, device_type, fn)
// For a CPU kernel that computes bf16 tensors itself (the slot then passes them through unchanged).
#define SEQLAB_REGISTER_KERNEL_TAKING_BF16(slot, device_type, fn)                                       \
  static ::seqlab::KernelRegistration<::seqlab::KernelSlot<slot##_fn>> SEQLAB_CONCAT(slot##_reg_, __LINE__)( \
      slot, device_type, fn, true)
