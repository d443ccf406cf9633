#include "train/data/data_io.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

namespace seqlab {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open (", errno_text(), ")"));
  std::string out;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, got);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return out;
}

absl::Status write_file_atomic(const std::string& path, std::initializer_list<absl::string_view> parts) {
  // Same folder as the target, so the rename cannot cross file systems.
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::InternalError(absl::StrCat(path, ": cannot create ", tmp, " (", errno_text(), ")"));
  bool ok = true;
  for (absl::string_view p : parts) ok = ok && (p.empty() || std::fwrite(p.data(), 1, p.size(), f) == p.size());
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  std::string reason = errno_text();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": write failed (", reason, ")"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    reason = errno_text();
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": rename failed (", reason, ")"));
  }
  return absl::OkStatus();
}

std::vector<std::string> remove_dead_temporaries(const std::string& folder) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    int64_t pid;
    if (at == std::string::npos || at == 0 || !absl::SimpleAtoi(absl::string_view(name).substr(at + 5), &pid) ||
        pid <= 0 || pid > INT32_MAX) {
      continue;
    }
    // kill(pid, 0) delivers nothing; it fails with ESRCH only when no such process exists (EPERM: one
    // exists, owned by another user).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);
    if (!rm) removed.push_back(name);
  }
  return removed;
}

absl::StatusOr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open (", errno_text(), ")"));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ > 0) {  // mmap of length 0 is an error; an empty file maps to nothing
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string reason = errno_text();
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed (", reason, ")"));
    }
    m.data_ = p;
  }
  ::close(fd);  // the mapping keeps the file alive
  return m;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(absl::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t random_below(Generator& gen, uint64_t n) {
  // Reject the top partial block of 2^64 so every residue is equally likely.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = gen.next_u64();
  while (x >= limit);
  return x % n;
}

}  // namespace seqlab
