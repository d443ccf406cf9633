// The elementwise kernels' own loops, for CPU kernels that apply an elementwise function to rows they
// hold (linear's epilogue): calling the loop the unary kernel runs gives its bits by construction.
#pragma once

#include <cstdint>

#include "tensor/kernels.h"

namespace seqlab::cpu {

// y[i] = op(x[i]) for i < n (y may be x), S = float or double: the unary kernel's loop itself.
template <class S>
void unary_forward_run(kernel::UnaryOp op, S* y, int64_t n, const S* x, S alpha);

}  // namespace seqlab::cpu
