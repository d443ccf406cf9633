// The arguments of a `seqlab` command: `--flag value` parsing, and numeric flags checked against their
// range, every mistake a UserError (errors.h) that names the flag. Here rather than in src/train/cli/
// because the training command itself (loop/training_run.cpp) reads its flags with it.
#pragma once

#include <absl/strings/numbers.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "train/common/errors.h"

namespace seqlab::cli {  // the namespace of src/train's shared helpers (errors.h says why)

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

}  // namespace seqlab::cli
