// Sequence parallelism: the zig-zag layout, the differentiable exchanges and state passing
// (sequence_parallel.h; the equations in docs/distributed.md "Sequence parallelism"). Ring attention
// and rotary positions at global positions live in the attention room (attention/ring_attention.h,
// attention/rope.h).
#include "layers/sequence_parallel.h"

#include <stdexcept>
#include <string>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace seqlab {

namespace {
thread_local const SequenceGroup* g_group = nullptr;
}  // namespace

int64_t sequence_chunk_len(int64_t local_len, const char* what) {
  if (local_len < 2 || local_len % 2 != 0) {
    throw std::invalid_argument(std::string(what) + ": a rank's " + std::to_string(local_len) +
                                " tokens are not two chunks of equal length (the sequence must split into 2P chunks)");
  }
  return local_len / 2;
}

Tensor ring_shift_raw(const Tensor& x, const SequenceGroup& g, int dir) {
  dist::Communicator& comm = g.comm();
  const int P = comm.size(), r = comm.rank();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  comm.send_recv(kernel::contiguous(x), (r + dir + P) % P, y, (r - dir + P) % P);
  return y;
}

const SequenceGroup* sequence_group() { return g_group; }
SequenceParallelScope::SequenceParallelScope(const SequenceGroup* group) : previous_(g_group) { g_group = group; }
SequenceParallelScope::~SequenceParallelScope() { g_group = previous_; }

Tensor sequence_take_local(const Tensor& x, const SequenceGroup& g) {
  const int64_t T = x.size(1), parts = 2 * int64_t{g.size()};
  if (T % parts != 0) {
    throw std::invalid_argument("sequence parallelism: " + std::to_string(T) + " tokens do not split into " +
                                std::to_string(parts) + " chunks (2 per rank of " + std::to_string(g.size()) + ")");
  }
  const int64_t c = T / parts;
  return concat({narrow(x, 1, g.chunk(0) * c, c), narrow(x, 1, g.chunk(1) * c, c)}, 1);
}

Tensor sequence_place_local(const Tensor& local, const SequenceGroup& g) {
  const int64_t c = sequence_chunk_len(local.size(1), "sequence_place_local"), parts = 2 * int64_t{g.size()};
  Shape chunk_shape = local.shape();
  chunk_shape[1] = c;
  std::vector<Tensor> pieces;
  for (int64_t s = 0; s < parts; ++s) {
    if (s == g.chunk(0) || s == g.chunk(1)) {
      pieces.push_back(narrow(local, 1, (s == g.chunk(0) ? 0 : 1) * c, c));
    } else {
      pieces.push_back(Tensor::zeros(chunk_shape, local.dtype(), local.device()));
    }
  }
  return concat(pieces, 1);
}

std::vector<int64_t> sequence_positions(int64_t local_len, const SequenceGroup& g) {
  const int64_t c = sequence_chunk_len(local_len, "sequence_positions");
  std::vector<int64_t> pos(static_cast<size_t>(local_len));
  for (int64_t t = 0; t < local_len; ++t) pos[static_cast<size_t>(t)] = g.chunk(static_cast<int>(t / c)) * c + t % c;
  return pos;
}

// ---- differentiable exchanges ----

Tensor ring_shift(const Tensor& x, const SequenceGroup& g) {
  dist::Communicator* comm = &g.comm();
  const int P = comm->size(), r = comm->rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  comm->send_recv(kernel::contiguous(x), next, y, prev);
  record("ring_shift", {x}, {&y}, {}, [comm, next, prev](const std::vector<Tensor>& grad, const auto&, const auto&) {
    // The gradient of what came from prev goes back to prev; ours comes from next.
    Tensor dx = Tensor::empty(grad[0].shape(), grad[0].dtype(), grad[0].device());
    comm->send_recv(kernel::contiguous(grad[0]), prev, dx, next);
    return std::vector<Tensor>{dx};
  });
  return y;
}

Tensor gather_ranks(const Tensor& x, const SequenceGroup& g) {
  dist::Communicator* comm = &g.comm();
  Shape shape = x.shape();
  if (shape.empty()) throw std::invalid_argument("gather_ranks: x must have a leading dimension");
  shape[0] *= comm->size();
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  comm->all_gather(kernel::contiguous(x), y);
  const Shape in_shape = x.shape();
  record("gather_ranks", {x}, {&y}, {}, [comm, in_shape](const std::vector<Tensor>& grad, const auto&, const auto&) {
    Tensor dx = Tensor::empty(in_shape, grad[0].dtype(), grad[0].device());
    comm->reduce_scatter(kernel::contiguous(grad[0]), dx, dist::ReduceOp::sum);
    return std::vector<Tensor>{dx};
  });
  return y;
}

std::vector<Tensor> sequence_halo(const Tensor& x, int64_t h, const SequenceGroup& g) {
  const int64_t c = sequence_chunk_len(x.size(1), "sequence_halo");
  if (h < 0 || h > c) {
    throw std::invalid_argument("sequence parallelism: a short convolution needs the " + std::to_string(h) +
                                " tokens before each chunk, but chunks hold " + std::to_string(c) +
                                " (use fewer ranks, a longer sequence or a shorter convolution)");
  }
  Shape halo_shape = x.shape();
  halo_shape[1] = h;
  if (h == 0) return {Tensor::zeros(halo_shape, x.dtype(), x.device()), Tensor::zeros(halo_shape, x.dtype(), x.device())};
  // Every rank's two tails, [2P, B, h, ...] in rank order (rank q's segment j at row 2q + j).
  const Tensor tails = gather_ranks(stack({narrow(x, 1, c - h, h), narrow(x, 1, 2 * c - h, h)}, 0), g);
  std::vector<Tensor> halos;
  for (int j = 0; j < 2; ++j) {
    const int64_t s = g.chunk(j);
    if (s == 0) {
      halos.push_back(Tensor::zeros(halo_shape, x.dtype(), x.device()));
    } else {
      const int64_t row = 2 * int64_t{g.owner(s - 1)} + g.segment_of(s - 1);
      halos.push_back(squeeze(narrow(tails, 0, row, 1), 0));
    }
  }
  return halos;
}

// ---- state passing ----

namespace {

// a ⊗ b per element for complex numbers stored as trailing (re, im) pairs of equal shapes:
// (ar br − ai bi, ar bi + ai br). Differentiable through the primitives it is made of.
Tensor complex_product(const Tensor& a, const Tensor& b) {
  const int64_t last = a.dim() - 1;
  const Tensor ar = narrow(a, last, 0, 1), ai = narrow(a, last, 1, 1), br = narrow(b, last, 0, 1),
               bi = narrow(b, last, 1, 1);
  return concat({sub(mul(ar, br), mul(ai, bi)), add(mul(ar, bi), mul(ai, br))}, last);
}

}  // namespace

Tensor sequence_recurrence(const LinearRecurrence& rec, int64_t local_len, const SequenceGroup& g) {
  const int64_t c = sequence_chunk_len(local_len, "sequence_recurrence"), chunks = 2 * int64_t{g.size()};
  const size_t n_states = rec.kinds.size();
  // Pass 1: each segment from a zero state: its final states F and transitions A.
  RecurrenceSegment first[2];
  std::vector<Tensor> pieces;  // this rank's summaries, flattened: segment 0's (F, A per state), then 1's
  std::vector<Shape> shapes;   // the shape of each piece, the same on every rank
  for (int j = 0; j < 2; ++j) {
    first[j] = rec.run(j * c, c, {});
    const std::vector<Tensor> a = rec.transition ? rec.transition(j * c, c) : std::vector<Tensor>(n_states);
    if (first[j].final.size() != n_states || a.size() != n_states) {
      throw std::logic_error("sequence_recurrence: the recurrence gave the wrong number of states");
    }
    for (size_t i = 0; i < n_states; ++i) {
      const Tensor& f = first[j].final[i];
      pieces.push_back(reshape(f, {f.numel()}));
      shapes.push_back(f.shape());
      if (rec.kinds[i] == StateTransition::additive) continue;
      const bool broadcast = rec.kinds[i] == StateTransition::elementwise || rec.kinds[i] == StateTransition::complex_diagonal;
      const Tensor t = broadcast ? contiguous(expand(to_dtype(a[i], f.dtype()), f.shape())) : to_dtype(a[i], f.dtype());
      pieces.push_back(reshape(t, {t.numel()}));
      shapes.push_back(t.shape());
    }
  }
  const Tensor mine = concat(pieces, 0);
  const int64_t per_rank = mine.numel();
  const Tensor all = gather_ranks(mine, g);  // [P · per_rank]
  // Chunk s's summaries: rank owner(s)'s pieces of its segment segment_of(s).
  const size_t per_segment = pieces.size() / 2;
  auto summary = [&](int64_t s, size_t piece) {
    const size_t index = static_cast<size_t>(g.segment_of(s)) * per_segment + piece;
    int64_t offset = int64_t{g.owner(s)} * per_rank;
    for (size_t p = 0; p < index; ++p) offset += pieces[p].numel();
    return reshape(narrow(all, 0, offset, pieces[index].numel()), shapes[index]);
  };
  // The prefix over chunks: E_0 = 0, E_{s+1} = A_s(E_s) + F_s, for every state.
  std::vector<std::vector<Tensor>> entering(static_cast<size_t>(chunks));
  std::vector<Tensor> E(n_states);
  for (int64_t s = 0; s < chunks; ++s) {
    entering[static_cast<size_t>(s)] = E;
    size_t piece = 0;
    for (size_t i = 0; i < n_states; ++i) {
      const Tensor F = summary(s, piece++);
      if (rec.kinds[i] == StateTransition::additive) {
        E[i] = E[i].defined() ? add(E[i], F) : F;
      } else {
        const Tensor A = summary(s, piece++);
        if (E[i].defined()) {
          const Tensor AE = rec.kinds[i] == StateTransition::elementwise        ? mul(A, E[i])
                            : rec.kinds[i] == StateTransition::complex_diagonal ? complex_product(A, E[i])
                                                                                : matmul(A, E[i]);
          E[i] = add(AE, F);
        } else {
          E[i] = F;
        }
      }
    }
  }
  // Pass 2: each segment from the state that enters it (chunk 0's first run already had it).
  Tensor out[2];
  for (int j = 0; j < 2; ++j) {
    const int64_t s = g.chunk(j);
    out[j] = s == 0 ? first[j].o : rec.run(j * c, c, entering[static_cast<size_t>(s)]).o;
  }
  return concat({out[0], out[1]}, 1);
}

}  // namespace seqlab
