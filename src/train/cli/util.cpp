#include "train/cli/util.h"

#include <absl/strings/str_replace.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>

namespace seqlab::cli {

std::string gnuplot_quote(const std::string& s) { return "'" + absl::StrReplaceAll(s, {{"'", "''"}}) + "'"; }

void run_gnuplot(const std::string& script, const std::string& out) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    throw UserError("gnuplot is not installed (Debian: apt-get install gnuplot-nox; ./train installs it)");
  }
  const std::string tmp = out + ".tmp";
  // gnuplot's own messages (its warnings about a range of one point, say) go to a file beside the plot,
  // not to the command's output; they are shown only when the plot fails.
  const std::string messages = out + ".gnuplot.tmp";
  FILE* gp = popen(("gnuplot > '" + absl::StrReplaceAll(messages, {{"'", "'\\''"}}) + "' 2>&1").c_str(), "w");
  if (gp == nullptr) throw UserError("could not start gnuplot");
  std::fputs(script.c_str(), gp);
  const int status = pclose(gp);
  std::error_code renamed, ec;
  if (status == 0) std::filesystem::rename(tmp, out, renamed);
  std::filesystem::remove(tmp, ec);
  std::string said;
  {
    std::ifstream in(messages);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) said = line;  // the last thing gnuplot said
    }
  }
  std::filesystem::remove(messages, ec);
  // A failed rename leaves no new plot, even where `out` exists (an older plot, or a folder).
  if (status == 0 && renamed) throw UserError(out + ": cannot write the plot (" + renamed.message() + ")");
  if (status != 0 || !std::filesystem::exists(out)) {
    throw UserError("gnuplot failed to draw " + out + (said.empty() ? "" : " (" + said + ")"));
  }
}

std::string describe_current_exception() {
  try {
    if (std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    return absl::StrReplaceAll(e.what(), {{"\n", " "}});
  } catch (...) {
    return "an exception that is not a std::exception";
  }
  return "std::terminate without an exception";
}

namespace {

[[noreturn]] void terminate_with_one_line() {
  std::fprintf(stderr, "seqlab: internal error: %s\n", describe_current_exception().c_str());
  std::fflush(stderr);
  std::_Exit(70);  // not abort(): no SIGABRT, no core dump
}

}  // namespace

void install_terminate_handler() { std::set_terminate(terminate_with_one_line); }

}  // namespace seqlab::cli
