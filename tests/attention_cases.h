// The case struct, input builder and CPU references shared by the checks of the CUDA attention
// kernels — the GPU test (tests/attention_gpu_test.cc, the slots of src/cuda/attention/attention.cu and
// attention_tc.cu) and the emulation tests (tests/attention_emulation_test.cc for the FMA
// kernels, tests/attention_tc_emulation_test.cc for the tensor-core ones, run on the CPU) — so that
// all draw q, k, v, dO and dlse the same way and compare with the same reference. Each program keeps
// its own case table (the emulation runs smaller shapes: it is slow), its launches and its checks.
//
// The references run the CPU slots in reference_type (f32 for bf16: the f32 kernels, not the CPU's own
// bf16 ones, which round P and dS as the GPU does) on the values as the dtype under test holds them. The backward reads the forward's outputs as
// a GPU run saves them: o in the dtype under test, lse in its accumulate_dtype.
//
// A case may carry masks (AttentionMasks of src/tensor/slots/attention/attention.h): query and key
// lengths per batch row, and an additive bias of 1 or B rows, drawn N(0, 1) with −∞ scattered through it
// (never on key 0, so that a row sees a finite score whenever its keys are not all padding).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace seqlab::testing {

// q [B, T, H, Dk] against k [B, S, Hk, Dk] and v [B, S, Hk, Dv], H a multiple of Hk.
struct AttentionCase {
  int64_t B, T, S, H, Hk, Dk, Dv;
  bool causal;
  double scale;  // ≤ 0: 1/√Dk
  // Also run the backward with some gradients not asked for (where a test does not always).
  bool subsets = false;
  // Masks: lengths per batch row (empty: none), and bias_rows = 0 (no bias), 1 or B.
  std::vector<int64_t> q_lengths = {}, k_lengths = {};
  int64_t bias_rows = 0;

  std::string name() const {
    auto list = [](const std::vector<int64_t>& x) {
      std::string s;
      for (int64_t v : x) s += (s.empty() ? "" : ",") + std::to_string(v);
      return s;
    };
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " S=" + std::to_string(S) +
           " H=" + std::to_string(H) + " Hk=" + std::to_string(Hk) + " Dk=" + std::to_string(Dk) +
           " Dv=" + std::to_string(Dv) + (causal ? " causal" : " bidirectional") +
           (q_lengths.empty() ? "" : " q_lengths=" + list(q_lengths)) +
           (k_lengths.empty() ? "" : " k_lengths=" + list(k_lengths)) +
           (bias_rows > 0 ? " bias[" + std::to_string(bias_rows) + "]" : "");
  }
  kernel::AttentionParams params() const {
    // The CPU block (16) is not the CUDA tiles' size, so the two tile the work differently.
    return {causal, scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(Dk)), 16};
  }
  Shape q_shape() const { return {B, T, H, Dk}; }
  Shape k_shape() const { return {B, S, Hk, Dk}; }
  Shape v_shape() const { return {B, S, Hk, Dv}; }
  Shape o_shape() const { return {B, T, H, Dv}; }
  Shape lse_shape() const { return {B, T, H}; }
  Shape bias_shape() const { return {bias_rows, H, T, S}; }
  Shape dbias_shape() const { return {B, H, T, S}; }
};

// The bias of a case: N(0, 1) in the dtype, −∞ where j > 0 and (i + 2j + h) mod 7 = 3 (a bias that masks,
// as T5's and BERT's additive masks do, but never the first key).
inline Tensor attention_bias(const AttentionCase& c, DType dtype, Generator& gen) {
  std::vector<double> x = Tensor::randn(c.bias_shape(), gen, DType::f64).to_doubles();
  for (int64_t r = 0; r < c.bias_rows * c.H; ++r) {
    const int64_t h = r % c.H;
    for (int64_t i = 0; i < c.T; ++i) {
      for (int64_t j = 1; j < c.S; ++j) {
        if ((i + 2 * j + h) % 7 == 3)
          x[static_cast<size_t>((r * c.T + i) * c.S + j)] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  return Tensor::from_vector(x, c.bias_shape(), dtype);
}

// q, k, v ~ N(0, 1) in the dtype under test, drawn in this order; with the backward's, then
// dO ~ N(0, 1) in the dtype and dlse ~ N(0, 0.5²) in its accumulate_dtype (undefined without); then the
// masks: the lengths (i64, on the CPU) and the bias (attention_bias), where the case has them.
struct AttentionInputs {
  Tensor q, k, v, dout, dlse;
  kernel::AttentionMasks masks;
};
inline AttentionInputs attention_inputs(const AttentionCase& c, DType dtype, Generator& gen, bool with_backward) {
  AttentionInputs in;
  in.q = Tensor::randn(c.q_shape(), gen, dtype);
  in.k = Tensor::randn(c.k_shape(), gen, dtype);
  in.v = Tensor::randn(c.v_shape(), gen, dtype);
  if (with_backward) {
    in.dout = Tensor::randn(c.o_shape(), gen, dtype);
    in.dlse = Tensor::randn(c.lse_shape(), gen, accumulate_dtype(dtype), 0.5);
  }
  if (!c.q_lengths.empty()) in.masks.q_lengths = Tensor::from_indices(c.q_lengths, {c.B});
  if (!c.k_lengths.empty()) in.masks.k_lengths = Tensor::from_indices(c.k_lengths, {c.B});
  if (c.bias_rows > 0) in.masks.bias = attention_bias(c, dtype, gen);
  return in;
}
// The inputs as the CUDA side of a check gets them: NaN in every row the lengths make padding (q, dO and
// dlse past q_len, k and v past k_len), since nothing read from those rows may reach an output; the CPU
// reference gets the drawn values. The same tensors when the case has no lengths.
inline AttentionInputs with_padding_poisoned(const AttentionCase& c, const AttentionInputs& in) {
  if (c.q_lengths.empty() && c.k_lengths.empty()) return in;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // x [B, L, ...] with rows l ≥ lengths[b] set to NaN (rows: L; a row's elements: the rest).
  auto poison = [&](const Tensor& x, const std::vector<int64_t>& lengths) {
    if (!x.defined() || lengths.empty()) return x;
    std::vector<double> v = x.to_doubles();
    const int64_t L = x.size(1), per_row = x.numel() / (x.size(0) * L);
    for (int64_t b = 0; b < x.size(0); ++b) {
      for (int64_t l = lengths[static_cast<size_t>(b)]; l < L; ++l) {
        std::fill_n(v.begin() + (b * L + l) * per_row, per_row, nan);
      }
    }
    return Tensor::from_vector(v, x.shape(), x.dtype());
  };
  AttentionInputs out = in;
  out.q = poison(in.q, c.q_lengths);
  out.dout = poison(in.dout, c.q_lengths);
  out.dlse = poison(in.dlse, c.q_lengths);
  out.k = poison(in.k, c.k_lengths);
  out.v = poison(in.v, c.k_lengths);
  return out;
}

// The masks in reference_type (the bias; the lengths stay i64).
inline kernel::AttentionMasks as_reference(const kernel::AttentionMasks& m) {
  return {m.q_lengths, m.k_lengths, as_reference(m.bias)};
}

// The forward's outputs: o [B, T, H, Dv] and lse [B, T, H].
struct AttentionOutputs {
  Tensor o, lse;
};
// The CPU's forward, in reference_type.
inline AttentionOutputs attention_forward_reference(const AttentionCase& c, const AttentionInputs& in) {
  const DType rt = reference_type(in.q.dtype());
  AttentionOutputs want{Tensor::empty(c.o_shape(), rt), Tensor::empty(c.lse_shape(), rt)};
  kernel::attention_forward_kernel(kCpu, as_reference(in.q), as_reference(in.k), as_reference(in.v),
                                   as_reference(in.masks), c.params(), want.o, want.lse);
  return want;
}
// The CPU forward's outputs as a GPU run saves them for the backward: o in the dtype under test, lse
// in its accumulate_dtype. Both sides of a backward check read these values.
inline AttentionOutputs as_saved(const AttentionOutputs& reference, DType dtype) {
  return {kernel::to_dtype(reference.o, dtype), kernel::to_dtype(reference.lse, accumulate_dtype(dtype))};
}
inline AttentionOutputs saved_attention_outputs(const AttentionCase& c, const AttentionInputs& in) {
  return as_saved(attention_forward_reference(c, in), in.q.dtype());
}

// The gradients a backward is asked for, and their names in messages (" dq dk dv dbias").
struct GradientsNeeded {
  bool dq, dk, dv;
  bool dbias = false;
  std::string names() const {
    return std::string(dq ? " dq" : "") + (dk ? " dk" : "") + (dv ? " dv" : "") + (dbias ? " dbias" : "");
  }
};

// The CPU's backward from the saved outputs, in reference_type: the gradients asked for, the others
// undefined.
inline kernel::AttentionGrads attention_backward_reference(const AttentionCase& c, const AttentionInputs& in,
                                                           const AttentionOutputs& saved, GradientsNeeded need) {
  const DType rt = reference_type(in.q.dtype());
  kernel::AttentionGrads want;
  if (need.dq) want.dq = Tensor::empty(c.q_shape(), rt);
  if (need.dk) want.dk = Tensor::empty(c.k_shape(), rt);
  if (need.dv) want.dv = Tensor::empty(c.v_shape(), rt);
  if (need.dbias) want.dbias = Tensor::empty(c.dbias_shape(), rt);
  kernel::attention_backward_kernel(kCpu, as_reference(in.dout), as_reference(in.dlse), as_reference(in.q),
                                    as_reference(in.k), as_reference(in.v), as_reference(in.masks),
                                    as_reference(saved.o), as_reference(saved.lse), c.params(), want);
  return want;
}

}  // namespace seqlab::testing
