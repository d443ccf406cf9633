#include "train/common/atomic_file.h"

#include <absl/strings/str_cat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace seqlab::cli {

std::string temporary_name(const std::string& file) { return absl::StrCat(file, ".tmp.", ::getpid()); }

absl::Status write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_name(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::InternalError(absl::StrCat(path, ": cannot create ", tmp, " (", std::strerror(errno), ")"));
  std::string failed;  // the first call that failed, with its reason
  auto check = [&](bool good, const char* what) {
    if (!good && failed.empty()) failed = absl::StrCat(what, " failed (", std::strerror(errno), ")");
  };
  check(text.empty() || std::fwrite(text.data(), 1, text.size(), f) == text.size(), "write");
  check(std::fflush(f) == 0, "write");
  check(::fsync(::fileno(f)) == 0, "fsync");
  check(std::fclose(f) == 0, "close");
  if (failed.empty()) check(std::rename(tmp.c_str(), path.c_str()) == 0, "rename");
  if (failed.empty()) return absl::OkStatus();
  std::remove(tmp.c_str());
  return absl::InternalError(absl::StrCat(path, ": ", failed));
}

}  // namespace seqlab::cli
