// Numbers in the JSON lines a run writes (metrics.jsonl, run.json, a sweep's results) and reads back.
// NaN and infinity are written as null, which JSON readers take, where printf's "nan" and "inf" are not
// JSON; a reader sees null as no number.
#pragma once

#include <absl/strings/str_format.h>

#include <optional>
#include <string>

namespace seqlab::cli {  // the namespace of src/train's shared helpers (errors.h says why)

// The number after "key": in a line of metrics.jsonl (the training loop's JSON lines), if present;
// nullopt for a field that is null (a value that was not finite, json_number).
std::optional<double> metrics_field(const std::string& line, const std::string& key);

// `value` as a JSON number, formatted by `format` ("%.6f", "%g", ...), or null when it is NaN or infinite:
// JSON has no such numbers, and printf's "nan", "-nan" and "inf" make a line that JSON readers refuse.
// Every number a run writes into a JSON or JSONL file goes through here.
std::string json_number(const absl::FormatSpec<double>& format, double value);

}  // namespace seqlab::cli
