// `./train RECIPE --nproc N`: the training process starts N rank processes of its own binary, one per
// rank, and supervises them (docs/distributed.md "Launcher"). No torchrun, no mpirun. Across machines
// (--nnodes K --node-rank I --rendezvous DIR) each machine's launcher starts its N ranks, I·N .. I·N+N-1,
// and they meet through the shared folder DIR (or the Redis server of --rendezvous redis://HOST:PORT/JOB)
// instead of a folder of the launcher's.
//
// The launcher holds the run folder's lock for the whole job, makes a fresh rendezvous folder
// RUN/.rendezvous/<launcher pid>/ (a Gloo file store; removed at the end, and one a killed launcher left
// is removed by the next), checks SEQLAB_GLOO_HOST / SEQLAB_GLOO_IFACE and, across machines, that every
// machine gave the same --nproc and --nnodes, and runs
// `/proc/self/exe ARGS...` N times with the same arguments and these environment variables:
//   SEQLAB_RANK        this process's rank, 0 .. N-1
//   SEQLAB_WORLD_SIZE  N
//   SEQLAB_RENDEZVOUS  the rendezvous folder
//   SEQLAB_LAUNCH_TOKEN  "PID:FD:TOKEN": the launcher's pid and a memory file it holds open, inherited by
//                      the ranks as FD, holding TOKEN (random); a rank honours the variables above only
//                      when its parent is PID and FD holds TOKEN (launched_rank)
// Rank 0 inherits the launcher's stdout and stderr (the progress bar, the run's messages); the other
// ranks' stdout is discarded and their stderr comes through the launcher, each line prefixed
// "[rank R] ". Each rank runs in its own process group (a Ctrl-C reaches the launcher alone, which
// forwards it once) and is killed by the kernel if the launcher dies.
//
// SIGINT or SIGTERM to the launcher is forwarded to every rank: the ranks agree to stop after the same
// step, rank 0 saves a checkpoint, and the launcher exits with their code (128 + the signal). A second
// signal kills the ranks at once. When a rank fails (exits non-zero or is killed while the job was not
// being stopped) the launcher stops the others (SIGTERM, then SIGKILL after a grace period) and exits
// non-zero with one line naming the rank and how it ended.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace seqlab::cli {

// The exit code of a rank whose communicator failed: a peer died or timed out. The launcher names the
// rank that failed first on its own, not one that only saw a peer fail.
constexpr int kPeerFailedExit = 4;

// What a rank process learns from the launcher's environment variables.
struct LaunchedRank {
  int rank = 0;
  int world = 1;
  std::string rendezvous;  // the rendezvous folder (a Gloo file store)
};

// The rank this process is, when a launcher started it (SEQLAB_RANK, SEQLAB_WORLD_SIZE and
// SEQLAB_RENDEZVOUS set); nullopt otherwise. A malformed variable is a UserError naming it, and so are
// these variables without a live launcher's SEQLAB_LAUNCH_TOKEN (left in an environment, set by hand).
std::optional<LaunchedRank> launched_rank();

// A job's rendezvous store as --rendezvous and SEQLAB_RENDEZVOUS name it: a folder (Gloo's file store), or
// redis://HOST[:PORT]/JOB (Gloo's Redis store, port 6379 by default, keys under JOB). A UserError names a
// malformed address; with `connect`, also a server that cannot be reached (else only the address is checked).
std::shared_ptr<gloo::rendezvous::Store> open_rendezvous(const std::string& spec, bool connect = true);
bool is_redis_rendezvous(const std::string& spec);

// The ranks of a job: nproc on each of nnodes machines; this machine's are node_rank·nproc ..
// node_rank·nproc + nproc - 1. `rendezvous` is the shared folder of a job on several machines ("": one
// machine, a fresh folder under the run folder).
struct JobLayout {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rendezvous;
};

// Runs this machine's ranks of `job` (this binary with `args`, the train command's arguments), meeting
// through the job's rendezvous folder, waits for all, and returns the job's exit code: 0 when every rank
// succeeded; the ranks' common code when they all ended alike (128 + N after a forwarded signal N, 3 after
// a non-finite step); otherwise the failing rank's exit code (1 when it was killed by a signal), after
// one line on stderr naming it. The caller holds the run folder's lock.
int launch_ranks(const std::vector<std::string>& args, const JobLayout& job, const std::string& run_dir);

}  // namespace seqlab::cli
