// The command line's safety nets (train/cli/util.h, and the train/common/ headers it includes): numeric
// flags refuse nan and inf; run_guarded turns every exception into one line and an exit code (2 for the
// user's mistakes, 1 otherwise, also for std::bad_alloc and exceptions that are not std::exception); the
// terminate handler turns an exception that cannot propagate (thrown in a noexcept function; an OpenMP
// region is one too) into one line and exit code 70 instead of SIGABRT. metrics_field reads one number of
// a metrics line (null: none); json_number writes one (null for NaN and infinity).
#include "train/cli/util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace seqlab::cli {
namespace {

TEST(CliFlags, NumbersMustBeFinite) {
  for (const char* text : {"nan", "inf", "-inf", "NaN"}) {
    Flags f({"--temperature", text}, "sample", {"--temperature"}, {}, {}, 0);
    try {
      f.number<double>("--temperature", 0.8);
      ADD_FAILURE() << text << " was accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--temperature expects a finite number, got '") + text + "'");
    }
  }
  Flags ok({"--temperature", "0.5"}, "sample", {"--temperature"}, {}, {}, 0);
  EXPECT_EQ(ok.number<double>("--temperature", 0.8), 0.5);
  Flags bad({"--tokens", "12x"}, "sample", {"--tokens"}, {}, {}, 0);
  EXPECT_THROW(bad.number<int64_t>("--tokens", 1), UserError);
}

// A negative seed, or an integer beyond what the flag takes, is told the range it takes, not "expects a
// number" (issue 26): the range is the type's (an unsigned flag takes no sign) unless the flag names one.
TEST(CliFlags, IntegersOutOfRangeAreToldTheRange) {
  auto error = [](const std::string& flag, const std::string& text, auto parse) {
    Flags f({flag, text}, "sample", {flag}, {}, {}, 0);
    try {
      parse(f);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto seed = [](const Flags& f) { f.number<uint64_t>("--seed", 0); };
  auto tokens = [](const Flags& f) { f.number<int64_t>("--tokens", 1); };
  auto nproc = [](const Flags& f) { f.number<int>("--nproc", 1); };
  auto shard_tokens = [](const Flags& f) { f.number<int64_t>("--shard-tokens", 1, 1); };
  EXPECT_EQ(error("--seed", "-1", seed), "--seed expects an integer from 0 to 2^64 - 1, got '-1'");
  EXPECT_EQ(error("--seed", "18446744073709551616", seed), "--seed expects an integer from 0 to 2^64 - 1, got '18446744073709551616'");
  EXPECT_EQ(error("--seed", "abc", seed), "--seed expects an integer from 0 to 2^64 - 1, got 'abc'");
  EXPECT_EQ(error("--seed", "18446744073709551615", seed), "accepted");
  EXPECT_EQ(error("--tokens", "99999999999999999999", tokens),
            "--tokens expects an integer from -2^63 to 2^63 - 1, got '99999999999999999999'");
  EXPECT_EQ(error("--nproc", "99999999999", nproc), "--nproc expects an integer from -2^31 to 2^31 - 1, got '99999999999'");
  EXPECT_EQ(error("--nproc", "2.5", nproc), "--nproc expects an integer, got '2.5'");
  EXPECT_EQ(error("--nproc", "abc", nproc), "--nproc expects a number, got 'abc'");
  EXPECT_EQ(error("--shard-tokens", "0", shard_tokens), "--shard-tokens expects an integer from 1 to 2^63 - 1, got '0'");
  EXPECT_EQ(error("--shard-tokens", "1", shard_tokens), "accepted");
  Flags f({"--seed", "18446744073709551615"}, "sample", {"--seed"}, {}, {}, 0);
  EXPECT_EQ(f.number<uint64_t>("--seed", 0), UINT64_C(18446744073709551615));
}

TEST(MetricsField, TheNumberAfterAKeyOfAMetricsLine) {
  const std::string line = R"({"step": 20, "loss": 5.3151, "val_loss": 5.28, "val_loss@64": 5.29, "mfu": 1e-3})";
  EXPECT_EQ(metrics_field(line, "step"), 20.0);
  EXPECT_EQ(metrics_field(line, "loss"), 5.3151);      // not val_loss's: the key is matched with its quotes
  EXPECT_EQ(metrics_field(line, "val_loss"), 5.28);    // not val_loss@64's
  EXPECT_EQ(metrics_field(line, "val_loss@64"), 5.29);
  EXPECT_EQ(metrics_field(line, "mfu"), 1e-3);         // the last field, before the brace
  EXPECT_EQ(metrics_field(line, "val_acc"), std::nullopt);
  EXPECT_EQ(metrics_field(R"({"step": "x"})", "step"), std::nullopt);
  EXPECT_EQ(metrics_field(R"({"step": 3, "val_loss": null, "val_ppl": null})", "val_loss"), std::nullopt);
}

// JSON has no NaN or infinity: json_number writes null for them, the number as formatted otherwise.
TEST(JsonNumber, NullForWhatIsNotFinite) {
  EXPECT_EQ(json_number("%.6f", 5.3151), "5.315100");
  EXPECT_EQ(json_number("%.6g", 1e30), "1e+30");
  EXPECT_EQ(json_number("%.4f", std::nan("")), "null");
  EXPECT_EQ(json_number("%.4f", -std::nan("")), "null");
  EXPECT_EQ(json_number("%.1f", HUGE_VAL), "null");
  EXPECT_EQ(json_number("%.1f", -HUGE_VAL), "null");
}

TEST(CliGuard, EveryExceptionBecomesOneLineAndAnExitCode) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded("x", [] { throw UserError("bad flag"); }), kUsageError);
  EXPECT_EQ(run_guarded("x", [] { throw std::invalid_argument("bad shape"); }), kUsageError);
  EXPECT_EQ(run_guarded("x", [] { throw std::bad_alloc(); }), 1);
  EXPECT_EQ(run_guarded("x", [] { throw std::runtime_error("broken\ninvariant"); }), 1);
  EXPECT_EQ(run_guarded("x", [] { throw 42; }), 1);
  EXPECT_EQ(run_guarded("x", [] {}), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err,
            "seqlab x: bad flag\n"
            "seqlab x: bad shape\n"
            "seqlab x: out of memory: an allocation failed (std::bad_alloc); the run needs more memory than this "
            "machine gave\n"
            "seqlab x: internal error: broken invariant\n"
            "seqlab x: internal error: an exception that is not a std::exception\n");
}

void throws() { throw std::runtime_error("thrown where it cannot propagate"); }
void throws_through_noexcept() noexcept { throws(); }

TEST(CliGuardDeathTest, TerminateIsOneLineAndExitCode70) {
  // The threads of OpenMP and OpenBLAS make fork() alone unsafe: the child runs the test binary afresh.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_terminate_handler();
        throws_through_noexcept();
      },
      testing::ExitedWithCode(70), "^seqlab: internal error: thrown where it cannot propagate\n$");
}

}  // namespace
}  // namespace seqlab::cli
