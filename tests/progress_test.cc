// Training progress (train/loop/progress.h): the MFU is never shown above 100%. A peak measured too
// low (a busy machine) is measured again when the steps run faster than it; if they still do, their
// own FLOP rate becomes the peak. Each change is said on a line of its own.
#include "train/loop/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

namespace seqlab::cli {
namespace {

// Captures what Progress prints.
class CaptureStdout {
 public:
  CaptureStdout() : old_(std::cout.rdbuf(out_.rdbuf())) {}
  ~CaptureStdout() { std::cout.rdbuf(old_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::streambuf* old_;
};

// A step of `tokens` tokens that took about `seconds`.
void step_after(Progress& p, int64_t step, int64_t tokens, double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  p.step(step, 1.0, 1e-3, tokens);
}

TEST(Progress, AMeasuredPeakBelowTheStepsRateIsMeasuredAgain) {
  // 1000 tokens of 10⁶ FLOPs each in ~20 ms: ≥ 2·10¹¹ FLOP/s at most 5·10¹¹ — far above a peak of 10⁹.
  int measured = 0;
  CaptureStdout out;
  Progress p(false, 1, 10, 1e6, 1e9, [&] {
    ++measured;
    return 1e13;  // the machine, measured again while idle
  });
  step_after(p, 1, 1000, 0.02);
  EXPECT_EQ(measured, 1);
  EXPECT_LE(p.mfu(), 1.0);
  EXPECT_EQ(p.peak_flops(), 1e13);
  EXPECT_NE(out.text().find("above the measured peak of 1e+09 FLOP/s; measured again: 1e+13 FLOP/s"), std::string::npos)
      << out.text();
  EXPECT_NE(out.text().find("MFU "), std::string::npos);
}

TEST(Progress, StepsFasterThanAnyMeasurementMakeTheirRateThePeak) {
  int measured = 0;
  CaptureStdout out;
  Progress p(false, 1, 10, 1e6, 1e9, [&] {
    ++measured;
    return 2e9;  // still far below what the steps do
  });
  // Steps that get faster and faster: each one beats the peak the one before set.
  const double seconds[] = {0.02, 0.02, 0.004, 0.001};
  for (int64_t s = 1; s <= 4; ++s) {
    step_after(p, s, 1000, seconds[s - 1]);
    EXPECT_LE(p.mfu(), 1.0 + 1e-12) << "step " << s;
  }
  EXPECT_EQ(measured, 2);  // twice at most in a run
  EXPECT_GT(p.peak_flops(), 2e9);
  EXPECT_NE(out.text().find("that rate is the peak now"), std::string::npos) << out.text();
  EXPECT_EQ(out.text().find("MFU 1000"), std::string::npos);
  // Every status line shows at most 100%.
  std::istringstream lines(out.text());
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("MFU ");
    if (at == std::string::npos || line.find("MFU:") != std::string::npos) continue;
    EXPECT_LE(std::stod(line.substr(at + 4)), 100.0) << line;
  }
}

TEST(Progress, AnHonestPeakIsLeftAlone) {
  int measured = 0;
  CaptureStdout out;
  Progress p(false, 1, 10, 1e6, 1e15, [&] {
    ++measured;
    return 1e15;
  });
  step_after(p, 1, 1000, 0.01);
  EXPECT_EQ(measured, 0);
  EXPECT_EQ(p.peak_flops(), 1e15);
  EXPECT_LT(p.mfu(), 1.0);
}

}  // namespace
}  // namespace seqlab::cli
