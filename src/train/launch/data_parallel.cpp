#include "train/launch/data_parallel.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <exception>
#include <string>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

DataParallel::DataParallel(dist::Communicator& comm, int64_t bucket_elements, int data_ranks)
    : comm_(comm), bucket_elements_(bucket_elements), data_ranks_(data_ranks > 0 ? data_ranks : comm.size()) {}

DataParallel::~DataParallel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (const Parameter& p : overlap_params_) p.tensor->mutable_autograd_meta()->on_grad_ready = nullptr;
}

std::vector<std::vector<size_t>> DataParallel::buckets_of(const std::vector<Parameter>& params, bool reverse) const {
  // Every rank runs the same model, so every rank lists the same gradients in the same order and
  // builds the same buckets (the communicator checks that the ranks' calls agree).
  std::vector<std::vector<size_t>> buckets;
  int64_t n = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const size_t i = reverse ? params.size() - 1 - k : k;
    const Tensor& t = *params[i].tensor;
    if (t.numel() == 0) continue;
    const bool joins = !buckets.empty() && n + t.numel() <= bucket_elements_ &&
                       params[buckets.back().front()].tensor->dtype() == t.dtype() &&
                       params[buckets.back().front()].tensor->device() == t.device();
    if (!joins) {
      buckets.emplace_back();
      n = 0;
    }
    buckets.back().push_back(i);
    n += t.numel();
  }
  return buckets;
}

void DataParallel::average_bucket(const std::vector<Parameter>& params, const std::vector<size_t>& bucket) {
  std::vector<Tensor> grads;
  int64_t n = 0;
  for (size_t i : bucket) {
    Tensor g = grad_of(*params[i].tensor);
    if (!g.defined() || g.numel() == 0) continue;  // not reached by the backward: alike on every rank
    n += g.numel();
    grads.push_back(std::move(g));
  }
  if (grads.empty()) return;
  Tensor flat = Tensor::empty({n}, grads.front().dtype(), grads.front().device());
  // The slice of the flat buffer that holds gradient k, shaped as the gradient.
  auto slice = [&](size_t k, int64_t offset) {
    return kernel::view(kernel::narrow(flat, 0, offset, grads[k].numel()), grads[k].shape());
  };
  int64_t offset = 0;
  for (size_t k = 0; k < grads.size(); offset += grads[k].numel(), ++k) kernel::copy_(slice(k, offset), grads[k]);
  comm_.all_reduce(flat, dist::ReduceOp::average);
  offset = 0;
  for (size_t k = 0; k < grads.size(); offset += grads[k].numel(), ++k) kernel::copy_(grads[k], slice(k, offset));
}

void DataParallel::start_overlap(const std::vector<Parameter>& params) {
  if (std::string(comm_.backend()) != "gloo") return;  // NCCL: one stream; averaged after the backward
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Parameter& p : overlap_params_) p.tensor->mutable_autograd_meta()->on_grad_ready = nullptr;
  overlap_params_ = params;
  overlap_buckets_ = buckets_of(params, /*reverse=*/true);
  waiting_.assign(overlap_buckets_.size(), 0);
  for (size_t b = 0; b < overlap_buckets_.size(); ++b) {
    waiting_[b] = static_cast<int64_t>(overlap_buckets_[b].size());
    for (size_t i : overlap_buckets_[b]) {
      params[i].tensor->mutable_autograd_meta()->on_grad_ready = [this, b] {
        {
          std::lock_guard<std::mutex> guard(mutex_);
          --waiting_[b];
        }
        changed_.notify_all();
      };
    }
  }
  next_bucket_ = 0;
  forced_ = false;
  worker_error_ = nullptr;
  overlapping_ = true;
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
}

// The worker: the buckets in order, each once all its gradients are final (or once the backward is over).
void DataParallel::worker_loop() {
  while (true) {
    size_t b = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] {
        return stop_ || (overlapping_ && next_bucket_ < overlap_buckets_.size() &&
                         (forced_ || waiting_[next_bucket_] <= 0));
      });
      if (stop_) return;
      b = next_bucket_;
    }
    std::exception_ptr error;
    try {
      average_bucket(overlap_params_, overlap_buckets_[b]);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++next_bucket_;
      if (error) {
        worker_error_ = error;
        next_bucket_ = overlap_buckets_.size();  // no further collective after a failed one
      }
    }
    changed_.notify_all();
  }
}

void DataParallel::finish_overlap() {
  if (!overlapping_) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    last_overlap_.buckets = static_cast<int64_t>(overlap_buckets_.size());
    last_overlap_.ready_during_backward = std::count_if(waiting_.begin(), waiting_.end(), [](int64_t w) { return w <= 0; });
    forced_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return next_bucket_ >= overlap_buckets_.size(); });
    overlapping_ = false;
  }
  for (const Parameter& p : overlap_params_) p.tensor->mutable_autograd_meta()->on_grad_ready = nullptr;
  if (worker_error_) std::rethrow_exception(worker_error_);
  averaged_ = true;
}

void DataParallel::average_gradients(const std::vector<Parameter>& params) {
  finish_overlap();  // where the trainer did not call it after the backward
  if (averaged_) {
    averaged_ = false;
    return;
  }
  for (const std::vector<size_t>& bucket : buckets_of(params, /*reverse=*/false)) average_bucket(params, bucket);
}

double DataParallel::average(double local) {
  Tensor t = Tensor::scalar(local, DType::f64);
  comm_.all_reduce(t, dist::ReduceOp::average);
  return t.item();
}

int DataParallel::agreed_stop_signal(int local_signal) {
  Tensor mine = Tensor::from_indices({local_signal}, {1}, DType::i64);
  Tensor all = Tensor::empty({comm_.size()}, DType::i64);
  comm_.all_gather(mine, all);
  const std::vector<int64_t> signals = all.to_indices();
  return static_cast<int>(*std::max_element(signals.begin(), signals.end()));
}

LoaderState DataParallel::to_global(const LoaderState& rank_state) const {
  return {rank_state.epoch, rank_state.position * data_ranks_};
}

absl::StatusOr<LoaderState> DataParallel::to_rank(const LoaderState& global_state) const {
  if (global_state.position % data_ranks_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's data position (", global_state.position, " windows into epoch ", global_state.epoch,
        ") does not split evenly across ", data_ranks_, " data-parallel ranks; resume it with a number of them "
        "that divides it"));
  }
  return LoaderState{global_state.epoch, global_state.position / data_ranks_};
}

}  // namespace seqlab
