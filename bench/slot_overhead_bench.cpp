// The cost of the step profile's switch (src/tensor/profile.h) in the kernel slot (KernelSlot::operator(),
// src/tensor/dispatch.h): ns per call of a slot whose kernel does almost nothing (fill_kernel of one f32
// element), through the slot with the profile off and on, against calling the registered kernel's function
// pointer directly (the peer: a slot with no check at all). Alternating runs, medians.
//
// Usage: slot_overhead_bench [calls per run, default 2000000] [runs, default 9]
#include <cstdio>
#include <cstdlib>

#include <vector>

#include "bench/bench_util.h"
#include "tensor/kernels.h"
#include "tensor/profile.h"

using namespace seqlab;

int main(int argc, char** argv) {
  const std::vector<int64_t> args =
      bench::positional_counts(argc, argv, {2000000, 9}, "slot_overhead_bench [calls per run] [runs]");
  const int64_t calls = args[0];
  const int runs = static_cast<int>(args[1]);
  Tensor t = Tensor::empty({1}, DType::f32);
  const Device cpu = cpu_device();
  const auto direct = kernel::fill_kernel.impl[static_cast<int>(DeviceType::CPU)];
  auto through_slot = [&] {
    for (int64_t i = 0; i < calls; ++i) kernel::fill_kernel(cpu, t, static_cast<double>(i));
  };
  auto by_pointer = [&] {
    for (int64_t i = 0; i < calls; ++i) direct(t, static_cast<double>(i));
  };
  const bench::PairTiming off = bench::time_pair(through_slot, by_pointer, 1, runs);
  profile::start();
  const double on = bench::time_median(through_slot, 1, runs);
  profile::stop();
  const double per = 1e9 / static_cast<double>(calls);
  std::printf("fill_kernel of 1 element, ns/call: direct pointer %.2f   slot, profile off %.2f (+%.2f)   "
              "slot, profile on %.2f (+%.2f)\n",
              off.b_seconds * per, off.a_seconds * per, (off.a_seconds - off.b_seconds) * per, on * per,
              (on - off.b_seconds) * per);
  return 0;
}
