// The NCCL backend: collectives over CUDA tensors, one GPU per rank, one communicator per process.
// Built only where CUDA and NCCL are found (make_communicator says so otherwise).
//
// Rank 0 creates the NCCL unique id and publishes it in the rendezvous store (the same Gloo store the
// CPU backend meets through); the others read it there. The communicator is non-blocking: every NCCL
// call returns at once, and this class polls ncclCommGetAsyncError and the stream until the work is
// done or the deadline passes, when it aborts the communicator (ncclCommAbort) and throws. Each call
// first waits for the tensor layer's work on the device (DeviceBackend::synchronize), runs on this
// communicator's own stream, and returns when that stream is idle: the caller's tensors are ready.
#pragma once

#include <chrono>
#include <memory>

#include "dist/communicator.h"

namespace seqlab::dist {

class NcclCommunicator : public Communicator {
 public:
  // Joins the job of `size` ranks as `rank` on GPU `device`. Throws CommError naming the rank when the
  // unique id does not arrive or NCCL's initialisation fails or does not finish within `timeout`.
  NcclCommunicator(Device device, std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                   std::chrono::milliseconds timeout = kDefaultTimeout);
  ~NcclCommunicator() override;
  const char* backend() const override { return "nccl"; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op, std::chrono::milliseconds timeout) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, std::chrono::milliseconds timeout) override;
  void do_all_gather(const Tensor& in, Tensor& out, std::chrono::milliseconds timeout) override;
  void do_broadcast(Tensor& t, int root, std::chrono::milliseconds timeout) override;
  void do_send_recv(const Tensor& send, int to, Tensor& recv, int from, std::chrono::milliseconds timeout) override;
  bool sends_to_itself() const override { return true; }

 private:
  struct State;  // the NCCL communicator and the stream (nccl.h stays out of this header)
  std::unique_ptr<State> state_;
};

}  // namespace seqlab::dist
