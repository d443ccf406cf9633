// Fused softmax attention: the raw entry points, the CPU forward and backward kernels side by side,
// the autograd node, the naive materialised reference, and the registry entry.
//
// How the CPU kernels work (equations in docs/variants/attention.md):
// - Work is cut into tiles of up to `block` query rows × `block` keys of one (batch, head) (bf16 on
//   the CPU's bf16 instructions: at least 128, kNativeBf16Block). Each tile's products (S = Q Kᵀ, then
//   P V in the forward; S, dP = dO Vᵀ, Pᵀ dO, dS K, dSᵀ Q in the backward) are GEMMs through the GEMM
//   slot, single-threaded inside the parallel loop over tasks, all of them of the forms A B and Aᵀ B
//   (Kᵀ and Vᵀ are transposed once; see transpose_into for why; bf16 on oneDNN reads K and V
//   transposed instead, KeysTransposed); only the softmax in between is elementwise, its row loops
//   (max, exp, sum) those of tensor/softmax_rows.h. A key block that no row of a tile sees (beyond the causal
//   limit) is never visited; inside a block, a row's future keys get probability 0. On a causal diagonal
//   block of a tile of at least 128 rows, the rows run their products in halves (quarters for bf16 on the
//   tile kernel) over the keys each part's last row sees (row_segments), which leaves out most of the
//   triangle above the diagonal. Scratch is a
//   few block × block tiles per thread and one Kᵀ (Vᵀ), never T × S.
// - Forward: online softmax. A task owns one query tile; each row keeps a running max m and sum ℓ;
//   its output sums are rescaled by exp(m_old − m_new) whenever a block raises the max, divided by ℓ
//   at the end. Saves lse = m + log ℓ.
// - Masks: padded queries are a suffix of each sequence and every other row sees key 0, so the rows
//   of a tile that see any key are a prefix of it (`live_rows`); the GEMMs run over those rows only,
//   so a padded row's q, dout and dlse enter no product. Keys past k_lengths[b] shorten the tile's
//   key range like the causal limit does. A row that sees no key gets o = 0 and lse = −∞; its
//   probabilities are taken as 0 (never exp(−∞ + ∞)), so it passes no gradient. The bias is added
//   to a row's visible scores only, and dbias = dS is written for them, 0 elsewhere.
// - Backward: P is recomputed from lse, never stored, once per tile. One race-free pass over
//   (batch, kv head): a task walks every query head sharing its kv head and every tile they see, so
//   it alone writes those dK/dV rows and those heads' dQ rows.
// - Sums accumulate in the input type (f32 like flash attention, or f64), and in f32 for bf16: the
//   kernels take bf16 tensors themselves (SEQLAB_REGISTER_KERNEL_TAKING_BF16, no f32 stand-ins), run
//   their GEMMs on bf16 operands into f32 sums (cpu::gemm: AVX512-BF16 through oneDNN, or widened to
//   f32 where the CPU lacks it or SEQLAB_CPU_BF16_GEMM=widened), round P and dS to bf16 before their
//   products exactly where the CUDA kernels round them, keep lse and δ in f32, and round o, dq, dk,
//   dv and dbias once, at the end. So the CPU stays the reference for the GPU's bf16 attention.
#include "layers/attention/attention.h"

#ifdef __AVX__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "layers/variant_inputs.h"
#include "tensor/bf16_convert.h"
#include "tensor/blas_rows.h"
#include "tensor/parallel.h"
#include "tensor/softmax_rows.h"
#include "tensor/elementwise_math.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace kernel {

namespace {

struct Dims {
  int64_t B, T, S, H, Hk, Dk, Dv;
};

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const VariantInputs in("attention", {{"q", q}, {"k", k}, {"v", v}},
                         "q [B, T, H, Dk], k [B, S, Hk, Dk], v [B, S, Hk, Dv]");
  const HeadDims h = in.qkv_with_kv_heads();
  if (causal && h.T > h.S) {
    in.fail(
        "causal attention needs T ≤ S: query i sits at key position i + S − T, so T > S puts queries before the "
        "first key");
  }
  in.same_dtype_and_device();
  return {h.B, h.T, h.S, h.H, h.Hk, h.dk, h.dv};
}

// The tile is never larger than the longest side (a larger one covers the same single tile), so an
// absurd block allocates nothing absurd.
AttentionParams resolve(const AttentionOptions& opts, const Dims& d) {
  if (opts.block <= 0)
    throw std::invalid_argument("attention: block must be positive, got " + std::to_string(opts.block));
  const int64_t block = std::min(opts.block, std::max<int64_t>(1, std::max(d.T, d.S)));
  return {opts.causal, opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(d.Dk)), block};
}

// Lengths [B] (i32 or i64) with values in [0, limit], as contiguous i64 on `device`; undefined stays undefined.
// The values are read on the host: an out-of-range length would index outside the tensors.
Tensor checked_lengths(const VariantInputs& in, const char* name, const Tensor& t, int64_t B, int64_t limit,
                       const char* limit_name, Device device) {
  if (!t.defined()) return t;
  const std::string n(name);
  if (!is_integer(t.dtype())) in.fail(n + " must be i32 or i64, got " + dtype_name(t.dtype()));
  if (t.dim() != 1 || t.size(0) != B) in.fail(n + " must be [B] = [" + std::to_string(B) + "]");
  const std::vector<int64_t> values = t.to_indices();
  for (size_t b = 0; b < values.size(); ++b) {
    if (values[b] < 0 || values[b] > limit) {
      in.fail(n + " must hold values in [0, " + limit_name + "] = [0, " + std::to_string(limit) + "], got " +
              std::to_string(values[b]) + " for batch row " + std::to_string(b));
    }
  }
  return kernel::contiguous(kernel::to_device(kernel::to_dtype(t, DType::i64), device));
}

// The lengths and the bias of one call, checked against the dims, as the kernels take them.
AttentionMasks check_masks(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d,
                           const AttentionOptions& opts, const Tensor& bias) {
  const VariantInputs in("attention",
                         {{"q", q}, {"k", k}, {"v", v}, {"q_lengths", opts.q_lengths}, {"k_lengths", opts.k_lengths},
                          {"bias", bias}},
                         "q [B, T, H, Dk], k [B, S, Hk, Dk], v [B, S, Hk, Dv], q_lengths [B], k_lengths [B], "
                         "bias [1 or B, H, T, S]");
  AttentionMasks m;
  m.q_lengths = checked_lengths(in, "q_lengths", opts.q_lengths, d.B, d.T, "T", q.device());
  m.k_lengths = checked_lengths(in, "k_lengths", opts.k_lengths, d.B, d.S, "S", q.device());
  if (bias.defined()) {
    if (bias.dim() != 4 || (bias.size(0) != 1 && bias.size(0) != d.B) || bias.size(1) != d.H || bias.size(2) != d.T ||
        bias.size(3) != d.S) {
      in.fail("bias must be [1 or B, H, T, S] = [1 or " + std::to_string(d.B) + ", " + std::to_string(d.H) + ", " +
              std::to_string(d.T) + ", " + std::to_string(d.S) + "]");
    }
    if (bias.dtype() != q.dtype()) {
      in.fail(std::string("bias must have q's dtype ") + dtype_name(q.dtype()) + ", got " + dtype_name(bias.dtype()));
    }
    if (bias.device() != q.device()) {
      in.fail("bias must be on q's device " + q.device().str() + ", got " + bias.device().str());
    }
    m.bias = kernel::contiguous(bias);
  }
  return m;
}

// t itself on the CPU where each token holds its heads × D contiguously ([B, N, heads, D] with strides
// [·, ·, D, 1]: a head split of a projection, as the attention mixer makes q, k, v), which the CPU kernels
// read in place (HeadRows); a contiguous copy otherwise, and on other devices, whose kernels take
// contiguous tensors only.
Tensor as_head_rows(const Tensor& t) {
  if (t.is_contiguous() || !t.device().is_cpu() || t.dim() != 4) return kernel::contiguous(t);
  const Shape &n = t.shape(), &st = t.strides();
  const bool rows = (n[3] == 1 || st[3] == 1) && (n[2] == 1 || st[2] == n[3]) && st[0] >= 0 && st[1] >= 0;
  return rows ? t : kernel::contiguous(t);
}

// Whether q, k, v are the three parts of one contiguous [B, T, H + 2Hk, D] tensor on the CPU, in that order
// (the attention mixer's split of its qkv projection). Then dq, dk, dv are written into one such tensor
// likewise, so that the split's backward finds them end to end and takes it without a copy (split,
// src/autograd/ops_index.cpp).
bool packed_parts(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d) {
  if (!q.device().is_cpu() || d.Dk != d.Dv || d.T != d.S || q.storage() != k.storage() ||
      q.storage() != v.storage()) {
    return false;
  }
  const Shape strides = contiguous_strides({d.B, d.T, d.H + 2 * d.Hk, d.Dk});
  return q.strides() == strides && k.strides() == strides && v.strides() == strides &&
         k.offset() == q.offset() + d.H * d.Dk && v.offset() == k.offset() + d.Hk * d.Dk;
}

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype) {
    throw std::invalid_argument(std::string("attention backward: ") + what + " is " +
                                (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "undefined") +
                                ", expected " + shape_str(shape) + " " + dtype_name(dtype));
  }
}

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                  const Tensor& bias) {
  const Dims d = check_inputs(q, k, v, opts.causal);
  const AttentionMasks masks = check_masks(q, k, v, d, opts, bias);
  const AttentionParams p = resolve(opts, d);
  AttentionOutput out{Tensor::empty({d.B, d.T, d.H, d.Dv}, q.dtype(), q.device()),
                      Tensor::empty({d.B, d.T, d.H}, accumulate_dtype(q.dtype()), q.device())};
  attention_forward_kernel(q.device(), as_head_rows(q), as_head_rows(k), as_head_rows(v), masks, p, out.o, out.lse);
  return out;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionOptions& opts,
                                  bool need_dq, bool need_dk, bool need_dv, const Tensor& bias, bool need_dbias) {
  const Dims d = check_inputs(q, k, v, opts.causal);
  const AttentionMasks masks = check_masks(q, k, v, d, opts, bias);
  const AttentionParams p = resolve(opts, d);
  if (need_dbias && !bias.defined()) throw std::invalid_argument("attention backward: dbias asked for without a bias");
  const Shape o_shape{d.B, d.T, d.H, d.Dv}, lse_shape{d.B, d.T, d.H};
  check_like(dout, o_shape, q.dtype(), "dout");
  check_like(out, o_shape, q.dtype(), "o");
  check_like(lse, lse_shape, accumulate_dtype(q.dtype()), "lse");
  if (dlse.defined()) check_like(dlse, lse_shape, accumulate_dtype(q.dtype()), "dlse");
  AttentionGrads g;
  if (need_dq && need_dk && need_dv && packed_parts(q, k, v, d)) {
    const Tensor packed = Tensor::empty({d.B, d.T, d.H + 2 * d.Hk, d.Dk}, q.dtype(), q.device());
    g.dq = kernel::narrow(packed, 2, 0, d.H);
    g.dk = kernel::narrow(packed, 2, d.H, d.Hk);
    g.dv = kernel::narrow(packed, 2, d.H + d.Hk, d.Hk);
  } else {
    if (need_dq) g.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
    if (need_dk) g.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
    if (need_dv) g.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  }
  if (need_dbias) g.dbias = Tensor::empty({d.B, d.H, d.T, d.S}, q.dtype(), q.device());
  if (!need_dq && !need_dk && !need_dv && !need_dbias) return g;
  Tensor dl =
      dlse.defined() ? kernel::contiguous(dlse) : Tensor::zeros(lse_shape, accumulate_dtype(q.dtype()), q.device());
  attention_backward_kernel(q.device(), kernel::contiguous(dout), dl, as_head_rows(q), as_head_rows(k), as_head_rows(v),
                            masks, kernel::contiguous(out), kernel::contiguous(lse), p, g);
  // A bias shared by the batch rows (Bb = 1 < B) gets the sum of their gradients.
  if (need_dbias && bias.size(0) != d.B) g.dbias = kernel::sum(g.dbias, {0}, true);
  return g;
}

}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::AttentionGrads;
using kernel::AttentionMasks;
using kernel::AttentionParams;

// The type every sum is kept in: f32 for bf16 tensors (as the CUDA kernels keep it), the tensors' own
// type otherwise. lse, dlse and δ are in it too (accumulate_dtype).
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

template <class T>
Acc<T> widen(T x) {
  return static_cast<Acc<T>>(x);
}

// Rounds a sum to the tensors' type (bf16: to nearest even, as the CUDA kernels store it).
template <class T>
T narrow(Acc<T> x) {
  return T(x);
}

// Where a (batch, token, head) row of q, k or v (or of dq, dk, dv) starts: a [B, N, heads, D] tensor whose
// tokens hold their heads × D contiguously, with any batch and token strides (q, k, v may be views of
// one packed projection, kernel::head_rows).
struct HeadRows {
  int64_t batch, token, d;
  int64_t at(int64_t b, int64_t i, int64_t h) const { return b * batch + i * token + h * d; }
};
HeadRows head_rows(const Tensor& t) {
  if (!t.defined()) return {0, 0, 0};
  return {t.strides()[0], t.strides()[1], t.size(3)};
}

// Rows [r0, r1) of a tile and the first nk keys of a key block: a product's extent (Geometry::row_segments).
struct RowSegment {
  int64_t r0, r1, nk;
};
// A tile is split into segments only where each keeps at least this many rows: smaller GEMMs run further
// from the GEMM rate than the triangle they leave out saves. bf16 tiles on the tile kernel
// (tensor/cpu/gemm_bf16_tiles.h), which keeps its rate down to 32 rows, are split down to kMinTileSegmentRows.
constexpr int64_t kMinSegmentRows = 64;
constexpr int64_t kMinTileSegmentRows = 32;
constexpr int kMaxSegments = 4;

// Geometry of one call: row numbers in the contiguous [B, T, H, ·] layouts of o, dO, lse and δ (times
// the head dim gives the element offset; q, k, v and their gradients are placed by HeadRows), the
// causal and padding limits, and where a row of scores starts in the [Bb, H, T, S] bias and the
// [B, H, T, S] dbias.
struct Geometry {
  int64_t B, T, S, H, Hk, Dk, Dv, group, block;
  bool causal;
  int64_t min_segment_rows = kMinSegmentRows;
  const int64_t* q_len = nullptr;  // [B], or null: every query valid
  const int64_t* k_len = nullptr;  // [B], or null: every key valid
  bool bias_shared = false;        // bias [1, H, T, S], read by every batch row

  int64_t q_row(int64_t b, int64_t i, int64_t h) const { return (b * T + i) * H + h; }
  // Query i of batch row b sees keys [0, key_end(b, i)); none when it is padding. Over the rows that
  // see any key, key_end never decreases with i (the backward's transposed tiles rely on it).
  int64_t key_end(int64_t b, int64_t i) const {
    if (q_len && i >= q_len[b]) return 0;
    const int64_t end = causal ? i + S - T + 1 : S;
    return k_len ? std::min(end, k_len[b]) : end;
  }
  // How many rows of the tile starting at query i0 see some key: a prefix of the tile, since padded
  // queries are a suffix and every other row sees key 0 (causal needs T ≤ S) unless k_len[b] = 0.
  int64_t live_rows(int64_t b, int64_t i0, int64_t rows) const {
    if (k_len && k_len[b] == 0) return 0;
    return q_len ? std::clamp<int64_t>(q_len[b] - i0, 0, rows) : rows;
  }
  int64_t bias_row(int64_t b, int64_t h, int64_t i) const { return ((bias_shared ? 0 : b) * H + h) * T * S + i * S; }
  int64_t dbias_row(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * T * S + i * S; }
  int64_t tiles(int64_t n) const { return (n + block - 1) / block; }
  // The live rows of the tile at query i0 against the key block [j0, j0 + nk), as up to kMaxSegments
  // segments of rows (halves, or quarters where each keeps min_segment_rows), each with the keys of the
  // block its last row sees: on a causal diagonal block the first rows see few of the keys, so their
  // products leave out most of the triangle above the diagonal. Neighbours that see the same keys are one
  // segment; rows outside every segment see none of the block's keys. Returns the number written to seg.
  int row_segments(int64_t b, int64_t i0, int64_t live, int64_t j0, int64_t nk, RowSegment seg[kMaxSegments]) const {
    int parts = 1;
    while (2 * parts <= kMaxSegments && live / (2 * parts) >= min_segment_rows) parts *= 2;
    int n = 0;
    for (int e = 0; e < parts; ++e) {
      const int64_t r0 = live * e / parts, r1 = live * (e + 1) / parts;
      const int64_t keys = e + 1 == parts ? nk : std::clamp<int64_t>(key_end(b, i0 + r1 - 1) - j0, 0, nk);
      if (keys == 0) continue;  // these rows see none of the block's keys: they enter no product
      if (n > 0 && seg[n - 1].nk == keys) {
        seg[n - 1].r1 = r1;
      } else {
        seg[n++] = {r0, r1, keys};
      }
    }
    return n;
  }
  // Whether the T×S work is worth a thread team.
  bool parallel(int64_t tasks) const { return tasks > 1 && T * S * (Dk + Dv) > kParallelGrain; }
};

// bf16 tiles on the CPU's bf16 instructions have at least this many rows and keys. Each tile GEMM is
// then one oneDNN call, whose fixed cost (wrapping the operands, dispatching; about a fifth of the
// time at 64 × 64 × 64) 128-row tiles amortise: 20% faster than 64 at B 4, H 8, T 1024, d 64, and 256
// no faster (docs/perf.md). f32 keeps `block`: OpenBLAS's small-matrix kernels stop at 10⁶
// multiply-adds per product, and past them its general path was 7× slower at 128.
constexpr int64_t kNativeBf16Block = 128;

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMasks& masks,
                  const AttentionParams& p) {
  int64_t block = p.block;
  if (q.dtype() == DType::bf16 && kernel::cpu_bf16_gemm_native()) {
    block = std::min(std::max(block, kNativeBf16Block), std::max<int64_t>(1, std::max(q.size(1), k.size(1))));
  }
  Geometry g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 1, block, p.causal};
  g.group = g.H / g.Hk;
  if (q.dtype() == DType::bf16 && kernel::cpu_bf16_gemm_tiles()) g.min_segment_rows = kMinTileSegmentRows;
  if (masks.q_lengths.defined()) g.q_len = masks.q_lengths.data<int64_t>();
  if (masks.k_lengths.defined()) g.k_len = masks.k_lengths.data<int64_t>();
  g.bias_shared = masks.bias.defined() && masks.bias.size(0) == 1;
  return g;
}

// A tile of n sums as the operand of a GEMM of T rows: the tile itself when T is the sum type; for
// bf16, its values rounded to bf16 into `rounded` (P and dS are rounded before their products, as the
// CUDA kernels and flash attention round them).
template <class T>
const T* gemm_operand(const Acc<T>* x, int64_t n, std::vector<T>& rounded) {
  if constexpr (std::is_same_v<T, Acc<T>>) {
    return x;
  } else {
    round_to_bf16_run(x, rounded.data(), n);
    return rounded.data();
  }
}

// C (sums) = α op(A) op(B) + β C with A and B of T: f32 and f64 as themselves, bf16 products summed in f32.
template <class T>
void gemm_acc(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, double beta, Acc<T>* c, int64_t ldc) {
  gemm<T, Acc<T>>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#ifdef __AVX__
// dst[c·ldd + r] = src[r·ld + c] for r, c < 8, through registers: rows are interleaved in pairs
// (unpack), pairs of pairs (shuffle), then the 128-bit halves are exchanged.
inline void transpose8x8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// Why the kernels transpose K and V first: a GEMM C = A Bᵀ (B stored row-major, "NT") of a tile's size
// takes OpenBLAS's general path, which packs both operands on every call (its small-matrix kernels
// skip that form once C has more than 1200 elements), and measured about 3× slower here than the same
// product as C = A B from a stored Bᵀ. So every product below is A B or Aᵀ B: the scores Q Kᵀ and
// dO Vᵀ read Kᵀ and Vᵀ, which cost one pass over K and V, against the block × S products they feed.
//
// dst[c·rows + r] = src[r·ld + c] for r < rows, c < cols: the rows × cols matrix at src transposed into
// contiguous cols × rows.
// f32 on AVX goes 8 × 8 blocks at a time in registers (the compiler leaves the scalar loop scalar:
// its reads are strided), the rest element by element; a copy either way, so the same values.
template <class T>
void transpose_into(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst) {
  int64_t rows_done = 0, cols_done = 0;  // the leading rows_done × cols_done block is written by blocks
#ifdef __AVX__
  if constexpr (std::is_same_v<T, float>) {
    rows_done = rows / 8 * 8;
    cols_done = cols / 8 * 8;
    for (int64_t r0 = 0; r0 < rows_done; r0 += 8) {
      for (int64_t c0 = 0; c0 < cols_done; c0 += 8) transpose8x8(src + r0 * ld + c0, ld, dst + c0 * rows + r0, rows);
    }
  }
#endif
  auto scalar = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    constexpr int64_t kTile = 16;  // tiles of 16 × 16, so both sides stay in cache lines already loaded
    for (int64_t rt = r0; rt < r1; rt += kTile) {
      for (int64_t ct = c0; ct < c1; ct += kTile) {
        for (int64_t c = ct; c < std::min(c1, ct + kTile); ++c) {
          for (int64_t r = rt; r < std::min(r1, rt + kTile); ++r) dst[c * rows + r] = src[r * ld + c];
        }
      }
    }
  };
  scalar(0, rows_done, cols_done, cols);  // the columns right of the blocks
  scalar(rows_done, rows, 0, cols);       // the rows below them
}

// Kᵀ (or Vᵀ) of one kv head as the B operand of the products that read it, D × S with key j in
// column j: a transposed copy (see transpose_into), or, for bf16 on the CPU's bf16 instructions, the
// rows of K themselves read transposed: oneDNN packs B into its own layout on every call whatever its
// strides, so a copy would only add a pass (it took a third of the bf16 kernels' own time at T 256).
template <class T>
class KeysTransposed {
 public:
  // At least one row, so that a column offset into the copy is a valid pointer even for a zero-width head.
  KeysTransposed(int64_t D, int64_t S)
      : copied_(!(std::is_same_v<T, bf16> && kernel::cpu_bf16_gemm_native())),
        copy_(copied_ ? static_cast<size_t>(std::max<int64_t>(D, 1) * S) : 0) {}
  // The S × D rows at `rows` (leading dimension ld).
  void set(const T* rows, int64_t ld, int64_t S, int64_t D) {
    if (copied_) {
      transpose_into(rows, ld, S, D, copy_.data());
      base_ = copy_.data();
      ld_ = S;
    } else {
      base_ = rows;
      ld_ = ld;
    }
  }
  const T* columns_from(int64_t j0) const { return copied_ ? base_ + j0 : base_ + j0 * ld_; }
  int64_t ld() const { return ld_; }
  bool trans() const { return !copied_; }  // whether the GEMM reads B transposed

 private:
  bool copied_;
  std::vector<T> copy_;
  const T* base_ = nullptr;
  int64_t ld_ = 0;
};

// Where a kernel sums the rows of an output: the output itself (leading dimension ld) when T is the
// sum type; otherwise a scratch of `rows` × n sums (ld = n) that `store` rounds into the output once.
template <class T>
struct SumRows {
  T* out;
  int64_t ld_out, rows, n;
  std::vector<Acc<T>>& scratch;

  Acc<T>* sums() {
    if constexpr (std::is_same_v<T, Acc<T>>) {
      return out;
    } else {
      return scratch.data();
    }
  }
  int64_t ld() const { return std::is_same_v<T, Acc<T>> ? ld_out : n; }
  void zero() {
    Acc<T>* s = sums();
    for (int64_t r = 0; r < rows; ++r) std::fill_n(s + r * ld(), n, Acc<T>(0));
  }
  void store() {
    if constexpr (!std::is_same_v<T, Acc<T>>) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < n; ++c) out[r * ld_out + c] = narrow<T>(scratch[r * n + c]);
      }
    }
  }
};

// Per (b, h) and query row i, over the visible keys j < key_end(b, i):
//   s_ij = scale q_i·k_j + bias_ij,  m_i = max_j s_ij,  ℓ_i = Σ_j exp(s_ij − m_i),
//   o_i = Σ_j exp(s_ij − m_i) v_j / ℓ_i,  lse_i = m_i + log ℓ_i,
// with m, ℓ and o_i built key block by key block (online softmax); a row with ℓ_i = 0 (no visible
// key, or a bias of −∞ on all of them) gets o_i = 0, lse_i = −∞. A task owns `block` query rows
// of one (b, h); for each key block it forms the live rows × block score tile S = scale Q Kᵀ with one
// GEMM, turns it into probabilities P = exp(S − m_new) against the running max in place, and adds
// P V into the rows' sums with a second GEMM (after rescaling them by exp(m_old − m_new) when the max
// rose). bf16: Q, K, V are bf16, S and every sum f32, P rounded to bf16 for P V (ℓ sums the unrounded
// P), o rounded once at the end; lse is f32.
// Memory: reads q, k, v, the lengths and the bias rows it sees; writes o [B, T, H, Dv] and
// lse [B, T, H]; scratch per thread: Kᵀ of one kv head (Dk × S), a block × block tile (and its bf16
// copy), `block` rows of output sums, and (m, ℓ) for `block` rows.
template <class T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMasks& masks, const AttentionParams& p,
             const Tensor& o, const Tensor& lse) {
  using A = Acc<T>;
  const Geometry g = geometry(q, k, v, masks, p);
  const T *Q = q.data<T>(), *K = k.data<T>(), *V = v.data<T>();
  const T* Bias = masks.bias.defined() ? masks.bias.data<T>() : nullptr;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  T* O = o.data<T>();
  A* LSE = lse.data<A>();
  const HeadRows qr = head_rows(q), kr = head_rows(k), vr = head_rows(v);
  const int64_t ldq = qr.token, ldk = kr.token, ldv = vr.token;
  const int64_t qtiles = g.tiles(g.T), tasks = g.B * g.H * qtiles;
#pragma omp parallel if (g.parallel(tasks))
  {
    // Kᵀ of the kv head (b, hk) = kt_of (−1: none yet). A thread's tasks come in order, so it transposes
    // each kv head it meets about once, into a tile that stays in cache.
    KeysTransposed<T> kt(g.Dk, g.S);
    int64_t kt_of = -1;
    std::vector<A> s(static_cast<size_t>(g.block * g.block)), m(g.block), l(g.block);
    std::vector<A> acc(static_cast<size_t>(g.block * g.Dv));  // o's sums, row r at r·Dv
    std::vector<T> p_rounded(std::is_same_v<T, A> ? 0 : s.size());
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (g.H * qtiles), h = task / qtiles % g.H, hk = h / g.group;
      const int64_t i0 = task % qtiles * g.block, i1 = std::min(g.T, i0 + g.block), rows = i1 - i0;
      std::fill_n(m.begin(), rows, kNegInf);
      std::fill_n(l.begin(), rows, A(0));
      std::fill_n(acc.begin(), rows * g.Dv, A(0));
      const int64_t live = g.live_rows(b, i0, rows);
      const int64_t tile_key_end = live > 0 ? g.key_end(b, i0 + live - 1) : 0;  // its last live row sees the most
      if (tile_key_end > 0 && kt_of != b * g.Hk + hk) {
        kt.set(K + kr.at(b, 0, hk), ldk, g.S, g.Dk);
        kt_of = b * g.Hk + hk;
      }
      for (int64_t j0 = 0; j0 < tile_key_end; j0 += g.block) {
        const int64_t nk = std::min(j0 + g.block, tile_key_end) - j0;
        RowSegment seg[kMaxSegments];
        const int segments = g.row_segments(b, i0, live, j0, nk, seg);
        for (int e = 0; e < segments; ++e) {
          gemm_acc<T>(false, kt.trans(), seg[e].r1 - seg[e].r0, seg[e].nk, g.Dk, p.scale,
                      Q + qr.at(b, i0 + seg[e].r0, h), ldq, kt.columns_from(j0), kt.ld(), 0.0,
                      s.data() + seg[e].r0 * nk, nk);
        }
        for (int64_t r = 0; r < live; ++r) {
          A* sr = s.data() + r * nk;
          // The keys of the block this row sees: [0, seen), its future (or padding) past them.
          const int64_t seen = std::clamp<int64_t>(g.key_end(b, i0 + r) - j0, 0, nk);
          if (Bias) {
            const T* br = Bias + g.bias_row(b, h, i0 + r) + j0;
            for (int64_t c = 0; c < seen; ++c) sr[c] += widen(br[c]);
          }
          const A block_max = row_max(sr, seen);
          if (block_max > m[r]) {  // rescale what was summed against the old max (0 on the first block)
            const A rescale = math::exp_vec(m[r] - block_max);
            l[r] *= rescale;
            scal(rescale, acc.data() + r * g.Dv, g.Dv);
            m[r] = block_max;
          }
          // While every score so far is −∞ (a bias of −∞), m stays −∞: exponents against 0 give 0, not NaN.
          l[r] += exp_shifted_sum(sr, seen, m[r] == kNegInf ? A(0) : m[r]);
          std::fill(sr + seen, sr + nk, A(0));  // P = 0 for the keys the row does not see
        }
        const T* p_op = gemm_operand<T>(s.data(), live * nk, p_rounded);
        for (int e = 0; e < segments; ++e) {  // a segment's P is 0 past its keys
          gemm_acc<T>(false, false, seg[e].r1 - seg[e].r0, g.Dv, seg[e].nk, 1.0, p_op + seg[e].r0 * nk, nk,
                      V + vr.at(b, j0, hk), ldv, 1.0, acc.data() + seg[e].r0 * g.Dv, g.Dv);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = O + g.q_row(b, i0 + r, h) * g.Dv;
        const A* arow = acc.data() + r * g.Dv;
        A& lse_r = LSE[g.q_row(b, i0 + r, h)];
        if (l[r] > 0) {
          const A inv = A(1) / l[r];
          for (int64_t c = 0; c < g.Dv; ++c) orow[c] = narrow<T>(arow[c] * inv);
          lse_r = m[r] + std::log(l[r]);
        } else {  // the row sees no key: o = 0, lse = log 0
          std::fill_n(orow, g.Dv, T(A(0)));
          lse_r = kNegInf;
        }
      }
    }
  }
}

// With P_ij = exp(s_ij − lse_i) recomputed from the saved lse (0 where lse_i = −∞ or j is not
// visible) and the output gradients dO, dlse:
//   δ_i = Σ_d dO_id O_id − dlse_i,  dP_ij = dO_i·v_j,  dS_ij = P_ij (dP_ij − δ_i)
//   dQ_i = scale Σ_j dS_ij k_j,  dK_j = scale Σ_{h,i} dS_ij q_i,  dV_j = Σ_{h,i} P_ij dO_i,
//   dbias_ij = dS_ij (s_ij = scale q_i·k_j + bias_ij; per batch row, the entry point sums a shared bias's)
// (sums over h run over the query heads sharing the kv head). Derivation: o_i = Σ_j P_ij v_j gives
// dP_ij = dO_i·v_j; the softmax Jacobian gives ∂L/∂s_ij = P_ij (dP_ij − Σ_j' P_ij' dP_ij') and
// Σ_j' P_ij' dP_ij' = dO_i·o_i; ∂lse_i/∂s_ij = P_ij adds P_ij dlse_i.
// One pass: a task owns one (b, kv head) and walks every query head of its group, every query tile
// and every key block the tile sees. Per tile (live query rows × nk keys), with K_blkᵀ and V_blkᵀ read
// from the task's transposed copies of its K and V (see transpose_into):
//   S = scale Q_tile K_blkᵀ,  P = exp(S − lse) (each row against its own lse),
//   dV_blk += Pᵀ dO_tile,  dP = dO_tile V_blkᵀ,  dS = P ∘ (dP − δ),
//   dQ_tile += scale dS K_blk,  dK_blk += scale dSᵀ Q_tile,
// five GEMMs and one exp per score. It alone writes the dK/dV rows of its kv head and the dQ rows and
// dbias rows of its query heads, so there are no races. Only a tile's live rows enter the GEMMs, so
// padded rows' dO and dlse reach no gradient. bf16: P and dS are rounded to bf16 before their products
// (as the CUDA kernels round them), every sum is f32, the gradients are rounded once at the end; dbias
// is dS rounded once.
// Memory: reads dO, dlse, q, k, v, o, lse, the lengths and the bias rows it sees; writes the requested
// dq, dk, dv and dbias [B, H, T, S]; scratch: δ [B, T, H]; per thread, Kᵀ and Vᵀ of one kv head
// (S × (Dk + Dv)), two block × block tiles (and their bf16 copies), and for bf16 the f32 sums of the
// task's dK, dV rows (S × (Dk + Dv)) and of a query tile's dQ rows.
template <class T>
void backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
              const AttentionMasks& masks, const Tensor& o, const Tensor& lse, const AttentionParams& p,
              const AttentionGrads& grads) {
  using A = Acc<T>;
  constexpr A kInf = std::numeric_limits<A>::infinity();
  const Geometry g = geometry(q, k, v, masks, p);
  const T* Bias = masks.bias.defined() ? masks.bias.data<T>() : nullptr;
  const T *dO = dout.data<T>(), *Q = q.data<T>(), *K = k.data<T>(), *V = v.data<T>(), *O = o.data<T>();
  const A *dL = dlse.data<A>(), *LSE = lse.data<A>();

  const int64_t rows_total = g.B * g.T * g.H;
  std::vector<A> delta(static_cast<size_t>(rows_total));
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.Dv));
  parallel_for(rows_total, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> x(std::is_same_v<T, A> ? 0 : g.Dv), y(x.size());  // bf16 rows widened (exactly) for the dot
    for (int64_t r = begin; r < end; ++r) {
      if constexpr (std::is_same_v<T, A>) {
        delta[r] = dot(dO + r * g.Dv, O + r * g.Dv, g.Dv) - dL[r];
      } else {
        for (int64_t c = 0; c < g.Dv; ++c) {
          x[c] = widen(dO[r * g.Dv + c]);
          y[c] = widen(O[r * g.Dv + c]);
        }
        delta[r] = dot(x.data(), y.data(), g.Dv) - dL[r];
      }
    }
  });

  T* dQ = grads.dq.defined() ? grads.dq.data<T>() : nullptr;
  T* dK = grads.dk.defined() ? grads.dk.data<T>() : nullptr;
  T* dV = grads.dv.defined() ? grads.dv.data<T>() : nullptr;
  T* dB = grads.dbias.defined() ? grads.dbias.data<T>() : nullptr;
  const HeadRows qr = head_rows(q), kr = head_rows(k), vr = head_rows(v);
  const HeadRows dqr = head_rows(grads.dq), dkr = head_rows(grads.dk), dvr = head_rows(grads.dv);
  const int64_t ldq = qr.token, ldo = g.H * g.Dv, ldk = kr.token, ldv = vr.token;
  const int64_t qtiles = g.tiles(g.T), tasks = g.B * g.Hk;
  constexpr bool kRounds = !std::is_same_v<T, A>;
#pragma omp parallel if (g.parallel(tasks))
  {
    std::vector<A> pt(static_cast<size_t>(g.block * g.block)), ds(pt.size());  // P, dP then dS
    std::vector<T> p_rounded(kRounds ? pt.size() : 0), ds_rounded(p_rounded.size());
    KeysTransposed<T> kt(g.Dk, g.S), vt(g.Dv, g.S);
    std::vector<A> dk_sums(kRounds && dK ? g.S * g.Dk : 0), dv_sums(kRounds && dV ? g.S * g.Dv : 0);
    std::vector<A> dq_sums(kRounds && dQ ? g.block * g.Dk : 0);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / g.Hk, hk = task % g.Hk;
      kt.set(K + kr.at(b, 0, hk), ldk, g.S, g.Dk);
      vt.set(V + vr.at(b, 0, hk), ldv, g.S, g.Dv);
      SumRows<T> dk_rows{dK ? dK + dkr.at(b, 0, hk) : nullptr, dkr.token, g.S, g.Dk, dk_sums};
      SumRows<T> dv_rows{dV ? dV + dvr.at(b, 0, hk) : nullptr, dvr.token, g.S, g.Dv, dv_sums};
      if (dK) dk_rows.zero();
      if (dV) dv_rows.zero();
      for (int64_t h = hk * g.group; h < (hk + 1) * g.group; ++h) {
        if (dB) std::fill_n(dB + g.dbias_row(b, h, 0), g.T * g.S, T(A(0)));
        for (int64_t tile = 0; tile < qtiles; ++tile) {
          const int64_t i0 = tile * g.block, i1 = std::min(g.T, i0 + g.block), rows = i1 - i0;
          const T *Qt = Q + qr.at(b, i0, h), *dOt = dO + g.q_row(b, i0, h) * g.Dv;
          SumRows<T> dq_rows{dQ ? dQ + dqr.at(b, i0, h) : nullptr, dqr.token, rows, g.Dk, dq_sums};
          if (dQ) dq_rows.zero();
          const int64_t live = g.live_rows(b, i0, rows);
          const int64_t tile_key_end = live > 0 ? g.key_end(b, i0 + live - 1) : 0;
          for (int64_t j0 = 0; j0 < tile_key_end; j0 += g.block) {
            const int64_t nk = std::min(j0 + g.block, tile_key_end) - j0;
            RowSegment seg[kMaxSegments];
            const int segments = g.row_segments(b, i0, live, j0, nk, seg);
            for (int e = 0; e < segments; ++e) {
              gemm_acc<T>(false, kt.trans(), seg[e].r1 - seg[e].r0, seg[e].nk, g.Dk, p.scale, Qt + seg[e].r0 * ldq,
                          ldq, kt.columns_from(j0), kt.ld(), 0.0, pt.data() + seg[e].r0 * nk, nk);
            }
            for (int64_t r = 0; r < live; ++r) {
              A* pr = pt.data() + r * nk;
              const A lse_r = LSE[g.q_row(b, i0 + r, h)];
              // A row whose scores were all −∞ (a bias of −∞) has lse = −∞ and P = 0.
              const int64_t seen = lse_r == -kInf ? 0 : std::clamp<int64_t>(g.key_end(b, i0 + r) - j0, 0, nk);
              if (Bias) {
                const T* br = Bias + g.bias_row(b, h, i0 + r) + j0;
                for (int64_t c = 0; c < seen; ++c) pr[c] += widen(br[c]);
              }
              exp_shifted(pr, seen, lse_r);
              std::fill(pr + seen, pr + nk, A(0));
            }
            const T* p_op = gemm_operand<T>(pt.data(), live * nk, p_rounded);
            for (int e = 0; dV && e < segments; ++e) {
              const int64_t r0 = seg[e].r0;
              gemm_acc<T>(true, false, seg[e].nk, g.Dv, seg[e].r1 - r0, 1.0, p_op + r0 * nk, nk, dOt + r0 * ldo, ldo,
                          1.0, dv_rows.sums() + j0 * dv_rows.ld(), dv_rows.ld());
            }
            if (!dQ && !dK && !dB) continue;
            for (int e = 0; e < segments; ++e) {  // dP, and dS over the segment's keys
              const int64_t r0 = seg[e].r0, r1 = seg[e].r1, n_keys = seg[e].nk;
              gemm_acc<T>(false, vt.trans(), r1 - r0, n_keys, g.Dv, 1.0, dOt + r0 * ldo, ldo, vt.columns_from(j0),
                          vt.ld(), 0.0, ds.data() + r0 * nk, nk);
              for (int64_t r = r0; r < r1; ++r) {
                const A dr = delta[g.q_row(b, i0 + r, h)];
                const A* pr = pt.data() + r * nk;
                A* dsr = ds.data() + r * nk;
                for (int64_t c = 0; c < n_keys; ++c) dsr[c] = pr[c] * (dsr[c] - dr);
              }
            }
            if (dB) {  // dbias_ij = dS_ij for the keys the row sees; the rest of the row stays 0
              for (int64_t r = 0; r < live; ++r) {
                const int64_t seen = std::clamp<int64_t>(g.key_end(b, i0 + r) - j0, 0, nk);
                T* brow = dB + g.dbias_row(b, h, i0 + r) + j0;
                for (int64_t c = 0; c < seen; ++c) brow[c] = narrow<T>(ds[r * nk + c]);
              }
            }
            if (!dQ && !dK) continue;
            const T* ds_op = gemm_operand<T>(ds.data(), live * nk, ds_rounded);
            for (int e = 0; e < segments; ++e) {
              const int64_t r0 = seg[e].r0, rows_e = seg[e].r1 - r0, n_keys = seg[e].nk;
              if (dQ) gemm_acc<T>(false, false, rows_e, g.Dk, n_keys, p.scale, ds_op + r0 * nk, nk,
                                  K + kr.at(b, j0, hk), ldk, 1.0, dq_rows.sums() + r0 * dq_rows.ld(),
                                  dq_rows.ld());
              if (dK) gemm_acc<T>(true, false, n_keys, g.Dk, rows_e, p.scale, ds_op + r0 * nk, nk, Qt + r0 * ldq, ldq,
                                  1.0, dk_rows.sums() + j0 * dk_rows.ld(), dk_rows.ld());
            }
          }
          if (dQ) dq_rows.store();
        }
      }
      if (dK) dk_rows.store();
      if (dV) dv_rows.store();
    }
  }
}

// bf16 tensors are taken as they are (the kernels above sum them in f32); f32 and f64 likewise.
template <class Fn>
void dispatch_attention(DType dtype, const char* op, Fn&& fn) {
  if (dtype == DType::bf16) {
    fn(bf16{});
  } else {
    dispatch_float(dtype, op, fn);
  }
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMasks& masks,
                 const AttentionParams& p, const Tensor& o, const Tensor& lse) {
  dispatch_attention(q.dtype(), "attention", [&](auto tag) { forward<decltype(tag)>(q, k, v, masks, p, o, lse); });
}

void backward_cpu(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionMasks& masks, const Tensor& o, const Tensor& lse, const AttentionParams& p,
                  const AttentionGrads& grads) {
  dispatch_attention(q.dtype(), "attention backward",
                     [&](auto tag) { backward<decltype(tag)>(dout, dlse, q, k, v, masks, o, lse, p, grads); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
// The kernels take bf16 tensors themselves (no f32 stand-ins): their GEMMs run on bf16 operands.
SEQLAB_REGISTER_KERNEL_TAKING_BF16(attention_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(attention_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves q, k, v, bias (contiguous), o and lse; the backward is the kernel
// above. The lengths travel in the options and are never differentiated.
AttentionOutput attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                   const Tensor& bias) {
  kernel::check_inputs(q, k, v, opts.causal);
  // Saved as the kernels read them: views of a packed projection stay views (kernel::as_head_rows).
  const Tensor qc = kernel::as_head_rows(q), kc = kernel::as_head_rows(k), vc = kernel::as_head_rows(v);
  const Tensor bc = bias.defined() ? kernel::contiguous(bias) : bias;
  AttentionOutput out = kernel::attention_forward(qc, kc, vc, opts, bc);
  record("attention", {q, k, v, bias}, {&out.o, &out.lse}, {qc, kc, vc, out.o, out.lse, bc},
         [opts](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           kernel::AttentionGrads d = kernel::attention_backward(g[0], g[1], s[0], s[1], s[2], s[3], s[4], opts,
                                                                 need[0], need[1], need[2], s[5], need[3]);
           return std::vector<Tensor>{d.dq, d.dk, d.dv, d.dbias};
         });
  return out;
}

// scores = Q Kᵀ · scale + bias over [B, H, T, S] (kv heads repeated for their query groups), masked
// to −∞ where a key is not visible; lse = m + log Σ_j exp(scores − m) with the row max m held
// constant (it cancels); o = exp(scores − lse) V. A row that sees no key has its scores set to 0
// (any finite value would do) so that nothing above is NaN, and then o = 0 and lse = −∞ by masked
// fills, which pass those rows no gradient.
AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                    const Tensor& bias) {
  const kernel::Dims d = kernel::check_inputs(q, k, v, opts.causal);
  kernel::check_masks(q, k, v, d, opts, bias);
  const double sc = opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(d.Dk));
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t group = d.H / d.Hk;
  auto heads_first = [](const Tensor& x) { return permute(x, {0, 2, 1, 3}); };
  auto repeat_kv = [&](const Tensor& x) {  // [B, S, Hk, D] → [B, H, S, D]
    Tensor t = unsqueeze(heads_first(x), 2);
    t = expand(t, {d.B, d.Hk, group, d.S, x.size(3)});
    return reshape(t, {d.B, d.H, d.S, x.size(3)});
  };
  Tensor scores = matmul(heads_first(q), transpose(repeat_kv(k), 2, 3)) * sc;
  if (bias.defined()) scores = scores + bias;
  const bool padded = opts.q_lengths.defined() || opts.k_lengths.defined();
  Tensor no_key;  // [B, 1, T, 1]: rows that see no key
  if (padded) {
    const std::vector<int64_t> ql = opts.q_lengths.defined() ? opts.q_lengths.to_indices()
                                                             : std::vector<int64_t>(static_cast<size_t>(d.B), d.T);
    const std::vector<int64_t> kl = opts.k_lengths.defined() ? opts.k_lengths.to_indices()
                                                             : std::vector<int64_t>(static_cast<size_t>(d.B), d.S);
    std::vector<int64_t> hidden(static_cast<size_t>(d.B * d.T * d.S)), empty(static_cast<size_t>(d.B * d.T));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t i = 0; i < d.T; ++i) {
        bool sees_any = false;
        for (int64_t j = 0; j < d.S; ++j) {
          const bool visible = i < ql[b] && j < kl[b] && (!opts.causal || j <= i + d.S - d.T);
          hidden[(b * d.T + i) * d.S + j] = !visible;
          sees_any = sees_any || visible;
        }
        empty[b * d.T + i] = !sees_any;
      }
    }
    no_key = Tensor::from_indices(empty, {d.B, 1, d.T, 1});
    scores = masked_fill(scores, Tensor::from_indices(hidden, {d.B, 1, d.T, d.S}), -inf);
    scores = masked_fill(scores, no_key, 0.0);
  } else if (opts.causal) {
    std::vector<int64_t> future(static_cast<size_t>(d.T * d.S));
    for (int64_t i = 0; i < d.T; ++i) {
      for (int64_t j = 0; j < d.S; ++j) future[i * d.S + j] = j > i + d.S - d.T;
    }
    scores = masked_fill(scores, Tensor::from_indices(future, {d.T, d.S}), -inf);
  }
  Tensor m = max(scores, {3}, true).detach();
  Tensor lse = m + log(sum(exp(scores - m), {3}, true));
  Tensor o = matmul(exp(scores - lse), repeat_kv(v));
  if (padded) {
    o = masked_fill(o, no_key, 0.0);
    lse = masked_fill(lse, no_key, -inf);
  }
  return {heads_first(o), permute(squeeze(lse, 3), {0, 2, 1})};
}

AttentionOutput attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  AttentionOptions opts;
  opts.causal = causal;
  opts.scale = scale;
  return attention_reference(q, k, v, opts);
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "attention";
  s.summary =
      "o = softmax(q kᵀ · scale + bias + mask) v, lse = log Σ_j exp(q kᵀ · scale + bias + mask); q [B, T, H, Dk], "
      "k [B, S, Hk, Dk], v [B, S, Hk, Dv], q_lengths, k_lengths [B], bias [1 or B, H, T, S], query i at key "
      "position i + S − T; a row that sees no key: o = 0, lse = −∞";
  s.inputs = {{"q"},
              {"k"},
              {"v"},
              {"q_lengths", OpInputKind::index, true},
              {"k_lengths", OpInputKind::index, true},
              {"bias", OpInputKind::floating, true}};
  s.outputs = {"o", "lse"};
  s.attrs = {{"causal", AttrType::boolean, "true", "query i sees keys j ≤ i + S − T (else every key)"},
             {"scale", AttrType::number, "0", "score scale; ≤ 0 means 1/√Dk"},
             {"block", AttrType::integer, "64", "keys (and query rows) per tile"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    AttentionOptions opts{a.get_bool("causal"), a.get_number("scale"), a.get_int("block"), in[3], in[4]};
    AttentionOutput out = attention_with_lse(in[0], in[1], in[2], opts, in[5]);
    return std::vector<Tensor>{out.o, out.lse};
  };
  // T = 5 and S = 7 are not multiples of the block, GQA with 2 query heads per kv head, Dk ≠ Dv. The lengths are
  // full (q_lengths as i32, k_lengths as i64) and the bias, shared by the batch rows, is 0: the example computes
  // what plain attention does (tests/attention_test.cc's RegistryEntry holds it to the unmasked reference), while
  // the gradient check of every op still checks dbias = dS and the hostile-input test reaches the masks' checks.
  // Padded rows would have lse = −∞, which no finite difference can check; tests/attention_test.cc checks them.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 5, 4, 3}, gen, dtype),
                               Tensor::randn({2, 7, 2, 3}, gen, dtype),
                               Tensor::randn({2, 7, 2, 4}, gen, dtype),
                               Tensor::from_indices({5, 5}, {2}, DType::i32),
                               Tensor::from_indices({7, 7}, {2}, DType::i64),
                               Tensor::zeros({1, 4, 5, 7}, dtype)};
  };
  s.example_attrs = {{"block", "2"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
