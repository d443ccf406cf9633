// The backend-independent half of every call: argument checks, the header that makes the ranks agree
// on the call, bf16 widening, non-contiguous tensors, deadlines and the translation of failures into
// messages that name the rank and the operation.
#include "dist/communicator.h"

#include <gloo/rendezvous/file_store.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <sstream>

#include "dist/gloo_communicator.h"
#include "tensor/kernels.h"

#if SEQLAB_HAVE_NCCL
#include "dist/nccl_communicator.h"
#endif

namespace seqlab::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A call's header: the operation, its parameter (reduce op, root), the dtype (-1: none), the number of
// dimensions and the dimensions, padded with -1.
constexpr int64_t kHeaderLength = 4 + kMaxDims;

std::vector<int64_t> header_of(Communicator::Op op, int64_t param, const Tensor* t) {
  std::vector<int64_t> h(kHeaderLength, -1);
  h[0] = static_cast<int64_t>(op);
  h[1] = param;
  if (t) {
    h[2] = static_cast<int64_t>(t->dtype());
    h[3] = t->dim();
    std::copy(t->shape().begin(), t->shape().end(), h.begin() + 4);
  }
  return h;
}

// "f32 [4, 3]": the dtype and shape a header carries.
std::string payload(const int64_t* h) {
  return std::string(dtype_name(static_cast<DType>(h[2]))) + " " +
         shape_str(Shape(h + 4, h + 4 + std::clamp<int64_t>(h[3], 0, kMaxDims)));
}

// "all_reduce(sum) of f32 [4, 3]", "broadcast(root 1) of i64 [7]", "barrier".
std::string describe(const int64_t* h) {
  const auto op = static_cast<Communicator::Op>(h[0]);
  std::string s = Communicator::op_name(op);
  if (op == Communicator::Op::all_reduce || op == Communicator::Op::reduce_scatter) {
    s += std::string("(") + reduce_op_name(static_cast<ReduceOp>(h[1])) + ")";
  } else if (op == Communicator::Op::broadcast) {
    s += "(root " + std::to_string(h[1]) + ")";
  }
  if (h[2] >= 0) s += " of " + payload(h);
  return s;
}

std::string tensor_str(const Tensor& t) { return std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()); }

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::average: return "average";
  }
  return "?";
}

const char* Communicator::op_name(Op op) {
  switch (op) {
    case Op::all_reduce: return "all_reduce";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_gather: return "all_gather";
    case Op::broadcast: return "broadcast";
    case Op::send_recv: return "send_recv";
    case Op::barrier: return "barrier";
  }
  return "unknown operation";
}

std::string Communicator::seconds_str(milliseconds t) {
  char buf[32];
  if (t.count() % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(t.count() / 1000));
  } else {
    std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(t.count()) / 1000.0);
  }
  return buf;
}

Communicator::Communicator(int rank, int size, Device device, milliseconds timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("communicator: rank " + std::to_string(rank) + " is not in a world of size " +
                                std::to_string(size));
  }
  if (timeout.count() <= 0) throw std::invalid_argument("communicator: the timeout must be positive");
}

void Communicator::set_timeout(milliseconds timeout) {
  if (timeout.count() <= 0) throw std::invalid_argument(who() + "set_timeout: the timeout must be positive");
  timeout_ = timeout;
}

std::string Communicator::who() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
}

// One public call. Refuses to start on a broken communicator; runs each transfer with what is left of
// the call's deadline; turns a transport failure into a CommError and breaks the communicator.
class Communicator::Call {
 public:
  Call(Communicator& comm, Op op) : comm_(comm), op_(op), deadline_(Clock::now() + comm.timeout_) {
    if (!comm_.broken_.empty()) {
      throw CommError(comm_.who() + op_name(op) + ": the communicator is unusable after an earlier failure (" +
                      comm_.broken_ + ")");
    }
  }
  Op op() const { return op_; }

  // Runs fn(timeout left). `tensors` are the ones the transfer touches: after a failure their storage is
  // kept alive, since the transport may still write into it.
  template <class Fn>
  void transfer(Fn&& fn, std::initializer_list<const Tensor*> tensors) {
    try {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) throw TransportFailure(true, "the deadline passed before the transfer started");
      fn(left);
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const TransportFailure& e) {
      fail(tensors, e.timed_out ? " timed out after " + seconds_str(comm_.timeout_) +
                                      " (a rank that died, did not join, or did not make this call?)"
                                : std::string(" failed: ") + e.what());
    } catch (const std::exception& e) {
      fail(tensors, std::string(" failed: ") + e.what());
    }
  }

 private:
  [[noreturn]] void fail(std::initializer_list<const Tensor*> tensors, const std::string& why) {
    for (const Tensor* t : tensors) {
      if (t->defined()) comm_.orphaned_.push_back(t->storage());
    }
    const std::string message = comm_.who() + op_name(op_) + why;
    comm_.broken_ = message;
    throw CommError(message);
  }

  Communicator& comm_;
  Op op_;
  Clock::time_point deadline_;
};

void Communicator::agree(Call& call, Op op, int64_t param, const Tensor& t) {
  const std::vector<int64_t> mine = header_of(op, param, t.defined() ? &t : nullptr);
  Tensor send = Tensor::from_indices(mine, {kHeaderLength}, DType::i64, device_);
  Tensor all = Tensor::zeros({size_ * kHeaderLength}, DType::i64, device_);
  call.transfer([&](milliseconds left) { do_all_gather(send, all, left); }, {&send, &all});
  const std::vector<int64_t> headers = all.to_indices();
  bool same = true;
  for (int r = 1; r < size_ && same; ++r) {
    same = std::equal(headers.begin(), headers.begin() + kHeaderLength, headers.begin() + r * kHeaderLength);
  }
  if (same) return;
  std::ostringstream msg;
  msg << who() << op_name(call.op()) << ": the ranks' calls differ:";
  for (int r = 0; r < size_; ++r) {
    msg << (r ? "; " : " ") << "rank " << r << " called " << describe(headers.data() + r * kHeaderLength);
  }
  throw std::invalid_argument(msg.str());
}

void Communicator::agree_pair(Call& call, const Tensor& send, int to, const Tensor& recv, int from) {
  // Each rank sends the header of what it sends to `to`, and returns to `from` the header of what it
  // expects from it, so that both ends of a mismatched pair see the mismatch and neither waits.
  Tensor sends = Tensor::from_indices(header_of(Op::send_recv, 0, &send), {kHeaderLength}, DType::i64, device_);
  Tensor expects = Tensor::from_indices(header_of(Op::send_recv, 0, &recv), {kHeaderLength}, DType::i64, device_);
  Tensor incoming = Tensor::zeros({kHeaderLength}, DType::i64, device_);
  Tensor expected_of_me = Tensor::zeros({kHeaderLength}, DType::i64, device_);
  call.transfer([&](milliseconds left) { do_send_recv(sends, to, incoming, from, left); }, {&sends, &incoming});
  call.transfer([&](milliseconds left) { do_send_recv(expects, from, expected_of_me, to, left); },
                {&expects, &expected_of_me});
  const std::vector<int64_t> in = incoming.to_indices(), want = expected_of_me.to_indices();
  const std::vector<int64_t> my_send = sends.to_indices(), my_recv = expects.to_indices();
  if (in != my_recv) {
    throw std::invalid_argument(who() + "send_recv: rank " + std::to_string(from) + " sends " + payload(in.data()) +
                                " but recv here is " + tensor_str(recv));
  }
  if (want != my_send) {
    throw std::invalid_argument(who() + "send_recv: rank " + std::to_string(to) + " expects " +
                                payload(want.data()) + " but this rank sends " + tensor_str(send));
  }
}

namespace {

void check_tensor(const Tensor& t, const char* what, Device device, const std::string& where) {
  if (!t.defined()) throw std::invalid_argument(where + what + " is an undefined tensor");
  if (t.device() != device) {
    throw std::invalid_argument(where + what + " is on " + t.device().str() + ", the communicator's device is " +
                                device.str());
  }
  if (t.dim() > kMaxDims) {
    throw std::invalid_argument(where + what + " has " + std::to_string(t.dim()) + " dimensions; at most " +
                                std::to_string(kMaxDims) + " are supported");
  }
}

void check_reduce(const Tensor& t, ReduceOp op, const std::string& where) {
  if (op == ReduceOp::average && is_integer(t.dtype())) {
    throw std::invalid_argument(where + "the average of an " + dtype_name(t.dtype()) +
                                " tensor would round; reduce with sum and divide as the caller means to");
  }
  if (op != ReduceOp::sum && op != ReduceOp::average) throw std::invalid_argument(where + "unknown reduce op");
}

// The tensor a backend transfers for `t`: t itself when contiguous (and, for reductions, not bf16),
// else a contiguous copy (f32 for a bf16 sum) that finish() copies back.
struct Work {
  Tensor tensor;
  bool copied = false;
  Work(const Tensor& t, bool widen_bf16) {
    if (widen_bf16 && t.dtype() == DType::bf16) {
      tensor = kernel::to_dtype(t, DType::f32);
      copied = true;
    } else {
      tensor = kernel::contiguous(t);
      copied = tensor.storage() != t.storage() || tensor.offset() != t.offset();
    }
  }
  // Writes the result back into `t` (rounding f32 to bf16 once) when the transfer went to a copy.
  void finish(const Tensor& t) const {
    if (copied) kernel::copy_(t, tensor);
  }
};

}  // namespace

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  const std::string where = who() + "all_reduce: ";
  check_tensor(t, "the tensor", device_, where);
  check_reduce(t, op, where);
  Call call(*this, Op::all_reduce);
  agree(call, Op::all_reduce, static_cast<int64_t>(op), t);
  if (t.numel() == 0) return;
  Work work(t, /*widen_bf16=*/true);
  call.transfer([&](milliseconds left) { do_all_reduce(work.tensor, op, left); }, {&work.tensor});
  work.finish(t);
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const std::string where = who() + "reduce_scatter: ";
  check_tensor(in, "the input", device_, where);
  check_tensor(out, "the output", device_, where);
  check_reduce(in, op, where);
  if (in.dtype() != out.dtype()) {
    throw std::invalid_argument(where + "the input is " + tensor_str(in) + " but the output is " + tensor_str(out));
  }
  Shape want = in.shape();
  if (want.empty() || want[0] % size_ != 0) {
    throw std::invalid_argument(where + "the input " + tensor_str(in) + " must have a first dimension divisible by " +
                                "the world size " + std::to_string(size_));
  }
  want[0] /= size_;
  if (out.shape() != want) {
    throw std::invalid_argument(where + "the output is " + tensor_str(out) + "; for the input " + tensor_str(in) +
                                " it must be " + shape_str(want));
  }
  Call call(*this, Op::reduce_scatter);
  agree(call, Op::reduce_scatter, static_cast<int64_t>(op), in);
  if (out.numel() == 0) return;
  Work in_work(in, /*widen_bf16=*/true);
  Work out_work(out, /*widen_bf16=*/true);
  call.transfer([&](milliseconds left) { do_reduce_scatter(in_work.tensor, out_work.tensor, op, left); },
                {&in_work.tensor, &out_work.tensor});
  out_work.finish(out);
}

void Communicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, milliseconds timeout) {
  // All ranks reduce the whole input, and each keeps its rows: twice the traffic of a native
  // reduce-scatter, and the same result.
  Tensor reduced = kernel::clone(in);
  do_all_reduce(reduced, op, timeout);
  kernel::copy_(out, kernel::narrow(reduced, 0, rank_ * out.size(0), out.size(0)));
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  const std::string where = who() + "all_gather: ";
  check_tensor(in, "the input", device_, where);
  check_tensor(out, "the output", device_, where);
  if (in.dtype() != out.dtype()) {
    throw std::invalid_argument(where + "the input is " + tensor_str(in) + " but the output is " + tensor_str(out));
  }
  if (in.dim() == 0) throw std::invalid_argument(where + "the input must have a dimension to gather along");
  Shape want = in.shape();
  want[0] *= size_;
  if (out.shape() != want) {
    throw std::invalid_argument(where + "the output is " + tensor_str(out) + "; for the input " + tensor_str(in) +
                                " it must be " + shape_str(want));
  }
  Call call(*this, Op::all_gather);
  agree(call, Op::all_gather, 0, in);
  if (out.numel() == 0) return;
  const Tensor in_c = kernel::contiguous(in);
  Work out_work(out, /*widen_bf16=*/false);
  call.transfer([&](milliseconds left) { do_all_gather(in_c, out_work.tensor, left); }, {&in_c, &out_work.tensor});
  out_work.finish(out);
}

void Communicator::broadcast(Tensor& t, int root) {
  const std::string where = who() + "broadcast: ";
  check_tensor(t, "the tensor", device_, where);
  if (root < 0 || root >= size_) {
    throw std::invalid_argument(where + "root " + std::to_string(root) + " is not a rank of a world of size " +
                                std::to_string(size_));
  }
  Call call(*this, Op::broadcast);
  agree(call, Op::broadcast, root, t);
  if (t.numel() == 0) return;
  Work work(t, /*widen_bf16=*/false);
  call.transfer([&](milliseconds left) { do_broadcast(work.tensor, root, left); }, {&work.tensor});
  work.finish(t);
}

void Communicator::send_recv(const Tensor& send, int to, Tensor& recv, int from) {
  const std::string where = who() + "send_recv: ";
  check_tensor(send, "the tensor sent", device_, where);
  check_tensor(recv, "the tensor received", device_, where);
  for (int peer : {to, from}) {
    if (peer < 0 || peer >= size_) {
      throw std::invalid_argument(where + "peer " + std::to_string(peer) + " is not a rank of a world of size " +
                                  std::to_string(size_));
    }
  }
  if ((to == rank_) != (from == rank_)) {
    throw std::invalid_argument(where + "sending to rank " + std::to_string(to) + " and receiving from rank " +
                                std::to_string(from) + ": a rank sends to itself only when it receives from itself");
  }
  if (to == rank_ && !sends_to_itself()) {
    if (send.dtype() != recv.dtype() || send.shape() != recv.shape()) {
      throw std::invalid_argument(where + "this rank sends itself " + tensor_str(send) + " but recv is " +
                                  tensor_str(recv));
    }
    Call call(*this, Op::send_recv);
    kernel::copy_(recv, send);
    return;
  }
  Call call(*this, Op::send_recv);
  agree_pair(call, send, to, recv, from);
  if (send.numel() == 0 && recv.numel() == 0) return;
  const Tensor send_c = kernel::contiguous(send);
  Work recv_work(recv, /*widen_bf16=*/false);
  call.transfer([&](milliseconds left) { do_send_recv(send_c, to, recv_work.tensor, from, left); },
                {&send_c, &recv_work.tensor});
  recv_work.finish(recv);
}

void Communicator::barrier() {
  Call call(*this, Op::barrier);
  // The header exchange is an all-gather: no rank gets every header before every rank has sent its own.
  agree(call, Op::barrier, 0, Tensor());
}

std::shared_ptr<gloo::rendezvous::Store> open_file_store(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw std::runtime_error("rendezvous store: cannot create the folder " + folder + ": " + ec.message());
  return std::make_shared<gloo::rendezvous::FileStore>(folder);
}

namespace {
class PrefixedStore : public gloo::rendezvous::Store {
 public:
  PrefixedStore(std::shared_ptr<gloo::rendezvous::Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix) + ".") {}  // "." rather than "/": FileStore keys are file names
  void set(const std::string& key, const std::vector<char>& data) override { base_->set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return base_->get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { base_->wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_->wait(prefixed(keys), timeout);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<gloo::rendezvous::Store> base_;
  std::string prefix_;
};
}  // namespace

std::shared_ptr<gloo::rendezvous::Store> prefixed_store(std::shared_ptr<gloo::rendezvous::Store> base,
                                                        const std::string& prefix) {
  if (!base) throw std::invalid_argument("prefixed_store: no base store");
  return std::make_shared<PrefixedStore>(std::move(base), prefix);
}

std::unique_ptr<Communicator> make_communicator(Device device, std::shared_ptr<gloo::rendezvous::Store> store,
                                                int rank, int size, milliseconds timeout) {
  if (!store) throw std::invalid_argument("make_communicator: no rendezvous store");
  if (device.is_cpu()) return std::make_unique<GlooCommunicator>(std::move(store), rank, size, timeout);
#if SEQLAB_HAVE_NCCL
  return std::make_unique<NcclCommunicator>(device, std::move(store), rank, size, timeout);
#else
  throw std::runtime_error("make_communicator: " + device.str() +
                           " needs the NCCL backend, and this build has none (built without CUDA or NCCL)");
#endif
}

}  // namespace seqlab::dist
