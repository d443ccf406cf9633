// bf16 GEMM through oneDNN's matmul primitive (see gemm_onednn.h).
//
// C_i = α op(A_i) op(B_i) + β C_i for i < batch, with A and B bf16 and C bf16 or f32: oneDNN's kernels
// multiply bf16 pairs into f32 sums (vdpbf16ps: two products per f32 lane per instruction), scale by α
// (an output scale), add β C (a sum post-op) in f32 and round to C's type once, as the widened path
// and the CUDA backend do. Only the order of the f32 additions differs from them.
//
// oneDNN describes each operand by dims and strides, so transposes, leading dimensions and batch
// strides need no copies: op(A) is [batch, m, k] with strides [stride_a, lda, 1], or [stride_a, 1, lda]
// when A is stored transposed; a batch stride of 0 (one matrix shared by every batch entry) becomes a
// batch dimension of 1, which oneDNN broadcasts. Building a primitive (picking and JIT-compiling a
// kernel for the shape) costs far more than a small GEMM, so each thread keeps the primitives it has
// built, keyed by everything that shapes them. oneDNN's OpenMP runtime is the one our kernels use
// (libgomp): its kernels run on the OpenMP team, or on the calling thread inside a parallel region.
#include "tensor/cpu/gemm_onednn.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#ifdef SEQLAB_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace seqlab::cpu {
namespace {

// 1 once the widened path is forced (by the environment or kernel::set_cpu_bf16_gemm_widened).
std::atomic<int> force_widened{-1};

#ifdef SEQLAB_HAVE_ONEDNN

bool widened_forced() {
  int f = force_widened.load(std::memory_order_relaxed);
  if (f < 0) {
    const char* env = std::getenv("SEQLAB_CPU_BF16_GEMM");
    f = env != nullptr && std::strcmp(env, "widened") == 0 ? 1 : 0;
    force_widened.store(f, std::memory_order_relaxed);
  }
  return f == 1;
}

// oneDNN's instruction sets are bit masks, each including the ones below it.
bool isa_has_bf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16_isa = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16_isa) == bf16_isa;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Everything that shapes a primitive: layout flags, sizes, leading dimensions, batch strides (0 or
// not, and their values), α and β (as bits), and C's type.
using Key = std::array<int64_t, 15>;

Key key_of(const kernel::GemmArgs& g) {
  uint64_t alpha_bits, beta_bits;
  std::memcpy(&alpha_bits, &g.alpha, sizeof alpha_bits);
  std::memcpy(&beta_bits, &g.beta, sizeof beta_bits);
  return {g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c,
          static_cast<int64_t>(alpha_bits), static_cast<int64_t>(beta_bits), g.c_is_f32};
}

// op(X) as [batch, rows, cols] (or [rows, cols] for a single product): row-major with leading
// dimension ld, or stored transposed.
dnnl::memory::desc operand(dnnl::memory::data_type type, int64_t batch, int64_t batch_stride, int64_t rows,
                           int64_t cols, int64_t ld, bool transposed) {
  const int64_t row_stride = transposed ? 1 : ld, col_stride = transposed ? ld : 1;
  if (batch == 1) return dnnl::memory::desc({rows, cols}, type, {row_stride, col_stride});
  const int64_t b = batch_stride == 0 ? 1 : batch;
  return dnnl::memory::desc({b, rows, cols}, type, {batch_stride == 0 ? 0 : batch_stride, row_stride, col_stride});
}

// A built primitive, memory objects of its operands' layouts (pointed at each call's data: creating
// them per call cost a fifth of a small bf16 GEMM's time) and its argument map.
struct Built {
  dnnl::matmul matmul;
  dnnl::memory a, b, c;
  std::unordered_map<int, dnnl::memory> args;
};

// The primitive for g's shape, or nullopt when oneDNN has only its reference (scalar) kernel for it.
std::optional<Built> build(const kernel::GemmArgs& g) {
  using dt = dnnl::memory::data_type;
  const auto a = operand(dt::bf16, g.batch, g.stride_a, g.m, g.k, g.lda, g.trans_a);
  const auto b = operand(dt::bf16, g.batch, g.stride_b, g.k, g.n, g.ldb, g.trans_b);
  const auto c = operand(g.c_is_f32 ? dt::f32 : dt::bf16, g.batch, g.stride_c, g.m, g.n, g.ldc, false);
  dnnl::primitive_attr attr;
  if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
  if (g.beta != 0.0) {
    dnnl::post_ops ops;
    ops.append_sum(static_cast<float>(g.beta));
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return std::nullopt;
    const dnnl::engine& e = cpu_engine();
    Built built{dnnl::matmul(pd), dnnl::memory(a, e, DNNL_MEMORY_NONE), dnnl::memory(b, e, DNNL_MEMORY_NONE),
                dnnl::memory(c, e, DNNL_MEMORY_NONE), {}};
    built.args = {{DNNL_ARG_SRC, built.a}, {DNNL_ARG_WEIGHTS, built.b}, {DNNL_ARG_DST, built.c}};
    return built;
  } catch (const dnnl::error&) {
    return std::nullopt;  // a layout oneDNN does not take (e.g. a stride it cannot express)
  }
}

// At most this many primitives per thread; past it the cache starts again (shapes in a training
// step number in the tens).
constexpr size_t kMaxCached = 4096;

#endif  // SEQLAB_HAVE_ONEDNN

}  // namespace

bool bf16_gemm_native() {
#ifdef SEQLAB_HAVE_ONEDNN
  static const bool hardware = isa_has_bf16();
  return hardware && !widened_forced();
#else
  return false;
#endif
}

bool onednn_bf16_gemm(const kernel::GemmArgs& g) {
#ifdef SEQLAB_HAVE_ONEDNN
  thread_local std::map<Key, std::optional<Built>> cache;
  thread_local dnnl::stream stream(cpu_engine());
  const Key key = key_of(g);
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCached) cache.clear();
    it = cache.emplace(key, build(g)).first;
  }
  if (!it->second) return false;
  Built& built = *it->second;
  built.a.set_data_handle(const_cast<void*>(g.a));
  built.b.set_data_handle(const_cast<void*>(g.b));
  built.c.set_data_handle(g.c);
  built.matmul.execute(stream, built.args);
  stream.wait();
  return true;
#else
  (void)g;
  return false;
#endif
}

std::string onednn_config() {
#ifdef SEQLAB_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  std::string s = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch);
  if (!isa_has_bf16()) return s + "; bf16 GEMM widened to f32 (the CPU has no AVX512-BF16 or AMX)";
  if (widened_forced()) return s + "; bf16 GEMM widened to f32 (forced)";
  return s + "; bf16 GEMM on AVX512-BF16/AMX";
#else
  return "no oneDNN in this build; bf16 GEMM widened to f32";
#endif
}

}  // namespace seqlab::cpu

namespace seqlab::kernel {

void set_cpu_bf16_gemm_widened(bool widened) { cpu::force_widened.store(widened ? 1 : 0); }
bool cpu_bf16_gemm_native() { return cpu::bf16_gemm_native(); }
std::string cpu_bf16_gemm_config() {
  if (!cpu::bf16_gemm_native()) return cpu::onednn_config();
  return cpu::onednn_config() + (cpu_bf16_gemm_tiles() ? "; small products with f32 sums on seqlab's tile kernel"
                                                       : "; every product through oneDNN");
}

}  // namespace seqlab::kernel
