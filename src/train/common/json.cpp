#include "train/common/json.h"

#include <absl/strings/numbers.h>

#include <cmath>

namespace seqlab::cli {

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

}  // namespace seqlab::cli
