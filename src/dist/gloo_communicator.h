// The Gloo backend: collectives over CPU tensors between processes, on Gloo's TCP transport.
//
// The ranks meet through a Gloo rendezvous store (every rank publishes its address under its rank and
// connects to every other: Gloo's full mesh). The transport binds to SEQLAB_GLOO_HOST (a host name or
// address; 127.0.0.1 when unset, for ranks on one machine) or, when SEQLAB_GLOO_IFACE is set, to that
// network interface (eth0, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace gloo {
class Context;  // gloo/context.h
}

namespace seqlab::dist {

class GlooCommunicator : public Communicator {
 public:
  // Joins the job of `size` ranks as `rank` through `store`. Throws CommError naming the rank when the
  // rendezvous fails or a rank does not join within `timeout`.
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                   std::chrono::milliseconds timeout = kDefaultTimeout);
  ~GlooCommunicator() override;
  const char* backend() const override { return "gloo"; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op, std::chrono::milliseconds timeout) override;
  void do_all_gather(const Tensor& in, Tensor& out, std::chrono::milliseconds timeout) override;
  void do_broadcast(Tensor& t, int root, std::chrono::milliseconds timeout) override;
  void do_send_recv(const Tensor& send, int to, Tensor& recv, int from, std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<gloo::Context> context_;
  // Messages sent to and received from each peer so far: the n-th message from a to b travels in the
  // slot made from n, so that both ends name the same slot without agreeing on anything else.
  std::vector<uint64_t> sent_, received_;
};

}  // namespace seqlab::dist
