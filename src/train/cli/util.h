// What every subcommand of `seqlab` shares: parsing `--flag value` arguments (train/common/flags.h),
// turning a failed absl::Status into the UserError that main reports as one line with exit code 2
// (train/common/errors.h), JSON numbers (train/common/json.h), the time and random ids
// (train/common/stamps.h) — included here, so that a subcommand includes this one header — and what
// only the command line needs: gnuplot, and the last net for an exception that escapes.
#pragma once

#include <string>

#include "train/cli/commands.h"
#include "train/common/errors.h"
#include "train/common/flags.h"
#include "train/common/json.h"
#include "train/common/stamps.h"

namespace seqlab::cli {

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
