// Data parallelism over a dist::Communicator: every rank holds the whole model, trains on its slice of
// the global batch, and the ranks average their gradients before the update, so every rank applies the
// same update to the same weights and the weights stay identical, bit for bit, after every step
// (docs/distributed.md "Data parallelism").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "layers/module.h"
#include "train/data/loader.h"

namespace seqlab {

// Gradients are averaged in buckets of at most this many elements (a parameter larger than that is a
// bucket of its own): one all-reduce per bucket instead of one per parameter, in parameter order.
inline constexpr int64_t kGradientBucketElements = int64_t{4} << 20;

class DataParallel {
 public:
  // `data_ranks`: how many ranks read distinct data (0: every rank); with sequence parallelism the sp ranks
  // of a group share their batch rows, so a job of N ranks reads N/sp shares (the loader positions below).
  explicit DataParallel(dist::Communicator& comm, int64_t bucket_elements = kGradientBucketElements,
                        int data_ranks = 0);

  // Every parameter's gradient ← its average over the ranks (Trainer's gradient hook). Consecutive
  // gradients of one dtype and device are copied into a flat bucket, the bucket is all-reduced
  // (average), and copied back. Not overlapped with the backward: Gloo's calls block the caller.
  void average_gradients(const std::vector<Parameter>& params);
  // This rank's value averaged over the ranks (the step's loss): the same double on every rank.
  double average(double local);
  // Whether any rank was asked to stop (its stop signal non-zero), and which signal: the largest any
  // rank received, so every rank decides the same at the same step.
  int agreed_stop_signal(int local_signal);

  // The loader position as checkpoints hold it, independent of the world size: within the epoch, the
  // windows consumed by all ranks together (rank position × data ranks), so a run resumes on any world size.
  LoaderState to_global(const LoaderState& rank_state) const;
  // Back to this rank's position; an error when the global position does not split evenly across the
  // ranks (a checkpoint taken with a batch size this world size does not divide).
  absl::StatusOr<LoaderState> to_rank(const LoaderState& global_state) const;

  dist::Communicator& comm() { return comm_; }

 private:
  dist::Communicator& comm_;
  int64_t bucket_elements_;
  int data_ranks_;
};

}  // namespace seqlab
