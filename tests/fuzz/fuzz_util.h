// What the libFuzzer targets of tests/fuzz share: a scratch folder of this process for the files a
// parser reads (the parsers take paths, not bytes), writing the input into it, cutting an input into
// parts, and the check that turns a broken invariant into a finding.
//
// A target calls the real parser through its public API. An error it reports (absl::Status, UserError,
// std::invalid_argument, ...) is a correct answer to a bad file; a crash, an abort, a sanitizer report,
// a timeout or an allocation beyond libFuzzer's -malloc_limit_mb is a finding, and so is an invariant
// FUZZ_CHECK sees broken (a file that reads back differently from what was written).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <absl/strings/string_view.h>

namespace seqlab::fuzz {

// $TMPDIR/seqlab_fuzz_<pid>/, made on first use and removed when the process exits normally (a
// crashing run leaves it for inspection). Per process, so parallel fuzzers do not share files.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() / ("seqlab_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// scratch_dir()/name, holding exactly `bytes`.
inline std::string write_scratch(const std::string& name, absl::string_view bytes) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// The input cut at every occurrence of `separator` (a line of its own in the text seeds); the parts
// keep everything between separators, so an input without one is a single part.
inline std::vector<absl::string_view> split_parts(absl::string_view input, absl::string_view separator) {
  std::vector<absl::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t at = input.find(separator, start);
    if (at == absl::string_view::npos) break;
    parts.push_back(input.substr(start, at - start));
    start = at + separator.size();
  }
  parts.push_back(input.substr(start));
  return parts;
}

// A broken invariant is a finding: say which, then abort so libFuzzer saves the input.
#define FUZZ_CHECK(condition, what)                                                                   \
  do {                                                                                                \
    if (!(condition)) {                                                                               \
      std::fprintf(stderr, "fuzz invariant broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, #condition, \
                   std::string(what).c_str());                                                        \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (0)

}  // namespace seqlab::fuzz
