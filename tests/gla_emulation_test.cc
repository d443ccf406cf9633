// The CUDA GLA kernels' schedule (src/cuda/scan/gated_scan_schedule.h, run by src/cuda/scan/gla.cu) executed on the host —
// the same phases, thread indices, shared-memory layout, checkpoints and reduction orders, every block
// in turn — against the CPU kernels of both forms (src/layers/scan/gla.cpp). This is where the GPU kernels'
// logic is checked on a machine without a GPU; tests/gla_gpu_test.cc compares the real kernels.
//
// Cases cover T not a multiple of the 16-step segment, T below a segment, T = 1, dk ≠ dv, dk not a
// multiple of the 8 rows per thread, dv over several 32-column tiles with a partial last tile, the
// largest head dims (128), strong and weak gates, with and without gv and the initial state, every
// gradient and only some, and reduction batches of 1, 3 and a whole segment.
// Tolerance |got − want| ≤ rtol · max(1, |want|): f64 1e-10 (against the CPU's f64), f32 1e-4 (the f32
// schedule against the CPU's f64 and f32 kernels: the f32 rounding of the recurrence over up to 70 steps
// and of sums over up to 128 terms, in different orders).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/scan/gated_scan_schedule.h"
#include "gated_scan_emulation.h"
#include "layers/scan/gla.h"
#include "tensor/kernels.h"
#include "variant_cases.h"

// The tests live in seqlab::testing, beside the helpers of variant_cases.h they use.
namespace seqlab::testing {
namespace {

namespace scan = cuda::scan;
using Case = GlaCase;
using Inputs = GlaInputs;

const Case kCases[] = {
    {2, 37, 3, 16, 16, -1.5, -0.02},    // two full segments and a partial one
    {1, 1, 2, 5, 7, -1.5, -0.02},       // T = 1, tiny head dims
    {2, 50, 2, 20, 40, -1.0, -0.01},    // dk ≠ dv, dk not a multiple of 8, two column tiles
    {1, 16, 2, 9, 33, -1.5, -0.02},     // exactly one segment; a last tile of one column
    {1, 12, 1, 3, 70, -0.5, -0.01},     // T below a segment, three tiles
    {1, 33, 1, 128, 128, -0.3, -0.01},  // the largest head dims: 16 row groups, 4 tiles
    {2, 70, 2, 64, 64, -20, -10},       // gla_small's head size, strong gates
    {1, 40, 2, 32, 24, -1e-6, -1e-7},   // gates ≈ 1
    {2, 150, 4, 64, 64, -1.0, -0.01},   // as in the GPU test: many segments
};

// The inputs in f64, then dO and dfinal ~ N(0, 1).
Inputs make_inputs(const Case& c, bool with_gv, bool with_h0, uint64_t seed) {
  Generator gen(seed);
  Inputs in = make_gla_inputs(c, DType::f64, with_gv, with_h0, gen);
  in.dout = Tensor::randn({c.B, c.T, c.H, c.dv}, gen, DType::f64);
  in.dfinal = Tensor::randn({c.B, c.H, c.dk, c.dv}, gen, DType::f64);
  return in;
}

template <class A>
scan::Problem<A, A> problem_of(const Inputs& in, double scale) {
  scan::Problem<A, A> pb;
  pb.nb = in.q.size(0);
  pb.nt = in.q.size(1);
  pb.nh = in.q.size(2);
  pb.dk = in.q.size(3);
  pb.dv = in.v.size(3);
  pb.scale = static_cast<A>(scale);
  pb.q = ptr<A>(in.q);
  pb.k = ptr<A>(in.k);
  pb.v = ptr<A>(in.v);
  pb.g = ptr<A>(in.g);
  pb.gv = ptr<A>(in.gv);
  pb.h0 = ptr<A>(in.h0);
  return pb;
}

Inputs converted(const Inputs& in, DType d) {
  return {cast_or_none(in.q, d),  cast_or_none(in.k, d),  cast_or_none(in.v, d),    cast_or_none(in.g, d),
          cast_or_none(in.gv, d), cast_or_none(in.h0, d), cast_or_none(in.dout, d), cast_or_none(in.dfinal, d)};
}

struct Reference {
  Tensor o, fs;
  kernel::GlaGrads grads;
};

// The CPU kernels of the form given in dtype d (on the inputs converted to it), every gradient.
Reference cpu_reference(const Inputs& in64, GlaForm form, double scale, DType d = DType::f64) {
  const Inputs in = converted(in64, d);
  const kernel::GlaParams p{form, 8, 4, scale};
  Reference r{Tensor::empty(in.dout.shape(), d), Tensor::empty(in.dfinal.shape(), d), {}};
  kernel::gla_forward_kernel(kCpu, in.q, in.k, in.v, in.g, in.gv, in.h0, p, r.o, r.fs);
  r.grads.dq = Tensor::empty(in.q.shape(), d);
  r.grads.dk = Tensor::empty(in.k.shape(), d);
  r.grads.dv = Tensor::empty(in.v.shape(), d);
  r.grads.dg = Tensor::empty(in.g.shape(), d);
  if (in.gv.defined()) r.grads.dgv = Tensor::empty(in.gv.shape(), d);
  if (in.h0.defined()) r.grads.dinitial_state = Tensor::empty(in.h0.shape(), d);
  kernel::gla_backward_kernel(kCpu, in.dout, in.dfinal, in.q, in.k, in.v, in.g, in.gv, in.h0, p, r.grads);
  return r;
}

struct Emulated {
  Tensor o, fs, dq, dk, dv, dg, dgv, dh0;
};

// The schedule in A (float or double) on inputs converted to A; `want` selects the optional gradients.
template <class A>
Emulated emulate(const Inputs& in64, double scale, int batch, bool want_dg, bool want_dgv, bool want_dh0) {
  const DType d = sizeof(A) == 8 ? DType::f64 : DType::f32;
  const Inputs in = converted(in64, d);
  const scan::Problem<A, A> pb = problem_of<A>(in, scale);
  Emulated e;
  e.o = poisoned(in.dout.shape(), d, kCpu);
  e.fs = poisoned(in.dfinal.shape(), d, kCpu);
  testing::emulate_forward(pb, e.o.data<A>(), e.fs.data<A>());
  e.dq = poisoned(in.q.shape(), d, kCpu);
  e.dk = poisoned(in.k.shape(), d, kCpu);
  e.dv = poisoned(in.v.shape(), d, kCpu);
  if (want_dg) e.dg = poisoned(in.g.shape(), d, kCpu);
  if (want_dgv && in.gv.defined()) e.dgv = poisoned(in.gv.shape(), d, kCpu);
  if (want_dh0) e.dh0 = poisoned(in.dfinal.shape(), d, kCpu);
  scan::BackwardIO<A, A> io;
  io.dout = ptr<A>(in.dout);
  io.dfinal = ptr<A>(in.dfinal);
  io.dv = mut<A>(e.dv);
  io.dgv = mut<A>(e.dgv);
  io.dh0 = mut<A>(e.dh0);
  testing::emulate_backward(pb, io, batch, mut<A>(e.dq), mut<A>(e.dk), mut<A>(e.dg));
  return e;
}

void compare(const Emulated& e, const Reference& r, const Inputs& in, double rtol, const std::string& what) {
  expect_schedule_close(e.o, r.o, rtol, what + " o");
  expect_schedule_close(e.fs, r.fs, rtol, what + " final_state");
  expect_schedule_close(e.dq, r.grads.dq, rtol, what + " dq");
  expect_schedule_close(e.dk, r.grads.dk, rtol, what + " dk");
  expect_schedule_close(e.dv, r.grads.dv, rtol, what + " dv");
  if (e.dg.defined()) expect_schedule_close(e.dg, r.grads.dg, rtol, what + " dg");
  if (e.dgv.defined()) expect_schedule_close(e.dgv, r.grads.dgv, rtol, what + " dgv");
  if (e.dh0.defined() && in.h0.defined()) expect_schedule_close(e.dh0, r.grads.dinitial_state, rtol, what + " dh0");
}

// The batch the launcher picks for the largest budget it prefers (112 KiB), as on the GPU.
template <class A>
int launcher_batch(const Inputs& in) {
  const int b =
      scan::backward_batch(problem_of<A>(converted(in, sizeof(A) == 8 ? DType::f64 : DType::f32), 1.0), 112 * 1024);
  return std::max(b, 1);
}

TEST(GlaCudaSchedule, MatchesCpuKernelsF64) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (bool with_gv : {false, true}) {
      for (bool with_h0 : {false, true}) {
        const Inputs in = make_inputs(c, with_gv, with_h0, ++seed);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
        const Reference rec = cpu_reference(in, GlaForm::recurrent, scale);
        const Reference chk = cpu_reference(in, GlaForm::chunkwise, scale);
        const std::string what = c.name() + (with_gv ? " gv" : "") + (with_h0 ? " h0" : "");
        for (int batch : {1, 3, launcher_batch<double>(in)}) {
          const Emulated e = emulate<double>(in, scale, batch, true, true, true);
          compare(e, rec, in, 1e-10, what + " batch " + std::to_string(batch) + " vs recurrent");
          compare(e, chk, in, 1e-10, what + " batch " + std::to_string(batch) + " vs chunkwise");
        }
        // dh0 of a zero initial state is still the gradient w.r.t. it (the schedule writes dS either way).
      }
    }
  }
}

TEST(GlaCudaSchedule, MatchesCpuKernelsF32) {
  uint64_t seed = 200;
  for (const Case& c : kCases) {
    for (bool with_gv : {false, true}) {
      const Inputs in = make_inputs(c, with_gv, true, ++seed);
      const double scale = 0.7 / std::sqrt(static_cast<double>(c.dk));  // an explicit scale
      const Emulated e = emulate<float>(in, scale, launcher_batch<float>(in), true, true, true);
      const std::string what = c.name() + (with_gv ? " gv" : "") + " f32";
      compare(e, cpu_reference(in, GlaForm::recurrent, scale), in, 1e-4, what + " vs f64");
      // What the GPU test compares: f32 against the CPU's f32 kernels of either form.
      compare(e, cpu_reference(in, GlaForm::recurrent, scale, DType::f32), in, 1e-4, what + " vs f32 recurrent");
      compare(e, cpu_reference(in, GlaForm::chunkwise, scale, DType::f32), in, 1e-4, what + " vs f32 chunkwise");
    }
  }
}

// Strong decays — every log-gate (g and gv) −20, every one −30, and the bimodal mixture of ≈ −1e-5 and
// [−30, −10] — where the CPU's chunkwise gate gradients once cancelled (docs/reliability.md, "Numerics
// at every decay"): the schedule against the f64 CPU kernels of both forms at this file's tolerances
// (f64 1e-10, f32 1e-4), and its dg, dgv norm-wise within 1e-12 (f64) and 1e-5 (f32) of the f64 CPU
// recurrent form (elementwise, |x| ≤ tol·max(1, |x|) says nothing about a gradient of size e^−60).
TEST(GlaCudaSchedule, StrongDecaysMatchCpuKernels) {
  const Case shapes[] = {{2, 37, 3, 16, 16, 0, 0}, {1, 50, 2, 20, 40, 0, 0}};
  uint64_t seed = 300;
  for (Decay d : {Decay::all20, Decay::all30, Decay::bimodal}) {
    for (const Case& c : shapes) {
      for (bool with_gv : {false, true}) {
        Inputs in = make_inputs(c, with_gv, true, ++seed);
        Generator gen(seed);
        in.g = draw_log_decays(d, in.g.shape(), gen, DType::f64);
        if (with_gv) in.gv = draw_log_decays(d, in.gv.shape(), gen, DType::f64);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
        const Reference rec = cpu_reference(in, GlaForm::recurrent, scale);
        const Reference chk = cpu_reference(in, GlaForm::chunkwise, scale);
        const std::string what =
            heads_name(c.B, c.T, c.H, c.dk, c.dv) + " decay " + decay_name(d) + (with_gv ? " gv" : "");
        const Emulated e64 = emulate<double>(in, scale, launcher_batch<double>(in), true, true, true);
        compare(e64, rec, in, 1e-10, what + " f64 vs recurrent");
        compare(e64, chk, in, 1e-10, what + " f64 vs chunkwise");
        // f32 on the f32-rounded inputs; the reference is the f64 CPU kernel on those same values.
        const Inputs in32 = converted(converted(in, DType::f32), DType::f64);
        const Reference rec32 = cpu_reference(in32, GlaForm::recurrent, scale);
        const Emulated e32 = emulate<float>(in32, scale, launcher_batch<float>(in32), true, true, true);
        compare(e32, rec32, in32, 1e-4, what + " f32 vs f64 recurrent");
        EXPECT_LE(norm_rel_error(e64.dg, rec.grads.dg), 1e-12) << what << " f64 dg";
        EXPECT_LE(norm_rel_error(e64.dg, chk.grads.dg), 1e-12) << what << " f64 dg vs chunkwise";
        EXPECT_LE(norm_rel_error(e32.dg, rec32.grads.dg), 1e-5) << what << " f32 dg";
        if (with_gv) {
          EXPECT_LE(norm_rel_error(e64.dgv, rec.grads.dgv), 1e-12) << what << " f64 dgv";
          EXPECT_LE(norm_rel_error(e64.dgv, chk.grads.dgv), 1e-12) << what << " f64 dgv vs chunkwise";
          EXPECT_LE(norm_rel_error(e32.dgv, rec32.grads.dgv), 1e-5) << what << " f32 dgv";
        }
      }
    }
  }
}

// Only some gradients: the others are neither computed into nor written (their buffers stay absent),
// and the ones asked for do not change.
TEST(GlaCudaSchedule, OnlyNeededGradients) {
  const Case c{2, 29, 2, 12, 36, -1.0, -0.05};
  const Inputs in = make_inputs(c, true, true, 7);
  const double scale = 0.25;
  const Reference r = cpu_reference(in, GlaForm::recurrent, scale);
  const Emulated all = emulate<double>(in, scale, 2, true, true, true);
  const Emulated some = emulate<double>(in, scale, 2, false, false, false);
  EXPECT_FALSE(some.dg.defined() || some.dgv.defined() || some.dh0.defined());
  compare(some, r, in, 1e-10, "dq, dk, dv only");
  EXPECT_EQ(some.dq.to_doubles(), all.dq.to_doubles());
  EXPECT_EQ(some.dk.to_doubles(), all.dk.to_doubles());
  EXPECT_EQ(some.dv.to_doubles(), all.dv.to_doubles());
}

// The launch geometry and shared memory the kernels ask for: 32 threads per 8 rows of dk, one block per
// 32 value columns, and shared memory within an sm_80 block's 163 KiB for every head dim up to 128.
TEST(GlaCudaSchedule, GeometryAndSharedMemory) {
  for (int64_t dk : {1, 8, 9, 64, 127, 128}) {
    for (int64_t dv : {1, 32, 33, 128}) {
      scan::Problem<double, double> p64;
      p64.dk = dk;
      p64.dv = dv;
      EXPECT_EQ(p64.threads(), 32 * ((dk + 7) / 8));
      EXPECT_LE(p64.threads(), scan::kMaxThreads);
      EXPECT_EQ(p64.tiles(), (dv + 31) / 32);
      EXPECT_LE(8 * scan::forward_shared_elems(p64), 163 * 1024);
      EXPECT_GE(scan::backward_batch(p64, 163 * 1024), 1) << "dk " << dk;
      scan::Problem<float, float> p32;
      p32.dk = dk;
      p32.dv = dv;
      EXPECT_GE(scan::backward_batch(p32, 112 * 1024), dk <= 64 ? 2 : 1) << "dk " << dk;
      EXPECT_LE(4 * scan::backward_shared_elems(p32, scan::backward_batch(p32, 112 * 1024)), 112 * 1024);
    }
  }
}

}  // namespace
}  // namespace seqlab::testing
