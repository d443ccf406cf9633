// Input checks shared by the fused variant ops whose inputs are q, k [B, T, H, dk] and v [B, T, H, dv]
// (retention, linear attention, DeltaNet). Each op adds the checks of its own inputs and options, and
// words every error through its own fail(why), which names the op and all the shapes it got.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace seqlab {

// The sizes a variant op reads from q [B, T, H, dk] and v [B, T, H, dv].
struct HeadDims {
  int64_t B, T, H, dk, dv;
};

// A shape for an error message; "undefined" for an absent tensor.
inline std::string shape_or_undefined(const Tensor& t) {
  return t.defined() ? shape_str(t.shape()) : std::string("undefined");
}

// q, k and v given and 4-dimensional, k shaped as q, and v agreeing with q in batch, length and heads;
// otherwise fail(why), which throws. Returns the sizes.
template <class Fail>
HeadDims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, Fail&& fail) {
  if (!q.defined() || !k.defined() || !v.defined()) fail("q, k and v must all be given");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k and v must have 4 dimensions");
  const HeadDims d{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
  if (k.shape() != q.shape()) fail("q and k differ in shape");
  if (v.size(0) != d.B || v.size(1) != d.T || v.size(2) != d.H) fail("v differs from q in batch, length or heads");
  return d;
}

}  // namespace seqlab
