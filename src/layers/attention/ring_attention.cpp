// Ring attention: softmax attention over a sequence shared by the ranks of a SequenceGroup
// (ring_attention.h; the layout and the exchanges in layers/sequence_parallel.h, the equations in
// docs/distributed.md "Sequence parallelism").
#include "layers/attention/ring_attention.h"

#include <stdexcept>
#include <string>

#include "autograd/function.h"
#include "layers/attention/attention.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {

// k and v of [B, 2c, Hk, D] in one flat tensor, the block that travels (in `dtype`).
Tensor pack(const Tensor& k, const Tensor& v, DType dtype) {
  Tensor block = Tensor::empty({k.numel() + v.numel()}, dtype, k.device());
  kernel::copy_(kernel::view(kernel::narrow(block, 0, 0, k.numel()), k.shape()), k);
  kernel::copy_(kernel::view(kernel::narrow(block, 0, k.numel(), v.numel()), v.shape()), v);
  return block;
}
Tensor unpack(const Tensor& block, const Shape& shape, int64_t offset) {
  return kernel::view(kernel::narrow(block, 0, offset, shape_numel(shape)), shape);
}

// Segment j (0 or 1) of a [B, 2c, ...] tensor, along dim 1.
Tensor seg(const Tensor& x, int j, int64_t c) { return kernel::narrow(x, 1, j * c, c); }

// The visits of one rank: at ring step `step` the block of rank src = r − step visits, and query chunk
// cq attends to its key chunk ck fully when ck < cq, causally when ck = cq, not at all when ck > cq.
template <class Visit>
void for_each_visit(const SequenceGroup& g, int step, Visit visit) {
  const int P = g.size(), src = (g.rank() - step + P) % P;
  for (int b = 0; b < 2; ++b) {
    const int64_t ck = b == 0 ? src : 2 * int64_t{P} - 1 - src;
    for (int a = 0; a < 2; ++a) {
      const int64_t cq = g.chunk(a);
      if (ck <= cq) visit(a, b, ck == cq);
    }
  }
}

}  // namespace

// Forward: the partial (o_j, lse_j) of each visit merges into the running (o, lse) of its query chunk,
//   lse ← lse + softplus(lse_j − lse),   o ← o·exp(lse_old − lse) + o_j·exp(lse_j − lse)
// in the lse's dtype (f32 for bf16): exponents ≤ 0. Saved: q, k, v, o, lse of this rank only.
// Backward: the blocks travel the ring again, each with the gradient of its keys and values; at each visit
// the fused backward with the row's global o and lse gives that block's share of dq, dk, dv (softmax's
// P_ij = exp(s_ij − lse_i) and D_i = Σ dO_i·O_i are the whole row's). After P steps one more shift brings
// every block's dk, dv home.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceGroup& g, double scale) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(1) != q.size(1) || v.size(1) != q.size(1)) {
    throw std::invalid_argument("ring_attention: q, k, v must be [B, 2c, heads, D] with one length, got " +
                                shape_str(q.shape()) + ", " + shape_str(k.shape()) + ", " + shape_str(v.shape()));
  }
  const int64_t c = sequence_chunk_len(q.size(1), "ring_attention");
  const DType acc = accumulate_dtype(q.dtype());
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v);
  AttentionOptions causal, full;
  causal.scale = full.scale = scale;
  full.causal = false;
  dist::Communicator* comm = &g.comm();
  const int P = g.size();

  Tensor o_acc[2], lse_acc[2];  // [B, c, H, Dv] and [B, c, H], in acc
  Tensor block = pack(kc, vc, q.dtype());
  for (int step = 0; step < P; ++step) {
    if (step > 0) block = ring_shift_raw(block, g, +1);
    const Tensor kb = unpack(block, k.shape(), 0), vb = unpack(block, v.shape(), k.numel());
    for_each_visit(g, step, [&](int a, int b, bool diagonal) {
      AttentionOutput part = kernel::attention_forward(seg(qc, a, c), seg(kb, b, c), seg(vb, b, c), diagonal ? causal : full);
      Tensor o_j = kernel::to_dtype(part.o, acc), lse_j = part.lse;
      if (!o_acc[a].defined()) {
        o_acc[a] = o_j;
        lse_acc[a] = lse_j;
        return;
      }
      using kernel::BinaryOp;
      const Tensor lse = kernel::binary(BinaryOp::add, lse_acc[a],
                                        kernel::unary(kernel::UnaryOp::softplus, kernel::binary(BinaryOp::sub, lse_j, lse_acc[a])));
      auto weight = [&](const Tensor& l) {  // exp(l − lse) as [B, c, H, 1]
        Tensor w = kernel::unary(kernel::UnaryOp::exp, kernel::binary(BinaryOp::sub, l, lse));
        Shape s = w.shape();
        s.push_back(1);
        return kernel::view(w, s);
      };
      o_acc[a] = kernel::binary(BinaryOp::add, kernel::binary(BinaryOp::mul, o_acc[a], weight(lse_acc[a])),
                                kernel::binary(BinaryOp::mul, o_j, weight(lse_j)));
      lse_acc[a] = lse;
    });
  }
  Shape o_shape = q.shape();
  o_shape[3] = v.size(3);
  Tensor o = Tensor::empty(o_shape, q.dtype(), q.device());
  Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, acc, q.device());
  for (int a = 0; a < 2; ++a) {
    kernel::copy_(seg(o, a, c), o_acc[a]);
    kernel::copy_(seg(lse, a, c), lse_acc[a]);
  }

  record("ring_attention", {q, k, v}, {&o}, {qc, kc, vc, o, lse},
         [g, comm, c, causal, full, acc](const std::vector<Tensor>& grad, const std::vector<Tensor>& s,
                                         const std::vector<bool>&) {
           const Tensor dout = kernel::contiguous(grad[0]);
           const Tensor &k_ = s[1], &v_ = s[2], &o_ = s[3], &lse_ = s[4];
           const int P = comm->size();
           Tensor dq = Tensor::zeros(s[0].shape(), acc, s[0].device());
           Tensor block = pack(k_, v_, k_.dtype());
           Tensor dblock = Tensor::zeros({block.numel()}, acc, block.device());  // its dk, dv travel with it
           for (int step = 0; step < P; ++step) {
             if (step > 0) {
               block = ring_shift_raw(block, g, +1);
               dblock = ring_shift_raw(dblock, g, +1);
             }
             const Tensor kb = unpack(block, k_.shape(), 0), vb = unpack(block, v_.shape(), k_.numel());
             const Tensor dk = unpack(dblock, k_.shape(), 0), dv = unpack(dblock, v_.shape(), k_.numel());
             for_each_visit(g, step, [&](int a, int b, bool diagonal) {
               kernel::AttentionGrads d =
                   kernel::attention_backward(seg(dout, a, c), Tensor(), seg(s[0], a, c), seg(kb, b, c), seg(vb, b, c),
                                              seg(o_, a, c), seg(lse_, a, c), diagonal ? causal : full, true, true, true);
               auto add_into = [&](const Tensor& dst, const Tensor& src) {
                 kernel::copy_(dst, kernel::binary(kernel::BinaryOp::add, dst, kernel::to_dtype(src, acc)));
               };
               add_into(seg(dq, a, c), d.dq);
               add_into(seg(dk, b, c), d.dk);
               add_into(seg(dv, b, c), d.dv);
             });
           }
           if (P > 1) dblock = ring_shift_raw(dblock, g, +1);  // each block's gradient back to its rank
           return std::vector<Tensor>{kernel::to_dtype(dq, s[0].dtype()),
                                      kernel::to_dtype(unpack(dblock, k_.shape(), 0), k_.dtype()),
                                      kernel::to_dtype(unpack(dblock, v_.shape(), k_.numel()), v_.dtype())};
         });
  return o;
}

}  // namespace seqlab
