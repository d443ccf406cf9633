// How src/train reports a user's mistake: a UserError (a bad command line, recipe, file or run folder),
// turned into one line on stderr and exit code 2 (kUsageError) by run_guarded, and the bridges from a
// failed absl::Status to it. The bottom of src/train, so that every folder of it may report errors so.
//
// The helpers of src/train/common/ keep the namespace seqlab::cli that they had when they lived in
// src/train/cli/ and checkpoint/run_folder.h: moving them changed no caller's code.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace seqlab::cli {

constexpr int kUsageError = 2;

// A problem with the command line or the files it names: reported as one line, exit code 2.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
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

}  // namespace seqlab::cli
