// The communicator: the collective and point-to-point operations that data and sequence parallelism
// are built on, over seqlab tensors of every dtype (f32, f64, bf16, i32, i64).
//
// One Communicator per process, one rank per process. Every rank of a job calls the same operations
// in the same order with tensors of the same dtype and shape (send_recv: the shapes its peers send);
// each call first exchanges a small header (the operation, its parameter, the dtype, the shape) with
// the other ranks, so a rank that called another operation, or passed another dtype or shape, ends
// the call on every rank with a std::invalid_argument naming what each rank passed, instead of
// corrupting data or hanging.
//
// Every call has a deadline (timeout(), 300 s unless set). A call that fails in the transport, or
// does not finish in time (a rank died, never joined, or never made the call), throws CommError whose
// message names this rank, the world size and the operation; the communicator is then broken and
// every later call throws at once. The caller (the launcher) ends the job with that message.
//
// Backends: GlooCommunicator (src/dist/gloo_communicator.h) for CPU tensors, NcclCommunicator
// (src/dist/nccl_communicator.h, built when CUDA and NCCL are found) for CUDA tensors. Both meet
// through a rendezvous store (Gloo's Store interface: a FileStore on a folder now, a RedisStore for
// several machines), which make_communicator takes. docs/distributed.md describes all of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace gloo::rendezvous {
class Store;  // Gloo's rendezvous store (gloo/rendezvous/store.h)
}

namespace seqlab::dist {

// How all_reduce and reduce_scatter combine the ranks' tensors. average is the sum divided by the
// world size, for floating dtypes only (an integer average would have to round; it is refused).
enum class ReduceOp { sum, average };
const char* reduce_op_name(ReduceOp op);

// A collective call that failed or timed out. what(): "rank R of N: OP timed out after S s (...)" or
// "rank R of N: OP failed: CAUSE".
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a backend throws when its transport fails or its deadline passes; the public call turns it into
// a CommError naming the rank and the operation, and marks the communicator broken.
struct TransportFailure : std::runtime_error {
  TransportFailure(bool timed_out, const std::string& cause) : std::runtime_error(cause), timed_out(timed_out) {}
  bool timed_out;
};

// 300 s: long enough for the slowest step of a large model to reach the next collective, short enough
// that a dead rank ends the job in minutes.
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::seconds(300);

// Tensors passed to a communicator have at most this many dimensions (the header that checks that
// ranks agree carries the shape).
inline constexpr int kMaxDims = 8;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The device whose tensors this communicator moves (CPU for Gloo, one GPU for NCCL).
  Device device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Applies to the calls that follow; must be positive.
  void set_timeout(std::chrono::milliseconds timeout);
  // The backend's name: "gloo" or "nccl".
  virtual const char* backend() const = 0;

  // t ← the sum (or average) over the ranks of t, in place. bf16 is summed in f32 and rounded once.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);
  // out ← rows [rank·k, (rank+1)·k) along dim 0 of the sum (or average) over the ranks of `in`, where
  // in is [size·k, ...] and out is [k, ...].
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::sum);
  // out ← the ranks' `in` concatenated along dim 0 in rank order: in is [k, ...], out is [size·k, ...].
  void all_gather(const Tensor& in, Tensor& out);
  // t ← root's t on every rank.
  void broadcast(Tensor& t, int root);
  // One step of a ring exchange: sends `send` to rank `to` and receives rank `from`'s tensor into
  // `recv`, both at once (so that a ring where every rank sends to its successor cannot deadlock).
  // `recv` has the dtype and shape that `from` sends. to == from == rank() copies send into recv.
  void send_recv(const Tensor& send, int to, Tensor& recv, int from);
  // Returns once every rank has called barrier.
  void barrier();

  // The operation names used in messages, for one ops' header code.
  enum class Op : int64_t { all_reduce = 1, reduce_scatter, all_gather, broadcast, send_recv, barrier };
  static const char* op_name(Op op);

 protected:
  Communicator(int rank, int size, Device device, std::chrono::milliseconds timeout);

  // "rank R of N: " — the start of every message.
  std::string who() const;

  // The backend's transfers, on contiguous non-empty tensors on device(), already checked (the same
  // dtype and shape on every rank); they run at every world size, 1 included. Each must finish or throw within `timeout`. Sums of bf16 reach them widened
  // to f32; they see no integer average.
  virtual void do_all_reduce(Tensor& t, ReduceOp op, std::chrono::milliseconds timeout) = 0;
  virtual void do_all_gather(const Tensor& in, Tensor& out, std::chrono::milliseconds timeout) = 0;
  virtual void do_broadcast(Tensor& t, int root, std::chrono::milliseconds timeout) = 0;
  // send goes to `to` and recv comes from `from`: other ranks, or this rank itself (both) where
  // sends_to_itself().
  virtual void do_send_recv(const Tensor& send, int to, Tensor& recv, int from,
                            std::chrono::milliseconds timeout) = 0;
  // Whether do_send_recv takes this rank as its peer (NCCL does); otherwise send_recv copies locally.
  virtual bool sends_to_itself() const { return false; }
  // reduce_scatter has a default: all_reduce of a copy, then this rank's rows. A backend with a native
  // reduce-scatter (NCCL) overrides it.
  virtual void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, std::chrono::milliseconds timeout);

  // "2 s" or "1.5 s": a timeout as messages print it.
  static std::string seconds_str(std::chrono::milliseconds t);

 private:
  class Call;  // one public call: its deadline, the broken-state check, the error translation

  // The header of one call (op, parameter, dtype, shape) exchanged with every rank; throws
  // std::invalid_argument naming each rank's header where they differ.
  void agree(Call& call, Op op, int64_t param, const Tensor& t);
  // The same between the two peers of a send_recv: what `from` sends must be what recv expects.
  void agree_pair(Call& call, const Tensor& send, int to, const Tensor& recv, int from);

  int rank_, size_;
  Device device_;
  std::chrono::milliseconds timeout_;
  std::string broken_;  // the message of the failure that broke this communicator; empty while usable
  // Storage that a failed call was transferring: the transport may still write into it, so it lives as
  // long as the communicator (which closes the transport first).
  std::vector<std::shared_ptr<Storage>> orphaned_;
};

// Checks the variable that tells the Gloo backend where to listen, as that backend will use it:
// SEQLAB_GLOO_IFACE (an interface of this machine with an IPv4 or IPv6 address), else SEQLAB_GLOO_HOST (a
// name or address that resolves to one this machine can bind to); neither set is 127.0.0.1. A value this
// machine cannot use is a std::invalid_argument naming the variable and its value, e.g.
// "SEQLAB_GLOO_HOST=nosuchhost: cannot resolve the host name (...)". The Gloo communicator checks it
// first; a launcher checks it before it starts any rank.
void check_gloo_transport();

// The rendezvous store on one machine: Gloo's FileStore on `folder` (created if missing). The folder
// must be fresh for each job: keys left by an earlier job would be read as this job's.
std::shared_ptr<gloo::rendezvous::Store> open_file_store(const std::string& folder);

// The rendezvous store across machines that share no folder: Gloo's RedisStore on host:port, every key
// under "JOB/" so that jobs sharing a server do not read each other's keys (a Redis server keeps them
// after a job ends: JOB must be fresh for each job). Throws std::runtime_error naming the server when it
// cannot be reached.
std::shared_ptr<gloo::rendezvous::Store> open_redis_store(const std::string& host, int port, const std::string& job);

// `base` with every key under "PREFIX.": the store of a group of ranks inside a job (the ranks of one
// sequence-parallel group meet through the job's store under their group's prefix). Keeps `base` alive.
std::shared_ptr<gloo::rendezvous::Store> prefixed_store(std::shared_ptr<gloo::rendezvous::Store> base,
                                                        const std::string& prefix);

// The communicator for tensors on `device`: Gloo for the CPU, NCCL for a GPU (device.index is this
// rank's GPU). Every rank passes the same store, size and its own rank. Throws CommError when the
// rendezvous does not complete within `timeout` (a rank did not join), std::invalid_argument for a bad
// rank or size, std::runtime_error for a CUDA device in a build without NCCL.
std::unique_ptr<Communicator> make_communicator(Device device, std::shared_ptr<gloo::rendezvous::Store> store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout = kDefaultTimeout);

}  // namespace seqlab::dist
