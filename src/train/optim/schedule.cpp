#include "train/optim/schedule.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>

namespace seqlab {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::linear: return "linear";
    case ScheduleKind::constant: return "constant";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::cosine, ScheduleKind::linear, ScheduleKind::constant}) {
    if (name == schedule_name(k)) return k;
  }
  return absl::InvalidArgumentError("unknown schedule '" + name + "' (choices: cosine, linear, constant)");
}

absl::Status validate(const LrSchedule& s) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("schedule: " + what); };
  if (!(s.lr >= 0) || !std::isfinite(s.lr)) return bad(absl::StrCat("lr must be a finite number >= 0, got ", s.lr));
  if (s.warmup_steps < 0) return bad(absl::StrCat("warmup_steps must be >= 0, got ", s.warmup_steps));
  if (s.steps < 1) return bad(absl::StrCat("steps must be >= 1, got ", s.steps));
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) {
    return bad(absl::StrCat("min_lr_ratio must be in [0, 1], got ", s.min_lr_ratio));
  }
  return absl::OkStatus();
}

double LrSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == ScheduleKind::constant) return lr;
  const double floor = min_lr_ratio * lr;
  const double decay_steps = static_cast<double>(steps - warmup_steps);
  const double p =
      steps <= warmup_steps ? 1.0 : std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  if (kind == ScheduleKind::linear) return lr - (lr - floor) * p;
  return floor + (lr - floor) * 0.5 * (1.0 + std::cos(kPi * p));
}

}  // namespace seqlab
