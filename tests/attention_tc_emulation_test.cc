// The bf16 tensor-core attention kernels (src/cuda/attention/attention_tc_kernels.cuh), run on the CPU against the
// CPU attention slots. No GPU needed: this is the check those kernels get on every build until a GPU runs
// tests/attention_gpu_test.cc.
//
// The kernel source is compiled by the host compiler over the emulation of CUDA in cuda_emulation.h: each
// block runs as 128 threads (fibers: one runs at a time, from barrier to barrier, in a seeded random
// order) with its own shared-memory buffer, filled with 0xff bytes (NaN as bf16 and f32) so a read of
// anything not written shows up; __syncthreads and __syncwarp are barriers of the block's 128 and the
// warp's 32 threads; __shfl_xor_sync goes through a per-warp buffer between two warp barriers. The
// tensor-core instructions (mma.sync m16n8k16, ldmatrix .x4 with and without .trans, cp.async and its
// groups) are emulated lane by lane from their documented fragment layouts (tests/tensor_core_emulation.h):
// a lane computes or receives exactly the elements the hardware gives it, so a wrong fragment index, a
// missing to_a conversion or a C layout read as if it were another shows up as a wrong result; cp.async
// lands only when the issuing thread waits for its group, so reading a tile before waiting for it, or
// staging into a buffer another warp still reads, computes with stale data and fails the comparison.
// Checked by breaking the kernels on purpose, one change at a time: two registers of to_a's A fragments
// swapped, the barrier at the end of the forward's key loop removed, the dK/dV loop waiting for all but two
// copy groups, the dQ kernel's mask dropped, one m-tile's fragment used for the other's product: each fails.
// What this cannot check: the real compiler, the hardware's scheduling and memory system, and performance.
//
// Shapes: head dims 64 and 128, T and S not multiples of the 64-row tiles, T < S and T > S, causal and
// bidirectional, MHA, GQA and MQA, decoding. Masks: query and key lengths of 0, partial and full (a batch
// row of padding queries, whose blocks return at once, one whose keys are all padding, a block that is
// part padding, key tiles cut at k_len), a bias of 1 and of B rows with −∞ in it (through bias_scores in
// all three kernels, transposed in dK/dV), dbias with the other gradients and alone (the dQ kernel without
// dQ); and rows whose every visible key has −∞ bias, which must end as rows that see no key do, checked
// against the CPU with those rows' keys cut by k_lengths = 0 instead. Tolerance as for bf16 in the GPU test:
// |got − want| ≤ 2e-2 · max(|want|, 1), the reference being the CPU kernels in f32 on the same bf16
// values. The case struct, inputs and references: tests/attention_cases.h, as in the GPU test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention_cases.h"
#include "cuda_emulation.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"
#include "tensor_core_emulation.h"

namespace seqlab::cuda {
using bf16_t = seqlab::bf16;
}

#define SEQLAB_TC_ATTENTION 1
#define SEQLAB_TC_SHARED_MEMORY(name) unsigned char* name = emu::dynamic_shared()
#include "cuda/attention/attention_tc_kernels.cuh"

// ---- the test ---------------------------------------------------------------------------------------
namespace seqlab {
namespace {

namespace atc = cuda::attention_tc;
using testing::GradientsNeeded;
using Case = testing::AttentionCase;  // Dk = Dv = D, 64 or 128

// Every case runs through the wide shapes (the default); the narrow ones (SEQLAB_ATTENTION_TC_SHAPE=narrow) skip
// the two largest, whose extra tiles they would also cover, to keep the emulation's time down.
struct CaseRun {
  Case c;
  bool narrow_too;
};
const CaseRun kCases[] = {
    {{2, 100, 100, 2, 2, 64, 64, true, 0}, true},      // MHA, T = S, a partial second tile
    {{1, 77, 150, 4, 2, 128, 128, true, 0}, false},    // GQA, queries at the end of a longer cache (S − T = 73)
    {{1, 130, 61, 3, 1, 64, 64, false, 0}, true},      // bidirectional MQA, T > S, partial tiles both ways
    {{1, 1, 200, 2, 1, 128, 128, true, 0}, true},      // decoding
    {{1, 128, 192, 2, 1, 64, 64, true, 0}, true},      // exact multiples of the tile, S − T = 64
    {{1, 90, 90, 2, 2, 128, 128, false, 0.05}, true},  // bidirectional, explicit scale
    {{1, 300, 300, 4, 2, 64, 64, true, 0}, false},     // every loop over several tiles (double buffers turn over)
    // Masks: {B, T, S, H, Hk, D, D, causal, scale, subsets, q_lengths, k_lengths, bias rows}.
    // causal GQA: batch row 1 has a part-padding query block and key tiles cut at k_len = 70
    {{2, 100, 130, 2, 1, 64, 64, true, 0, false, {100, 37}, {130, 70}, 0}, true},
    // bidirectional, T > S: a batch row of padding queries, one whose keys are all padding, one real key;
    // a bias of B rows
    {{3, 70, 50, 2, 2, 64, 64, false, 0, false, {0, 70, 65}, {50, 0, 1}, 3}, true},
    // decoding with a key length and a bias shared by the batch rows
    {{1, 1, 150, 2, 1, 128, 128, true, 0, false, {1}, {90}, 1}, false},
    // causal T = S with a bias only, several tiles
    {{1, 96, 96, 2, 1, 128, 128, true, 0, false, {}, {}, 1}, false},
};

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  ASSERT_EQ(g.size(), w.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < g.size() && failures < 5; ++i) {
    if (!(g[i] == w[i] || std::fabs(g[i] - w[i]) <= 2e-2 * std::max(std::fabs(w[i]), 1.0))) {  // (== for ±∞)
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " from the kernel, " << w[i] << " on the CPU";
    }
  }
}

Tensor nans(const Shape& shape, DType dtype = DType::bf16) { return Tensor::full(shape, std::nan(""), dtype); }

// attention.cu's tc_problem(): the call with the masks of `m`.
atc::Problem problem(const Case& c, const kernel::AttentionMasks& m) {
  atc::Problem p{c.B, c.T, c.S, c.H, c.Hk, c.Dk, c.causal, static_cast<float>(c.params().scale)};
  p.q_lengths = m.q_lengths.defined() ? m.q_lengths.data<int64_t>() : nullptr;
  p.k_lengths = m.k_lengths.defined() ? m.k_lengths.data<int64_t>() : nullptr;
  p.bias = m.bias.defined() ? m.bias.data<bf16>() : nullptr;
  p.bias_batched = m.bias.defined() && m.bias.size(0) == c.B;
  return p;
}

// A case's inputs: bf16 q, k, v, dO, and the bias; dlse f32 (lse and dlse: f32 for bf16). `all_minus_infinity`
// sets the last plane of the bias (the last batch row's, or with one row every batch row's) to −∞
// everywhere, and returns the case and inputs the CPU reference runs instead: those batch rows' keys cut by
// k_lengths = 0.
struct TcInputs {
  testing::AttentionInputs in, reference;
  Case reference_case;
};
TcInputs tc_inputs(const Case& c, Generator& gen, bool all_minus_infinity) {
  TcInputs x{testing::attention_inputs(c, DType::bf16, gen, true), {}, c};
  x.reference = x.in;
  if (all_minus_infinity) {
    std::vector<double> bias = x.in.masks.bias.to_doubles();
    const size_t plane = bias.size() / static_cast<size_t>(c.bias_rows);
    std::fill(bias.end() - static_cast<ptrdiff_t>(plane), bias.end(), -std::numeric_limits<double>::infinity());
    x.in.masks.bias = Tensor::from_vector(bias, c.bias_shape(), DType::bf16);
    x.reference = x.in;
    x.reference_case.k_lengths.assign(static_cast<size_t>(c.B), c.bias_rows == 1 ? 0 : c.S);
    x.reference_case.k_lengths.back() = 0;
    x.reference.masks.k_lengths = Tensor::from_indices(x.reference_case.k_lengths, {c.B});
  }
  return x;
}

// One case through one set of kernel shapes (Fwd, Dq, Dkdv: atc::kernels::Shape).
template <class Fwd, class Dq, class Dkdv>
void run_case(const Case& c, Generator& gen, const std::string& shapes, bool all_minus_infinity = false) {
  constexpr int D = Fwd::D;
  const std::string what =
      c.name() + " (" + shapes + " shapes)" + (all_minus_infinity ? " (last batch row's bias all −∞)" : "");
  const TcInputs x = tc_inputs(c, gen, all_minus_infinity);
  const testing::AttentionInputs in = testing::with_padding_poisoned(c, x.in);  // what the kernels get
  const atc::Problem p = problem(c, in.masks);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout, &dlse = in.dlse;
  const bf16 *Q = q.data<bf16>(), *K = k.data<bf16>(), *V = v.data<bf16>(), *dO = dout.data<bf16>();
  auto tiles = [](int64_t n, int rows) { return static_cast<unsigned>((n + rows - 1) / rows); };

  // Forward. The kernels compiled with the masks' code where there are masks (or dbias), as attention_tc.cu's
  // launches choose them.
  const bool masks = p.q_lengths != nullptr || p.k_lengths != nullptr || p.bias != nullptr;
  Tensor o = nans({c.B, c.T, c.H, D}), lse = nans({c.B, c.T, c.H}, DType::f32);  // lse: f32 for bf16
  const dim3 block(atc::kernels::kThreads);
  emu::launch(dim3(tiles(c.T, Fwd::BR), static_cast<unsigned>(c.H), static_cast<unsigned>(c.B)), block,
              atc::kernels::FwdLayout<Fwd>::bytes, [&] {
                (masks ? atc::kernels::tc_forward<Fwd, true>
                       : atc::kernels::tc_forward<Fwd, false>)(p, Q, K, V, o.data<bf16>(), lse.data<float>());
              });
  const testing::AttentionOutputs want = testing::attention_forward_reference(x.reference_case, x.reference);
  EXPECT_FALSE(cuda::tc::tensor_core_copies_pending()) << what << ": forward left cp.async copies unwaited";
  expect_close(o, want.o, what + " o");
  expect_close(lse, want.lse, what + " lse");

  // Backward from the CPU forward's outputs as bf16 holds them (both sides read the same values), with
  // δ = dO·O − dlse in f32 as attention.cu's delta kernel forms it.
  const testing::AttentionOutputs saved = testing::as_saved(want, DType::bf16);
  const std::vector<double> od = saved.o.to_doubles(), dod = dout.to_doubles(), dld = dlse.to_doubles();
  std::vector<float> delta(static_cast<size_t>(c.B * c.T * c.H));
  for (size_t r = 0; r < delta.size(); ++r) {
    float dot = 0;
    for (int d = 0; d < D; ++d) dot += static_cast<float>(dod[r * D + d]) * static_cast<float>(od[r * D + d]);
    delta[r] = dot - static_cast<float>(dld[r]);
  }
  const bool with_bias = c.bias_rows > 0;
  std::vector<GradientsNeeded> needs = {{true, true, true, with_bias}, {false, true, false}, {false, false, true}};
  if (with_bias) needs.push_back({false, false, false, true});
  for (GradientsNeeded need : needs) {
    const std::string with = what + need.names();
    Tensor dq = nans(q.shape()), dk = nans(k.shape()), dv = nans(v.shape()), dbias = nans(c.dbias_shape());
    bf16* dQ = need.dq ? dq.data<bf16>() : nullptr;
    bf16* dK = need.dk ? dk.data<bf16>() : nullptr;
    bf16* dV = need.dv ? dv.data<bf16>() : nullptr;
    bf16* dB = need.dbias ? dbias.data<bf16>() : nullptr;
    const float* L = saved.lse.data<float>();
    if (dK || dV) {
      emu::launch(dim3(tiles(c.S, Dkdv::BR), static_cast<unsigned>(c.Hk), static_cast<unsigned>(c.B)), block,
                  atc::kernels::DkdvLayout<Dkdv>::bytes, [&] {
                    (masks ? atc::kernels::tc_dkdv<Dkdv, true>
                           : atc::kernels::tc_dkdv<Dkdv, false>)(p, Q, K, V, dO, L, delta.data(), dK, dV);
                  });
    }
    if (dQ || dB) {
      emu::launch(dim3(tiles(c.T, Dq::BR), static_cast<unsigned>(c.H), static_cast<unsigned>(c.B)), block,
                  atc::kernels::DqLayout<Dq>::bytes, [&] {
                    (masks || dB ? atc::kernels::tc_dq<Dq, true>
                                 : atc::kernels::tc_dq<Dq, false>)(p, Q, K, V, dO, L, delta.data(), dQ, dB);
                  });
    }
    EXPECT_FALSE(cuda::tc::tensor_core_copies_pending()) << with << ": backward left cp.async copies unwaited";
    const kernel::AttentionGrads grads =
        testing::attention_backward_reference(x.reference_case, x.reference, saved, need);
    if (need.dq) expect_close(dq, grads.dq, with + " → dq");
    if (need.dk) expect_close(dk, grads.dk, with + " → dk");
    if (need.dv) expect_close(dv, grads.dv, with + " → dv");
    if (need.dbias) expect_close(dbias, grads.dbias, with + " → dbias");
    // A gradient not asked for is not touched.
    for (auto [asked, t, name] :
         {std::tuple{need.dq, &dq, "dq"}, {need.dk, &dk, "dk"}, {need.dv, &dv, "dv"}, {need.dbias, &dbias, "dbias"}}) {
      if (asked) continue;
      for (double x : t->to_doubles()) {
        if (!std::isnan(x)) {
          ADD_FAILURE() << with << ": " << name << " was written though not asked for";
          break;
        }
      }
    }
  }
}

TEST(AttentionTensorCoreEmulation, MatchesTheCpuKernels) {
  Generator gen(testing::test_seed(97));
  // Both sets of shapes attention_tc.cu launches (SEQLAB_ATTENTION_TC_SHAPE).
  auto both = [&](auto d, const CaseRun& run) {
    using Sh = atc::kernels::Shapes<decltype(d)::value>;
    run_case<typename Sh::WideForward, typename Sh::WideDq, typename Sh::WideDkdv>(run.c, gen, "wide");
    if (run.narrow_too) run_case<typename Sh::Forward, typename Sh::Dq, typename Sh::Dkdv>(run.c, gen, "narrow");
  };
  for (const CaseRun& run : kCases) {
    if (run.c.Dk == 64) {
      both(std::integral_constant<int, 64>{}, run);
    } else {
      both(std::integral_constant<int, 128>{}, run);
    }
  }
}

// The last batch row's bias is −∞ on every key, so each of its rows sees only −∞ scores: the kernels must
// end them as rows that see no key (o = 0, lse = −∞, no gradient into q, k, v or the bias, and no NaN),
// which is what the CPU gives for the same call with that row's k_length = 0. Causal and bidirectional,
// both head dims, the wide shapes.
TEST(AttentionTensorCoreEmulation, RowsOfMinusInfiniteBiasSeeNothing) {
  Generator gen(testing::test_seed(98));
  using Sh64 = atc::kernels::Shapes<64>;
  using Sh128 = atc::kernels::Shapes<128>;
  run_case<Sh64::WideForward, Sh64::WideDq, Sh64::WideDkdv>({2, 70, 90, 2, 1, 64, 64, true, 0, false, {}, {}, 2}, gen,
                                                            "wide", true);
  run_case<Sh128::WideForward, Sh128::WideDq, Sh128::WideDkdv>(
      {2, 20, 70, 2, 2, 128, 128, false, 0, false, {20, 11}, {}, 1}, gen, "wide", true);
}

}  // namespace
}  // namespace seqlab
