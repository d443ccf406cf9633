#include "train/checkpoint/run_folder.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/strip.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "train/common/errors.h"
#include "train/common/stamps.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// What the holder wrote into the lock file, without the newline; "" when it has not written yet.
std::string read_holder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(absl::StripTrailingAsciiWhitespace(std::string(buf, static_cast<size_t>(n)))) : "";
}

// True when a process with this pid runs (one we may not signal too). A zombie — killed, not yet
// reaped by its parent — writes nothing more: its state in /proc/PID/stat (after "pid (comm) ") is Z.
bool process_alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || (text[paren + 2] != 'Z' && text[paren + 2] != 'X');
}

}  // namespace

RunLock RunLock::acquire(const std::string& run_dir, bool sweep) {
  std::error_code ec;
  const fs::path dir(run_dir);
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw UserError(run_dir + ": exists and is not a folder; name a run folder (new or existing) with --out DIR");
  }
  // The folders about to be created (the run folder, then its missing parents), for remove_if_unused.
  std::vector<std::string> created;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) throw UserError(absl::StrCat(run_dir, ": cannot create the run folder (", ec.message(), ")"));
  const std::string file = (dir / kRunLockFile).string();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw UserError(absl::StrCat(run_dir, ": cannot write into the run folder (", file, ": ", std::strerror(errno), ")"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = read_holder(fd);
    // The holder writes its name right after locking: give it a moment if we came in between.
    for (int i = 0; i < 20 && holder.empty() && err == EWOULDBLOCK; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      holder = read_holder(fd);
    }
    ::close(fd);
    if (err != EWOULDBLOCK) {
      throw UserError(absl::StrCat(run_dir, ": cannot lock ", file, " (", std::strerror(err), ")"));
    }
    throw UserError(absl::StrCat(run_dir, sweep ? " is in use by another sweep (" : " is in use by another training process (",
                                 holder.empty() ? "its pid is not written yet" : holder, "; lock ", file,
                                 sweep ? "): one sweep runs in a folder at a time; wait for it to end, or sweep "
                                         "into another folder with --out DIR"
                                       : "): one process writes a run folder at a time; wait for it to end, or train "
                                         "into another folder with --out DIR"));
  }
  // Ours now; a dead holder's text is replaced.
  const std::string text = absl::StrCat("pid ", ::getpid(), " host ", host_name(), " since ", utc_timestamp(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd);
    throw UserError(absl::StrCat(run_dir, ": cannot write into the run folder (", file, ": ", std::strerror(err), ")"));
  }
  return RunLock(fd, run_dir, std::move(created));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

void RunLock::remove_if_unused() {
  if (fd_ < 0 || created_.empty()) return;
  const fs::path dir(dir_);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kRunLockFile) return;  // something was written: the folder stays
  }
  if (ec) return;
  // Removed while still locked, so no other process can have started to write here meanwhile; one that
  // opened the lock file already finds it unlinked and its folder gone, and fails to write.
  fs::remove(dir / kRunLockFile, ec);
  for (const std::string& folder : created_) {
    if (!fs::remove(folder, ec)) break;  // fs::remove deletes only an empty folder
  }
  ::close(fd_);
  fd_ = -1;
}

std::vector<std::string> remove_leftover_temporaries(const std::string& run_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    int64_t pid = 0;
    if (at == std::string::npos || !absl::SimpleAtoi(name.substr(at + 5), &pid) || pid <= 0) continue;
    if (pid == ::getpid() || process_alive(static_cast<pid_t>(pid))) continue;
    std::error_code rm;
    if (fs::remove(e.path(), rm)) removed.push_back(name);
  }
  return removed;
}

}  // namespace seqlab::cli
