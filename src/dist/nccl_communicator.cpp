// The NCCL backend (see nccl_communicator.h). Every call follows one pattern: wait for the tensor
// layer's stream, enqueue the NCCL work on our stream, then poll until it is done, failed or late.
#include "dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dist/store.h"

namespace seqlab::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The key under which rank 0 publishes the NCCL unique id in the rendezvous store.
constexpr const char* kUniqueIdKey = "seqlab/nccl_unique_id";

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  throw std::invalid_argument(std::string("nccl: no NCCL type for ") + dtype_name(d));
}

std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(": ") + last;
  return s;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw TransportFailure(false, std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  bool aborted = false;

  // Polls until NCCL has finished what was issued (the communicator is no longer "in progress"), and,
  // when `stream_too`, until the stream is idle. Aborts the communicator and throws on an error or when
  // `deadline` passes.
  void wait(Clock::time_point deadline, bool stream_too) {
    for (;;) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess) fail(false, "ncclCommGetAsyncError: " + nccl_error(comm, r));
      if (async != ncclSuccess && async != ncclInProgress) fail(false, nccl_error(comm, async));
      if (async == ncclSuccess) {
        if (!stream_too) return;
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) fail(false, std::string("cudaStreamQuery: ") + cudaGetErrorString(q));
      }
      if (Clock::now() > deadline) fail(true, "NCCL did not finish before the deadline");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Checks the result of an NCCL call made on the non-blocking communicator: ncclInProgress is
  // success-so-far; the next wait() sees the outcome.
  void issued(ncclResult_t r, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress) fail(false, std::string(call) + ": " + nccl_error(comm, r));
  }
  [[noreturn]] void fail(bool timed_out, const std::string& cause) {
    // A failed or late communicator cannot be trusted with more work; abort frees it and stops its
    // kernels, so the process can end (or report) instead of hanging in NCCL.
    if (!aborted && comm) ncclCommAbort(comm);
    aborted = true;
    throw TransportFailure(timed_out, cause);
  }
  // The tensor layer's work on the device, which produced the inputs, is done before NCCL reads them.
  void start() {
    if (aborted) throw TransportFailure(false, "the NCCL communicator was aborted by an earlier failure");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    if (DeviceBackend* backend = cuda_backend()) backend->synchronize(device);
  }
};

NcclCommunicator::NcclCommunicator(Device device, std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                                   milliseconds timeout)
    : Communicator(rank, size, device, timeout), state_(std::make_unique<State>()) {
  if (!device.is_cuda()) throw std::invalid_argument(who() + "nccl: " + device.str() + " is not a GPU");
  if (!store) throw std::invalid_argument(who() + "nccl: no rendezvous store");
  if (!cuda_available()) throw CommError(who() + "nccl: " + device.str() + " is not usable: no GPU in this process");
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.device = device.index;
  try {
    check_cuda(cudaSetDevice(s.device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // The unique id: made by rank 0, read by the others from the store within the timeout.
    ncclUniqueId id;
    DeadlineStore bounded(std::move(store), timeout);
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw TransportFailure(false, std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
      bounded.set(kUniqueIdKey, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::vector<char> bytes = bounded.get(kUniqueIdKey);
      if (bytes.size() != sizeof(id.internal)) {
        throw TransportFailure(false, "the NCCL unique id in the store has " + std::to_string(bytes.size()) +
                                          " bytes, not " + std::to_string(sizeof(id.internal)));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; State::wait polls with the deadline
    s.issued(ncclCommInitRankConfig(&s.comm, size, id, rank, &config), "ncclCommInitRankConfig");
    s.wait(deadline, /*stream_too=*/false);
  } catch (const TransportFailure& e) {
    throw CommError(who() + "nccl initialisation " +
                    (e.timed_out ? "timed out after " + seconds_str(timeout) + " (a rank that did not join?)"
                                 : std::string("failed: ") + e.what()));
  } catch (const std::exception& e) {
    // Gloo's store throws its own exceptions when the unique id does not arrive in time.
    throw CommError(who() + "nccl initialisation failed (a rank that did not join?): " + e.what());
  }
}

NcclCommunicator::~NcclCommunicator() {
  State& s = *state_;
  if (s.comm && !s.aborted) {
    // Finalize flushes what is still queued (nothing: every call waited); abort is the bounded way out.
    ncclCommAbort(s.comm);
  }
  if (s.stream) cudaStreamDestroy(s.stream);
}

void NcclCommunicator::do_all_reduce(Tensor& t, ReduceOp op, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.start();
  s.issued(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                         op == ReduceOp::average ? ncclAvg : ncclSum, s.comm, s.stream),
           "ncclAllReduce");
  s.wait(deadline, /*stream_too=*/true);
}

void NcclCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.start();
  s.issued(ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()), nccl_type(in.dtype()),
                             op == ReduceOp::average ? ncclAvg : ncclSum, s.comm, s.stream),
           "ncclReduceScatter");
  s.wait(deadline, /*stream_too=*/true);
}

void NcclCommunicator::do_all_gather(const Tensor& in, Tensor& out, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.start();
  s.issued(ncclAllGather(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), s.comm,
                         s.stream),
           "ncclAllGather");
  s.wait(deadline, /*stream_too=*/true);
}

void NcclCommunicator::do_broadcast(Tensor& t, int root, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.start();
  s.issued(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), root,
                         s.comm, s.stream),
           "ncclBroadcast");
  s.wait(deadline, /*stream_too=*/true);
}

void NcclCommunicator::do_send_recv(const Tensor& send, int to, Tensor& recv, int from, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  State& s = *state_;
  s.start();
  // One group: NCCL posts the send and the receive together, so a ring of send_recv cannot deadlock.
  s.issued(ncclGroupStart(), "ncclGroupStart");
  if (send.numel() > 0) {
    s.issued(ncclSend(send.raw_data(), static_cast<size_t>(send.numel()), nccl_type(send.dtype()), to, s.comm, s.stream),
             "ncclSend");
  }
  if (recv.numel() > 0) {
    s.issued(ncclRecv(recv.raw_data(), static_cast<size_t>(recv.numel()), nccl_type(recv.dtype()), from, s.comm,
                      s.stream),
             "ncclRecv");
  }
  s.issued(ncclGroupEnd(), "ncclGroupEnd");
  s.wait(deadline, /*stream_too=*/true);
}

}  // namespace seqlab::dist
