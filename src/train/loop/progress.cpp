#include "train/loop/progress.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>

#include "tensor/kernels.h"

namespace seqlab::cli {

double measured_peak_flops(Device device, DType dtype) {
  constexpr int64_t n = 1024;
  Generator gen(0);
  Tensor a = kernel::to_dtype(Tensor::randn({n, n}, gen, DType::f32, 1.0, device), dtype);
  Tensor b = kernel::to_dtype(Tensor::randn({n, n}, gen, DType::f32, 1.0, device), dtype);
  double best = 0;
  (void)kernel::narrow(kernel::narrow(kernel::matmul(a, b), 0, 0, 1), 1, 0, 1).item();  // warm-up
  for (int i = 0; i < 10; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor c = kernel::matmul(a, b);
    (void)kernel::narrow(kernel::narrow(c, 0, 0, 1), 1, 0, 1).item();  // waits for the device
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

Progress::Progress(bool bar, int64_t every, int64_t total_steps, double flops_per_token, double peak_flops,
                   std::function<double()> measure_peak)
    : bar_(bar),
      every_(every),
      total_(total_steps),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_flops),
      start_(std::chrono::steady_clock::now()),
      last_(start_),
      measure_peak_(std::move(measure_peak)) {}

void Progress::check_peak() {
  constexpr int kMaxRemeasures = 2;
  if (mfu() <= 1.0) return;
  const double rate = tokens_per_s_ * flops_per_token_;
  if (measure_peak_ && remeasured_ < kMaxRemeasures) {
    ++remeasured_;
    const double before = peak_flops_;
    raise_peak(measure_peak_());
    line(absl::StrFormat("MFU: the steps ran at %.3g FLOP/s, above the measured peak of %.3g FLOP/s; measured again: "
                         "%.3g FLOP/s",
                         rate, before, peak_flops_));
    if (mfu() <= 1.0) return;
  }
  line(absl::StrFormat("MFU: the steps ran at %.3g FLOP/s, above the peak of %.3g FLOP/s: that rate is the peak now "
                       "(the fastest this machine was seen to compute)",
                       rate, peak_flops_));
  peak_flops_ = rate;
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::step(int64_t step, double loss, double lr, int64_t tokens, const std::string& detail) {
  auto now = std::chrono::steady_clock::now();
  const double dt = std::max(1e-9, std::chrono::duration<double>(now - last_).count());
  last_ = now;
  // Moving averages over ~20 steps; the first step seeds them.
  const double alpha = steps_seen_ == 0 ? 1.0 : 0.1;
  step_seconds_ += alpha * (dt - step_seconds_);
  tokens_per_s_ += alpha * (static_cast<double>(tokens) / dt - tokens_per_s_);
  ++steps_seen_;
  check_peak();
  if (bar_) {
    std::cout << "\r\033[K" << status(step, loss, lr, detail) << std::flush;
    bar_drawn_ = true;
  } else if (step % every_ == 0 || step == total_) {
    std::cout << status(step, loss, lr, detail) << "\n" << std::flush;
  }
}

void Progress::line(const std::string& text) {
  if (bar_ && bar_drawn_) std::cout << "\r\033[K";
  std::cout << text << "\n" << std::flush;
  bar_drawn_ = false;
}

void Progress::finish() {
  if (bar_ && bar_drawn_) std::cout << "\n" << std::flush;
  bar_drawn_ = false;
}

std::string Progress::status(int64_t step, double loss, double lr, const std::string& detail) const {
  std::string head;
  if (bar_) {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(1, total_));
    head = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '.') +
           "] ";
  }
  return head + absl::StrFormat("step %d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  MFU %.1f%%  ETA %s", step, total_, loss,
                                detail.empty() ? "" : "  " + detail, lr, tokens_per_s_, 100.0 * mfu(),
                                format_duration(seconds_left(step)));
}

}  // namespace seqlab::cli
