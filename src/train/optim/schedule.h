// Learning-rate schedules: linear warmup, then cosine, linear or no decay.
//
// With peak lr, W = warmup_steps, S = steps, floor = min_lr_ratio·lr and steps counted from 0:
//   step < W:   lr_at(step) = lr · (step + 1) / W
//   otherwise:  p = clamp((step − W) / (S − W), 0, 1)   (p = 1 when S ≤ W)
//     cosine:   lr_at(step) = floor + (lr − floor) · ½ · (1 + cos(π·p))
//     linear:   lr_at(step) = lr − (lr − floor) · p
//     constant: lr_at(step) = lr
// so the last warmup step and step W both give lr, and step S (and beyond) gives floor.
#pragma once

#include <cstdint>
#include <string>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

namespace seqlab {

enum class ScheduleKind { cosine, linear, constant };
const char* schedule_name(ScheduleKind kind);
// "cosine" | "linear" | "constant", else InvalidArgument listing the choices.
absl::StatusOr<ScheduleKind> parse_schedule_kind(const std::string& name);

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double lr = 3e-4;
  int64_t warmup_steps = 0;
  int64_t steps = 1;
  double min_lr_ratio = 0.1;

  double lr_at(int64_t step) const;  // the formula above; a pure function of step
};

// OK, or InvalidArgument naming the first bad field (lr < 0, warmup_steps < 0, steps < 1,
// min_lr_ratio outside [0, 1]).
absl::Status validate(const LrSchedule& schedule);

}  // namespace seqlab
