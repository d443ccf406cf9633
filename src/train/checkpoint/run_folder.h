// What keeps a run folder whole: one writer at a time, and files replaced atomically.
//
// One writer per run folder. A training process (`seqlab RECIPE --out RUN`, `seqlab --resume RUN`)
// takes RUN/.lock before it writes anything into RUN and holds it until it exits:
//
//   flock(fd, LOCK_EX | LOCK_NB) on RUN/.lock, the file then holding "pid PID host HOST since TIME".
//
// A second process on the same folder fails to take it and is refused at once, naming the holder.
// The kernel drops an flock with the last descriptor of its holder, also when the holder is killed
// (SIGKILL, a crash, the OOM killer), so a lock file left by a dead process is simply taken again:
// there is no stale lock to clean up, and the file itself is never deleted (deleting it would let two
// processes lock two different files of the same name).
//
// Temporary files of the run folder are named NAME.tmp.PID (checkpoints, logs rewritten on resume,
// the resolved recipe); remove_leftover_temporaries deletes those whose writer is no longer running,
// which a kill in the middle of a write leaves behind.
#pragma once

#include <string>
#include <vector>

// temporary_name and write_file_atomically, whose temporaries remove_leftover_temporaries removes.
#include "train/common/atomic_file.h"

namespace seqlab::cli {

class RunLock {
 public:
  // Creates `run_dir` (and its parents) when missing, then takes its lock. UserError when run_dir
  // names something that is not a folder, cannot be created or written, or when another process
  // holds the lock (the message names its pid and host). A sweep folder takes the same lock, with
  // `sweep` true so that the refusal speaks of a sweep.
  static RunLock acquire(const std::string& run_dir, bool sweep = false);

  RunLock(RunLock&& other) noexcept
      : fd_(other.fd_), dir_(std::move(other.dir_)), created_(std::move(other.created_)) {
    other.fd_ = -1;
  }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  RunLock& operator=(RunLock&&) = delete;
  ~RunLock();  // releases the lock

  // For a run that was refused or failed before it wrote anything: when acquire created the folder and
  // it still holds nothing but the lock file, removes both (and the parents acquire created, when empty),
  // then releases the lock. A folder that existed before, or that holds anything else, is left as it is.
  void remove_if_unused();

 private:
  RunLock(int fd, std::string dir, std::vector<std::string> created)
      : fd_(fd), dir_(std::move(dir)), created_(std::move(created)) {}
  int fd_ = -1;
  std::string dir_;
  std::vector<std::string> created_;  // the folders acquire created, the run folder first
};

// The name of the lock file inside a run folder.
constexpr const char* kRunLockFile = ".lock";

// Deletes the files NAME.tmp.PID of `run_dir` whose process PID no longer runs (on this host: the
// lock holder is the only writer of the folder) and returns their names.
std::vector<std::string> remove_leftover_temporaries(const std::string& run_dir);

}  // namespace seqlab::cli
