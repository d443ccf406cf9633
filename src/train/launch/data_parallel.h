// Data parallelism over a dist::Communicator: every rank holds the whole model, trains on its slice of
// the global batch, and the ranks average their gradients before the update, so every rank applies the
// same update to the same weights and the weights stay identical, bit for bit, after every step
// (docs/distributed.md "Data parallelism").
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
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
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Overlap (Trainer's last-backward hook; CPU ranks over Gloo — a NCCL job averages after the backward):
  // before the step's last backward, the parameters are cut into buckets in reverse order (the backward
  // reaches the last layers first) and every parameter's gradient-ready callback is set; a worker thread
  // all-reduces each bucket, in bucket order, as soon as all of its gradients are final, while the backward
  // goes on. finish_overlap (right after that backward) marks the remaining buckets ready — a parameter the
  // backward did not reach has no gradient and is left out, on every rank alike — and waits for the
  // worker; the step's average_gradients then has nothing left to do. Nothing happens for a backend that
  // cannot overlap (the gradients are averaged in average_gradients).
  void start_overlap(const std::vector<Parameter>& params);
  void finish_overlap();
  // The last overlapped step: its buckets, and how many had all their gradients before the backward ended
  // (so their all-reduce could start while it ran).
  struct OverlapStats {
    int64_t buckets = 0, ready_during_backward = 0;
  };
  OverlapStats last_overlap() const { return last_overlap_; }

  // Every parameter's gradient ← its average over the ranks (Trainer's gradient hook). Consecutive
  // gradients of one dtype and device are copied into a flat bucket, the bucket is all-reduced
  // (average), and copied back — unless finish_overlap averaged them already in this step.
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
  // Consecutive gradients of one dtype and device, at most bucket_elements_ together (or one larger
  // gradient): indices into the parameter list.
  std::vector<std::vector<size_t>> buckets_of(const std::vector<Parameter>& params, bool reverse) const;
  // All-reduces (average) the defined gradients of `params[bucket]` through one flat buffer.
  void average_bucket(const std::vector<Parameter>& params, const std::vector<size_t>& bucket);
  void worker_loop();

  dist::Communicator& comm_;
  int64_t bucket_elements_;
  int data_ranks_;

  // The overlap's state: the step's parameters and buckets, how many gradients each bucket still
  // waits for, the next bucket the worker takes, and its error (rethrown by average_gradients).
  std::vector<Parameter> overlap_params_;
  std::vector<std::vector<size_t>> overlap_buckets_;
  std::vector<int64_t> waiting_;
  size_t next_bucket_ = 0;
  bool overlapping_ = false, forced_ = false, stop_ = false;
  bool averaged_ = false;  // finish_overlap averaged this step's gradients
  std::exception_ptr worker_error_;
  OverlapStats last_overlap_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread worker_;
};

}  // namespace seqlab
