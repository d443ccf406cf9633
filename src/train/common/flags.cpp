#include "train/common/flags.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <algorithm>

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

}  // namespace seqlab::cli
