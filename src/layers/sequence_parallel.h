// Sequence parallelism (docs/distributed.md "Sequence parallelism"): the P ranks of a group share every
// sequence of the batch, each holding 2c = T/P of its T tokens, and the layers that mix tokens across
// positions exchange what they need through the group's communicator. Everything else a model does
// (embeddings, projections, norms, feed-forward layers, the loss) is per token and runs unchanged on
// the local tokens.
//
// Layout, zig-zag: a sequence is cut into 2P chunks of c tokens; rank r holds chunks r and 2P−1−r, in
// that order, as its 2c local tokens ("segments" 0 and 1). Under causal attention chunk s attends to
// s + 1 chunks, so every rank's two chunks together attend to 2P + 1: the work is balanced.
//
// The exchanges, each a differentiable op whose backward is the mirrored exchange:
//   ring_attention      softmax attention: key/value blocks travel around the ring (P − 1 shifts), each
//                       rank attends its queries to the visiting block with the fused op (causal on its
//                       own chunk, full on earlier chunks, skipped on later ones), and the partial outputs
//                       merge by their log-sum-exp in f32. Backward: the gradients of the visiting blocks
//                       travel back around the ring.
//   sequence_recurrence a linear recurrence S_out = A(S_in) + F: each rank runs its segments from a zero
//                       state (F and the transition A of each), the 2P summaries are gathered, every rank
//                       forms the state entering each chunk by the prefix E_{s+1} = A_s(E_s) + F_s, and
//                       runs its segments again from their entering states.
//   sequence_halo       the last h tokens of the previous chunk (short convolutions).
// Positions are global: sequence_positions gives each local token's place in the whole sequence.
//
// Ring attention (attention/ring_attention.h) and rotary positions at global positions (sequence_rope,
// attention/rope.h) live in the attention room; this file has the layout and the exchanges they use.
//
// A model runs sequence-parallel while a SequenceParallelScope names the group (the trainer's step);
// without one, sequence_group() is null and every layer runs as in one process.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dist/communicator.h"
#include "tensor/tensor.h"

namespace seqlab {

class SequenceGroup {
 public:
  explicit SequenceGroup(dist::Communicator& comm) : comm_(&comm) {}
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  dist::Communicator& comm() const { return *comm_; }
  // The global chunk index (0 … 2P−1) of local segment j (0 or 1): r, then 2P−1−r.
  int64_t chunk(int j) const { return j == 0 ? rank() : 2 * int64_t{size()} - 1 - rank(); }
  // The global chunk s's holder and its local segment there.
  int owner(int64_t s) const { return static_cast<int>(s < size() ? s : 2 * int64_t{size()} - 1 - s); }
  int segment_of(int64_t s) const { return s < size() ? 0 : 1; }

 private:
  dist::Communicator* comm_;
};

// The group the calling thread's model forward runs in, or null (one process holds whole sequences).
const SequenceGroup* sequence_group();

// Sets the calling thread's group for its lifetime (null: none), restoring the previous one after.
class SequenceParallelScope {
 public:
  explicit SequenceParallelScope(const SequenceGroup* group);
  ~SequenceParallelScope();
  SequenceParallelScope(const SequenceParallelScope&) = delete;
  SequenceParallelScope& operator=(const SequenceParallelScope&) = delete;

 private:
  const SequenceGroup* previous_;
};

// This rank's tokens of a whole sequence: x [B, T, ...] → [B, 2c, ...], chunks r and 2P−1−r of c = T/(2P)
// along dim 1. Throws std::invalid_argument when T is not a multiple of 2P. (Not differentiable: for
// batches and tests.)
Tensor sequence_take_local(const Tensor& x, const SequenceGroup& g);
// The inverse on one rank's part: the local [B, 2c, ...] placed at its chunks of a [B, T, ...] tensor of
// zeros (for tests: the ranks' parts summed give the whole).
Tensor sequence_place_local(const Tensor& local, const SequenceGroup& g);
// The global position of each of `local_len` local tokens (segment 0's, then segment 1's).
std::vector<int64_t> sequence_positions(int64_t local_len, const SequenceGroup& g);

// c = local_len / 2, the length of a rank's chunks; throws std::invalid_argument naming `what` when the
// local tokens do not split into two chunks of equal length.
int64_t sequence_chunk_len(int64_t local_len, const char* what);

// ---- exchanges ----

// The raw exchange (not differentiable): rank r's x goes to r + dir and rank r − dir's comes back
// (dir = +1: the ring's direction; −1: the other way round).
Tensor ring_shift_raw(const Tensor& x, const SequenceGroup& g, int dir);

// Every rank's x at once: rank r gets rank r−1's x (rank 0 gets rank P−1's). Backward: the gradient
// travels the other way round.
Tensor ring_shift(const Tensor& x, const SequenceGroup& g);
// x [n, ...] of every rank, concatenated in rank order: [P·n, ...]. Backward: the gradient's rows of this
// rank, summed over the ranks (every rank used every rank's x).
Tensor gather_ranks(const Tensor& x, const SequenceGroup& g);

// For each local segment, the last h tokens before it in the whole sequence, [B, h, ...] per segment
// (zeros before chunk 0). x [B, 2c, ...]; needs h ≤ c.
std::vector<Tensor> sequence_halo(const Tensor& x, int64_t h, const SequenceGroup& g);

// A linear recurrence over a segment of the local tokens, from given initial states, as a mixer runs its
// fused op: the outputs and final states of one segment are differentiable in the segment's inputs and in
// the initial states.
enum class StateTransition {
  additive,     // S_out = S_in + F (linear attention, its normaliser)
  elementwise,  // S_out = A ⊙ S_in + F, A broadcastable to the state (GLA, retention)
  matrix,       // S_out = M S_in + F, M [..., dk, dk] acting on the state's rows (DeltaNet)
  complex_diagonal,  // S_out = A ⊗ S_in + F, complex numbers as trailing (re, im) pairs: A [..., 2]
                     // broadcastable to the state [..., 2], ⊗ the complex product per element (S4D: Ā^len)
};
struct RecurrenceSegment {
  Tensor o;                   // [B, len, ...]
  std::vector<Tensor> final;  // one per state, in the order of LinearRecurrence::kinds
};
struct LinearRecurrence {
  std::vector<StateTransition> kinds;  // one per state
  // The local tokens [begin, begin + len) run from `initial` (empty: zero states).
  std::function<RecurrenceSegment(int64_t begin, int64_t len, const std::vector<Tensor>& initial)> run;
  // The transition of each state over those tokens (A or M; undefined for additive states).
  std::function<std::vector<Tensor>(int64_t begin, int64_t len)> transition;
};
// The recurrence over the whole sequence, this rank's outputs [B, local_len, ...] (segment 0's, then
// segment 1's). Two runs of each segment (from a zero state, then from the entering state) and one
// gather of the 2P summaries; the backward mirrors it through autograd.
Tensor sequence_recurrence(const LinearRecurrence& rec, int64_t local_len, const SequenceGroup& g);

}  // namespace seqlab
