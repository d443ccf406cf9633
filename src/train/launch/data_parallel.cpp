#include "train/launch/data_parallel.h"

#include <absl/strings/str_cat.h>

#include <algorithm>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace seqlab {

DataParallel::DataParallel(dist::Communicator& comm, int64_t bucket_elements, int data_ranks)
    : comm_(comm), bucket_elements_(bucket_elements), data_ranks_(data_ranks > 0 ? data_ranks : comm.size()) {}

void DataParallel::average_gradients(const std::vector<Parameter>& params) {
  // Every rank runs the same model, so every rank lists the same gradients in the same order and
  // builds the same buckets (the communicator checks that the ranks' calls agree).
  std::vector<Tensor> grads;
  for (const Parameter& p : params) {
    Tensor g = grad_of(*p.tensor);
    if (g.defined() && g.numel() > 0) grads.push_back(std::move(g));
  }
  size_t first = 0;
  while (first < grads.size()) {
    const DType dtype = grads[first].dtype();
    const Device device = grads[first].device();
    size_t end = first;
    int64_t n = 0;
    while (end < grads.size() && grads[end].dtype() == dtype && grads[end].device() == device &&
           (end == first || n + grads[end].numel() <= bucket_elements_)) {
      n += grads[end].numel();
      ++end;
    }
    Tensor bucket = Tensor::empty({n}, dtype, device);
    // The slice of the bucket that holds gradient i, shaped as the gradient.
    auto slice = [&](size_t i, int64_t offset) {
      return kernel::view(kernel::narrow(bucket, 0, offset, grads[i].numel()), grads[i].shape());
    };
    int64_t offset = 0;
    for (size_t i = first; i < end; offset += grads[i].numel(), ++i) kernel::copy_(slice(i, offset), grads[i]);
    comm_.all_reduce(bucket, dist::ReduceOp::average);
    offset = 0;
    for (size_t i = first; i < end; offset += grads[i].numel(), ++i) kernel::copy_(grads[i], slice(i, offset));
    first = end;
  }
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
