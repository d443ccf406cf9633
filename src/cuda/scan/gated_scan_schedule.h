// The column-parallel gated linear recurrence behind the CUDA kernels of GLA (src/cuda/scan/gla.cu) and
// retention (src/cuda/scan/retention.cu), written once as __host__ __device__ code so that a CPU test
// (tests/gla_emulation_test.cc, tests/retention_emulation_test.cc) runs the kernels' exact
// schedule — the same phases, barriers, thread indices and reduction orders — against the CPU kernels.
//
// The recurrence, per batch entry b and head h (S_t ∈ R^{dk×dv}, orientation and scale as the CPU):
//   S_t = (α_tᵀ β_t) ⊙ S_{t−1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   S_{−1} = h0 (or 0), final = S_{T−1}
// with α_t = exp(g_t) [dk] (GLA) or the head's constant decay γ_h (retention, g absent), β_t = exp(gv_t)
// [dv] (GLA with a value gate) or 1. Column j of S evolves on its own:
//   S[:, j] ← α_t β_t[j] ⊙ S[:, j] + k_t v_t[j],   o_t[j] = scale Σ_i q_t[i] S[i, j]
// so the kernels run the recurrent form for every form a slot is asked for (the chunkwise, parallel and
// recurrent forms are equal; only rounding differs).
//
// Work split. One block per (column tile of kCols = 32 value columns, head, batch entry); thread
// tid = p·kCols + c owns column j = tile·kCols + c and the kRows = 8 state rows i = p·kRows + r, r < kRows,
// held in registers; P = ⌈dk / kRows⌉ row groups, so a block has 32·P ≤ 512 threads (head dims ≤ 128).
// Threads past dv or rows past dk hold zeros and contribute zeros.
//
// Forward (forward_block), per segment of kSegment = 16 steps:
//   1. stage q, k, α of the segment's steps into shared memory (compute type) — barrier;
//   2. each thread steps its rows through the segment, writing its partial Σ_r q_i S_ij per step
//      into red[s][p][c] — barrier;
//   3. o_t[j] = scale Σ_{p = 0..P−1} red[s][p][c] (fixed order), one thread per (s, c).
//   At the end every thread writes its rows of final_state.
// Backward (backward_block), reverse-time recurrence for dS (column-separable like the forward):
//   dS += scale q_tᵀ do_t;  dq_t = scale S_t do_t;  dk_t = dS v_t;  dv_t = k_t dS;
//   D = dS ⊙ αβᵀ ⊙ S_{t−1}:  dg_t = Σ_j D_ij,  dgv_t = Σ_i D_ij;   dS ← αβᵀ ⊙ dS
//   and dh0 = dS at the end. S_{t−1} is never recovered by dividing by gates: pass 1 runs the forward and
//   stores the state entering every segment (ckpt, thread-private global scratch); pass 2 walks the
//   segments in reverse, recomputes the segment's states from its checkpoint into segs (thread-private
//   global scratch) and walks them backwards in batches of `batch` steps. Per batch each thread writes
//   its per-column terms of dq, dk, dg into red[s][kind][i][c] and its per-row-group sums of dv, dgv into
//   redi[s][kind][p][c] — barrier — then one thread per output sums them in a fixed order: over the
//   32 columns c for dq, dk, dg (a partial sum of this column tile, written to `part`), over the P row
//   groups for dv, dgv (complete: the block holds every row) — barrier. A last pass (sum_tiles) adds the
//   column tiles' partials in tile order. No atomics anywhere: the same inputs give the same bits.
//
// Files: this header (the schedule, host-compilable) and gated_scan.cuh (the CUDA kernels and launchers that
// run it, nvcc only).
//
// Shared memory (elements of the compute type A): forward 3·16·dk + 16·P·32; backward
// 3·16·dk + batch·(3·dk·33 + 2·P·32). Global scratch of the backward: ckpt ⌈T/16⌉·dk·32 and segs 16·dk·32
// per block, part (2 or 3)·tiles·B·T·H·dk.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/elementwise_math.h"  // SEQLAB_HD: __host__ __device__ under nvcc, inline otherwise

#ifdef __CUDA_ARCH__
#define SEQLAB_SCAN_UNROLL _Pragma("unroll")
#else
#define SEQLAB_SCAN_UNROLL
#endif

namespace seqlab::cuda::scan {

constexpr int kRows = 8;          // state rows per thread (registers)
constexpr int kCols = 32;         // value columns per block, one per lane of a warp
constexpr int kSegment = 16;      // steps per staged segment (and between backward checkpoints)
constexpr int kMaxHeadDim = 128;  // dk, dv limit: at most 16 row groups, 512 threads
constexpr int kMaxThreads = kCols * kMaxHeadDim / kRows;

SEQLAB_HD float exp_of(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}
SEQLAB_HD double exp_of(double x) {
#ifdef __CUDA_ARCH__
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

// Element conversions (bf16 ↔ f32 through __nv_bfloat16's own conversions: round to nearest even).
template <class To, class From>
SEQLAB_HD To cvt(From x) {
  return static_cast<To>(x);
}

SEQLAB_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// One call: shapes, the inputs (storage type E, contiguous [B, T, H, ·] and [B, H, dk, dv]) and the
// scale in the compute type A.
template <class E, class A>
struct Problem {
  int64_t nb = 0, nt = 0, nh = 0, dk = 0, dv = 0;  // B, T, H, dk, dv
  A scale = 1;
  const E *q = nullptr, *k = nullptr, *v = nullptr;
  const E* g = nullptr;      // [B, T, H, dk] log-gates; null: α = decay[h]
  const E* gv = nullptr;     // [B, T, H, dv] log-gates; null: β = 1
  const E* h0 = nullptr;     // [B, H, dk, dv]; null: zeros
  const A* decay = nullptr;  // [H], read when g is null

  SEQLAB_HD int row_groups() const { return static_cast<int>((dk + kRows - 1) / kRows); }
  SEQLAB_HD int threads() const { return row_groups() * kCols; }
  SEQLAB_HD int64_t tiles() const { return (dv + kCols - 1) / kCols; }
  SEQLAB_HD int64_t segments() const { return (nt + kSegment - 1) / kSegment; }
  SEQLAB_HD int64_t row_k(int64_t b, int64_t t, int64_t h) const { return ((b * nt + t) * nh + h) * dk; }
  SEQLAB_HD int64_t row_v(int64_t b, int64_t t, int64_t h) const { return ((b * nt + t) * nh + h) * dv; }
  SEQLAB_HD int64_t state(int64_t b, int64_t h) const { return (b * nh + h) * dk * dv; }
  SEQLAB_HD int64_t block(int64_t b, int64_t h, int64_t tile) const { return (b * nh + h) * tiles() + tile; }
  SEQLAB_HD A beta(int64_t rv, int64_t j) const { return gv != nullptr ? exp_of(cvt<A>(gv[rv + j])) : A(1); }
};

// What the backward reads and writes besides the Problem. Scratch in the compute type.
template <class E, class A>
struct BackwardIO {
  const E* dout = nullptr;    // [B, T, H, dv]
  const E* dfinal = nullptr;  // [B, H, dk, dv]
  E* dv = nullptr;            // [B, T, H, dv], always written
  E* dgv = nullptr;           // [B, T, H, dv] or null
  E* dh0 = nullptr;           // [B, H, dk, dv] or null
  bool want_dg = false;       // part holds kind 2 (dg) too
  A* part = nullptr;          // [kinds][tiles][B·T·H·dk]: kind 0 dq, 1 dk, 2 dg, summed over one tile's columns
  A* ckpt = nullptr;          // [blocks][segments][kRows][threads]: the state entering each segment
  A* segs = nullptr;          // [blocks][kSegment][kRows][threads]: the states of the segment being walked
  int batch = 1;              // steps per reduction batch in the backward (≤ kSegment)
};

template <class E, class A>
SEQLAB_HD int64_t forward_shared_elems(const Problem<E, A>& pb) {
  return 3 * kSegment * pb.dk + int64_t{kSegment} * pb.row_groups() * kCols;
}
template <class E, class A>
SEQLAB_HD int64_t backward_shared_elems(const Problem<E, A>& pb, int batch) {
  return 3 * kSegment * pb.dk + int64_t{batch} * (3 * pb.dk * (kCols + 1) + 2 * pb.row_groups() * kCols);
}

template <class A>
struct ForwardThread {
  A S[kRows];  // S[p·kRows + r, j]
};
template <class A>
struct BackwardThread {
  A S[kRows];   // a state (pass 1, recomputation)
  A dS[kRows];  // the gradient w.r.t. the current state
};

// q, k, α of steps t0 .. t0 + len − 1 into qs, ks, as [len][dk] (qs may be null): thread tid of n
// takes elements tid, tid + n, ...
template <class E, class A>
SEQLAB_HD void stage_rows(const Problem<E, A>& pb, int64_t b, int64_t h, int64_t t0, int len, int tid, int n, A* qs,
                          A* ks, A* as) {
  const int64_t dk = pb.dk;
  for (int64_t e = tid; e < len * dk; e += n) {
    const int64_t s = e / dk, i = e - s * dk, rk = pb.row_k(b, t0 + s, h) + i;
    if (qs != nullptr) qs[e] = cvt<A>(pb.q[rk]);
    ks[e] = cvt<A>(pb.k[rk]);
    as[e] = pb.g != nullptr ? exp_of(cvt<A>(pb.g[rk])) : pb.decay[h];
  }
}

// One step of a thread's rows: S_i ← α_i β_j S_i + k_i v_j; returns Σ_r q_i S_i when q is given.
template <class A>
SEQLAB_HD A step_rows(A* S, const A* q, const A* k, const A* a, A vj, A bj, int p, int64_t dk) {
  A part = 0;
  SEQLAB_SCAN_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = int64_t{p} * kRows + r;
    if (i < dk) {
      S[r] = a[i] * bj * S[r] + k[i] * vj;
      if (q != nullptr) part += q[i] * S[r];
    }
  }
  return part;
}

// A thread's rows from / to an [dk, dv] state matrix (column j; zeros / nothing outside it).
template <class E, class A>
SEQLAB_HD void load_state(const E* src, int p, int64_t j, int64_t dk, int64_t dv, A* S) {
  SEQLAB_SCAN_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = int64_t{p} * kRows + r;
    S[r] = src != nullptr && i < dk && j < dv ? cvt<A>(src[i * dv + j]) : A(0);
  }
}
template <class E, class A>
SEQLAB_HD void store_state(const A* S, int p, int64_t j, int64_t dk, int64_t dv, E* dst) {
  SEQLAB_SCAN_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = int64_t{p} * kRows + r;
    if (i < dk && j < dv) dst[i * dv + j] = cvt<E>(S[r]);
  }
}

// A thread's rows in thread-private scratch: element r at base[r · stride] (stride = threads, so a
// warp's accesses are contiguous).
template <class A>
SEQLAB_HD void save_rows(const A* S, A* base, int stride) {
  SEQLAB_SCAN_UNROLL
  for (int r = 0; r < kRows; ++r) base[int64_t{r} * stride] = S[r];
}
template <class A>
SEQLAB_HD void load_rows(const A* base, int stride, A* S) {
  SEQLAB_SCAN_UNROLL
  for (int r = 0; r < kRows; ++r) S[r] = base[int64_t{r} * stride];
}

// The forward of block (tile, h, b): writes o_t[j] for the tile's columns, every t, and the tile's
// columns of final_state. `ex` runs a phase on every thread (ex.each(f): f(tid, thread state)) and
// holds the barrier (ex.sync()). smem: forward_shared_elems(pb) elements.
template <class E, class A, class Exec>
SEQLAB_HD void forward_block(Exec& ex, const Problem<E, A>& pb, int64_t b, int64_t h, int64_t tile, A* smem, E* o,
                             E* final_state) {
  const int P = pb.row_groups(), n = pb.threads();
  const int64_t dk = pb.dk, dv = pb.dv, st = pb.state(b, h);
  A* qs = smem;                 // [kSegment][dk]
  A* ks = qs + kSegment * dk;   // [kSegment][dk]
  A* as = ks + kSegment * dk;   // [kSegment][dk]
  A* red = as + kSegment * dk;  // [kSegment][P][kCols]
  ex.each([&](int tid, ForwardThread<A>& th) {
    load_state(pb.h0 != nullptr ? pb.h0 + st : nullptr, tid / kCols, tile * kCols + tid % kCols, dk, dv, th.S);
  });
  for (int64_t t0 = 0; t0 < pb.nt; t0 += kSegment) {
    const int len = static_cast<int>(min64(kSegment, pb.nt - t0));
    ex.each([&](int tid, ForwardThread<A>&) { stage_rows(pb, b, h, t0, len, tid, n, qs, ks, as); });
    ex.sync();
    ex.each([&](int tid, ForwardThread<A>& th) {
      const int p = tid / kCols, c = tid % kCols;
      const int64_t j = tile * kCols + c;
      const bool col = j < dv;
      for (int s = 0; s < len; ++s) {
        const int64_t rv = pb.row_v(b, t0 + s, h);
        const A vj = col ? cvt<A>(pb.v[rv + j]) : A(0), bj = col ? pb.beta(rv, j) : A(1);
        red[(s * P + p) * kCols + c] = step_rows(th.S, qs + s * dk, ks + s * dk, as + s * dk, vj, bj, p, dk);
      }
    });
    ex.sync();
    // No barrier after this phase: the next segment's staging writes qs, ks, as, which it does not read,
    // and red is written again only after the next barrier.
    ex.each([&](int tid, ForwardThread<A>&) {
      for (int e = tid; e < len * kCols; e += n) {
        const int s = e / kCols, c = e % kCols;
        const int64_t j = tile * kCols + c;
        if (j >= dv) continue;
        A sum = 0;
        for (int p = 0; p < P; ++p) sum += red[(s * P + p) * kCols + c];
        o[pb.row_v(b, t0 + s, h) + j] = cvt<E>(pb.scale * sum);
      }
    });
  }
  ex.each([&](int tid, ForwardThread<A>& th) {
    store_state(th.S, tid / kCols, tile * kCols + tid % kCols, dk, dv, final_state + st);
  });
}

// The backward of block (tile, h, b): dv (and dgv) of the tile's columns, the tile's partial sums of
// dq, dk (and dg) in io.part, and the tile's columns of dh0. smem: backward_shared_elems(pb, io.batch).
template <class E, class A, class Exec>
SEQLAB_HD void backward_block(Exec& ex, const Problem<E, A>& pb, const BackwardIO<E, A>& io, int64_t b, int64_t h,
                              int64_t tile, A* smem) {
  const int P = pb.row_groups(), n = pb.threads(), W = kCols + 1;
  const int64_t dk = pb.dk, dv = pb.dv, st = pb.state(b, h), nseg = pb.segments(), tiles = pb.tiles();
  const int64_t blk = pb.block(b, h, tile), N = pb.nb * pb.nt * pb.nh * dk;
  A* qs = smem;                                    // [kSegment][dk]
  A* ks = qs + kSegment * dk;                      // [kSegment][dk]
  A* as = ks + kSegment * dk;                      // [kSegment][dk]
  A* red = as + kSegment * dk;                     // [batch][3][dk][kCols + 1]: dq, dk, dg terms per column
  A* redi = red + io.batch * 3 * dk * W;           // [batch][2][P][kCols]: dv, dgv sums per row group
  A* ckpt = io.ckpt + blk * nseg * kRows * n;      // + (seg·kRows + r)·n + tid
  A* segs = io.segs + blk * kSegment * kRows * n;  // + (s·kRows + r)·n + tid

  ex.each([&](int tid, BackwardThread<A>& th) {
    const int p = tid / kCols;
    const int64_t j = tile * kCols + tid % kCols;
    load_state(pb.h0 != nullptr ? pb.h0 + st : nullptr, p, j, dk, dv, th.S);
    load_state(io.dfinal + st, p, j, dk, dv, th.dS);
  });
  // Pass 1: the state entering every segment (the last segment's end state is not needed).
  for (int64_t seg = 0; seg < nseg; ++seg) {
    const int64_t t0 = seg * kSegment;
    const int len = static_cast<int>(min64(kSegment, pb.nt - t0));
    ex.each([&](int tid, BackwardThread<A>& th) { save_rows(th.S, ckpt + seg * kRows * n + tid, n); });
    if (seg + 1 == nseg) break;
    ex.each([&](int tid, BackwardThread<A>&) { stage_rows<E, A>(pb, b, h, t0, len, tid, n, nullptr, ks, as); });
    ex.sync();
    ex.each([&](int tid, BackwardThread<A>& th) {
      const int p = tid / kCols;
      const int64_t j = tile * kCols + tid % kCols;
      for (int s = 0; s < len; ++s) {
        const int64_t rv = pb.row_v(b, t0 + s, h);
        const A vj = j < dv ? cvt<A>(pb.v[rv + j]) : A(0), bj = j < dv ? pb.beta(rv, j) : A(1);
        step_rows<A>(th.S, nullptr, ks + s * dk, as + s * dk, vj, bj, p, dk);
      }
    });
    ex.sync();
  }
  // Pass 2: segments in reverse.
  for (int64_t seg = nseg - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * kSegment;
    const int len = static_cast<int>(min64(kSegment, pb.nt - t0));
    ex.each([&](int tid, BackwardThread<A>&) { stage_rows(pb, b, h, t0, len, tid, n, qs, ks, as); });
    ex.sync();
    // segs[s] = S_{t0+s}, recomputed from the checkpoint (thread-private: no barrier needed).
    ex.each([&](int tid, BackwardThread<A>& th) {
      const int p = tid / kCols;
      const int64_t j = tile * kCols + tid % kCols;
      load_rows(ckpt + seg * kRows * n + tid, n, th.S);
      for (int s = 0; s < len; ++s) {
        const int64_t rv = pb.row_v(b, t0 + s, h);
        const A vj = j < dv ? cvt<A>(pb.v[rv + j]) : A(0), bj = j < dv ? pb.beta(rv, j) : A(1);
        step_rows<A>(th.S, nullptr, ks + s * dk, as + s * dk, vj, bj, p, dk);
        save_rows(th.S, segs + int64_t{s} * kRows * n + tid, n);
      }
    });
    for (int s1 = len; s1 > 0; s1 -= io.batch) {
      const int s0 = s1 > io.batch ? s1 - io.batch : 0;
      ex.each([&](int tid, BackwardThread<A>& th) {
        const int p = tid / kCols, c = tid % kCols;
        const int64_t j = tile * kCols + c;
        const bool col = j < dv;
        for (int s = s1 - 1; s >= s0; --s) {
          const int64_t rv = pb.row_v(b, t0 + s, h);
          const A doj = col ? cvt<A>(io.dout[rv + j]) : A(0), vj = col ? cvt<A>(pb.v[rv + j]) : A(0),
                  bj = col ? pb.beta(rv, j) : A(1);
          const A* St = segs + int64_t{s} * kRows * n + tid;                                             // S_t
          const A* Sp = s > 0 ? segs + int64_t{s - 1} * kRows * n + tid : ckpt + seg * kRows * n + tid;  // S_{t−1}
          const A *q = qs + s * dk, *k = ks + s * dk, *a = as + s * dk;
          A* rd = red + int64_t{s - s0} * 3 * dk * W;
          A dv_acc = 0, dgv_acc = 0;
          SEQLAB_SCAN_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const int64_t i = int64_t{p} * kRows + r;
            if (i < dk) {
              const A ds = th.dS[r] + pb.scale * q[i] * doj;  // w.r.t. S_t
              rd[i * W + c] = St[int64_t{r} * n] * doj;       // dq_t[i] (× scale in the reduction)
              rd[(dk + i) * W + c] = ds * vj;                 // dk_t[i]
              dv_acc += k[i] * ds;                            // dv_t[j]
              const A dprev = a[i] * bj * ds;                 // w.r.t. S_{t−1}
              const A D = dprev * Sp[int64_t{r} * n];
              rd[(2 * dk + i) * W + c] = D;  // dg_t[i]
              dgv_acc += D;                  // dgv_t[j]
              th.dS[r] = dprev;
            }
          }
          A* ri = redi + int64_t{s - s0} * 2 * P * kCols;
          ri[p * kCols + c] = dv_acc;
          ri[(P + p) * kCols + c] = dgv_acc;
        }
      });
      ex.sync();
      ex.each([&](int tid, BackwardThread<A>&) {
        const int nbat = s1 - s0, kinds = io.want_dg ? 3 : 2;
        for (int64_t e = tid; e < nbat * 3 * dk; e += n) {
          const int64_t sl = e / (3 * dk), rem = e - sl * 3 * dk, kind = rem / dk, i = rem - kind * dk;
          if (kind >= kinds) continue;
          const A* src = red + ((sl * 3 + kind) * dk + i) * W;
          A sum = 0;
          for (int c = 0; c < kCols; ++c) sum += src[c];
          if (kind == 0) sum *= pb.scale;
          io.part[(kind * tiles + tile) * N + pb.row_k(b, t0 + s0 + sl, h) + i] = sum;
        }
        for (int e = tid; e < nbat * 2 * kCols; e += n) {
          const int sl = e / (2 * kCols), rem = e - sl * 2 * kCols, kind = rem / kCols, c = rem - kind * kCols;
          const int64_t j = tile * kCols + c;
          E* dst = kind == 0 ? io.dv : io.dgv;
          if (j >= dv || dst == nullptr) continue;
          A sum = 0;
          for (int p = 0; p < P; ++p) sum += redi[((sl * 2 + kind) * P + p) * kCols + c];
          dst[pb.row_v(b, t0 + s0 + sl, h) + j] = cvt<E>(sum);
        }
      });
      ex.sync();
    }
  }
  if (io.dh0 != nullptr) {
    ex.each([&](int tid, BackwardThread<A>& th) {
      store_state(th.dS, tid / kCols, tile * kCols + tid % kCols, dk, dv, io.dh0 + st);
    });
  }
}

// out[x] = Σ_{tile = 0 .. tiles−1} part[(kind·tiles + tile)·N + x]: the column tiles' sums of dq, dk, dg.
template <class A>
SEQLAB_HD A sum_tiles(const A* part, int kind, int64_t tiles, int64_t N, int64_t x) {
  A sum = 0;
  for (int64_t tile = 0; tile < tiles; ++tile) sum += part[(kind * tiles + tile) * N + x];
  return sum;
}

// Steps per reduction batch of the backward within `budget_bytes` of shared memory (0: not even one).
template <class E, class A>
SEQLAB_HD int backward_batch(const Problem<E, A>& pb, int64_t budget_bytes) {
  const int64_t one = backward_shared_elems(pb, 1) - backward_shared_elems(pb, 0);
  const int64_t avail = budget_bytes / static_cast<int64_t>(sizeof(A)) - backward_shared_elems(pb, 0);
  return avail < one ? 0 : static_cast<int>(min64(kSegment, avail / one));
}

// Runs a block's phases on the host: each(f) calls f for every thread in turn, so a phase completes on
// all threads before the next starts — what the barriers guarantee on the GPU.
template <class State>
class HostExec {
 public:
  explicit HostExec(int threads) : states_(static_cast<size_t>(threads)) {}
  void sync() {}
  template <class F>
  void each(F&& f) {
    for (size_t t = 0; t < states_.size(); ++t) f(static_cast<int>(t), states_[t]);
  }

 private:
  std::vector<State> states_;
};

}  // namespace seqlab::cuda::scan
