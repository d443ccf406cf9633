// Scalar formulas of the elementwise ops, shared by the CPU kernels and the CUDA kernels so both
// compute exactly the same function. T is float or double.
#pragma once

#include <cmath>

#include "tensor/kernels.h"

#ifdef __CUDACC__
#define SEQLAB_HD __host__ __device__ __forceinline__
#else
#define SEQLAB_HD inline
#endif

namespace seqlab::math {

#ifndef __CUDACC__
// Host code picks the float overloads from std; nvcc provides them for device code.
using std::exp;
using std::fabs;
using std::log;
using std::log1p;
using std::pow;
using std::sqrt;
using std::tanh;
#endif

template <class T>
SEQLAB_HD T sigmoid(T x) {
  // Branches keep exp's argument ≤ 0, so neither side overflows.
  if (x >= T(0)) {
    T e = exp(-x);
    return T(1) / (T(1) + e);
  }
  T e = exp(x);
  return e / (T(1) + e);
}

// GELU, tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;

// y = f(x)
template <class T>
SEQLAB_HD T unary_forward(kernel::UnaryOp op, T x, T alpha) {
  using kernel::UnaryOp;
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return T(1) / sqrt(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return sigmoid(x);
    case UnaryOp::silu: return x * sigmoid(x);
    case UnaryOp::gelu: return T(0.5) * x * (T(1) + tanh(T(kGeluC) * (x + T(kGeluA) * x * x * x)));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::elu: return x > T(0) ? x : alpha * (exp(x) - T(1));
    case UnaryOp::softplus: return (x > T(0) ? x : T(0)) + log1p(exp(-fabs(x)));  // log(1 + eˣ), stable
  }
  return x;
}

// dx = dy · f'(x), given x and y = f(x).
template <class T>
SEQLAB_HD T unary_backward(kernel::UnaryOp op, T dy, T x, T y, T alpha) {
  using kernel::UnaryOp;
  switch (op) {
    case UnaryOp::neg: return -dy;
    case UnaryOp::exp: return dy * y;
    case UnaryOp::log: return dy / x;
    case UnaryOp::sqrt: return dy * T(0.5) / y;
    case UnaryOp::rsqrt: return dy * T(-0.5) * y * y * y;
    case UnaryOp::square: return dy * T(2) * x;
    case UnaryOp::tanh: return dy * (T(1) - y * y);
    case UnaryOp::sigmoid: return dy * y * (T(1) - y);
    case UnaryOp::silu: {
      T s = sigmoid(x);
      return dy * (s + x * s * (T(1) - s));
    }
    case UnaryOp::gelu: {
      T u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
      T t = tanh(u);
      T du = T(kGeluC) * (T(1) + T(3 * kGeluA) * x * x);
      return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
    }
    case UnaryOp::relu: return x > T(0) ? dy : T(0);
    case UnaryOp::elu: return x > T(0) ? dy : dy * (y + alpha);
    case UnaryOp::softplus: return dy * sigmoid(x);
  }
  return dy;
}

template <class T>
SEQLAB_HD T binary(kernel::BinaryOp op, T a, T b) {
  using kernel::BinaryOp;
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
  }
  return a;
}

template <class T>
SEQLAB_HD T scalar(kernel::ScalarOp op, T x, T s) {
  using kernel::ScalarOp;
  switch (op) {
    case ScalarOp::add: return x + s;
    case ScalarOp::mul: return x * s;
    case ScalarOp::pow: return pow(x, s);
    case ScalarOp::rsub: return s - x;
    case ScalarOp::rdiv: return s / x;
  }
  return x;
}

}  // namespace seqlab::math
