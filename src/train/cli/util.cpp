#include "train/cli/util.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>

namespace seqlab::cli {

std::string number_bound(int64_t v) {
  if (v == std::numeric_limits<int64_t>::min()) return "-2^63";
  if (v == std::numeric_limits<int64_t>::max()) return "2^63 - 1";
  if (v == std::numeric_limits<int32_t>::min()) return "-2^31";
  if (v == std::numeric_limits<int32_t>::max()) return "2^31 - 1";
  return absl::StrCat(v);
}

std::string number_bound(uint64_t v) {
  if (v == std::numeric_limits<uint64_t>::max()) return "2^64 - 1";
  if (v == std::numeric_limits<uint32_t>::max()) return "2^32 - 1";
  return absl::StrCat(v);
}

std::string number_bound(double v) { return absl::StrCat(v); }

std::string integer_flag_error(const std::string& flag, const std::string& text, bool whole_type,
                               const std::string& min, const std::string& max) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  absl::string_view digits = stripped;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) digits.remove_prefix(1);
  const bool integer = !digits.empty() && std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit);
  double as_double = 0;
  const bool numeric = integer || absl::SimpleAtod(stripped, &as_double);
  if (whole_type && !numeric) return absl::StrCat(flag, " expects a number, got '", text, "'");
  if (whole_type && !integer) return absl::StrCat(flag, " expects an integer, got '", text, "'");
  return absl::StrCat(flag, " expects an integer from ", min, " to ", max, ", got '", text, "'");
}

Flags::Flags(const std::vector<std::string>& args, const std::string& command, const std::set<std::string>& valued,
             const std::set<std::string>& switches, const std::set<std::string>& repeatable, size_t max_positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool is_flag = absl::StartsWith(arg, "--");
    const size_t eq = is_flag ? arg.find('=') : std::string::npos;
    const std::string flag = is_flag ? arg.substr(0, eq) : arg;
    if (switches.count(flag)) {
      if (eq != std::string::npos) throw UserError(flag + " takes no value");
      values_[flag] = {""};
    } else if (valued.count(flag)) {
      if (eq == std::string::npos && i + 1 >= args.size()) throw UserError(flag + " needs a value");
      // A flag of this command is never taken for the value before it: `--resume --set k=v` lacks the
      // run directory; it does not name a run "--set". (A value that starts like a flag: --flag=VALUE.)
      if (eq == std::string::npos) {
        const std::string next = args[i + 1].substr(0, args[i + 1].find('='));
        if (valued.count(next) || switches.count(next)) {
          throw UserError(absl::StrCat(flag, " needs a value before ", next, " (see seqlab ",
                                       command.empty() ? "" : command + " ", "--help)"));
        }
      }
      if (values_.count(flag) && !repeatable.count(flag)) throw UserError(flag + " given twice");
      values_[flag].push_back(eq != std::string::npos ? arg.substr(eq + 1) : args[++i]);
    } else if (!absl::StartsWith(arg, "-") && positional_.size() < max_positional) {
      positional_.push_back(arg);
    } else {
      throw UserError(absl::StrCat(absl::StartsWith(arg, "-") ? "unknown flag '" : "unexpected argument '", arg,
                                   "' (see seqlab ", command.empty() ? "" : command + " ", "--help)"));
    }
  }
}

std::string Flags::get(const std::string& flag, const std::string& fallback) const {
  auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Flags::all(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int run_guarded(const std::string& command, const std::function<void()>& body) {
  auto report = [&](const std::string& message) {
    std::cerr << "seqlab " << command << ": " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  };
  try {
    body();
    return 0;
  } catch (const UserError& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::bad_alloc&) {
    report("out of memory: an allocation failed (std::bad_alloc); the run needs more memory than this machine gave");
    return 1;
  } catch (const std::exception& e) {
    report(std::string("internal error: ") + e.what());
    return 1;
  } catch (...) {
    report("internal error: an exception that is not a std::exception");
    return 1;
  }
}

std::optional<double> metrics_field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\": ";
  size_t at = line.find(tag);
  if (at == std::string::npos) return std::nullopt;
  at += tag.size();
  const size_t end = line.find_first_of(",}", at);
  double v;
  if (!absl::SimpleAtod(line.substr(at, end - at), &v)) return std::nullopt;
  return v;
}

std::string json_number(const absl::FormatSpec<double>& format, double value) {
  return std::isfinite(value) ? absl::StrFormat(format, value) : std::string("null");
}

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

std::string utc_timestamp() {
  char when[32] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (::gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return when;
}

std::string random_hex128() {
  std::random_device device;
  std::string hex;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&hex, absl::StrFormat("%08x", static_cast<uint32_t>(device())));
  return hex;
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
