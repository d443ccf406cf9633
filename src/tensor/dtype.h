// Element types and the helpers that turn a runtime dtype into a compile-time C++ type.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace seqlab {

enum class DType { f32, f64, bf16, i32, i64 };

// bfloat16 storage type: the top 16 bits of an IEEE float32. Arithmetic happens in f32;
// conversion rounds to nearest even, NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>((u + rounding) >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

inline size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

inline const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

// The dtype in which sums over a tensor of dtype d are kept when they are stored: softmax
// statistics, norm statistics, losses. f32 for bf16 (8 significant bits would lose them), d otherwise.
inline DType accumulate_dtype(DType d) { return d == DType::bf16 ? DType::f32 : d; }
inline bool is_floating(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::bf16; }
inline bool is_integer(DType d) { return d == DType::i32 || d == DType::i64; }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };

// Calls fn(T{}) with T the C++ type of a floating dtype the CPU computes in (f32, f64). A kernel
// dispatching with it sees bf16 tensors as f32 stand-ins (tensor/dispatch.h); kernels that take bf16
// themselves use dispatch_float_or_bf16 (tensor/bf16_convert.h).
template <class Fn>
auto dispatch_float(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    default:
      throw std::invalid_argument(std::string(op) + ": expected a f32 or f64 tensor, got " + dtype_name(d));
  }
}

// Calls fn(T{}) with T an index type (i32, i64).
template <class Fn>
auto dispatch_index(DType d, const char* op, Fn&& fn) {
  switch (d) {
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    default:
      throw std::invalid_argument(std::string(op) + ": expected an i32 or i64 tensor, got " + dtype_name(d));
  }
}

// Calls fn(T{}) for any dtype.
template <class Fn>
auto dispatch_any(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bf16{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
  }
  return fn(float{});
}

// Converting one scalar between any two element types (bf16 goes through float).
template <class To, class From>
inline To convert_scalar(From x) {
  if constexpr (std::is_same_v<From, bf16>) {
    return convert_scalar<To>(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace seqlab
