#include "train/common/stamps.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <cstdint>
#include <ctime>
#include <random>

namespace seqlab::cli {

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

}  // namespace seqlab::cli
