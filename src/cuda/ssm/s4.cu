// CUDA side of the S4D slots declared in src/tensor/slots/ssm/s4.h (entry points, CPU kernels and the
// equations: src/layers/ssm/s4.cpp, docs/variants/s4.md). Inputs are contiguous: u [B, T, H], log_dt [H],
// A, B, C [H, N2, 2], D [H] and initial_state [B, H, N2, 2] optional.
//
// The per-thread math is in src/cuda/ssm/s4_schedule.h as __host__ __device__ functions (which threads
// exist and what each writes is listed there); tests/s4_emulation_test.cc runs that exact schedule on the
// CPU against the CPU kernels. This file only launches it: the recurrent form one thread per (b, h)
// walking time, the convolution form its kernel per (h, j), its outputs per (b, h, t) and per (b, h, n),
// and the backward's per-mode gradients per (h, n), then per-channel sums per h. The diagonal-plus-low-rank form
// (P, Q [H, N2, 2] besides) runs one thread per channel h for the forward and one for the backward, each the
// CPU's per-channel DPLR code with its locals in a per-channel scratch slice. A simple, correct kernel
// set (GPU speed is not its aim): everything computes in double whatever the element type (f32, f64 and
// bf16 storage), deterministic (no atomics, every sum in a fixed order). Compiled for sm_80/sm_90; not yet
// run on a GPU (tests/s4_gpu_test.cc compares it with the CPU kernels there).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda/ssm/s4_schedule.h"
#include "tensor/slots/ssm/s4.h"

namespace seqlab::cuda {
namespace {

namespace sc = s4_cuda;

constexpr int kBlock = 128;

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_recurrent_fwd(sc::Dims d, sc::Inputs<T> in, double* ybuf, T* y, T* xT) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.B * d.H) sc::recurrent_forward(i, d, in, ybuf + i * d.T, y, xT);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_recurrent_bwd(sc::Dims d, sc::Inputs<T> in, const T* dy, const T* dfinal, sc::Cx* xs, double* dubuf,
                     double* partial, double* dd, T* du, T* dx0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.B * d.H) sc::recurrent_backward(i, d, in, dy, dfinal, xs + i * d.T, dubuf + i * d.T, partial, dd, du, dx0);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_recurrent_modes(sc::Dims d, sc::Inputs<T> in, const double* partial, double* ddt, T* dA, T* dB, T* dC) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.H * d.N2) sc::recurrent_mode_grads(i, d, in, partial, ddt, dA, dB, dC);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_channels(sc::Dims d, sc::Inputs<T> in, const T* dy, const double* ddt, const double* dd, T* dlog_dt, T* dD) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.H) sc::channel_grads(i, d, in, dy, ddt, dd, dlog_dt, dD);
}

template <class T>
__global__ void __launch_bounds__(kBlock) s4_conv_kernel(sc::Dims d, sc::Inputs<T> in, double* K) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.H * d.T) sc::conv_kernel(i, d, in, K);
}

template <class T>
__global__ void __launch_bounds__(kBlock) s4_conv_fwd(sc::Dims d, sc::Inputs<T> in, const double* K, T* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.B * d.H * d.T) sc::conv_forward(i, d, in, K, y);
}

template <class T>
__global__ void __launch_bounds__(kBlock) s4_conv_final(sc::Dims d, sc::Inputs<T> in, T* xT) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.B * d.H * d.N2) sc::conv_final_state(i, d, in, xT);
}

template <class T>
__global__ void __launch_bounds__(kBlock) s4_conv_dkernel(sc::Dims d, sc::Inputs<T> in, const T* dy, double* dK) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.H * d.T) sc::conv_dkernel(i, d, in, dy, dK);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_conv_du(sc::Dims d, sc::Inputs<T> in, const T* dy, const T* dfinal, const double* K, T* du) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.B * d.H * d.T) sc::conv_du(i, d, in, dy, dfinal, K, du);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_conv_modes(sc::Dims d, sc::Inputs<T> in, const T* dy, const T* dfinal, const double* dK, double* ddt, T* dA,
                  T* dB, T* dC, T* dx0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < d.H * d.N2) sc::conv_mode_grads(i, d, in, dy, dfinal, dK, ddt, dA, dB, dC, dx0);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_dplr_fwd(sc::Dims d, sc::DplrInputs<T> in, bool recurrent, sc::Cx* cwork, double* fwork, T* y, T* xT) {
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h < d.H) sc::dplr_forward(h, d, in, recurrent, cwork, fwork, y, xT);
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    s4_dplr_bwd(sc::Dims d, sc::DplrInputs<T> in, bool recurrent, const T* dy, const T* dfinal, sc::Cx* cwork,
                double* fwork, T* du, T* dlog_dt, T* dA, T* dP, T* dQ, T* dB, T* dC, T* dD, T* dx0) {
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h < d.H) {
    sc::dplr_backward(h, d, in, recurrent, dy, dfinal, cwork, fwork, du, dlog_dt, dA, dP, dQ, dB, dC, dD, dx0);
  }
}

void check_tensor(const Tensor& t, const Tensor& like, const char* op, const char* what) {
  if (!t.defined() || !t.is_contiguous() || t.dtype() != like.dtype() || !t.device().is_cuda() ||
      t.device() != like.device()) {
    throw std::logic_error(std::string(op) + " on CUDA: " + what + " must be a contiguous " +
                           dtype_name(like.dtype()) + " tensor on " + like.device().str() + ", got " +
                           (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) + " on " + t.device().str()
                                        : std::string("undefined")));
  }
}

sc::Dims dims_of(const Tensor& u, const Tensor& A, const kernel::S4Params& p) {
  return {u.size(0), u.size(1), u.size(2), A.size(1), p.disc == S4Discretisation::zoh};
}

template <class T>
const T* cptr_or_null(const Tensor& t) {
  return t.defined() ? cptr<T>(t) : nullptr;
}
template <class T>
T* mptr_or_null(const Tensor& t) {
  return t.defined() ? mptr<T>(t) : nullptr;
}

template <class T>
sc::Inputs<T> inputs_of(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
                        const Tensor& D, const Tensor& x0) {
  return {cptr<T>(u), cptr<T>(log_dt), cptr<T>(A), cptr<T>(B), cptr<T>(C), cptr_or_null<T>(D), cptr_or_null<T>(x0)};
}

Tensor scratch(int64_t n, const Tensor& like) { return Tensor::empty({std::max<int64_t>(n, 1)}, DType::f64, like.device()); }

void forward_cuda(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& B, const Tensor& C,
                  const Tensor& D, const Tensor& x0, const kernel::S4Params& p, const Tensor& y, const Tensor& xT) {
  for (auto [t, what] : {std::pair{&u, "u"}, {&log_dt, "log_dt"}, {&A, "A"}, {&B, "B"}, {&C, "C"}, {&y, "y"},
                         {&xT, "final_state"}}) {
    check_tensor(*t, u, "s4", what);
  }
  if (D.defined()) check_tensor(D, u, "s4", "D");
  if (x0.defined()) check_tensor(x0, u, "s4", "initial_state");
  const sc::Dims d = dims_of(u, A, p);
  if (d.B * d.H == 0) return;
  dispatch_floating(u.dtype(), "s4", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const sc::Inputs<T> in = inputs_of<T>(u, log_dt, A, B, C, D, x0);
    const int device = u.device().index;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    if (p.form == S4Form::recurrent) {
      // Scratch returned to the allocator's cache at exit: safe, later users queue on the same stream.
      Tensor ybuf = scratch(d.B * d.H * d.T, u);
      s4_recurrent_fwd<T><<<blocks_of(d.B * d.H), kBlock, 0, st>>>(d, in, mptr<double>(ybuf), mptr<T>(y), mptr<T>(xT));
      SEQLAB_CUDA_CHECK_LAUNCH("s4 recurrent forward kernel");
    } else {
      Tensor K = scratch(d.H * d.T, u);
      if (d.T > 0) {  // no empty grids: a launch of zero blocks is an error
        s4_conv_kernel<T><<<blocks_of(d.H * d.T), kBlock, 0, st>>>(d, in, mptr<double>(K));
        SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution kernel kernel");
        s4_conv_fwd<T><<<blocks_of(d.B * d.H * d.T), kBlock, 0, st>>>(d, in, cptr<double>(K), mptr<T>(y));
        SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution forward kernel");
      }
      s4_conv_final<T><<<blocks_of(d.B * d.H * d.N2), kBlock, 0, st>>>(d, in, mptr<T>(xT));
      SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution final state kernel");
    }
  });
}

void backward_cuda(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                   const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& x0, const kernel::S4Params& p,
                   const kernel::S4Grads& g) {
  for (auto [t, what] : {std::pair{&dy, "dy"}, {&dfinal, "dfinal"}, {&u, "u"}, {&log_dt, "log_dt"}, {&A, "A"},
                         {&B, "B"}, {&C, "C"}, {&g.du, "du"}, {&g.dlog_dt, "dlog_dt"}, {&g.dA, "dA"}, {&g.dB, "dB"},
                         {&g.dC, "dC"}}) {
    check_tensor(*t, u, "s4 backward", what);
  }
  for (auto [t, what] : {std::pair{&D, "D"}, {&x0, "initial_state"}, {&g.dD, "dD"}, {&g.dinitial_state, "dinitial_state"}}) {
    if (t->defined()) check_tensor(*t, u, "s4 backward", what);
  }
  const sc::Dims d = dims_of(u, A, p);
  if (d.H * d.N2 == 0) return;
  dispatch_floating(u.dtype(), "s4 backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const sc::Inputs<T> in = inputs_of<T>(u, log_dt, A, B, C, D, x0);
    const int device = u.device().index;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    Tensor ddt = scratch(d.H * d.N2, u);
    T* dx0 = mptr_or_null<T>(g.dinitial_state);
    if (p.form == S4Form::recurrent) {
      Tensor xs = scratch(2 * d.B * d.H * d.T, u), dubuf = scratch(d.B * d.H * d.T, u);
      Tensor partial = scratch(6 * d.B * d.H * d.N2, u), dd = scratch(d.B * d.H, u);
      if (d.B > 0) {  // with no batch entries the partial sums below are empty (zero)
        s4_recurrent_bwd<T><<<blocks_of(d.B * d.H), kBlock, 0, st>>>(
            d, in, cptr<T>(dy), cptr<T>(dfinal), reinterpret_cast<sc::Cx*>(mptr<double>(xs)), mptr<double>(dubuf),
            mptr<double>(partial), mptr<double>(dd), mptr<T>(g.du), dx0);
        SEQLAB_CUDA_CHECK_LAUNCH("s4 recurrent backward kernel");
      }
      s4_recurrent_modes<T><<<blocks_of(d.H * d.N2), kBlock, 0, st>>>(d, in, cptr<double>(partial), mptr<double>(ddt),
                                                                      mptr<T>(g.dA), mptr<T>(g.dB), mptr<T>(g.dC));
      SEQLAB_CUDA_CHECK_LAUNCH("s4 recurrent mode gradients kernel");
      s4_channels<T><<<blocks_of(d.H), kBlock, 0, st>>>(d, in, cptr<T>(dy), cptr<double>(ddt), cptr<double>(dd),
                                                        mptr<T>(g.dlog_dt), mptr_or_null<T>(g.dD));
      SEQLAB_CUDA_CHECK_LAUNCH("s4 channel gradients kernel");
    } else {
      Tensor K = scratch(d.H * d.T, u), dK = scratch(d.H * d.T, u);
      if (d.T > 0) {
        s4_conv_kernel<T><<<blocks_of(d.H * d.T), kBlock, 0, st>>>(d, in, mptr<double>(K));
        SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution kernel kernel");
        s4_conv_dkernel<T><<<blocks_of(d.H * d.T), kBlock, 0, st>>>(d, in, cptr<T>(dy), mptr<double>(dK));
        SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution kernel gradient kernel");
      }
      if (d.B * d.T > 0) {
        s4_conv_du<T><<<blocks_of(d.B * d.H * d.T), kBlock, 0, st>>>(d, in, cptr<T>(dy), cptr<T>(dfinal),
                                                                      cptr<double>(K), mptr<T>(g.du));
        SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution du kernel");
      }
      s4_conv_modes<T><<<blocks_of(d.H * d.N2), kBlock, 0, st>>>(d, in, cptr<T>(dy), cptr<T>(dfinal), cptr<double>(dK),
                                                                 mptr<double>(ddt), mptr<T>(g.dA), mptr<T>(g.dB),
                                                                 mptr<T>(g.dC), dx0);
      SEQLAB_CUDA_CHECK_LAUNCH("s4 convolution mode gradients kernel");
      s4_channels<T><<<blocks_of(d.H), kBlock, 0, st>>>(d, in, cptr<T>(dy), cptr<double>(ddt), nullptr,
                                                        mptr<T>(g.dlog_dt), mptr_or_null<T>(g.dD));
      SEQLAB_CUDA_CHECK_LAUNCH("s4 channel gradients kernel");
    }
  });
}

// ---- diagonal-plus-low-rank form: one thread per channel, forward and backward (s4_schedule.h) ----

template <class T>
sc::DplrInputs<T> dplr_inputs_of(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P,
                                 const Tensor& Q, const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& x0) {
  return {cptr<T>(u), cptr<T>(log_dt), cptr<T>(A), cptr<T>(P), cptr<T>(Q), cptr<T>(B), cptr<T>(C),
          cptr_or_null<T>(D), cptr_or_null<T>(x0)};
}

void dplr_forward_cuda(const Tensor& u, const Tensor& log_dt, const Tensor& A, const Tensor& P, const Tensor& Q,
                       const Tensor& B, const Tensor& C, const Tensor& D, const Tensor& x0, const kernel::S4Params& p,
                       const Tensor& y, const Tensor& xT) {
  for (auto [t, what] : {std::pair{&u, "u"}, {&log_dt, "log_dt"}, {&A, "A"}, {&P, "P"}, {&Q, "Q"}, {&B, "B"},
                         {&C, "C"}, {&y, "y"}, {&xT, "final_state"}}) {
    check_tensor(*t, u, "s4", what);
  }
  if (D.defined()) check_tensor(D, u, "s4", "D");
  if (x0.defined()) check_tensor(x0, u, "s4", "initial_state");
  const sc::Dims d = dims_of(u, A, p);
  if (d.H == 0) return;
  dispatch_floating(u.dtype(), "s4", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int device = u.device().index;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    Tensor cwork = scratch(2 * d.H * sc::dplr_work_cx(d), u), fwork = scratch(d.H * sc::dplr_work_f64(d), u);
    s4_dplr_fwd<T><<<blocks_of(d.H), kBlock, 0, st>>>(d, dplr_inputs_of<T>(u, log_dt, A, P, Q, B, C, D, x0),
                                                      p.form == S4Form::recurrent,
                                                      reinterpret_cast<sc::Cx*>(mptr<double>(cwork)),
                                                      mptr<double>(fwork), mptr<T>(y), mptr<T>(xT));
    SEQLAB_CUDA_CHECK_LAUNCH("s4 diagonal-plus-low-rank forward kernel");
  });
}

void dplr_backward_cuda(const Tensor& dy, const Tensor& dfinal, const Tensor& u, const Tensor& log_dt, const Tensor& A,
                        const Tensor& P, const Tensor& Q, const Tensor& B, const Tensor& C, const Tensor& D,
                        const Tensor& x0, const kernel::S4Params& p, const kernel::S4DplrGrads& g) {
  for (auto [t, what] : {std::pair{&dy, "dy"}, {&dfinal, "dfinal"}, {&u, "u"}, {&log_dt, "log_dt"}, {&A, "A"},
                         {&P, "P"}, {&Q, "Q"}, {&B, "B"}, {&C, "C"}, {&g.du, "du"}, {&g.dlog_dt, "dlog_dt"},
                         {&g.dA, "dA"}, {&g.dP, "dP"}, {&g.dQ, "dQ"}, {&g.dB, "dB"}, {&g.dC, "dC"}}) {
    check_tensor(*t, u, "s4 backward", what);
  }
  for (auto [t, what] : {std::pair{&D, "D"}, {&x0, "initial_state"}, {&g.dD, "dD"}, {&g.dinitial_state, "dinitial_state"}}) {
    if (t->defined()) check_tensor(*t, u, "s4 backward", what);
  }
  const sc::Dims d = dims_of(u, A, p);
  if (d.H == 0) return;
  dispatch_floating(u.dtype(), "s4 backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int device = u.device().index;
    DeviceGuard guard(device);
    cudaStream_t st = stream(device);
    Tensor cwork = scratch(2 * d.H * sc::dplr_work_cx(d), u), fwork = scratch(d.H * sc::dplr_work_f64(d), u);
    s4_dplr_bwd<T><<<blocks_of(d.H), kBlock, 0, st>>>(
        d, dplr_inputs_of<T>(u, log_dt, A, P, Q, B, C, D, x0), p.form == S4Form::recurrent, cptr<T>(dy),
        cptr<T>(dfinal), reinterpret_cast<sc::Cx*>(mptr<double>(cwork)), mptr<double>(fwork), mptr<T>(g.du),
        mptr<T>(g.dlog_dt), mptr<T>(g.dA), mptr<T>(g.dP), mptr<T>(g.dQ), mptr<T>(g.dB), mptr<T>(g.dC),
        mptr_or_null<T>(g.dD), mptr_or_null<T>(g.dinitial_state));
    SEQLAB_CUDA_CHECK_LAUNCH("s4 diagonal-plus-low-rank backward kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(s4_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(s4_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
SEQLAB_REGISTER_KERNEL(s4_dplr_forward_kernel, DeviceType::CUDA, &cuda::dplr_forward_cuda);
SEQLAB_REGISTER_KERNEL(s4_dplr_backward_kernel, DeviceType::CUDA, &cuda::dplr_backward_cuda);
}  // namespace seqlab::kernel
