// The CUDA retention kernels' schedule (src/cuda/scan/gated_scan_schedule.h with a constant decay per head, run by
// src/cuda/scan/retention.cu) executed on the host — the same phases, thread indices, shared-memory layout,
// checkpoints and reduction orders, every block in turn — against the CPU kernels of all three forms
// (src/layers/scan/retention.cpp). This is where the GPU kernels' logic is checked on a machine without a GPU;
// tests/retention_gpu_test.cc compares the real kernels.
//
// Cases: T not a multiple of the 16-step segment, T below a segment, T = 1, dk ≠ dv, dv over several
// 32-column tiles, head dims 128; RetNet's default decays and decays of 0, 1 and in between; a zero and
// a random initial state; reduction batches of 1, 3 and the launcher's.
// Tolerance |got − want| ≤ rtol · max(1, |want|): f64 1e-10 (against the CPU's f64), f32 1e-4 (against the
// CPU's f64 and f32 kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/scan/gated_scan_schedule.h"
#include "gated_scan_emulation.h"
#include "layers/scan/retention.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of variant_cases.h they use.
namespace seqlab::testing {
namespace {

namespace scan = cuda::scan;
using Case = RetentionCase;
using Inputs = RetentionInputs;

const std::vector<Case> kCases = {
    {2, 37, 3, 16, 16, {}},                // two full segments and a partial one
    {1, 1, 2, 5, 7, {}},                   // T = 1
    {2, 50, 2, 20, 40, {0.0, 1.0}},        // γ = 0 and γ = 1; dk ≠ dv, two column tiles
    {1, 12, 3, 3, 70, {0.5, 0.9, 0.999}},  // T below a segment, three tiles
    {1, 33, 1, 128, 128, {}},              // the largest head dims
    {2, 70, 4, 64, 64, {}},                // a RetNet head size, several segments
    {2, 150, 4, 64, 64, {}},               // as in the GPU test: many segments
};

Inputs make_inputs(const Case& c, bool random_s0, uint64_t seed) {
  Generator gen(seed);
  return make_retention_inputs(c, random_s0, DType::f64, gen);
}

kernel::RetentionParams params(const Case& c, RetentionForm form, double scale) {
  return {form, 8, scale, c.gammas.empty() ? retention_default_gammas(c.H) : c.gammas};
}

struct Outputs {
  Tensor o, s, dq, dk, dv, ds0;
};

// The CPU kernels in dtype d, on the inputs converted to it.
Outputs cpu_reference(const Inputs& in64, const kernel::RetentionParams& p, DType d = DType::f64) {
  Inputs in;
  Tensor* dst[6] = {&in.q, &in.k, &in.v, &in.s0, &in.dout, &in.ds};
  const Tensor* src[6] = {&in64.q, &in64.k, &in64.v, &in64.s0, &in64.dout, &in64.ds};
  for (int i = 0; i < 6; ++i) *dst[i] = kernel::to_dtype(*src[i], d);
  Outputs r{Tensor::empty(in.dout.shape(), d), Tensor::empty(in.ds.shape(), d), Tensor::empty(in.q.shape(), d),
            Tensor::empty(in.k.shape(), d),    Tensor::empty(in.v.shape(), d),  Tensor::empty(in.s0.shape(), d)};
  kernel::retention_forward_kernel(kCpu, in.q, in.k, in.v, in.s0, p, r.o, r.s);
  kernel::retention_backward_kernel(kCpu, in.q, in.k, in.v, in.s0, in.dout, in.ds, p, r.dq, r.dk, r.dv, r.ds0);
  return r;
}

// The schedule in A on the inputs converted to A, with α = γ_h (no g) and β = 1 (no gv), as retention.cu
// sets it up.
template <class A>
scan::Problem<A, A> problem_of(const std::vector<Tensor>& x, const std::vector<A>& decays, double scale) {
  scan::Problem<A, A> pb;
  pb.nb = x[0].size(0);
  pb.nt = x[0].size(1);
  pb.nh = x[0].size(2);
  pb.dk = x[0].size(3);
  pb.dv = x[2].size(3);
  pb.scale = static_cast<A>(scale);
  pb.q = x[0].data<A>();
  pb.k = x[1].data<A>();
  pb.v = x[2].data<A>();
  pb.h0 = x[3].data<A>();
  pb.decay = decays.data();
  return pb;
}

template <class A>
Outputs emulate(const Inputs& in64, const kernel::RetentionParams& p, int batch) {
  const DType d = sizeof(A) == 8 ? DType::f64 : DType::f32;
  std::vector<Tensor> x;
  for (const Tensor* t : {&in64.q, &in64.k, &in64.v, &in64.s0, &in64.dout, &in64.ds}) {
    x.push_back(kernel::to_dtype(*t, d));
  }
  const std::vector<A> decays(p.gammas.begin(), p.gammas.end());
  const scan::Problem<A, A> pb = problem_of<A>(x, decays, p.scale);
  Outputs e{poisoned(in64.dout.shape(), d, kCpu), poisoned(in64.ds.shape(), d, kCpu),
            poisoned(in64.q.shape(), d, kCpu),    poisoned(in64.k.shape(), d, kCpu),
            poisoned(in64.v.shape(), d, kCpu),    poisoned(in64.s0.shape(), d, kCpu)};
  testing::emulate_forward(pb, e.o.data<A>(), e.s.data<A>());
  scan::BackwardIO<A, A> io;
  io.dout = x[4].data<A>();
  io.dfinal = x[5].data<A>();
  io.dv = e.dv.data<A>();
  io.dh0 = e.ds0.data<A>();
  testing::emulate_backward(pb, io, batch, e.dq.data<A>(), e.dk.data<A>(), static_cast<A*>(nullptr));
  return e;
}

void compare(const Outputs& e, const Outputs& r, double rtol, const std::string& what) {
  expect_schedule_close(e.o, r.o, rtol, what + " o");
  expect_schedule_close(e.s, r.s, rtol, what + " final state");
  expect_schedule_close(e.dq, r.dq, rtol, what + " dq");
  expect_schedule_close(e.dk, r.dk, rtol, what + " dk");
  expect_schedule_close(e.dv, r.dv, rtol, what + " dv");
  expect_schedule_close(e.ds0, r.ds0, rtol, what + " ds0");
}

TEST(RetentionCudaSchedule, MatchesCpuKernelsF64) {
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    for (bool random_s0 : {false, true}) {
      const Inputs in = make_inputs(c, random_s0, ++seed);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
      const std::string what = c.name() + (random_s0 ? " s0" : "");
      scan::Problem<double, double> shape;
      shape.dk = c.dk;
      shape.dv = c.dv;
      for (RetentionForm form : {RetentionForm::parallel, RetentionForm::chunkwise, RetentionForm::recurrent}) {
        const kernel::RetentionParams p = params(c, form, scale);
        const Outputs r = cpu_reference(in, p);
        for (int batch : {1, 3, std::max(1, scan::backward_batch(shape, 112 * 1024))}) {
          compare(emulate<double>(in, p, batch), r, 1e-10,
                  what + " form " + std::to_string(static_cast<int>(form)) + " batch " + std::to_string(batch));
        }
      }
    }
  }
}

TEST(RetentionCudaSchedule, MatchesCpuKernelsF32) {
  uint64_t seed = 400;
  for (const Case& c : kCases) {
    const Inputs in = make_inputs(c, true, ++seed);
    scan::Problem<float, float> shape;
    shape.dk = c.dk;
    shape.dv = c.dv;
    const int batch = std::max(1, scan::backward_batch(shape, 112 * 1024));
    for (RetentionForm form : {RetentionForm::parallel, RetentionForm::chunkwise, RetentionForm::recurrent}) {
      const kernel::RetentionParams p = params(c, form, 0.3);
      const Outputs e = emulate<float>(in, p, batch);
      const std::string what = c.name() + " f32 form " + std::to_string(static_cast<int>(form));
      compare(e, cpu_reference(in, p), 1e-4, what + " vs f64");
      // What the GPU test compares: f32 against the CPU's f32 kernels.
      compare(e, cpu_reference(in, p, DType::f32), 1e-4, what + " vs f32");
    }
  }
}

}  // namespace
}  // namespace seqlab::testing
