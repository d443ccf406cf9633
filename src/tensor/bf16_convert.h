// bf16 on the CPU: the one place for the f32 <-> bf16 conversion loops, and the element access of the
// CPU kernels that take bf16 tensors themselves.
//
// Conversions. widen: f = bits << 16 (exact). round: RNE with NaN kept quiet, exactly bf16(float) of
// tensor/dtype.h, whose selects GCC turns into vector blends: the loops vectorise, 8 floats per AVX2
// instruction at the library's -march=x86-64-v3 (portable C++, so a CPU without AVX-512, or without
// AVX2 under another SEQLAB_CPU_ARCH, runs the same code); the rounding takes 16 at a time on AVX-512
// where the CPU has it, with the same bits. Both are memory bound (6 bytes per element). The copy
// kernel (tensor/cpu/copy.cpp) runs them on each contiguous run: a contiguous tensor as one block split
// over the OpenMP team, a strided one row by row.
//
// Native bf16 kernels. The semantics of a bf16 CPU kernel are fixed by the dispatch layer
// (tensor/dispatch.h): widen every bf16 input to f32, run the f32 kernel, round each output once.
// A kernel registered with SEQLAB_REGISTER_KERNEL_TAKING_BF16 gives the same bits without the
// stand-in copies by being written once over a storage type T and its compute type compute_t<T>
// (T for f32 and f64, float for bf16): every element read is from_storage(x) (exact), every element
// written is to_storage<T>(v) with v in compute_t<T> (the f32 kernel's value, rounded once), and
// every intermediate is kept in compute_t<T>, as the f32 kernel keeps it in its f32 stand-in. For
// T = f32 and f64 both are the identity, so those paths compile to the arithmetic they had.
// Statistics (norms' mean and rstd, lse, losses) are accumulate_dtype: compute_t<T> for every T.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "tensor/dispatch.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace seqlab {

// dst[i] = float(src[i]) for i < n (exact).
inline void widen_bf16_run(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// dst[i] = bf16(src[i]) for i < n (round to nearest even, NaN quiet): on AVX-512 where the CPU has it
// (tensor/cpu/avx512.h, the same bits), else a plain loop (bf16_convert.cpp).
void round_to_bf16_run(const float* src, bf16* dst, int64_t n);

// The largest run map_runs hands its loop at once for bf16: 4 rows of 512 floats stay in L1.
constexpr int64_t kBf16Block = 512;

template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
// The type a kernel computes an element of storage type T in: float for bf16, T otherwise.
template <class T>
using compute_t = typename compute_type<T>::type;

// An element as the kernel computes with it (exact).
template <class T>
inline compute_t<T> from_storage(T x) {
  return x;
}
inline float from_storage(bf16 x) { return static_cast<float>(x); }

// A computed value as the element stored (bf16: rounded once; f32, f64: as it is).
template <class T>
inline T to_storage(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16(v);
  } else {
    return v;
  }
}

// A contiguous elementwise map over elements [begin, end): calls loop(out, n, in...) with pointers of
// compute_t<T>. f32 and f64 call it once on the tensors themselves. bf16 calls it on float blocks of
// at most kBf16Block elements: each input's block widened first, the outputs rounded after. So the loop
// a bf16 kernel runs is the f32 kernel's own (the same instantiation: the same bits, NaN payloads
// included), and it vectorises as f32's does, where a rounding inside it would keep it scalar. `out`
// may alias an input (each block is read before it is written).
namespace detail {
template <class Loop, class... In, size_t... K>
void map_bf16_runs(int64_t begin, int64_t end, bf16* out, Loop& loop, std::index_sequence<K...>, const In*... in) {
  float out_block[kBf16Block];
  float in_blocks[sizeof...(In) > 0 ? sizeof...(In) : 1][kBf16Block];
  for (int64_t b = begin; b < end; b += kBf16Block) {
    const int64_t m = std::min<int64_t>(kBf16Block, end - b);
    (widen_bf16_run(in + b, in_blocks[K], m), ...);
    loop(out_block, m, static_cast<const float*>(in_blocks[K])...);
    round_to_bf16_run(out_block, out + b, m);
  }
}
}  // namespace detail

template <class T, class Loop, class... In>
void map_runs(int64_t begin, int64_t end, T* out, Loop&& loop, const In*... in) {
  static_assert((std::is_same_v<In, T> && ...), "map_runs: the inputs are of the output's type");
  if constexpr (std::is_same_v<T, bf16>) {
    detail::map_bf16_runs(begin, end, out, loop, std::index_sequence_for<In...>{}, in...);
  } else {
    loop(out + begin, end - begin, (in + begin)...);
  }
}

// Calls fn(T{}) with T the storage type of a floating dtype: float, double or bf16 (for kernels that
// take bf16 natively, computing in compute_t<T>).
template <class Fn>
auto dispatch_float_or_bf16(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bf16{});
    default:
      throw std::invalid_argument(std::string(op) + ": expected a f32, f64 or bf16 tensor, got " + dtype_name(d));
  }
}

namespace bf16_on_cpu {

// Whether a native kernel's bf16 code applies: true when `data` (the tensors a kernel reads and writes
// in its element type; undefined ones are skipped) are all bf16 and `stats` (those it keeps in
// accumulate_dtype) are all f32. A call with bf16 mixed in any other way (a bf16 x with an f32
// weight, say) returns false, and the kernel runs the stand-in path, which accepts any mix.
inline bool native_bf16(std::initializer_list<const Tensor*> data, std::initializer_list<const Tensor*> stats = {}) {
  for (const Tensor* t : data) {
    if (t->defined() && t->dtype() != DType::bf16) return false;
  }
  for (const Tensor* t : stats) {
    if (t->defined() && t->dtype() != DType::f32) return false;
  }
  return true;
}

template <class T>
struct non_deduced {
  using type = T;
};
// f(args...) on f32 stand-ins of its bf16 tensors, rounded back after (dispatch.h): what a native kernel
// does with a mix of dtypes its bf16 code does not take. f then sees no bf16 and takes its f32 path.
template <class... Args>
void call_on_standins(void (*f)(Args...), typename non_deduced<Args>::type... args) {
  call_widened<void, Args...>(f, args...);
}

}  // namespace bf16_on_cpu
}  // namespace seqlab
