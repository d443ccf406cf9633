// The FMA attention kernels (src/cuda/attention/attention_kernels.cuh: the forward with its online softmax and
// lse, the δ = rowsum(dO ⊙ O) − dlse kernel, dK/dV and dQ), run on the CPU against the CPU attention
// slots. No GPU needed: this is the check these kernels get on every build until a GPU runs
// tests/attention_gpu_test.cc. They serve f32, f64 and the bf16 shapes the tensor-core kernels
// do not take (tests/attention_tc_emulation_test.cc checks those).
//
// The kernel source is compiled by the host compiler over tests/cuda_emulation.h: one fiber per CUDA
// thread (128 per block) run from barrier to barrier in a seeded random order, real barriers and
// shuffles, dynamic shared memory filled with NaN before every block. Each launch mirrors
// attention.cu's launchers: the same grids and shared-memory sizes (forward_shape, delta_blocks,
// dkdv_shape, dq_shape of the kernel header), the same arguments, and the backward's dK/dV and dQ
// kernels read the δ that the delta kernel wrote. Outputs start as NaN between guard bands, so an
// element not written and a write outside an output both fail; gradients not asked for get a null
// pointer, as from the launcher, and stay untouched.
//
// Shapes (the GPU test's kinds, smaller: see kCases): causal and bidirectional, T = S, T < S (queries
// at the end of a longer cache, the causal diagonal crossing key tiles), T > S (bidirectional),
// decoding, MHA, GQA and MQA, Dk ≠ Dv, head dims 1 to 128, T and S not multiples of the tiles (16 or
// 8 query rows, 32 keys, 16 or 8 keys per dK/dV block, 32 or 16 staged query rows). The masks
// (kMaskCases): query and key lengths of 0, partial and full (whole batch rows of padding, rows that see
// no key, key tiles past k_len), a bias of 1 and of B rows with −∞ in it, dbias with and without the
// other gradients, T = 1; and rows whose every visible key has −∞ bias, which must end as rows that see
// no key do (o = 0, lse = −∞, no gradient), checked against the CPU with those rows' keys cut by
// k_lengths = 0 instead. Tolerance:
// fused_op_rtol (1e-4 f32, 1e-10 f64, 2e-2 bf16, the reference being the CPU kernels in f32 on the
// same bf16 values); δ against a sum in double at gpu_rtol, scaled by Σ|dO·O| + |dlse|. The case
// struct, inputs and references: tests/attention_cases.h, as in the GPU test.
// What this cannot check: the real compiler, the hardware's scheduling and memory system, performance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "cuda_emulation_util.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#define SEQLAB_ATTENTION_SHARED_MEMORY(name) unsigned char* name = emu::dynamic_shared()
#include "cuda/attention/attention_kernels.cuh"

namespace seqlab {
namespace {

namespace fma = cuda::attention_fma;
using cuda::compute_t;
using testing::expect_output;
using testing::for_each_type;
using testing::GradientsNeeded;
using testing::GuardedOutput;
using Case = testing::AttentionCase;

double rtol(DType d) { return testing::fused_op_rtol(d); }

// attention.cu's geometry(), with the masks of `in`.
fma::Geo geo(const Case& c, const kernel::AttentionMasks& m) {
  fma::Geo g{c.B, c.T, c.S, c.H, c.Hk, c.Dk, c.Dv, c.H / c.Hk, c.causal};
  g.q_lengths = m.q_lengths.defined() ? m.q_lengths.data<int64_t>() : nullptr;
  g.k_lengths = m.k_lengths.defined() ? m.k_lengths.data<int64_t>() : nullptr;
  g.bias_batched = m.bias.defined() && m.bias.size(0) == c.B;
  return g;
}
// The bias as the kernels read it (attention.cu's bias_of).
template <class T>
const T* bias_of(const kernel::AttentionMasks& m) {
  return m.bias.defined() ? m.bias.data<T>() : nullptr;
}

// Small, because every shuffle and barrier is a round of fiber switches in the emulation (the dK/dV
// kernel costs ~0.3 ms per (query, key) pair here): B·H·T·S stays in the low thousands per case.
// Query tiles are 16 rows (8 for f64), key tiles 32, dK/dV blocks 16 keys (8 for f64) over staged
// query tiles of 32 rows (16 for f64). `subsets`: each subset of gradients relaunches dK/dV or dQ.
const Case kCases[] = {
    {1, 37, 37, 2, 1, 16, 16, true, 0},       // two heads on one kv head, T = S, partial tiles everywhere
    {1, 5, 40, 4, 2, 24, 40, true, 0},        // GQA, a block of new queries against a longer cache, Dk ≠ Dv
    {2, 1, 33, 3, 1, 32, 32, true, 0, true},  // decoding, MQA, two sequences
    {1, 40, 19, 1, 1, 8, 12, false, 0},       // bidirectional with T > S
    {1, 12, 40, 1, 1, 128, 96, false, 0.3},   // the largest head dims (4 and 3 per lane), explicit scale
    {1, 17, 17, 2, 2, 1, 3, true, 0, true},   // MHA, a head dim of 1
    {1, 20, 90, 1, 1, 40, 72, true, 0},       // S − T = 70: the diagonal crosses a key tile; dims not multiples of 32
    {1, 1, 1, 1, 1, 5, 7, true, 0},           // one query, one key
};

// With masks: {B, T, S, H, Hk, Dk, Dv, causal, scale, subsets, q_lengths, k_lengths, bias rows}.
const Case kMaskCases[] = {
    // causal GQA against a longer cache, Dk ≠ Dv: a query tile half padding, keys past k_len cut the causal band
    {2, 37, 45, 2, 1, 16, 24, true, 0, false, {37, 20}, {45, 30}, 0},
    // bidirectional MQA with T > S: a batch row of padding queries, one whose keys are all padding, a bias of B rows
    {3, 20, 13, 3, 1, 8, 12, false, 0, true, {0, 20, 9}, {13, 0, 5}, 3},
    // decoding with key lengths and a bias shared by the batch rows (dbias alone among the subsets)
    {2, 1, 33, 2, 2, 32, 32, true, 0, true, {1, 1}, {33, 17}, 1},
    // causal T = S with a bias only, over two key tiles, explicit scale
    {1, 40, 40, 1, 1, 24, 16, true, 0.2, false, {}, {}, 1},
    // cross attention: k_len = 33 leaves one real key in the second tile; a bias of B rows
    {2, 9, 70, 2, 1, 40, 40, false, 0, false, {9, 4}, {70, 33}, 2},
};

// ---- the launches, as attention.cu's forward_cuda and backward_cuda make them ---------------------

template <class T>
void forward(const fma::Geo& g, const Tensor& q, const Tensor& k, const Tensor& v, const T* bias, double scale,
             GuardedOutput& o, GuardedOutput& lse) {
  using A = compute_t<T>;
  if (g.B == 0 || g.T == 0 || g.H == 0) return;
  const fma::LaunchShape shape = fma::forward_shape<A>(g);
  emu::launch(shape.grid, dim3(fma::kAttentionThreads), shape.shared_bytes, fma::attention_fwd<T>, g, q.data<T>(),
              k.data<T>(), v.data<T>(), bias, static_cast<A>(scale), o.data<T>(), lse.data<A>());
}

template <class T>
void delta(const fma::Geo& g, const Tensor& dout, const Tensor& o, const Tensor& dlse, GuardedOutput& out) {
  using A = compute_t<T>;
  const int64_t n = g.B * g.T * g.H;
  emu::launch(dim3(fma::delta_blocks(n)), dim3(fma::kAttentionThreads), 0, fma::attention_delta<T>, n, g.Dv,
              dout.data<T>(), o.data<T>(), dlse.data<A>(), out.data<A>());
}

// dq, dk, dv, dbias: null where not asked for.
template <class T>
void backward(const fma::Geo& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const T* bias,
              const Tensor& lse, const GuardedOutput& delta, double scale, GuardedOutput* dq, GuardedOutput* dk,
              GuardedOutput* dv, GuardedOutput* dbias) {
  using A = compute_t<T>;
  const A* D = delta.data<A>();
  if (dk != nullptr || dv != nullptr) {
    const fma::LaunchShape shape = fma::dkdv_shape<A>(g);
    emu::launch(shape.grid, dim3(fma::kAttentionThreads), shape.shared_bytes, fma::attention_dkdv<T>, g, q.data<T>(),
                k.data<T>(), v.data<T>(), dout.data<T>(), bias, lse.data<A>(), D, static_cast<A>(scale),
                dk != nullptr ? dk->data<T>() : nullptr, dv != nullptr ? dv->data<T>() : nullptr);
  }
  if (dq != nullptr || dbias != nullptr) {
    const fma::LaunchShape shape = fma::dq_shape<A>(g);
    emu::launch(shape.grid, dim3(fma::kAttentionThreads), shape.shared_bytes, fma::attention_dq<T>, g, q.data<T>(),
                k.data<T>(), v.data<T>(), dout.data<T>(), bias, lse.data<A>(), D, static_cast<A>(scale),
                dq != nullptr ? dq->data<T>() : nullptr, dbias != nullptr ? dbias->data<T>() : nullptr);
  }
}

// ---- the tests ----------------------------------------------------------------------------------

class AttentionEmulation : public ::testing::Test {
 protected:
  Generator gen_{testing::test_seed(43)};
};

// The forward of every case of `cases` against the CPU kernel's, in every dtype.
template <size_t N>
void check_forward(const Case (&cases)[N], Generator& gen) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (const Case& c : cases) {
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
      const testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen, false);
      const testing::AttentionInputs x = testing::with_padding_poisoned(c, in);  // what the kernels get
      GuardedOutput o(c.o_shape(), dtype), lse(c.lse_shape(), accumulate_dtype(dtype));
      forward<T>(geo(c, x.masks), x.q, x.k, x.v, bias_of<T>(x.masks), c.params().scale, o, lse);
      const testing::AttentionOutputs want = testing::attention_forward_reference(c, in);
      expect_output(o, want.o, rtol(dtype), what + " o");
      expect_output(lse, want.lse, rtol(dtype), what + " lse");
    }
  });
}

// The backward of every case of `cases` against the CPU kernel's, in every dtype: δ, then all gradients
// (dbias with them where the case has a bias) and, for the cases marked `subsets`, some of them alone.
template <size_t N>
void check_backward(const Case (&cases)[N], Generator& gen) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    const DType at = accumulate_dtype(dtype);
    for (const Case& c : cases) {
      const testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen, true);
      const testing::AttentionInputs x = testing::with_padding_poisoned(c, in);  // what the kernels get
      const Tensor &q = x.q, &k = x.k, &v = x.v, &dout = x.dout, &dlse = x.dlse;
      // The saved outputs as the dtype under test holds them; both sides read these values.
      const testing::AttentionOutputs saved = testing::saved_attention_outputs(c, in);
      const Tensor &o = saved.o, &lse = saved.lse;

      // δ_r = Σ_d dO_rd O_rd − dlse_r, against the same sum in double from the same values.
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
      const int64_t n = c.B * c.T * c.H;
      const std::vector<double> dod = dout.to_doubles(), od = o.to_doubles(), dld = dlse.to_doubles();
      std::vector<double> want_delta(static_cast<size_t>(n)), delta_scale(static_cast<size_t>(n));
      for (size_t r = 0; r < want_delta.size(); ++r) {
        double dot = 0, magnitude = std::fabs(dld[r]);
        for (size_t d = 0; d < static_cast<size_t>(c.Dv); ++d) {
          dot += dod[r * c.Dv + d] * od[r * c.Dv + d];
          magnitude += std::fabs(dod[r * c.Dv + d] * od[r * c.Dv + d]);
        }
        want_delta[r] = dot - dld[r];
        delta_scale[r] = magnitude;
      }
      GuardedOutput got_delta({n}, at);
      delta<T>(geo(c, in.masks), dout, o, dlse, got_delta);
      expect_output(got_delta, Tensor::from_vector(want_delta, {n}, at), testing::gpu_rtol(dtype), what + " δ",
                    Tensor::from_vector(delta_scale, {n}, at));

      const bool with_bias = c.bias_rows > 0;
      std::vector<GradientsNeeded> needs = {{true, true, true, with_bias}};
      if (c.subsets) needs.insert(needs.end(), {{false, false, true}, {true, false, false}, {false, true, false}});
      if (c.subsets && with_bias) needs.push_back({false, false, false, true});
      for (GradientsNeeded need : needs) {
        const std::string with = what + need.names();
        GuardedOutput dq(q.shape(), dtype), dk(k.shape(), dtype), dv(v.shape(), dtype), dbias(c.dbias_shape(), dtype);
        backward<T>(geo(c, in.masks), q, k, v, dout, bias_of<T>(in.masks), lse, got_delta, c.params().scale,
                    need.dq ? &dq : nullptr, need.dk ? &dk : nullptr, need.dv ? &dv : nullptr,
                    need.dbias ? &dbias : nullptr);
        const kernel::AttentionGrads want = testing::attention_backward_reference(c, in, saved, need);
        const auto check = [&](bool asked, const GuardedOutput& got, const Tensor& want_grad, const char* name) {
          if (asked) {
            expect_output(got, want_grad, rtol(dtype), with + " → " + name);
          } else {  // not asked for: untouched
            expect_output(got, testing::poisoned(got.value().shape(), dtype, testing::kCpu), 0.0,
                          with + " → " + name + " (not written)");
          }
        };
        check(need.dq, dq, want.dq, "dq");
        check(need.dk, dk, want.dk, "dk");
        check(need.dv, dv, want.dv, "dv");
        check(need.dbias, dbias, want.dbias, "dbias");
      }
    }
  });
}

TEST_F(AttentionEmulation, ForwardMatchesTheCpuKernel) { check_forward(kCases, gen_); }

TEST_F(AttentionEmulation, BackwardAllAndSomeGradients) { check_backward(kCases, gen_); }

TEST_F(AttentionEmulation, ForwardWithMasksMatchesTheCpuKernel) { check_forward(kMaskCases, gen_); }

TEST_F(AttentionEmulation, BackwardWithMasksMatchesTheCpuKernel) { check_backward(kMaskCases, gen_); }

// Batch row 1's bias is −∞ on every key, so each of its rows sees only −∞ scores: the kernels must end
// them as rows that see no key (o = 0, lse = −∞, no gradient into q, k, v or the bias, and no NaN
// anywhere), which is what the CPU gives for the same call with k_lengths = {S, 0}.
TEST_F(AttentionEmulation, RowsOfMinusInfiniteBiasSeeNothing) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (bool causal : {true, false}) {
      Case c{2, 13, 21, 2, 1, 8, 8, causal, 0, false, {}, {}, 2};
      testing::AttentionInputs in = testing::attention_inputs(c, dtype, gen_, true);
      std::vector<double> bias = in.masks.bias.to_doubles();
      std::fill(bias.begin() + static_cast<ptrdiff_t>(bias.size() / 2), bias.end(),
                -std::numeric_limits<double>::infinity());
      in.masks.bias = Tensor::from_vector(bias, c.bias_shape(), dtype);
      Case cut = c;  // the reference: batch row 1's keys cut instead
      cut.k_lengths = {c.S, 0};
      testing::AttentionInputs cut_in = in;
      cut_in.masks.k_lengths = Tensor::from_indices(cut.k_lengths, {c.B});
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name() + " (batch row 1 all −∞)";

      GuardedOutput o(c.o_shape(), dtype), lse(c.lse_shape(), accumulate_dtype(dtype));
      forward<T>(geo(c, in.masks), in.q, in.k, in.v, bias_of<T>(in.masks), c.params().scale, o, lse);
      const testing::AttentionOutputs want = testing::attention_forward_reference(cut, cut_in);
      expect_output(o, want.o, rtol(dtype), what + " o");
      expect_output(lse, want.lse, rtol(dtype), what + " lse");

      const testing::AttentionOutputs saved = testing::as_saved(want, dtype);
      GuardedOutput delta_out({c.B * c.T * c.H}, accumulate_dtype(dtype));
      delta<T>(geo(c, in.masks), in.dout, saved.o, in.dlse, delta_out);
      GuardedOutput dq(c.q_shape(), dtype), dk(c.k_shape(), dtype), dv(c.v_shape(), dtype),
          dbias(c.dbias_shape(), dtype);
      backward<T>(geo(c, in.masks), in.q, in.k, in.v, in.dout, bias_of<T>(in.masks), saved.lse, delta_out,
                  c.params().scale, &dq, &dk, &dv, &dbias);
      const kernel::AttentionGrads grads =
          testing::attention_backward_reference(cut, cut_in, saved, {true, true, true, true});
      expect_output(dq, grads.dq, rtol(dtype), what + " → dq");
      expect_output(dk, grads.dk, rtol(dtype), what + " → dk");
      expect_output(dv, grads.dv, rtol(dtype), what + " → dv");
      expect_output(dbias, grads.dbias, rtol(dtype), what + " → dbias");
    }
  });
}

}  // namespace
}  // namespace seqlab
