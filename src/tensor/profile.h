// The step profile: wall time of every CPU kernel-slot call, by slot and by category.
//
// Every kernel goes through KernelSlot::operator() (dispatch.h), so timing there sees all of them. Off by
// default: the slot then reads one relaxed atomic flag and branches, nothing else (bench/slot_overhead_bench
// measures it against calling the kernel's function pointer directly). On, each CPU call is timed with
// steady_clock.
//
// What is counted, so that nothing is counted twice and the kernels' sum never exceeds the wall time:
//   - the outermost call only: a kernel that calls other slots (a variant's kernel calling gemm_kernel,
//     the widening of dispatch.h calling copy_kernel) owns their time. Of a GEMM nested inside another
//     kernel, the time is reported with the outer slot as `nested_gemm` (summed over threads when the outer
//     kernel calls GEMMs from inside a parallel region, so it may exceed the outer's wall time);
//     (linear_kernel is one such call: its GEMM, then its own pass for the bias and GELU, tensor/cpu/linear.cpp;
//     category "gemm");
//   - the f32 stand-ins of bf16 tensors (dispatch.h) are timed apart, as "bf16 widen" and "bf16 round",
//     and left out of the time of the kernel they serve.
// CUDA calls are not timed (they are queued, not run, when the slot returns).
//
// "framework" is what a caller adds: its measured wall time minus the kernels' sum (the autograd graph,
// allocation, the data loader, the host code between kernels).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace seqlab::profile {

// One flag for the whole program (an inline variable: one instance across the shared libraries).
inline std::atomic<bool> g_enabled{false};
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

// Clears the totals and turns timing on; stop() turns it off and keeps the totals for snapshot().
void start();
void stop();

struct SlotTotals {
  std::string name;      // the slot: "gemm_kernel", "attention_forward_kernel", "bf16 widen", ...
  std::string category;  // see category_of
  int64_t calls = 0;     // outermost calls
  double seconds = 0;    // their wall time, without the slot's own bf16 widening and rounding
  double nested_gemm_seconds = 0;  // GEMMs run inside those calls (thread-summed)
};

struct Snapshot {
  std::vector<SlotTotals> slots;  // by seconds, largest first
  double kernel_seconds() const;  // Σ seconds
};
Snapshot snapshot();

// The category of a slot, from its name and the header that declares it:
//   gemm; attention/variant (any slot declared under src/tensor/slots/ but the optimizer's); norm;
//   elementwise (unary, binary, scalar, where, reductions, cumsum); optimizer (optimizer steps, gradient
//   norm and scaling); memory (copies and fills); bf16 stand-ins; loss/softmax/embedding; other.
std::string category_of(const std::string& slot, const std::string& declared_in);
// The categories in the order the report lists them ("framework" last).
const std::vector<std::string>& categories();

// The report of `steps` steps that took `wall_seconds` in all: per category ms/step and share of the
// wall time, "framework" = wall − kernels; then the `top` slots by time.
std::string table(const Snapshot& s, double wall_seconds, int64_t steps, int top = 12);
// The same as one JSON object: {"steps", "wall_ms_per_step", "kernel_ms_per_step", "categories": [{"name",
// "ms_per_step", "share"}], "slots": [{"name", "category", "calls_per_step", "ms_per_step", "share",
// "nested_gemm_ms_per_step"}]}.
std::string json(const Snapshot& s, double wall_seconds, int64_t steps);

// ---- used by KernelSlot::operator() (dispatch.h) while enabled() ----

// Times one CPU slot call: an outermost call is recorded under its slot; a nested gemm_kernel call is
// added to the outermost call's nested_gemm; other nested calls are not recorded.
class SlotCall {
 public:
  SlotCall(const char* name, const char* declared_in);
  ~SlotCall();
  SlotCall(const SlotCall&) = delete;
  SlotCall& operator=(const SlotCall&) = delete;

 private:
  enum class Kind { outer, nested_gemm, nested };
  Kind kind_;
  const char* name_;
  const char* declared_in_;
  std::chrono::steady_clock::time_point t0_;
};

// Times the widening (round = false) or the rounding back (round = true) of a slot call's bf16
// stand-ins; its copy_kernel calls count as nested. Recorded, and taken out of the slot's own time,
// when it serves an outermost call (or none); inside another kernel it is that kernel's time.
class StandinConversion {
 public:
  explicit StandinConversion(bool round);
  ~StandinConversion();
  StandinConversion(const StandinConversion&) = delete;
  StandinConversion& operator=(const StandinConversion&) = delete;

 private:
  bool round_;
  bool recorded_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace seqlab::profile
