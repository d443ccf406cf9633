// The row-reduction CUDA kernels, run on the CPU against the CPU slots: layer and RMS norm (forward,
// plain and fused with the residual add; dx with and without the residual's gradient; the dw/db
// column sums), softmax and log-softmax (forward and backward), cross-entropy (forward rows and the
// element-wise backward, i32 and i64 targets, ignore_index), the row sums of sum_rows and max over rows
// with the CPU's first argmax. No GPU needed: this is the check these kernels get on every build until
// a GPU runs tests/rows_gpu_test.cc, which checks the same slots end to end.
//
// The kernel source (src/cuda/{norm,softmax,reduce_rows}_kernels.cuh, block_reduce.cuh) is compiled by
// the host compiler over tests/cuda_emulation.h: one fiber per CUDA thread, real barriers and
// shuffles, an emulated GPU of one multiprocessor. Each launch below mirrors its launcher in
// src/cuda/{norm,softmax,elementwise,index}.cu: the same early returns, the same grid and block (the
// launchers' own helpers, row_grid, row_threads, param_chunks, grid_stride_blocks, given the emulated
// multiprocessor count), the same arguments. With one multiprocessor a grid stops at 32 blocks, so the
// shapes with more rows than that run the kernels' row loops too. Outputs start as NaN (a sentinel for
// indices) between guard bands, so an element not written and a write outside the output both fail.
//
// Shapes: columns 1, 7 (< a warp), 33, 100 (not a multiple of the block), 300 and 600 (> 256: several
// elements per thread), rows 1 to 40. Tolerances as in the GPU test (gpu_rtol: 1e-5 f32, 1e-10 f64,
// 1e-2 bf16, the reference being the CPU kernels in f32 on the same bf16 values); argmax exact.
// Inputs and references: tests/rows_cases.h, drawn and computed as in the GPU test.
// What this cannot check: the real compiler, the hardware's memory system and scheduling, performance.
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_emulation_util.h"
#include "rows_cases.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/norm_kernels.cuh"
#include "cuda/reduce_rows_kernels.cuh"
#include "cuda/softmax_kernels.cuh"

namespace seqlab {
namespace {

namespace rows = cuda::rows;
using cuda::compute_t;
using kernel::NormGrads;
using kernel::NormOutput;
using testing::as_reference;
using testing::cpu_empty;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
using testing::kIgnoreIndex;
using testing::kLossScale;
using testing::reference_type;
constexpr int kSMs = emu::kMultiprocessors;

double rtol(DType d) { return testing::gpu_rtol(d); }
std::string case_name(const char* op, DType dtype, int64_t rows, int64_t cols) {
  return testing::rows_case_name(op, dtype, rows, cols);
}

// fn(std::bool_constant<b>{}) for a runtime b: picks a kernel's bool template argument.
template <class Fn>
void with_flag(bool b, Fn&& fn) {
  if (b) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// ---- the launchers, as src/cuda/*.cu launch (with the emulated multiprocessor count) --------------

// rows::launch_elements: f(i) for i in [0, n) in a grid-stride loop.
template <class F>
void launch_elements(int64_t n, const F& f) {
  if (n == 0) return;
  emu::launch(dim3(cuda::grid_stride_blocks(n, kSMs)), dim3(cuda::kThreads), 0, cuda::grid_stride_loop<F>, n, f);
}

// norm.cu norm_forward: residual and sum both defined (fused) or both null; mean null for rms.
template <class T>
void norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                  GuardedOutput* sum, GuardedOutput& y, GuardedOutput* mean, GuardedOutput& rstd) {
  using A = compute_t<T>;
  const int64_t n = x.size(0), c = x.size(1);
  if (n == 0 || c == 0) return;
  const T* bias = b.defined() ? b.data<T>() : nullptr;
  const T* res = residual.defined() ? residual.data<T>() : nullptr;
  T* s = sum != nullptr ? sum->data<T>() : nullptr;
  const dim3 grid(rows::row_grid(n, kSMs)), block(rows::row_threads(c));
  with_flag(mean != nullptr, [&](auto centered) {
    constexpr bool kCentered = decltype(centered)::value;
    emu::launch(grid, block, 0, rows::norm_forward_rows<T, kCentered>, x.data<T>(), res, s, w.data<T>(), bias,
                y.data<T>(), kCentered ? mean->data<A>() : nullptr, rstd.data<A>(), n, c, eps);
  });
}

// norm.cu norm_backward: each of dx, dw, db null where not asked for; mean undefined for rms.
template <class T>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dsum, GuardedOutput* dx, GuardedOutput* dw, GuardedOutput* db) {
  using A = compute_t<T>;
  const int64_t n = x.size(0), c = x.size(1);
  with_flag(mean.defined(), [&](auto centered) {
    constexpr bool kCentered = decltype(centered)::value;
    const A* mu = kCentered ? mean.data<A>() : nullptr;
    if (dx != nullptr && n > 0 && c > 0) {
      emu::launch(dim3(rows::row_grid(n, kSMs)), dim3(rows::row_threads(c)), 0,
                  rows::norm_backward_dx_rows<T, kCentered>, dy.data<T>(), x.data<T>(), w.data<T>(), mu, rstd.data<A>(),
                  dsum.defined() ? dsum.data<T>() : nullptr, dx->data<T>(), n, c);
    }
    if ((dw == nullptr && db == nullptr) || c == 0) return;
    const int64_t chunks = n == 0 ? 1 : rows::param_chunks(n, c, kSMs), per = n == 0 ? 0 : (n + chunks - 1) / chunks;
    const DType acc_type = std::is_same_v<A, double> ? DType::f64 : DType::f32;
    GuardedOutput part_w({chunks, c}, acc_type), part_b({chunks, c}, acc_type);
    A* pw = dw != nullptr ? part_w.data<A>() : nullptr;
    A* pb = db != nullptr ? part_b.data<A>() : nullptr;
    const dim3 grid(static_cast<unsigned>((c + rows::kMaxThreads - 1) / rows::kMaxThreads),
                    static_cast<unsigned>(chunks));
    emu::launch(grid, dim3(rows::kMaxThreads), 0, rows::norm_param_partials<T, kCentered>, dy.data<T>(), x.data<T>(),
                mu, rstd.data<A>(), pw, pb, n, c, per);
    if (dw != nullptr) launch_elements(c, rows::SumPartialsFn<T>{pw, dw->data<T>(), chunks, c});
    if (db != nullptr) launch_elements(c, rows::SumPartialsFn<T>{pb, db->data<T>(), chunks, c});
    part_w.expect_guards_intact("norm weight partial sums");
    part_b.expect_guards_intact("norm bias partial sums");
  });
}

// softmax.cu softmax_cuda and softmax_backward_cuda on rows [n, c].
template <class T>
void softmax_forward(const Tensor& x, bool log, GuardedOutput& y) {
  const int64_t n = x.size(0), c = x.size(1);
  if (n == 0 || c == 0) return;
  with_flag(log, [&](auto is_log) {
    emu::launch(dim3(rows::row_grid(n, kSMs)), dim3(rows::row_threads(c)), 0,
                rows::softmax_rows<T, decltype(is_log)::value>, x.data<T>(), y.data<T>(), n, c);
  });
}
template <class T>
void softmax_backward(const Tensor& dy, const Tensor& y, bool log, GuardedOutput& dx) {
  const int64_t n = y.size(0), c = y.size(1);
  if (n == 0 || c == 0) return;
  with_flag(log, [&](auto is_log) {
    emu::launch(dim3(rows::row_grid(n, kSMs)), dim3(rows::row_threads(c)), 0,
                rows::softmax_backward_rows<T, decltype(is_log)::value>, dy.data<T>(), y.data<T>(), dx.data<T>(), n, c);
  });
}

// softmax.cu cross_entropy_cuda and cross_entropy_backward_cuda, targets of index type I.
template <class T, class I>
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, GuardedOutput& losses,
                           GuardedOutput& lse) {
  using A = compute_t<T>;
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  emu::launch(dim3(rows::row_grid(n, kSMs)), dim3(rows::row_threads(v)), 0, rows::cross_entropy_rows<T, I>,
              logits.data<T>(), targets.data<I>(), ignore_index, losses.data<A>(), lse.data<A>(), n, v);
}
template <class T, class I>
void cross_entropy_backward(double scale, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            int64_t ignore_index, GuardedOutput& dlogits) {
  using A = compute_t<T>;
  launch_elements(logits.numel(), rows::CrossEntropyBackwardFn<T, I>{logits.data<T>(), lse.data<A>(), targets.data<I>(),
                                                                     dlogits.data<T>(), logits.size(1), ignore_index,
                                                                     static_cast<A>(scale)});
}

// elementwise.cu sum_rows_cuda: short rows by one thread each, longer ones by a block per row.
template <class T>
void sum_rows(const Tensor& x, GuardedOutput& out) {
  const int64_t n = x.size(0), inner = x.size(1);
  if (inner < rows::kShortRow) {
    launch_elements(n, rows::SumShortRowsFn<T>{x.data<T>(), out.data<T>(), inner});
    return;
  }
  if (n == 0) return;
  emu::launch(dim3(rows::row_grid(n, kSMs)), dim3(cuda::kThreads), 0, rows::sum_rows_by_block<T>, x.data<T>(),
              out.data<T>(), n, inner);
}

// index.cu max_rows_cuda.
template <class T>
void max_rows(const Tensor& x, GuardedOutput& out, GuardedOutput& index) {
  const int64_t outer = x.size(0), inner = x.size(1);
  if (outer == 0) return;
  emu::launch(dim3(rows::row_grid(outer, kSMs)), dim3(rows::row_threads(inner)), 0, rows::max_rows<T>, x.data<T>(),
              out.data<T>(), index.data<int64_t>(), outer, inner);
}

// ---- the tests ----------------------------------------------------------------------------------

class RowsEmulation : public ::testing::Test {
 protected:
  Generator gen_{testing::test_seed(31)};
};

// [rows, C]: one element; a column per row with more rows than the 32-block grid; a few short rows;
// rows of a warp and one; more rows than blocks with C not a multiple of the block; C > 256.
const std::pair<int64_t, int64_t> kRowShapes[] = {{1, 1}, {40, 1}, {5, 7}, {37, 33}, {3, 300}, {2, 600}};

TEST_F(RowsEmulation, NormForwardPlainAndFused) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    const DType at = accumulate_dtype(dtype);
    for (auto [n, c] : kRowShapes) {
      const testing::AddNormInputs in = testing::add_norm_inputs(n, c, dtype, gen_);
      for (bool fused : {false, true}) {
        for (int kind = 0; kind < 3; ++kind) {  // layer norm, layer norm without bias, rms norm
          const bool centered = kind < 2, with_bias = kind == 0;
          const std::string what = case_name(kind == 0   ? "layer_norm"
                                             : kind == 1 ? "layer_norm without bias"
                                                         : "rms_norm",
                                             dtype, n, c) +
                                   (fused ? " fused with the residual add" : "");
          const Tensor bias = with_bias ? in.bias : Tensor();
          // Fused: the CPU's sum, then its plain norm of that sum as stored in the dtype under test.
          const testing::AddNormReference fused_want =
              fused ? testing::add_norm_reference(in, centered, with_bias) : testing::AddNormReference();
          const NormOutput want = fused ? fused_want.norm : testing::norm_reference(in.x, in.weight, bias, centered);

          GuardedOutput sum({n, c}, dtype), y({n, c}, dtype), mean({n}, at), rstd({n}, at);
          norm_forward<T>(in.x, fused ? in.residual : Tensor(), in.weight, bias, testing::norm_eps(centered),
                          fused ? &sum : nullptr, y, centered ? &mean : nullptr, rstd);
          if (fused) expect_output(sum, fused_want.sum, rtol(dtype), what + " sum");
          expect_output(y, want.y, rtol(dtype), what + " y");
          if (centered) expect_output(mean, want.mean, rtol(dtype), what + " mean");
          expect_output(rstd, want.rstd, rtol(dtype), what + " rstd");
          // What a launch must not write: the sum when not fused, the mean for rms.
          if (!fused) expect_output(sum, testing::poisoned({n, c}, dtype, kCpu), 0.0, what + " sum (not written)");
          if (!centered) expect_output(mean, testing::poisoned({n}, at, kCpu), 0.0, what + " mean (not written)");
        }
      }
    }
  });
}

TEST_F(RowsEmulation, NormBackward) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {40, 1}, {5, 7}, {37, 33}, {3, 300}, {0, 5}};
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (auto [n, c] : shapes) {
      const testing::NormBackwardInputs in = testing::norm_backward_inputs(n, c, dtype, gen_);
      for (bool centered : {true, false}) {
        const std::string what = case_name(centered ? "layer_norm backward" : "rms_norm backward", dtype, n, c);
        const testing::NormStatistics saved = testing::saved_norm_statistics(in, centered);
        // Every gradient, then only the parameter gradients (dx skipped), then only dx; dx also with
        // dsum, the gradient of a fused residual sum, added onto it.
        for (int ask = 0; ask < 3; ++ask) {
          const bool need_dx = ask != 1, need_params = ask != 2;
          const NormGrads want = testing::norm_backward_reference(in, saved, centered, need_dx, need_params);
          for (bool with_dsum : {false, true}) {
            if (with_dsum && !need_dx) continue;
            GuardedOutput dx({n, c}, dtype), dw({c}, dtype), db({c}, dtype);
            norm_backward<T>(in.dy, in.x, in.weight, saved.mean, saved.rstd, with_dsum ? in.dsum : Tensor(),
                             need_dx ? &dx : nullptr, need_params ? &dw : nullptr,
                             need_params && centered ? &db : nullptr);
            const Tensor want_dx = with_dsum ? testing::dx_plus_dsum(want.dx, in.dsum) : want.dx;
            const std::string asked = what + " (ask " + std::to_string(ask) + (with_dsum ? ", with dsum)" : ")");
            if (need_dx) expect_output(dx, want_dx, rtol(dtype), asked + " dx", with_dsum ? want.dx : Tensor());
            if (need_params) expect_output(dw, want.dweight, rtol(dtype), asked + " dweight");
            if (need_params && centered) expect_output(db, want.dbias, rtol(dtype), asked + " dbias");
          }
        }
      }
    }
  });
}

TEST_F(RowsEmulation, SoftmaxForwardAndBackward) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (auto [n, c] : kRowShapes) {
      const testing::SoftmaxInputs in = testing::softmax_inputs(n, c, dtype, gen_);
      for (bool log : {false, true}) {
        const std::string what = case_name(log ? "log_softmax" : "softmax", dtype, n, c);
        const Tensor want = testing::softmax_reference(in.x, log);
        GuardedOutput got({n, c}, dtype);
        softmax_forward<T>(in.x, log, got);
        expect_output(got, want, rtol(dtype), what);

        const Tensor y = kernel::to_dtype(want, dtype);  // y as the forward stored it
        const Tensor dwant = testing::softmax_backward_reference(in.dy, y, log);
        GuardedOutput dgot({n, c}, dtype);
        softmax_backward<T>(in.dy, y, log, dgot);
        expect_output(dgot, dwant, rtol(dtype), what + " backward");
      }
    }
  });
}

TEST_F(RowsEmulation, SoftmaxOfLargeLogitsAndNaN) {
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    const Tensor x = testing::large_logits_with_nan(dtype, gen_);
    for (bool log : {false, true}) {
      const Tensor want = testing::softmax_reference(x, log);
      GuardedOutput got({4, 100}, dtype);
      softmax_forward<T>(x, log, got);
      expect_output(got, want, rtol(dtype),
                    std::string(log ? "log_softmax" : "softmax") + " large " + dtype_name(dtype));
    }
  });
}

TEST_F(RowsEmulation, CrossEntropyForwardAndBackward) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {40, 1}, {13, 7}, {33, 100}, {3, 600}};
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    const DType at = accumulate_dtype(dtype);
    for (DType target_type : {DType::i32, DType::i64}) {
      for (auto [n, v] : shapes) {
        const std::string what = case_name("cross_entropy", dtype, n, v) + " " + dtype_name(target_type);
        const testing::CrossEntropyInputs in = testing::cross_entropy_inputs(n, v, dtype, target_type, gen_);
        const testing::CrossEntropyReference want = testing::cross_entropy_reference(in);
        GuardedOutput loss_got({n}, at), lse_got({n}, at), dgot({n, v}, dtype);
        // The backward reads lse as the forward stored it.
        if (target_type == DType::i32) {
          cross_entropy_forward<T, int32_t>(in.logits, in.targets, kIgnoreIndex, loss_got, lse_got);
          cross_entropy_backward<T, int32_t>(kLossScale, in.logits, in.targets, want.saved_lse, kIgnoreIndex, dgot);
        } else {
          cross_entropy_forward<T, int64_t>(in.logits, in.targets, kIgnoreIndex, loss_got, lse_got);
          cross_entropy_backward<T, int64_t>(kLossScale, in.logits, in.targets, want.saved_lse, kIgnoreIndex, dgot);
        }
        expect_output(loss_got, want.losses, rtol(dtype), what + " losses");
        expect_output(lse_got, want.lse, rtol(dtype), what + " lse");
        expect_output(dgot, want.dlogits, rtol(dtype), what + " backward");
      }
    }
  });
}

TEST_F(RowsEmulation, SumRows) {
  // Short rows (one thread each, below kShortRow = 32 columns) and block rows, more rows than blocks
  // (with one busy warp, and with all eight).
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {300, 7}, {5, 31}, {40, 32}, {40, 300}, {2, 1000}, {0, 40}};
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (auto [n, c] : shapes) {
      Tensor x = Tensor::rand({n, c}, gen_, dtype, -1.0, 2.0);  // mean 0.5: the sums grow
      Tensor want = cpu_empty({n}, reference_type(dtype));
      kernel::sum_rows_kernel(kCpu, as_reference(x), want);
      GuardedOutput got({n}, dtype);
      sum_rows<T>(x, got);
      expect_output(got, want, rtol(dtype), case_name("sum_rows", dtype, n, c));
    }
  });
}

TEST_F(RowsEmulation, MaxRowsFirstArgmaxTiesAndNaN) {
  // kRowShapes, and more rows than blocks with every warp of the block holding candidates.
  std::vector<std::pair<int64_t, int64_t>> shapes(std::begin(kRowShapes), std::end(kRowShapes));
  shapes.emplace_back(40, 100);
  for_each_type([&](auto tag, DType dtype) {
    using T = decltype(tag);
    for (auto [n, c] : shapes) {
      const std::string what = case_name("max_rows", dtype, n, c);
      // Ties, NaN rows, and each row 10 above the one before, so a candidate leaking from a block's
      // next row would win.
      std::vector<double> values = testing::max_rows_values(n, c, gen_, 10.0);
      // Row 0's max in its last column only, where a block's last warp holds it.
      if (c > 1) values[static_cast<size_t>(c - 1)] = 100.0;
      Tensor x = Tensor::from_vector(values, {n, c}, dtype);
      Tensor want = cpu_empty({n}, reference_type(dtype)), want_index = cpu_empty({n}, DType::i64);
      kernel::max_rows_kernel(kCpu, as_reference(x), want, want_index);
      GuardedOutput got({n}, dtype), got_index({n}, DType::i64);
      max_rows<T>(x, got, got_index);
      expect_output(got, want, 0.0, what + " values");
      expect_output(got_index, want_index, 0.0, what + " indices");
    }
  });
}

}  // namespace
}  // namespace seqlab
