#include "train/launch/launcher.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <gloo/rendezvous/store.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <tuple>

#include "train/common/errors.h"
#include "train/common/stamps.h"

extern char** environ;

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kRankVar = "SEQLAB_RANK";
constexpr const char* kWorldVar = "SEQLAB_WORLD_SIZE";
constexpr const char* kRendezvousVar = "SEQLAB_RENDEZVOUS";
// "PID:FD:TOKEN": the launcher's pid, and a memory file it holds open (inherited by its ranks as FD) whose
// bytes are TOKEN, 32 random hex digits of this job. The three variables above are honoured only with it.
constexpr const char* kTokenVar = "SEQLAB_LAUNCH_TOKEN";

// How long a rank told to stop (SIGTERM) after another rank failed has before it is killed: enough to
// notice the failure in its next collective and exit on its own.
constexpr std::chrono::seconds kStopGrace{5};

// The launcher's SIGINT/SIGTERM handler records the signal and counts them; the supervision loop
// forwards the first to every rank and answers a second by killing them.
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_signal_count = 0;

extern "C" void record_launcher_signal(int signal) {
  g_signal = signal;
  g_signal_count = g_signal_count + 1;
}

// Installs record_launcher_signal without SA_RESTART, so a signal wakes the loop's poll at once.
class LauncherSignals {
 public:
  LauncherSignals() {
    struct sigaction sa {};
    sa.sa_handler = record_launcher_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    g_signal_count = 0;
    sigaction(SIGINT, &sa, &previous_int_);
    sigaction(SIGTERM, &sa, &previous_term_);
  }
  ~LauncherSignals() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

int env_int(const char* name) {
  const char* text = std::getenv(name);
  int value = 0;
  if (text == nullptr || !absl::SimpleAtoi(text, &value)) {
    throw UserError(absl::StrCat(name, " = '", text ? text : "", "' is not a number (set by the launcher, ./train --nproc N)"));
  }
  return value;
}

// One rank process as the launcher sees it.
struct RankProcess {
  pid_t pid = -1;
  int err_fd = -1;      // read end of the rank's stderr pipe (ranks > 0), -1 once closed
  std::string pending;  // stderr bytes after the last complete line
  bool running = true;
  int status = 0;              // waitpid's status once ended
  int sent = 0;  // the last signal the launcher sent it because another rank failed (SIGTERM, SIGKILL)
};

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string describe_end(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrFormat("was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

void write_stderr(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr gone: nothing to report to
    done += static_cast<size_t>(n);
  }
}

// Reads what is available from rank r's stderr pipe and writes its complete lines prefixed "[rank r] "
// (at EOF, the last partial line too).
void pump_stderr(RankProcess& p, int r) {
  char buffer[4096];
  const ssize_t n = ::read(p.err_fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  const std::string prefix = absl::StrCat("[rank ", r, "] ");
  if (n > 0) p.pending.append(buffer, static_cast<size_t>(n));
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = p.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += prefix + p.pending.substr(start, nl + 1 - start);
  }
  p.pending.erase(0, start);
  if (n <= 0) {  // EOF (or an error): the rank closed its stderr
    if (!p.pending.empty()) out += prefix + p.pending + "\n";
    p.pending.clear();
    ::close(p.err_fd);
    p.err_fd = -1;
  }
  write_stderr(out);
}

// The environment of rank `rank`: the launcher's, without any launcher variables it inherited itself,
// plus this job's.
std::vector<std::string> rank_environment(int rank, int world, const std::string& rendezvous, const std::string& token) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (absl::StartsWith(entry, absl::StrCat(kRankVar, "=")) || absl::StartsWith(entry, absl::StrCat(kWorldVar, "=")) ||
        absl::StartsWith(entry, absl::StrCat(kRendezvousVar, "=")) || absl::StartsWith(entry, absl::StrCat(kTokenVar, "="))) {
      continue;
    }
    env.push_back(entry);
  }
  env.push_back(absl::StrCat(kRankVar, "=", rank));
  env.push_back(absl::StrCat(kWorldVar, "=", world));
  env.push_back(absl::StrCat(kRendezvousVar, "=", rendezvous));
  env.push_back(absl::StrCat(kTokenVar, "=", token));
  return env;
}

// The launcher's token (kTokenVar): a memory file holding 32 random hex digits, left open without
// close-on-exec so that the ranks inherit it. Closed when the launcher is done.
struct LaunchToken {
  int fd = -1;
  std::string value;  // "PID:FD:TOKEN"
  LaunchToken() {
    const std::string secret = random_hex128();
    fd = ::memfd_create("seqlab-launch-token", 0);
    if (fd < 0 || ::pwrite(fd, secret.data(), secret.size(), 0) != static_cast<ssize_t>(secret.size())) {
      throw UserError(absl::StrCat("cannot start the ranks: memfd_create failed (", std::strerror(errno), ")"));
    }
    value = absl::StrCat(::getpid(), ":", fd, ":", secret);
  }
  ~LaunchToken() {
    if (fd >= 0) ::close(fd);
  }
};

// Whether this process was started by a live seqlab launcher: kTokenVar names its parent (the launcher
// forks every rank itself and the kernel kills the rank when it dies) and a descriptor inherited from it
// that holds the token. Variables copied into another shell or left in an environment fail both.
bool started_by_launcher() {
  const char* value = std::getenv(kTokenVar);
  if (value == nullptr) return false;
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  int pid = 0, fd = -1;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &pid) || !absl::SimpleAtoi(parts[1], &fd) ||
      parts[2].size() != 32 || pid != ::getppid() || fd < 0) {
    return false;
  }
  char held[33] = {};
  return ::pread(fd, held, 33, 0) == 32 && parts[2] == std::string(held, 32);
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// True while a process of this pid runs (one we may not signal too); a zombie, killed but not yet
// reaped, no longer runs: its state in /proc/PID/stat, after "PID (comm) ", is Z.
bool process_runs(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || (text[paren + 2] != 'Z' && text[paren + 2] != 'X');
}

// Removes the folders RUN/.rendezvous/<pid> whose launcher no longer runs and names each in one line: a
// launcher killed with SIGKILL cannot remove its own. The caller holds the run folder's lock, so no other
// launcher of this folder is at work; a pid is judged on this machine (a dead launcher's pid that an
// unrelated process took since keeps its folder until that process ends).
void remove_dead_rendezvous(const fs::path& parent) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    int64_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid) || pid <= 0 || pid > INT32_MAX) continue;
    if (pid == ::getpid() || process_runs(static_cast<pid_t>(pid))) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) write_stderr(absl::StrCat("seqlab: removed ", e.path().string(), ", left behind by a launcher that was killed\n"));
  }
}

// Gloo's exception text without what only its sources explain: the "[enforce fail at FILE:LINE] " it starts
// with, the failed expression after it and the values it compared ("!ifs.is_open(). File already exists:
// ..." -> "File already exists: ...").
std::string gloo_cause(const std::string& what) {
  std::string text = what;
  const bool enforce = absl::StartsWith(text, "[enforce fail at ");
  while (!text.empty() && text[0] == '[' && text.find("] ") != std::string::npos) text.erase(0, text.find("] ") + 2);
  if (enforce && text.find(". ") != std::string::npos) text.erase(0, text.find(". ") + 2);
  // GLOO_ENFORCE_EQ adds the two values compared: "0 vs 1. Key 'JOB/k' already set".
  const size_t vs = text.find(" vs "), stop = text.find(". ");
  if (enforce && vs != std::string::npos && stop != std::string::npos && vs < stop) text.erase(0, stop + 2);
  return text;
}

// The machines of a job must agree on --nproc and --nnodes: ranks started for different world sizes meet
// in Gloo's rendezvous and fail there in Gloo's terms ("sizeof(impl_) == bytes.size(). 136 vs 226"), or
// wait for ranks that never come until it times out. So each launcher publishes its own under
// "seqlab.layout.<node>" before it starts a rank; machine 0 reads every other machine's, the others read
// machine 0's, so that both sides of a disagreement refuse, each naming both values. A key that is there
// already (Gloo's stores refuse to set a key twice) is another machine's of the same --node-rank, or an
// earlier job's.
void check_machines_agree(gloo::rendezvous::Store& store, const JobLayout& job) {
  auto key = [](int node) { return absl::StrCat("seqlab.layout.", node); };
  const std::string mine = absl::StrCat(job.nproc, " ", job.nnodes);
  try {
    store.set(key(job.node_rank), std::vector<char>(mine.begin(), mine.end()));
  } catch (const std::exception& e) {
    throw UserError(absl::StrFormat("--rendezvous %s: cannot publish this machine's --nproc and --nnodes as "
                                    "--node-rank %d (%s): did another machine of the job give --node-rank %d, or "
                                    "an earlier job use this rendezvous? Give each machine its own --node-rank, "
                                    "and each job a fresh --rendezvous",
                                    job.rendezvous, job.node_rank, gloo_cause(e.what()), job.node_rank));
  }
  std::vector<int> others;
  for (int node = 0; node < job.nnodes; ++node) {
    if (node != job.node_rank && (job.node_rank == 0 || node == 0)) others.push_back(node);
  }
  for (int node : others) {
    try {
      store.wait({key(node)}, dist::kDefaultTimeout);
    } catch (const std::exception& e) {
      // Gloo's stores say "Wait timeout for key(s)" when the time is up; anything else is the store failing.
      if (absl::StrContains(e.what(), "imeout")) {
        throw UserError(absl::StrFormat("--rendezvous %s: machine %d of the job did not join within %d s (not "
                                        "started, or given another --rendezvous?)",
                                        job.rendezvous, node,
                                        std::chrono::duration_cast<std::chrono::seconds>(dist::kDefaultTimeout).count()));
      }
      throw UserError(absl::StrFormat("--rendezvous %s: failed while waiting for machine %d (%s)", job.rendezvous,
                                      node, gloo_cause(e.what())));
    }
    std::string theirs;
    try {
      const std::vector<char> bytes = store.get(key(node));
      theirs.assign(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      throw UserError(absl::StrFormat("--rendezvous %s: cannot read machine %d's --nproc and --nnodes (%s)",
                                      job.rendezvous, node, gloo_cause(e.what())));
    }
    const std::vector<std::string> fields = absl::StrSplit(theirs, ' ');
    int nproc = 0, nnodes = 0;
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &nproc) || !absl::SimpleAtoi(fields[1], &nnodes)) {
      throw UserError(absl::StrFormat("--rendezvous %s: machine %d published '%s', not its --nproc and --nnodes "
                                      "(a folder an earlier job or another program used? give each job a fresh one)",
                                      job.rendezvous, node, theirs));
    }
    for (const auto& [flag, here, there] : {std::make_tuple("--nproc", job.nproc, nproc),
                                             std::make_tuple("--nnodes", job.nnodes, nnodes)}) {
      if (here != there) {
        throw UserError(absl::StrFormat("%s differs between the machines of the job: this machine has %s %d, "
                                        "machine %d has %s %d (every machine must give the same --nproc and --nnodes)",
                                        flag, flag, here, node, flag, there));
      }
    }
  }
}

}  // namespace

bool is_redis_rendezvous(const std::string& spec) { return absl::StartsWith(spec, "redis://"); }

std::shared_ptr<gloo::rendezvous::Store> open_rendezvous(const std::string& spec, bool connect) {
  if (!is_redis_rendezvous(spec)) return connect ? dist::open_file_store(spec) : nullptr;
  // redis://HOST[:PORT]/JOB
  const std::string rest = spec.substr(std::string("redis://").size());
  const size_t slash = rest.find('/');
  const std::string address = rest.substr(0, slash);
  const std::string job = slash == std::string::npos ? "" : rest.substr(slash + 1);
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  int port = 6379;
  const bool port_ok = colon == std::string::npos ||
                       (absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 && port < 65536);
  const bool job_ok = !job.empty() && job.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789._-") == std::string::npos;
  if (host.empty() || !port_ok || !job_ok) {
    throw UserError("--rendezvous " + spec + ": expected redis://HOST[:PORT]/JOB, JOB a name fresh for each job "
                    "(letters, digits, '.', '_', '-')");
  }
  if (!connect) return nullptr;
  try {
    return dist::open_redis_store(host, port, job);
  } catch (const std::runtime_error& e) {
    throw UserError("--rendezvous " + spec + ": " + e.what());
  }
}

std::optional<LaunchedRank> launched_rank() {
  std::vector<std::string> set;
  for (const char* name : {kRankVar, kWorldVar, kRendezvousVar, kTokenVar}) {
    if (std::getenv(name) != nullptr) set.push_back(name);
  }
  if (set.empty()) return std::nullopt;
  // Honoured only from the launcher: left in an environment, they made a plain run a rank, which takes no
  // lock and skips the check for an earlier run's checkpoints, and overwrote finished runs.
  if (!started_by_launcher()) {
    throw UserError(absl::StrCat(set[0], " is set but this process was not started by a seqlab launcher: unset ",
                                 absl::StrJoin(set, " ")));
  }
  LaunchedRank l;
  l.rank = env_int(kRankVar);
  l.world = env_int(kWorldVar);
  const char* rendezvous = std::getenv(kRendezvousVar);
  if (rendezvous == nullptr || *rendezvous == '\0') throw UserError(absl::StrCat(kRendezvousVar, " is not set (set by the launcher)"));
  l.rendezvous = rendezvous;
  if (l.world < 1 || l.rank < 0 || l.rank >= l.world) {
    throw UserError(absl::StrCat(kRankVar, " = ", l.rank, " is not a rank of ", kWorldVar, " = ", l.world));
  }
  return l;
}

int launch_ranks(const std::vector<std::string>& args, const JobLayout& job, const std::string& run_dir) {
  const int nproc = job.nproc, world = job.nproc * job.nnodes, first = job.node_rank * job.nproc;
  // A fresh store for this job: keys left by an earlier job would be read as this one's. On one machine
  // the launcher makes it; across machines it is the shared folder given, which the user keeps fresh.
  const bool own_store = job.rendezvous.empty();
  const bool redis = is_redis_rendezvous(job.rendezvous);
  const fs::path rendezvous = own_store ? fs::path(run_dir) / ".rendezvous" / std::to_string(::getpid())
                                        : fs::path(job.rendezvous);  // a folder, or the redis:// address
  // Where the ranks will listen, checked here: each rank would otherwise refuse it on its own.
  dist::check_gloo_transport();
  std::error_code ec;
  if (own_store) {
    remove_dead_rendezvous(rendezvous.parent_path());
    fs::remove_all(rendezvous, ec);
  }
  if (!redis) fs::create_directories(rendezvous, ec);
  if (ec) throw UserError(absl::StrCat(rendezvous.string(), ": cannot create the rendezvous folder (", ec.message(), ")"));
  // The machines' keys stay: a folder is fresh for each job (the mended commands meet in a new one), and
  // machine 0 could not tell when the others have read its key.
  if (!own_store) check_machines_agree(*open_rendezvous(job.rendezvous), job);
  const std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw UserError(absl::StrCat("cannot find this program's own binary (/proc/self/exe: ", ec.message(), ")"));

  std::vector<std::string> argv_strings{exe};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv = c_strings(argv_strings);
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull < 0) throw UserError(absl::StrCat("/dev/null: ", std::strerror(errno)));

  const LaunchToken token;
  LauncherSignals signals;
  const pid_t launcher = ::getpid();
  std::vector<RankProcess> ranks(static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_strings = rank_environment(first + r, world, rendezvous.string(), token.value);
    std::vector<char*> envp = c_strings(env_strings);
    int pipe_fds[2] = {-1, -1};
    const bool piped = first + r > 0;  // every rank but rank 0 of the job
    if (piped && ::pipe2(pipe_fds, O_CLOEXEC) != 0) throw UserError(absl::StrCat("pipe: ", std::strerror(errno)));
    const pid_t pid = ::fork();
    if (pid < 0) throw UserError(absl::StrCat("cannot start rank ", first + r, ": fork: ", std::strerror(errno)));
    if (pid == 0) {
      // The rank: its own process group (the terminal's Ctrl-C reaches the launcher, which forwards it
      // once), killed if the launcher dies, stderr into the launcher's pipe for ranks > 0.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);  // the launcher died before the line above
      if (piped) {
        ::dup2(pipe_fds[1], STDERR_FILENO);
        ::dup2(devnull, STDOUT_FILENO);
      }
      ::execve(exe.c_str(), argv.data(), envp.data());
      const char message[] = "seqlab train: cannot start a rank: exec of /proc/self/exe failed\n";
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, sizeof message - 1);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that the group exists before any signal is forwarded
    ranks[r].pid = pid;
    if (piped) {
      ::close(pipe_fds[1]);
      ranks[r].err_fd = pipe_fds[0];
    }
  }
  ::close(devnull);

  int forwarded_signals = 0;  // how many of the launcher's signals were passed on
  int stop_signal = 0;        // the first signal forwarded
  std::vector<int> failed;    // ranks that failed, in the order the launcher saw them end
  bool killing = false;  // SIGTERM sent after a failure: SIGKILL follows at kill_at
  Clock::time_point kill_at = Clock::now();
  auto any_left = [&] {
    for (const RankProcess& p : ranks) {
      if (p.running || p.err_fd >= 0) return true;
    }
    return false;
  };
  auto signal_running = [&](int signal, bool by_us) {
    for (RankProcess& p : ranks) {
      if (!p.running) continue;
      ::kill(p.pid, signal);
      if (by_us) p.sent = signal;
    }
  };
  while (any_left()) {
    if (g_signal_count > forwarded_signals) {
      if (forwarded_signals == 0) {
        stop_signal = g_signal;
        signal_running(stop_signal, false);  // the ranks stop together after a step; rank 0 saves
      } else {
        signal_running(SIGKILL, false);  // a second signal: stop now
      }
      forwarded_signals = g_signal_count;
    }
    std::vector<pollfd> fds;
    std::vector<int> fd_rank;
    for (int r = 0; r < nproc; ++r) {
      if (ranks[r].err_fd >= 0) {
        fds.push_back({ranks[r].err_fd, POLLIN, 0});
        fd_rank.push_back(r);
      }
    }
    const int ready = ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump_stderr(ranks[fd_rank[i]], first + fd_rank[i]);
    }
    for (int r = 0; r < nproc; ++r) {
      RankProcess& p = ranks[r];
      if (!p.running || ::waitpid(p.pid, &p.status, WNOHANG) != p.pid) continue;
      p.running = false;
      if (succeeded(p.status)) continue;
      failed.push_back(r);
      if (stop_signal == 0 && !killing) {
        signal_running(SIGTERM, true);
        killing = true;
        kill_at = Clock::now() + kStopGrace;
      }
    }
    if (killing && Clock::now() >= kill_at) signal_running(SIGKILL, true);
  }
  if (own_store) {
    fs::remove_all(rendezvous, ec);
    fs::remove(rendezvous.parent_path(), ec);  // only when empty: another job's folder stays
  } else if (job.node_rank == 0 && !redis) {
    // The shared folder's keys are read only while the ranks connect, long over once the job's ranks end.
    fs::remove_all(rendezvous, ec);
  }

  if (failed.empty()) return 0;
  // The ranks all ended alike (a forwarded signal's 128 + N after rank 0 saved, a non-finite step's 3,
  // the same error everywhere): each said why; their code is the job's.
  bool alike = true;
  for (const RankProcess& p : ranks) alike = alike && WIFEXITED(p.status) && p.status == ranks[0].status;
  if (alike) return WEXITSTATUS(ranks[0].status);
  // Otherwise name the rank that failed on its own: not one stopped by the launcher, nor one that only
  // saw a peer's failure in a collective (kPeerFailedExit), when there is such a rank.
  // A rank that died on its own between its last check and the launcher's SIGTERM counts as failing on
  // its own: what ended it was not what the launcher sent.
  auto ended_by_launcher = [](const RankProcess& p) {
    if (p.sent == 0) return false;
    if (WIFSIGNALED(p.status)) return WTERMSIG(p.status) == SIGTERM || WTERMSIG(p.status) == p.sent;
    return WEXITSTATUS(p.status) == 128 + SIGTERM;
  };
  int culprit = failed.front();
  for (int r : failed) {
    const RankProcess& p = ranks[r];
    const bool peer_failed = WIFEXITED(p.status) && WEXITSTATUS(p.status) == kPeerFailedExit;
    if (!ended_by_launcher(p) && !peer_failed) {
      culprit = r;
      break;
    }
  }
  const RankProcess& c = ranks[culprit];
  write_stderr(absl::StrFormat("seqlab train: rank %d of %d %s%s\n", first + culprit, world, describe_end(c.status),
                               stop_signal != 0 ? absl::StrCat(" while stopping on ", strsignal(stop_signal))
                                                : std::string("; the other ranks were stopped")));
  if (stop_signal != 0) return 128 + stop_signal;
  return WIFEXITED(c.status) ? WEXITSTATUS(c.status) : 1;
}

}  // namespace seqlab::cli
