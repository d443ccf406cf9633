// Tests that run one process per rank (tests/communicator_test.cc, tests/sequence_parallel_test.cc): a
// fresh folder for the ranks' file store, and run_ranks, which forks the ranks and watches them.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace seqlab::testing {

// A fresh folder for one job's file store, removed with the object.
struct StoreFolder {
  std::string path;
  StoreFolder() {
    // Under the system's temporary folder ($TMPDIR, else /tmp).
    std::string tmpl = (std::filesystem::temp_directory_path() / "seqlab_ranks_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed in " + tmpl);
    path = tmpl;
  }
  ~StoreFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Runs body(rank, store folder) in `size` child processes, one per rank. Returns one line per rank that
// failed (exit status, signal, or killed by the watchdog); empty when every rank passed.
inline std::vector<std::string> run_ranks(int size, const std::function<void(int, const std::string&)>& body,
                                   std::chrono::seconds watchdog = std::chrono::seconds(30)) {
  StoreFolder folder;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // GNU OpenMP's thread pool does not survive fork: a child that opens a parallel region with more
      // than one thread waits forever for the parent's workers. The ranks run on one thread each, as
      // the launcher (fork + exec) gives two ranks on two cores.
      omp_set_num_threads(1);
      int code = 0;
      try {
        body(rank, folder.path);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      _exit(code);  // no static destructors or GoogleTest teardown in the child
    }
    pids.push_back(pid);
  }
  std::vector<std::string> failures;
  std::vector<bool> done(size, false);
  const auto deadline = std::chrono::steady_clock::now() + watchdog;
  int remaining = size;
  while (remaining > 0) {
    for (int rank = 0; rank < size; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --remaining;
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        failures.push_back("rank " + std::to_string(rank) + " exited with " + std::to_string(WEXITSTATUS(status)));
      } else if (WIFSIGNALED(status)) {
        failures.push_back("rank " + std::to_string(rank) + " ended by signal " + std::to_string(WTERMSIG(status)));
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < size; ++rank) {
        if (done[rank]) continue;
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], nullptr, 0);
        failures.push_back("rank " + std::to_string(rank) + " hung: killed by the watchdog");
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failures;
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

}  // namespace seqlab::testing
