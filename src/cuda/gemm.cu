// CUDA GEMM: the CUDA side of gemm_kernel (src/tensor/kernels.h), computing what the CPU's
// src/tensor/cpu/gemm.cpp computes:
//
//   C[i] = α · op(A[i]) · op(B[i]) + β · C[i]   for i < batch,
//
// row-major, with leading dimensions lda, ldb, ldc and element strides between batch entries (0 reuses
// one matrix). f32 and bf16 go through cublasLtMatmul with CUBLAS_COMPUTE_32F (bf16 operands and
// result, f32 accumulation and f32 α, β); f64 through cublasDgemmStridedBatched.
//
// Row-major onto column-major. cuBLAS reads a row-major r×c matrix with leading dimension ld as the
// column-major c×r matrix (its transpose) with the same ld, so instead of C = op(A) op(B) we ask it
// for Cᵀ = op(B)ᵀ op(A)ᵀ: cuBLAS's first operand is our B, its second our A, its m×n result is our
// n×m (row-major m×n) C, and each operand keeps its own transpose flag. The layouts below describe the
// matrices as stored (before the op): B is n×k column-major (k×n when trans_b), A is k×m (m×k when
// trans_a), C is n×m.
//
// linear_kernel's slot is here too: one cublasLtMatmul whose epilogue adds a linear layer's bias and, in
// bf16, applies GELU (Epilogue below): no pass to copy the bias into C first, none for the GELU over the
// MLP's widest activation.
//
// TF32 stays off (CUBLAS_COMPUTE_32F, never _FAST_TF32), so f32 results match the CPU to 1e-5.
// β = 0 means C is not read (as in BLAS): NaN in an uninitialised output does not propagate.
//
// Handles: one cuBLASLt and one cuBLAS handle per device, created on first use with that device
// current and never destroyed (like the streams: tensors may be freed during static destruction).
// Both work on cuda::stream(device) and share one fixed 32 MiB workspace per device, which is safe
// because everything on the device is serialised on that one stream. cuBLASLt's heuristic is asked once
// per distinct call (shapes, layouts, alignments, epilogue) and its answer kept with the handles.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/runtime.h"
#include "tensor/kernels.h"

namespace seqlab::cuda {

// Throws std::runtime_error naming the cuBLAS call, file:line and the library's status string.
[[noreturn]] static void cublas_fail(cublasStatus_t status, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLAS error: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
}
static inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) cublas_fail(status, call, file, line);
}

}  // namespace seqlab::cuda

#define SEQLAB_CUBLAS_CHECK(call) ::seqlab::cuda::cublas_check((call), #call, __FILE__, __LINE__)

namespace seqlab::cuda {
namespace {

using kernel::GemmArgs;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper; ample for Ampere
constexpr int64_t kMaxBatch = INT32_MAX;              // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT is an int32_t

// What decides cuBLASLt's choice of algorithm for a call: dtype, transposes, m, n, k, leading dimensions,
// batch and strides, whether C is read (β ≠ 0), the operands' alignments, and the epilogue with its
// pointers' alignments.
using AlgoKey = std::array<int64_t, 20>;
// The heuristic's answer for one key (found = 0: none).
struct AlgoChoice {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  int found = 0;
  cublasLtMatmulHeuristicResult_t result{};
};

struct Handles {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  // cuBLASLt's choices so far: the heuristic is asked once per distinct call, as it costs more host time
  // than a small GEMM takes on the GPU (and a training step repeats the same few dozen calls).
  std::mutex algo_mutex;
  std::map<AlgoKey, AlgoChoice> algos;
};

// The handles of `device`, created on first use.
Handles& handles(int device) {
  static std::mutex mutex;
  static auto* table = new std::map<int, Handles*>;  // never destroyed, see the top of the file
  std::lock_guard<std::mutex> lock(mutex);
  auto it = table->find(device);
  if (it != table->end()) return *it->second;
  cudaStream_t s = stream(device);
  DeviceGuard guard(device);
  auto h = std::make_unique<Handles>();
  SEQLAB_CUBLAS_CHECK(cublasLtCreate(&h->lt));
  SEQLAB_CUBLAS_CHECK(cublasCreate(&h->blas));
  SEQLAB_CUDA_CHECK(cudaMalloc(&h->workspace, kWorkspaceBytes));
  // cublasSetStream resets the handle's workspace to its default pool: set the stream first.
  SEQLAB_CUBLAS_CHECK(cublasSetStream(h->blas, s));
  SEQLAB_CUBLAS_CHECK(cublasSetWorkspace(h->blas, h->workspace, kWorkspaceBytes));
  SEQLAB_CUBLAS_CHECK(cublasSetMathMode(h->blas, CUBLAS_DEFAULT_MATH));
  Handles* created = h.release();
  (*table)[device] = created;
  return *created;
}

// Descriptors released on every path out of a call, including a throwing check.
struct LtLayout {
  cublasLtMatrixLayout_t h = nullptr;
  ~LtLayout() {
    if (h) cublasLtMatrixLayoutDestroy(h);
  }
};
struct LtMatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  ~LtMatmulDesc() {
    if (h) cublasLtMatmulDescDestroy(h);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t h = nullptr;
  ~LtPreference() {
    if (h) cublasLtMatmulPreferenceDestroy(h);
  }
};

size_t element_size(DType d) {
  switch (d) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    default:
      break;
  }
  throw std::invalid_argument(std::string("matmul on CUDA supports f32, f64 and bf16, got ") + dtype_name(d));
}

// The largest power of two (at most 256) dividing the address of every batch entry of an operand:
// cuBLASLt's heuristic assumes 256-byte-aligned operands unless told otherwise.
uint32_t alignment(const void* p, int64_t stride_elems, int64_t batch, size_t elem_size) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elems) * elem_size;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

// A stored column-major rows×cols matrix with leading dimension ld, repeated `batch` times `stride`
// elements apart.
void make_layout(LtLayout& layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  SEQLAB_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout.h, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  const int32_t count = static_cast<int32_t>(batch);
  SEQLAB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  SEQLAB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

std::string describe(const GemmArgs& g) {
  return std::string(dtype_name(g.dtype)) + " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
         " k=" + std::to_string(g.k) + " batch=" + std::to_string(g.batch) + " trans_a=" + std::to_string(g.trans_a) +
         " trans_b=" + std::to_string(g.trans_b) + " lda=" + std::to_string(g.lda) + " ldb=" + std::to_string(g.ldb) +
         " ldc=" + std::to_string(g.ldc);
}

// The epilogue of linear_kernel: cuBLASLt adds the bias to the f32 accumulator (and applies GELU to the
// sum) before it rounds into C: with GELU, gelu_input = α·op(A)·op(B) + bias (bias[j] added to every
// row's column j) is stored too and C = gelu(gelu_input); without, C = α·op(A)·op(B) + bias. cuBLASLt's
// bias is "one value per row of D", and its D is our C transposed (see the top of the file), so its rows
// are our columns: bias has n elements.
struct Epilogue {
  const void* bias = nullptr;  // [n], C's dtype, or null for none
  void* gelu_input = nullptr;  // null: no GELU; else laid out as C (ldc, which must be a multiple of 8)
  cublasLtEpilogue_t kind() const {
    if (gelu_input != nullptr) return bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    return bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
};

// f32 or bf16 through cuBLASLt, with `epilogue` when given; g.batch ≤ kMaxBatch, strides non-negative,
// C entries disjoint (with an epilogue: batch 1, β = 0). Returns false, having launched
// nothing, when cuBLASLt offers no algorithm for the call; `why` (if given) then says what was asked.
bool gemm_lt(const GemmArgs& g, int device, const Epilogue* epilogue, std::string* why) {
  Handles& h = handles(device);
  const bool bf16 = g.dtype == DType::bf16;
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const size_t es = bf16 ? 2 : 4;
  const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);

  LtMatmulDesc desc;
  SEQLAB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // cuBLAS's A is our B
  const int32_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's B is our A
  SEQLAB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  SEQLAB_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  if (epilogue != nullptr) {
    const uint32_t kind = epilogue->kind();
    SEQLAB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
    if (epilogue->bias != nullptr) {
      const int32_t bias_type = type;
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue->bias,
                                                         sizeof(epilogue->bias)));
      SEQLAB_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (epilogue->gelu_input != nullptr) {
      const int64_t ld = g.ldc;
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                         &epilogue->gelu_input, sizeof(epilogue->gelu_input)));
      SEQLAB_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
  }

  LtLayout first, second, out;
  make_layout(first, type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch, g.stride_b);
  make_layout(second, type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch, g.stride_a);
  make_layout(out, type, g.n, g.m, g.ldc, g.batch, g.stride_c);  // C and D: the same matrix, in place

  const uint32_t align_first = alignment(g.b, g.stride_b, g.batch, es);
  const uint32_t align_second = alignment(g.a, g.stride_a, g.batch, es);
  const uint32_t align_out = alignment(g.c, g.stride_c, g.batch, es);
  const Epilogue none;
  const Epilogue& e = epilogue != nullptr ? *epilogue : none;
  // clang-format off
  const AlgoKey key{static_cast<int64_t>(g.dtype), g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch,
                    g.stride_a, g.stride_b, g.stride_c, g.beta != 0.0, align_first, align_second, align_out, e.kind(),
                    e.bias != nullptr ? alignment(e.bias, 0, 1, es) : 0,
                    e.gelu_input != nullptr ? alignment(e.gelu_input, 0, 1, es) : 0};
  // clang-format on

  DeviceGuard guard(device);
  AlgoChoice choice;
  {
    std::lock_guard<std::mutex> lock(h.algo_mutex);
    auto it = h.algos.find(key);
    if (it != h.algos.end()) {
      choice = it->second;
    } else {
      // The workspace on offer and the operands' real alignments (see alignment()).
      LtPreference pref;
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
      const uint64_t workspace = kWorkspaceBytes;
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace, sizeof(workspace)));
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                               &align_first, sizeof(align_first)));
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                               &align_second, sizeof(align_second)));
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                               &align_out, sizeof(align_out)));
      SEQLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                               &align_out, sizeof(align_out)));
      choice.status = cublasLtMatmulAlgoGetHeuristic(h.lt, desc.h, first.h, second.h, out.h, out.h, pref.h, 1,
                                                     &choice.result, &choice.found);
      h.algos.emplace(key, choice);
    }
  }
  const cublasStatus_t status = choice.status;
  const cublasLtMatmulHeuristicResult_t& result = choice.result;
  if (status != CUBLAS_STATUS_SUCCESS || choice.found == 0) {
    if (why != nullptr) {
      *why = "cuBLAS error: cublasLtMatmulAlgoGetHeuristic found no algorithm for " + describe(g) +
             (epilogue != nullptr ? " with epilogue " + std::to_string(e.kind()) : std::string()) +
             " (alignment of B, A, C: " + std::to_string(align_first) + ", " + std::to_string(align_second) + ", " +
             std::to_string(align_out) + " bytes): " + cublasGetStatusName(status) + " (" +
             cublasGetStatusString(status) + ")";
    }
    return false;
  }
  SEQLAB_CUBLAS_CHECK(cublasLtMatmul(h.lt, desc.h, &alpha, g.b, first.h, g.a, second.h, &beta, g.c, out.h, g.c, out.h,
                                     &result.algo, h.workspace, kWorkspaceBytes, stream(device)));
  return true;
}

// f64 through cuBLAS; same preconditions as gemm_lt.
void gemm_f64(const GemmArgs& g, int device) {
  Handles& h = handles(device);
  DeviceGuard guard(device);
  const double alpha = g.alpha, beta = g.beta;
  SEQLAB_CUBLAS_CHECK(cublasDgemmStridedBatched_64(
      h.blas, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, &alpha,
      static_cast<const double*>(g.b), g.ldb, g.stride_b, static_cast<const double*>(g.a), g.lda, g.stride_a, &beta,
      static_cast<double*>(g.c), g.ldc, g.stride_c, g.batch));
}

// C = β · C over the m×n entries of one row-major matrix (k = 0: the product is empty). β = 0 writes
// zeros without reading C, as BLAS does. One thread per element in a grid-stride loop over m·n.
template <class T>
__global__ void scale_rows_kernel(T* c, int64_t m, int64_t n, int64_t ldc, float beta_f, double beta_d) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    T* p = c + (i / n) * ldc + i % n;
    if constexpr (std::is_same_v<T, double>) {
      *p = beta_d == 0.0 ? 0.0 : beta_d * *p;
    } else if constexpr (std::is_same_v<T, float>) {
      *p = beta_f == 0.0f ? 0.0f : beta_f * *p;
    } else {
      *p = __float2bfloat16(beta_f == 0.0f ? 0.0f : beta_f * __bfloat162float(*p));
    }
  }
}

template <class T>
void scale_c(const GemmArgs& g, int device, size_t es) {
  DeviceGuard guard(device);
  const int64_t total = g.m * g.n;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, int64_t{4} * multiprocessor_count(device));
  for (int64_t i = 0; i < g.batch; ++i) {
    T* c = reinterpret_cast<T*>(static_cast<char*>(g.c) + i * g.stride_c * static_cast<int64_t>(es));
    scale_rows_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream(device)>>>(
        c, g.m, g.n, g.ldc, static_cast<float>(g.beta), g.beta);
    SEQLAB_CUDA_CHECK_LAUNCH("scale_rows_kernel (gemm with k = 0)");
  }
}

void run(const GemmArgs& g, int device) {
  if (g.dtype == DType::f64) {
    gemm_f64(g, device);
  } else {
    std::string why;
    if (!gemm_lt(g, device, nullptr, &why)) throw std::runtime_error(why);
  }
}

void gemm_cuda(const GemmArgs& g, Device device) {
  const size_t es = element_size(g.dtype);  // throws for a non-floating dtype, as the CPU does
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return;
  if (g.k <= 0) {
    if (g.beta == 1.0) return;
    // Sequential batch entries sharing one C (stride 0) each scale it again: β^batch, as on the CPU.
    switch (g.dtype) {
      case DType::f64:
        return scale_c<double>(g, device.index, es);
      case DType::f32:
        return scale_c<float>(g, device.index, es);
      default:
        return scale_c<__nv_bfloat16>(g, device.index, es);
    }
  }
  // One batched call needs non-negative strides and disjoint C entries. Otherwise (e.g. stride_c = 0:
  // every entry accumulates into one C) the entries run one after another on the stream, in order,
  // which is what the CPU's loop over batch entries computes.
  const int64_t c_extent = (g.m - 1) * g.ldc + g.n;
  const bool batched = g.batch == 1 || (g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= c_extent);
  const int64_t step = batched ? kMaxBatch : 1;
  const int64_t bytes = static_cast<int64_t>(es);
  for (int64_t i0 = 0; i0 < g.batch; i0 += step) {
    GemmArgs part = g;
    part.batch = std::min(step, g.batch - i0);
    part.a = static_cast<const char*>(g.a) + i0 * g.stride_a * bytes;
    part.b = static_cast<const char*>(g.b) + i0 * g.stride_b * bytes;
    part.c = static_cast<char*>(g.c) + i0 * g.stride_c * bytes;
    if (part.batch == 1) part.stride_a = part.stride_b = part.stride_c = 0;
    run(part, device.index);
  }
}

// linear_kernel: one cuBLASLt call whose epilogue adds the bias (f32, bf16) and, in bf16, applies GELU;
// otherwise, or where cuBLASLt has no algorithm for it, the unfused steps (GEMM onto the bias, then the
// elementwise GELU kernel). f32 keeps the elementwise GELU: f32 is the precision the GPU tests hold to
// 1e-5 of the CPU, and how exactly the epilogue evaluates tanh is not documented; in bf16 the rounding
// of the outputs (2⁻⁸ relative) is what dominates. f64 goes through cuBLAS, which has no epilogues.
void linear_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, kernel::Activation act, const Tensor& pre,
                 const Tensor& y) {
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const bool gelu = act == kernel::Activation::gelu;
  const bool fused = in > 0 && (gelu ? x.dtype() == DType::bf16 && out % 8 == 0  // the GELU input's ld % 8 == 0
                                     : bias.defined() && x.dtype() != DType::f64);
  if (fused) {
    GemmArgs g;
    g.dtype = x.dtype();
    g.trans_b = true;  // y = x Wᵀ
    g.m = rows;
    g.n = out;
    g.k = in;
    g.a = x.raw_data();
    g.lda = in;
    g.b = weight.raw_data();
    g.ldb = in;
    g.c = y.raw_data();
    g.ldc = out;
    const Epilogue epilogue{bias.defined() ? bias.raw_data() : nullptr, gelu ? pre.raw_data() : nullptr};
    if (gemm_lt(g, x.device().index, &epilogue, nullptr)) return;
  }
  kernel::linear_unfused(x, weight, bias, act, pre, y);
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(gemm_kernel, DeviceType::CUDA, &cuda::gemm_cuda);
SEQLAB_REGISTER_KERNEL(linear_kernel, DeviceType::CUDA, &cuda::linear_cuda);
}  // namespace seqlab::kernel
