// Training progress for a person: a live bar redrawn every step on a terminal, or plain lines (every
// log.every steps) when the output is a file or a pipe. Both show the step, the loss, the learning
// rate, tokens/s, the estimated model FLOPs utilisation (MFU) and the time left (ETA).
//
//   MFU = tokens/s · flops_per_token / peak FLOP/s,   flops_per_token = 6·N + mixing
// (N parameters: forward and backward through every weight; mixing is the model's
// mixing_flops_per_token: 6·L·T·d for causal attention, the count bench/peers/torch_gpt.py
// prints, and the chunkwise cost for the recurrent mixers). The peak is not a datasheet figure but
// the GEMM rate the device reaches at start-up in the training dtype (measured_peak_flops), so the
// MFU says how close training runs to the best matrix multiply of that size there.
//
// An MFU above 100% would mean the steps ran faster than the peak — a peak measured while the machine
// was busy, or a model whose kernels beat that GEMM. Then the peak is measured again (twice at most in
// a run), and if the steps still run faster, the peak becomes their own FLOP rate: the fastest this
// machine was seen to compute. Either change is said on a line of its own; the MFU shown is never
// above 100%.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "tensor/tensor.h"

namespace seqlab::cli {

// GEMM throughput in `dtype` on `device`: the best of ten 1024×1024×1024 products after one warm-up
// (about 0.1 s in f32 on a two-core CPU), so sleeping worker threads are awake when it counts.
double measured_peak_flops(Device device, DType dtype = DType::f32);

class Progress {
 public:
  // bar: redraw one status line in place every step; otherwise print it every `every` steps.
  // `measure_peak` measures the peak again (measured_peak_flops); none: the peak is not re-measured.
  Progress(bool bar, int64_t every, int64_t total_steps, double flops_per_token, double peak_flops,
           std::function<double()> measure_peak = {});

  // After each optimiser step: `tokens` trained on in it. `detail`, when not empty, follows the loss
  // (the MoE blocks' figures: "aux 0.0101  dropped 1.2%").
  void step(int64_t step, double loss, double lr, int64_t tokens, const std::string& detail = "");
  // A permanent line (evaluation, samples, messages) printed above the bar.
  void line(const std::string& text);
  // A second reading of the peak, taken right after a step: the higher one counts (a reading taken while
  // the machine was busy for a moment comes out low and would inflate the MFU). The time it took is not
  // charged to the next step.
  void raise_peak(double peak_flops) {
    peak_flops_ = peak_flops > peak_flops_ ? peak_flops : peak_flops_;
    last_ = std::chrono::steady_clock::now();
  }
  // Leaves the terminal on a fresh line.
  void finish();

  double tokens_per_s() const { return tokens_per_s_; }
  double mfu() const { return peak_flops_ > 0 ? tokens_per_s_ * flops_per_token_ / peak_flops_ : 0.0; }
  double peak_flops() const { return peak_flops_; }
  double seconds_left(int64_t step) const { return step_seconds_ * static_cast<double>(total_ - step); }
  double elapsed_s() const;

 private:
  std::string status(int64_t step, double loss, double lr, const std::string& detail) const;
  // Keeps mfu() ≤ 1 (see the top of this file).
  void check_peak();

  bool bar_;
  int64_t every_, total_;
  double flops_per_token_, peak_flops_;
  std::chrono::steady_clock::time_point start_, last_;
  // Smoothed over the last ~20 steps (exponential moving averages), seeded by the first step.
  double step_seconds_ = 0, tokens_per_s_ = 0;
  int64_t steps_seen_ = 0;
  bool bar_drawn_ = false;
  std::function<double()> measure_peak_;
  int remeasured_ = 0;
};

// "2h03m", "4m10s", "12s".
std::string format_duration(double seconds);

}  // namespace seqlab::cli
