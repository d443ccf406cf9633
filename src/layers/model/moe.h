// The mixture-of-experts FFN of a block (FfnKind::moe; ModelConfig::moe): a router sends every token to
// top_k of E expert FFNs and adds their outputs, weighted by the router (Switch Transformer, GShard,
// Mixtral; Jamba puts one in every other layer). For x_t, the block's normalised stream at token t:
//
//   p_t = softmax(x_t W_rᵀ)                      router W_r [E, C], no bias; p_t ∈ R^E
//   e_t,1 … e_t,k = the k largest p_t,e         ties broken by the smaller expert index (deterministic)
//   w_t,j = p_t,e_t,j / Σ_i p_t,e_t,i           renormalize = true (Mixtral); false: w_t,j = p_t,e_t,j
//                                               (Switch, Jamba). With k = 1, renormalising makes every
//                                               weight 1: the router then learns from the aux loss alone.
//   y_t = Σ_j kept_t,j · w_t,j · FFN_e_t,j(x_t) a dropped assignment adds nothing; the residual stream
//                                               carries the token past the block unchanged
//
// Capacity (training mode only): expert e takes at most cap = ceil(capacity_factor · N · k / E) of the
// assignments of the N tokens routed together (capacity_factor 0: no limit). Assignments queue by choice
// first — every token's first choice before any second choice (GShard) — then by token order (row by
// row, t within the row); those past cap are dropped and counted. In evaluation and decoding no token
// is dropped, so a prompt and then one token at a time give the logits of a full forward.
//
// Load balancing (Switch Transformer, eq. 4, extended to k choices): with f_e the fraction of the N·k
// assignments whose choice is e (before capacity; Σ f = 1) and P_e = (1/N) Σ_t p_t,e,
//   aux = aux_loss_weight · E · Σ_e f_e · P_e            1 · aux_loss_weight when perfectly balanced
// f is a count (no gradient); P carries the gradient into the router. The model adds every MoE block's
// aux to its objective in training (MoeStats; the trainer reports aux_loss, moe_balance, moe_dropped).
//
// Data parallelism (moe_routing_group): the N tokens routed together are the whole batch of all ranks,
// as one process routes them: each rank gathers every rank's per-row counts (one all-gather of
// [B, k, E] integers per block), so capacity, the queue order and f are the whole batch's; P stays the
// rank's own mean, and the mean of the ranks' aux is the whole batch's aux, its gradient the average
// the data-parallel step forms. Rank r's row b is row b·P + r of the batch (the loader's split: rank r
// takes windows r, r + P, …). Every expert runs on every rank, on a row of zeros when no token reaches
// it there, so every expert weight has a gradient on every rank (zero when unused) and the ranks'
// gradient buckets agree.
//
// Parameter names: router.weight [E, C], experts.{e}.{fc,gate,proj}.* (the expert FFN's).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "layers/basic.h"
#include "layers/model/block.h"
#include "layers/model/model_config.h"
#include "layers/module.h"

namespace seqlab {

// The routing of one MoE block's tokens (host values), from which the forward gathers and scatters.
struct MoeRouting {
  std::vector<int64_t> expert;  // [N·k] token t's choice j at t·k + j (j = 0 the most probable)
  std::vector<uint8_t> kept;    // [N·k] 1 when within its expert's capacity
  std::vector<int64_t> counts;  // [E] assignments per expert over the routing group, before capacity
  int64_t group_tokens = 0;     // N over the routing group (this rank's tokens without one)
  int64_t capacity = 0;         // per expert; 0: no limit
  int64_t dropped = 0;          // this rank's assignments past capacity
};

// Routes the B·T tokens of probs (row-major [B·T, E], the router's softmax) to their top k experts and
// applies the capacity (capacity_factor 0: none) over `group` (null: these tokens alone). Throws
// std::invalid_argument for sizes that do not fit.
MoeRouting route_tokens(const std::vector<double>& probs, int64_t B, int64_t T, int64_t E, int64_t k,
                        double capacity_factor, dist::Communicator* group);

// The figures of one training forward's MoE blocks, summed over the blocks.
struct MoeStats {
  Tensor aux_loss;          // Σ over blocks of aux (above), a differentiable scalar; undefined: none added
  double aux_value = 0;     // its value
  double balance = 0;       // Σ over blocks of E · Σ_e f_e P_e (1 per block when balanced)
  int64_t blocks = 0;       // MoE blocks that ran
  int64_t assignments = 0;  // this rank's (token, choice) assignments: N · k per block
  int64_t dropped = 0;      // of those, past their expert's capacity
};

// The data-parallel ranks whose tokens are routed together in training, or null (one process).
dist::Communicator* moe_routing_group();
// Sets the calling thread's routing group for its lifetime (null: none), restoring the previous one.
class MoeRoutingScope {
 public:
  explicit MoeRoutingScope(dist::Communicator* group);
  ~MoeRoutingScope();
  MoeRoutingScope(const MoeRoutingScope&) = delete;
  MoeRoutingScope& operator=(const MoeRoutingScope&) = delete;

 private:
  dist::Communicator* previous_;
};

// Each expert's hidden width: moe.d_ff, else the model's d_ff, else ffn_d_ff(expert kind, d_model).
int64_t moe_expert_d_ff(const MoeConfig& moe, int64_t model_d_ff, int64_t d_model);
// The weights of one MoE FFN (router and every expert), and those one token passes through (router and
// top_k experts).
double moe_parameter_count(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias);
double moe_active_parameter_count(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias);
// Throws std::invalid_argument naming what does not fit (experts, top_k, the expert kind, ...).
void check_moe_config(const MoeConfig& moe);

class MoeFfn : public Module {
 public:
  // Weights from `gen`: the router, then experts 0 … E−1.
  MoeFfn(const MoeConfig& moe, int64_t d_model, int64_t model_d_ff, bool bias, Generator& gen, double init_std);
  // x [B, T, C] → [B, T, C]. In training mode the capacity binds and, when `stats` is given, the block's
  // aux loss and counts are added to it.
  Tensor forward(const Tensor& x, MoeStats* stats) const;
  const MoeConfig& config() const { return moe_; }

 private:
  MoeConfig moe_;
  Linear& router_;
  std::vector<Ffn*> experts_;
};

}  // namespace seqlab
