// What every subcommand of `seqlab` shares: parsing `--flag value` arguments, and turning a failed
// absl::Status into the UserError that main reports as one line with exit code 2.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "train/cli/commands.h"

namespace seqlab::cli {

// A bound of a numeric flag's range as its message prints it: 2^63 - 1 rather than 9223372036854775807.
std::string number_bound(int64_t v);
std::string number_bound(uint64_t v);
std::string number_bound(double v);
template <class T, class = std::enable_if_t<std::is_integral_v<T>>>
std::string number_bound(T v) {
  if constexpr (std::is_signed_v<T>) return number_bound(static_cast<int64_t>(v));
  else return number_bound(static_cast<uint64_t>(v));
}
// The message for `flag TEXT` refused as an integer from MIN to MAX: text that is no number says "expects
// a number" (when the range is a signed type's whole range, `whole_type`, which the message then omits);
// 2.5, or an integer out of the range, is told the range.
std::string integer_flag_error(const std::string& flag, const std::string& text, bool whole_type,
                               const std::string& min, const std::string& max);

// The arguments of one subcommand: `--flag value` or `--flag=value` for the flags in `valued`
// (given at most once, except those also in `repeatable`, which collect every value in order), bare
// `--flag` for the `switches`, and up to `max_positional` arguments that are not flags. Anything else
// is a UserError naming the argument and `seqlab COMMAND --help` (`seqlab --help` for an empty COMMAND),
// as is a valued flag followed by another flag of the command instead of its value (`--resume --set
// k=v`); a value that itself starts with a flag's name is given as --flag=VALUE.
class Flags {
 public:
  Flags(const std::vector<std::string>& args, const std::string& command, const std::set<std::string>& valued,
        const std::set<std::string>& switches = {}, const std::set<std::string>& repeatable = {},
        size_t max_positional = 0);

  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  // The (last) value of `flag`, or `fallback` when it was not given.
  std::string get(const std::string& flag, const std::string& fallback = "") const;
  // Every value of a repeatable flag, in the order given.
  std::vector<std::string> all(const std::string& flag) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // The value of `flag` as a number (integer or floating point by T), or `fallback`; a value outside
  // [min, max] (by default T's whole range: an unsigned T refuses a negative value) is a UserError that
  // names the range, so that `--seed -1` is not told "expects a number".
  template <class T>
  T number(const std::string& flag, T fallback, T min = std::numeric_limits<T>::lowest(),
           T max = std::numeric_limits<T>::max()) const {
    if (!has(flag)) return fallback;
    const std::string text = get(flag);
    T v{};
    if constexpr (std::is_floating_point_v<T>) {
      if (!absl::SimpleAtod(text, &v)) throw UserError(flag + " expects a number, got '" + text + "'");
      // nan and inf parse, but no flag means them: --temperature nan would otherwise decode greedily.
      if (!std::isfinite(v)) throw UserError(flag + " expects a finite number, got '" + text + "'");
      if (v < min || v > max) {
        throw UserError(flag + " expects a number from " + number_bound(min) + " to " + number_bound(max) + ", got '" +
                        text + "'");
      }
    } else {
      if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
        const bool whole_type = std::is_signed_v<T> && min == std::numeric_limits<T>::lowest() &&
                                max == std::numeric_limits<T>::max();
        throw UserError(integer_flag_error(flag, text, whole_type, number_bound(min), number_bound(max)));
      }
    }
    return v;
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

template <class T>
T value_or_throw(absl::StatusOr<T> v) {
  if (!v.ok()) throw UserError(std::string(v.status().message()));
  return std::move(*v);
}

inline void ok_or_throw(const absl::Status& s) {
  if (!s.ok()) throw UserError(std::string(s.message()));
}

// Runs a subcommand's body: 0 when it returns; a UserError (or std::invalid_argument from a config
// check) is printed as "seqlab COMMAND: message" on one line and gives exit code 2; any other
// exception is a broken invariant inside seqlab, reported as an internal error with exit code 1.
int run_guarded(const std::string& command, const std::function<void()>& body);

// The number after "key": in a line of metrics.jsonl (the training loop's JSON lines), if present;
// nullopt for a field that is null (a value that was not finite, json_number).
std::optional<double> metrics_field(const std::string& line, const std::string& key);

// `value` as a JSON number, formatted by `format` ("%.6f", "%g", ...), or null when it is NaN or infinite:
// JSON has no such numbers, and printf's "nan", "-nan" and "inf" make a line that JSON readers refuse.
// Every number a run writes into a JSON or JSONL file goes through here.
std::string json_number(const absl::FormatSpec<double>& format, double value);

// The current time in UTC as 2026-11-27T16:06:29Z (lock holders, run identities).
std::string utc_timestamp();
// 128 bits from the system's random source as 32 lowercase hex digits (run ids, launch tokens).
std::string random_hex128();

// A string as a gnuplot string literal (single quotes, doubled inside).
std::string gnuplot_quote(const std::string& s);
// Runs `script` through gnuplot, which must write its PNG to `out` + ".tmp" (`set output`); the PNG is
// renamed to `out` when whole. UserError when gnuplot is missing (naming the Debian package) or fails.
void run_gnuplot(const std::string& script, const std::string& out);

// What the exception being handled (std::current_exception) says, in one line.
std::string describe_current_exception();
// Makes std::terminate print "seqlab: internal error: <what>" and exit with code 70 (EX_SOFTWARE) instead of
// aborting: for an exception that cannot propagate (thrown inside an OpenMP region or a noexcept function).
void install_terminate_handler();

}  // namespace seqlab::cli
