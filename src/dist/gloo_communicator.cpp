// The Gloo backend. Gloo's collectives take a timeout each and throw gloo::IoException when it passes or
// the connection to a peer fails; both become TransportFailure here, and CommError above.
#include "dist/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

#include "dist/store.h"

namespace seqlab::dist {
namespace {

using std::chrono::milliseconds;

// Gloo words its timeouts "Timed out waiting ..." (transfers) and "Wait timeout for key(s) ..." (stores).
bool is_timeout(const std::string& message) {
  return message.find("imed out") != std::string::npos || message.find("imeout") != std::string::npos;
}

// Gloo's message without the "[./gloo/...cc:147] " source locations it starts with.
std::string gloo_message(const std::string& message) {
  size_t at = 0;
  while (at < message.size() && message[at] == '[') {
    const size_t close = message.find("] ", at);
    if (close == std::string::npos) break;
    at = close + 2;
  }
  return message.substr(at);
}

// Runs a Gloo call, turning its exceptions into TransportFailure.
template <class Fn>
void gloo_call(Fn&& fn) {
  try {
    fn();
  } catch (const gloo::Exception& e) {
    throw TransportFailure(is_timeout(e.what()), gloo_message(e.what()));
  }
}

// The TCP device: SEQLAB_GLOO_IFACE names an interface, else SEQLAB_GLOO_HOST a host, else loopback.
// The caller has vetted the variable first (check_gloo_transport): Gloo's own checks crash on a host name
// that does not resolve (it reads getaddrinfo's result without looking at its error), and word the others
// in terms of its internals.
std::shared_ptr<gloo::transport::Device> tcp_device() {
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("SEQLAB_GLOO_IFACE");
  const char* host = std::getenv("SEQLAB_GLOO_HOST");
  if (iface && *iface) {
    attr.iface = iface;
  } else {
    attr.hostname = host && *host ? host : "127.0.0.1";
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

// The interfaces of this machine that have an IPv4 or IPv6 address, as a message lists them.
std::string interfaces_with_addresses(const ifaddrs* list) {
  std::set<std::string> names;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6)) names.insert(a->ifa_name);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// Slots of send_recv messages: a prefix byte that none of Gloo's collectives use, then the count.
constexpr uint64_t kSendRecvSlots = 0xA5ull << 56;

template <class T>
void divide(Tensor& t, int by) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<T>(by);
}

}  // namespace

void check_gloo_transport() {
  const char* iface = std::getenv("SEQLAB_GLOO_IFACE");
  const char* host = std::getenv("SEQLAB_GLOO_HOST");
  if (iface && *iface) {
    // What Gloo looks for: an IPv4 or IPv6 address of the interface of that name.
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) {
      throw std::invalid_argument(std::string("SEQLAB_GLOO_IFACE=") + iface +
                                  ": cannot list this machine's network interfaces (" + std::strerror(errno) + ")");
    }
    bool named = false, addressed = false;
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (std::strcmp(a->ifa_name, iface) != 0) continue;
      named = true;
      addressed = addressed || (a->ifa_addr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6));
    }
    const std::string have = interfaces_with_addresses(list);
    ::freeifaddrs(list);
    if (!addressed) {
      throw std::invalid_argument(std::string("SEQLAB_GLOO_IFACE=") + iface + ": " +
                                  (named ? "the interface has no IPv4 or IPv6 address"
                                         : "no network interface of this name on this machine") +
                                  " (interfaces with an address: " + have + ")");
    }
    return;
  }
  if (!host || !*host) return;  // 127.0.0.1
  // What Gloo does with a host name: resolve it, then bind to the first of its addresses that binds.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rv = ::getaddrinfo(host, nullptr, &hints, &result);
  if (rv != 0) {
    throw std::invalid_argument(std::string("SEQLAB_GLOO_HOST=") + host + ": cannot resolve the host name (" +
                                (rv == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rv)) +
                                "); give a name or an address of this machine, or SEQLAB_GLOO_IFACE");
  }
  std::string why;
  bool bound = false;
  for (const addrinfo* a = result; a != nullptr && !bound; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any free port, released at once
    if (!bound) why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(result);
  if (!bound) {
    throw std::invalid_argument(std::string("SEQLAB_GLOO_HOST=") + host +
                                ": no address of this name is one of this machine's (bind: " + why +
                                "); give a name or an address of this machine, or SEQLAB_GLOO_IFACE");
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                                   milliseconds timeout)
    : Communicator(rank, size, cpu_device(), timeout), sent_(size, 0), received_(size, 0) {
  if (!store) throw std::invalid_argument(who() + "gloo: no rendezvous store");
  // Before the try: a transport variable this machine cannot use is the user's to fix, said as it is.
  check_gloo_transport();
  // A write to the socket of a peer that died raises SIGPIPE, whose default ends this process at once —
  // a rank killed by signal 13 instead of the CommError naming the failed call that the launcher reports.
  // Ignored, the write fails with EPIPE, which Gloo turns into an error like any other broken connection.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    std::shared_ptr<gloo::transport::Device> device = tcp_device();
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    DeadlineStore bounded(std::move(store), timeout);
    context->connectFullMesh(bounded, device);
    context_ = std::move(context);
  } catch (const std::exception& e) {
    if (is_timeout(e.what())) {
      throw CommError(who() + "rendezvous timed out after " + seconds_str(timeout) + " (a rank that did not join?): " +
                      gloo_message(e.what()));
    }
    throw CommError(who() + "rendezvous failed: " + gloo_message(e.what()));
  }
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::do_all_reduce(Tensor& t, ReduceOp op, milliseconds timeout) {
  gloo::AllreduceOptions opts(context_);
  opts.setTimeout(timeout);
  const size_t n = static_cast<size_t>(t.numel());
  // In place: Gloo reduces the outputs themselves when no inputs are given.
  switch (t.dtype()) {
    case DType::f32:
      opts.setOutput(t.data<float>(), n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      break;
    case DType::f64:
      opts.setOutput(t.data<double>(), n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
      break;
    case DType::i32:
      opts.setOutput(t.data<int32_t>(), n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int32_t>));
      break;
    case DType::i64:
      opts.setOutput(t.data<int64_t>(), n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int64_t>));
      break;
    case DType::bf16:
      throw std::invalid_argument(who() + "gloo: bf16 reaches all_reduce widened to f32");
  }
  gloo_call([&] { gloo::allreduce(opts); });
  if (op == ReduceOp::average) {
    if (t.dtype() == DType::f32) divide<float>(t, size());
    if (t.dtype() == DType::f64) divide<double>(t, size());
  }
}

void GlooCommunicator::do_all_gather(const Tensor& in, Tensor& out, milliseconds timeout) {
  gloo::AllgatherOptions opts(context_);
  opts.setTimeout(timeout);
  // Bytes: a gather moves elements without looking at them, whatever the dtype. Gloo only reads the input.
  opts.setInput(static_cast<char*>(in.raw_data()), in.nbytes());
  opts.setOutput(static_cast<char*>(out.raw_data()), out.nbytes());
  gloo_call([&] { gloo::allgather(opts); });
}

void GlooCommunicator::do_broadcast(Tensor& t, int root, milliseconds timeout) {
  gloo::BroadcastOptions opts(context_);
  opts.setTimeout(timeout);
  opts.setRoot(root);
  // In place: the root sends its output buffer, the others receive into theirs.
  opts.setOutput(static_cast<char*>(t.raw_data()), t.nbytes());
  gloo_call([&] { gloo::broadcast(opts); });
}

void GlooCommunicator::do_send_recv(const Tensor& send, int to, Tensor& recv, int from, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  gloo_call([&] {
    // Both transfers are posted before either is waited for: in a ring every rank sends and receives
    // at once. Gloo only reads a buffer it sends.
    std::unique_ptr<gloo::transport::UnboundBuffer> out = context_->createUnboundBuffer(send.raw_data(), send.nbytes());
    std::unique_ptr<gloo::transport::UnboundBuffer> in = context_->createUnboundBuffer(recv.raw_data(), recv.nbytes());
    // An empty tensor is not sent: its peer, which agreed on its shape, posts no receive for it.
    if (send.nbytes() > 0) out->send(to, kSendRecvSlots | sent_[to]++);
    if (recv.nbytes() > 0) in->recv(from, kSendRecvSlots | received_[from]++);
    const auto left = [&] {
      return std::max(milliseconds(1),
                      std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()));
    };
    if (recv.nbytes() > 0 && !in->waitRecv(left())) {
      throw TransportFailure(false, "the receive from rank " + std::to_string(from) + " was aborted");
    }
    if (send.nbytes() > 0 && !out->waitSend(left())) {
      throw TransportFailure(false, "the send to rank " + std::to_string(to) + " was aborted");
    }
  });
}

}  // namespace seqlab::dist
