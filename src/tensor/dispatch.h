// Device dispatch: one function-pointer slot per device for each kernel family.
//
// A kernel family is declared once (SEQLAB_DECLARE_KERNEL in src/tensor/kernels.h), its CPU
// implementation registers itself from src/tensor/cpu/*.cpp and its CUDA implementation from
// src/cuda/*.cu with the same signature. Op code calls `stub(device, args...)` and never sees an
// #ifdef. The slots are zero-initialised constants, so registration from any translation unit's
// static initialiser is safe regardless of initialisation order.
#pragma once

#include <stdexcept>
#include <string>

#include "tensor/device.h"

namespace seqlab {

template <class Fn>
struct KernelSlot;

template <class R, class... Args>
struct KernelSlot<R (*)(Args...)> {
  using Fn = R (*)(Args...);
  const char* name;
  Fn impl[2];

  R operator()(Device d, Args... args) const {
    Fn f = impl[static_cast<int>(d.type)];
    if (!f) {
      throw std::runtime_error(std::string("kernel '") + name + "' has no implementation on " + d.str() +
                               (d.is_cuda() ? " (this build has no CUDA backend)" : ""));
    }
    return f(args...);
  }
  bool has(DeviceType t) const { return impl[static_cast<int>(t)] != nullptr; }
};

template <class Slot>
struct KernelRegistration {
  KernelRegistration(Slot& slot, DeviceType t, typename Slot::Fn fn) { slot.impl[static_cast<int>(t)] = fn; }
};

}  // namespace seqlab

#define SEQLAB_DECLARE_KERNEL(slot, signature) \
  using slot##_fn = signature;                 \
  extern ::seqlab::KernelSlot<slot##_fn> slot

#define SEQLAB_DEFINE_KERNEL(slot) ::seqlab::KernelSlot<slot##_fn> slot = {#slot, {nullptr, nullptr}}

#define SEQLAB_CONCAT_INNER(a, b) a##b
#define SEQLAB_CONCAT(a, b) SEQLAB_CONCAT_INNER(a, b)
#define SEQLAB_REGISTER_KERNEL(slot, device_type, fn)                                                   \
  static ::seqlab::KernelRegistration<::seqlab::KernelSlot<slot##_fn>> SEQLAB_CONCAT(slot##_reg_, __LINE__)( \
      slot, device_type, fn)
