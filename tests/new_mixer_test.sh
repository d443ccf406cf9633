#!/usr/bin/env bash
# Adding a mixer edits no existing file (docs/design.md, "Adding a variant"): the acceptance criterion
# "adding a throwaway mixer in a scratch copy needs no edit to any existing file but the generated
# docs/recipes.md", shown on every run.
#
#   1. copies the tracked files of this tree (git ls-files; not build/, runs/ or data/cache/) into a
#      scratch folder, and commits them there in a git repository of its own;
#   2. adds, as new files only, a complete mixer room exactly as "Adding a variant" lists it: family toy/,
#      op toy_mix, the causal running mean y_t = (1/(t+1)) Σ_{s≤t} v_s per head, continuing a running sum
#      and count (initial and final state, a decode step), with its slot header, op (CPU kernels of two
#      forms, hand-derived backward, op-registry entry), mixer registration (recurrent, causal, and no
#      sequence-parallel form), CUDA kernels, CPU, emulation and GPU tests, NumPy reference, doc page
#      and recipe (the heredocs below);
#   3. regenerates docs/recipes.md with the copy's own binary (`seqlab recipe --doc`);
#   4. configures and builds the copy as the build that runs this test is configured (its CMakeCache.txt,
#      beside the binary given: compiler, build type, sanitizers, CUDA), through ccache (CMakeLists sets
#      CCACHE_BASEDIR to the tree, so the copy hits the cache for every file it shares with this tree),
#      and runs there the tests that cover every registered mixer or op (mixer_test: names, traits,
#      parameter and state sizes; decoder_test: decoding, causality and float64 gradients of every mixer;
#      recipe_test: docs/recipes.md and the recipes; sequence_parallel_test: the mixers that declare it;
#      op_gradcheck_test and op_hostile_test: every op; model_kinds_test: causal mixers refused by an
#      encoder; layering_test.py: the includes of the new files), the toy room's own tests, its NumPy
#      reference through the op runner, and 20 training steps of its recipe (the loss falls) and a sample;
#   5. checks with `git status --porcelain` in the copy that the only tracked file changed is
#      docs/recipes.md, and that every other change is one of the files added in step 2;
#   6. checks that `seqlab recipe check` refuses the toy recipe with parallel.sp = 2, on the command line
#      and in the file, in one line naming the mixer, and accepts it with parallel.sp = 1.
# A room that needed an edit elsewhere would fail here: an existing test with a hand-kept list of mixers
# or ops, a central switch, a missing registration.
# Run time on the 2-core development machine, ccache warm for the tree: about 40 s when the room's own
# objects are cached too, 1 minute when they are not (its seven files compile, nvcc's among them); in the
# ASan build of scripts/sanitize.sh, which runs it again, 1.5 to 2.5 minutes. Every run recompiles
# mixer_test.cc and recipe_test.cc, whose generated source_dir.h names the copy's (random) folder; the
# rest hits ccache.
# Usage: new_mixer_test.sh /path/to/seqlab
set -u
SEQLAB=${1:?usage: $0 /path/to/seqlab}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
COPY=$WORK/tree
JOBS=2  # the CI machine has 2 cores
source "$SRC/tests/train_script_util.sh"  # pass, fail, failures, word_corpus

# The copy's git must be its own, whatever the environment points git at.
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_PREFIX
copy_git() {
  git -C "$COPY" -c user.name=new_mixer_test -c user.email=new_mixer_test@localhost -c commit.gpgsign=false \
    -c core.hooksPath=/dev/null -c init.defaultBranch=main "$@"
}
phase() { echo "-- $1 (${SECONDS}s)"; }
# stop WHAT LOG: a step the rest depends on failed: the end of its log, and exit.
stop() {
  fail "$1"
  [ -f "$2" ] && tail -n 30 "$2" | sed 's/^/  /'
  exit 1
}

# ---- 1. the tracked files, committed in a repository of the copy's own ----
phase "copying the tracked files of $SRC"
mkdir -p "$COPY"
if git -C "$SRC" ls-files -z > "$WORK/listed" 2> /dev/null && [ -s "$WORK/listed" ]; then
  # Files deleted in the working tree but still in the index are left out.
  while IFS= read -r -d '' f; do
    if [ -e "$SRC/$f" ] || [ -L "$SRC/$f" ]; then printf '%s\0' "$f"; fi
  done < "$WORK/listed" > "$WORK/files"
else  # not a git checkout (an unpacked archive): everything but what a build or a run leaves
  (cd "$SRC" && find . \( -name .git -o -path './build*' -o -path ./runs -o -path ./data/cache -o -name __pycache__ \) \
     -prune -o \( -type f -o -type l \) -print0) > "$WORK/files"
fi
(cd "$SRC" && tar --null -T "$WORK/files" -cf -) | tar -xf - -C "$COPY" || stop "copying the tree" /dev/null
# A fixed date, so that the same tree gives the same commit (and build_info.h, and ccache hits).
export GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z
copy_git init -q && copy_git add -A -f && copy_git commit -q -m "the tree as it was" ||
  stop "committing the copy in its own repository" /dev/null
[ -z "$(copy_git status --porcelain --untracked-files=all)" ] ||
  stop "the copy is not clean after its first commit" /dev/null
echo "   $(tr -cd '\0' < "$WORK/files" | wc -c) files"

# ---- 2. the toy room: new files only ----
NEW=()
# add PATH: writes stdin to the copy's PATH, which must not exist yet.
add() {
  local f=$COPY/$1
  if [ -e "$f" ]; then stop "$1 already exists in the tree: a new room must add new files only" /dev/null; fi
  mkdir -p "$(dirname "$f")"
  cat > "$f"
  NEW+=("$1")
}
phase "adding the toy_mix room"

# "Adding a variant", 1: the slots
add src/tensor/slots/toy/toy_mix.h <<'ROOM'
// Kernel slots of toy_mix (the op: src/layers/toy/toy_mix.h; CPU kernels in src/layers/toy/toy_mix.cpp,
// CUDA kernels in src/cuda/toy/toy_mix.cu).
#pragma once

#include <cstdint>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace seqlab {

enum class ToyMixForm { recurrent, parallel };

namespace kernel {

// Options as the kernels receive them: the form, and n0, the tokens already summed into s0.
struct ToyMixParams {
  ToyMixForm form = ToyMixForm::recurrent;
  int64_t count = 0;
};

// v [B, T, H, D], s0 [B, H, D] (zeros when absent), contiguous, one dtype. The forward writes every
// element of y [B, T, H, D] and s [B, H, D] (the final running sum). The op is linear in (v, s0), so the
// backward needs only the output gradients dy and ds (zeros where unused) and writes every element of
// dv [B, T, H, D] and ds0 [B, H, D].
SEQLAB_DECLARE_KERNEL(toy_mix_forward_kernel, void (*)(const Tensor& v, const Tensor& s0, const ToyMixParams& p,
                                                       const Tensor& y, const Tensor& s));
SEQLAB_DECLARE_KERNEL(toy_mix_backward_kernel, void (*)(const Tensor& dy, const Tensor& ds, const ToyMixParams& p,
                                                        const Tensor& dv, const Tensor& ds0));

}  // namespace kernel
}  // namespace seqlab
ROOM

# "Adding a variant", 2: the op: its header
add src/layers/toy/toy_mix.h <<'ROOM'
// toy_mix, a fused op: the causal running mean of v per head, continuing a running sum.
//
//   v [B, T, H, D],  s0 = initial_state [B, H, D] (or 0) holding the sum of n0 = count earlier tokens
//   S_t = S_{t−1} + v_t,  S_{−1} = s0          S [B, H, D]
//   y_t = w_t S_t,  w_t = 1 / (n0 + t + 1)     y [B, T, H, D],  final_state = S_{T−1},  final_count = n0 + T
//
// With s0 = 0 and n0 = 0, y_t = (1/(t+1)) Σ_{s≤t} v_s. Forms (equal; docs/variants/toy_mix.md):
//   recurrent — the step above, token by token (decoding: T = 1 from a given state). O(T·D).
//   parallel  — y = A V + w s0ᵀ with A_ts = w_t for s ≤ t, else 0 (one T × T GEMM per (batch, head));
//               final_state = s0 + Σ_t v_t.
// The backward (derived by hand): with G_t = ∂L/∂S_t = dS + Σ_{t'≥t} w_t' dy_t',
//   dv_t = G_t,  ds0 = G_0 (dS when T = 0);  parallel: dV = Aᵀ dY + 1 dSᵀ,  ds0 = dS + Σ_t w_t dy_t.
// A throwaway mixer room: it exists to show that adding a mixer edits no existing file.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/slots/toy/toy_mix.h"
#include "tensor/tensor.h"

namespace seqlab {

struct ToyMixOptions {
  ToyMixForm form = ToyMixForm::recurrent;
  int64_t count = 0;  // n0: tokens summed into initial_state, in [0, 2^53] (so n0 + t + 1 is exact)
};

struct ToyMixOutput {
  Tensor y;                 // [B, T, H, D]
  Tensor final_state;       // [B, H, D], the running sum
  int64_t final_count = 0;  // n0 + T
};

// The fused op, differentiable in v and initial_state (may be undefined: zeros) through both outputs.
// Throws std::invalid_argument naming the shapes when they do not fit the layout above, or when the
// count is outside [0, 2^53].
ToyMixOutput toy_mix(const Tensor& v, const Tensor& initial_state = Tensor(), const ToyMixOptions& = {});

// Parses "recurrent", "parallel"; throws std::invalid_argument listing them.
ToyMixForm parse_toy_mix_form(const std::string& name);

}  // namespace seqlab
ROOM

# "Adding a variant", 2: the op: CPU kernels of both forms, the node (hand-derived backward), op-registry entry
add src/layers/toy/toy_mix.cpp <<'ROOM'
// toy_mix: the entry point, the CPU forward and backward kernels of both forms side by side, the autograd
// node and the registry entry. Equations in toy_mix.h; the derivation in docs/variants/toy_mix.md.
//
// How the CPU kernels work: one task per (batch, head), OpenMP over tasks. w_t = 1/(n0 + t + 1) is
// formed in the compute type as 1 / T(n0 + t + 1), as the CUDA kernels form it, so the recurrent forms
// of both devices round alike. Nothing is saved for the backward: the op is linear in (v, s0), so its
// gradients need only the output gradients and the count.
#include "layers/toy/toy_mix.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "tensor/blas_rows.h"
#include "tensor/kernels.h"
#include "tensor/parallel.h"

namespace seqlab {

ToyMixForm parse_toy_mix_form(const std::string& name) {
  static const FormNames<ToyMixForm> forms{"toy_mix",
                                           {{"recurrent", ToyMixForm::recurrent}, {"parallel", ToyMixForm::parallel}}};
  return forms.parse(name);
}

namespace {

constexpr int64_t kMaxCount = int64_t{1} << 53;

struct Dims {
  int64_t B, T, H, D;
};

Dims check_inputs(const Tensor& v, const Tensor& s0, const ToyMixOptions& opts) {
  const VariantInputs in("toy_mix", {{"v", v}, {"initial_state", s0}},
                         "v [B, T, H, D], initial_state [B, H, D] or none");
  if (!v.defined()) in.fail("v must be given");
  if (v.dim() != 4) in.fail("v must have 4 dimensions");
  const Dims d{v.size(0), v.size(1), v.size(2), v.size(3)};
  in.shaped("initial_state", {d.B, d.H, d.D}, "[B, H, D]");
  if (!is_floating(v.dtype())) in.fail(std::string("v must be f32, f64 or bf16, got ") + dtype_name(v.dtype()));
  if (s0.defined() && (s0.dtype() != v.dtype() || s0.device() != v.device())) {
    in.fail("initial_state must have v's dtype and device, got " + std::string(dtype_name(s0.dtype())) + " on " +
            s0.device().str() + " and " + dtype_name(v.dtype()) + " on " + v.device().str());
  }
  if (opts.count < 0 || opts.count > kMaxCount) {
    in.fail("count must lie in [0, 2^53], got " + std::to_string(opts.count));
  }
  return d;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::ToyMixParams;

struct Geometry {
  int64_t B, T, H, D;
  int64_t tasks() const { return B * H; }
  int64_t ld() const { return H * D; }                                              // row stride of v, y
  int64_t offset(int64_t task) const { return (task / H * T * H + task % H) * D; }  // of (b, 0, h, 0)
  bool parallel() const { return tasks() > 1 && T * (D + 1) > kParallelGrain; }
};

Geometry geometry(const Tensor& v) { return {v.size(0), v.size(1), v.size(2), v.size(3)}; }

// w[t] = 1 / (n0 + t + 1) in T, for t < Tn.
template <class T>
std::vector<T> weights(int64_t n0, int64_t Tn) {
  std::vector<T> w(static_cast<size_t>(Tn));
  for (int64_t t = 0; t < Tn; ++t) w[static_cast<size_t>(t)] = T(1) / static_cast<T>(n0 + t + 1);
  return w;
}

// A [T, T]: A_ts = w_t for s ≤ t, 0 above the diagonal (the parallel form's averaging matrix).
template <class T>
void averaging_matrix(const std::vector<T>& w, std::vector<T>& A) {
  const int64_t Tn = static_cast<int64_t>(w.size());
  A.assign(static_cast<size_t>(Tn * Tn), T(0));
  for (int64_t t = 0; t < Tn; ++t) std::fill_n(A.data() + t * Tn, t + 1, w[static_cast<size_t>(t)]);
}

// ---- forward ----
// Per task (b, h), S initialised from s0:
//   recurrent: for t: S += v_t, y_t = w_t S.
//   parallel:  y = A V (one GEMM), y_t += w_t s0, then S = s0 + Σ_t v_t.
// Memory: reads v, s0; writes y, s. Scratch: w [T], and A [T, T] for the parallel form.
template <class T>
void forward(const Tensor& v_t, const Tensor& s0_t, const ToyMixParams& p, const Tensor& y_t, const Tensor& s_t) {
  const Geometry g = geometry(v_t);
  const int64_t D = g.D, ld = g.ld(), Tn = g.T;
  if (Tn == 0 || D == 0) {  // nothing to sum (no token, or heads of size 0): the state passes through
    std::copy_n(s0_t.data<T>(), s_t.numel(), s_t.data<T>());
    return;
  }
  const std::vector<T> w = weights<T>(p.count, Tn);
  std::vector<T> A;
  if (p.form == ToyMixForm::parallel) averaging_matrix(w, A);
#pragma omp parallel for schedule(static) if (g.parallel())
  for (int64_t task = 0; task < g.tasks(); ++task) {
    const T* v = v_t.data<T>() + g.offset(task);
    const T* s0 = s0_t.data<T>() + task * D;
    T* y = y_t.data<T>() + g.offset(task);
    T* S = s_t.data<T>() + task * D;
    std::copy_n(s0, D, S);
    if (p.form == ToyMixForm::recurrent) {
      for (int64_t t = 0; t < Tn; ++t) {
        const T wt = w[static_cast<size_t>(t)];
        for (int64_t d = 0; d < D; ++d) {
          S[d] += v[t * ld + d];
          y[t * ld + d] = wt * S[d];
        }
      }
      continue;
    }
    gemm<T>(false, false, Tn, D, Tn, 1.0, A.data(), Tn, v, ld, 0.0, y, ld);
    for (int64_t t = 0; t < Tn; ++t) {
      axpy(w[static_cast<size_t>(t)], s0, y + t * ld, D);
      axpy(T(1), v + t * ld, S, D);
    }
  }
}

// ---- backward ----
// Output gradients dY and dS:
//   recurrent: G = dS; for t = T−1 … 0: G += w_t dy_t, dv_t = G; then ds0 = G.
//   parallel:  dV = Aᵀ dY (one GEMM), dv_t += dS; ds0 = dS + Σ_t w_t dy_t.
// Memory: reads dy, ds; writes dv, ds0. Scratch: w [T], and A [T, T] for the parallel form.
template <class T>
void backward(const Tensor& dy_t, const Tensor& ds_t, const ToyMixParams& p, const Tensor& dv_t, const Tensor& ds0_t) {
  const Geometry g = geometry(dy_t);
  const int64_t D = g.D, ld = g.ld(), Tn = g.T;
  if (Tn == 0 || D == 0) {  // nothing was summed: the state's gradient passes through
    std::copy_n(ds_t.data<T>(), ds0_t.numel(), ds0_t.data<T>());
    return;
  }
  const std::vector<T> w = weights<T>(p.count, Tn);
  std::vector<T> A;
  if (p.form == ToyMixForm::parallel) averaging_matrix(w, A);
#pragma omp parallel for schedule(static) if (g.parallel())
  for (int64_t task = 0; task < g.tasks(); ++task) {
    const T* dy = dy_t.data<T>() + g.offset(task);
    const T* dS = ds_t.data<T>() + task * D;
    T* dv = dv_t.data<T>() + g.offset(task);
    T* G = ds0_t.data<T>() + task * D;  // accumulates in place into ds0
    std::copy_n(dS, D, G);
    if (p.form == ToyMixForm::recurrent) {
      for (int64_t t = Tn - 1; t >= 0; --t) {
        const T wt = w[static_cast<size_t>(t)];
        for (int64_t d = 0; d < D; ++d) {
          G[d] += wt * dy[t * ld + d];
          dv[t * ld + d] = G[d];
        }
      }
      continue;
    }
    gemm<T>(true, false, Tn, D, Tn, 1.0, A.data(), Tn, dy, ld, 0.0, dv, ld);
    for (int64_t t = 0; t < Tn; ++t) {
      axpy(T(1), dS, dv + t * ld, D);
      axpy(w[static_cast<size_t>(t)], dy + t * ld, G, D);
    }
  }
}

void forward_cpu(const Tensor& v, const Tensor& s0, const ToyMixParams& p, const Tensor& y, const Tensor& s) {
  dispatch_float(v.dtype(), "toy_mix", [&](auto tag) { forward<decltype(tag)>(v, s0, p, y, s); });
}

void backward_cpu(const Tensor& dy, const Tensor& ds, const ToyMixParams& p, const Tensor& dv, const Tensor& ds0) {
  dispatch_float(dy.dtype(), "toy_mix backward", [&](auto tag) { backward<decltype(tag)>(dy, ds, p, dv, ds0); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
SEQLAB_REGISTER_KERNEL(toy_mix_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL(toy_mix_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable op: saves nothing (linear in v and s0).
ToyMixOutput toy_mix(const Tensor& v, const Tensor& initial_state, const ToyMixOptions& opts) {
  const Dims d = check_inputs(v, initial_state, opts);
  const kernel::ToyMixParams p{opts.form, opts.count};
  const Tensor vc = kernel::contiguous(v);
  const Tensor s0 = initial_state.defined() ? kernel::contiguous(initial_state)
                                            : Tensor::zeros({d.B, d.H, d.D}, v.dtype(), v.device());
  ToyMixOutput out{Tensor::empty({d.B, d.T, d.H, d.D}, v.dtype(), v.device()),
                   Tensor::empty({d.B, d.H, d.D}, v.dtype(), v.device()), opts.count + d.T};
  kernel::toy_mix_forward_kernel(v.device(), vc, s0, p, out.y, out.final_state);
  record("toy_mix", {v, initial_state}, {&out.y, &out.final_state}, {},
         [p](const std::vector<Tensor>& g, const std::vector<Tensor>&, const std::vector<bool>& need) {
           const Tensor dy = kernel::contiguous(g[0]), ds = kernel::contiguous(g[1]);
           Tensor dv = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
           Tensor ds0 = Tensor::empty(ds.shape(), ds.dtype(), ds.device());
           kernel::toy_mix_backward_kernel(dy.device(), dy, ds, p, dv, ds0);
           return std::vector<Tensor>{need[0] ? dv : Tensor(), need[1] ? ds0 : Tensor()};
         });
  return out;
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "toy_mix";
  s.summary =
      "S_t = S_{t-1} + v_t, y_t = S_t / (count + t + 1); v [B, T, H, D], initial_state [B, H, D] "
      "(the sum of `count` earlier tokens)";
  s.inputs = {{"v"}, {"initial_state", OpInputKind::floating, true}};
  s.outputs = {"y", "final_state"};
  s.attrs = {{"form", AttrType::string, "recurrent", "recurrent or parallel"},
             {"count", AttrType::integer, "0", "tokens already summed into initial_state, in [0, 2^53]"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    ToyMixOptions o;
    o.form = parse_toy_mix_form(a.get_string("form"));
    o.count = a.get_int("count");
    ToyMixOutput out = toy_mix(in[0], in[1], o);
    return std::vector<Tensor>{out.y, out.final_state};
  };
  // T = 7, three heads of odd size 3, an initial state holding the sum of 4 earlier tokens.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 7, 3, 3}, gen, dtype), Tensor::randn({2, 3, 3}, gen, dtype)};
  };
  s.example_attrs = {{"count", "4"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
ROOM

# "Adding a variant", 3: the layer around the op and its MixerRegistration
add src/layers/toy/toy_mix_mixer.cpp <<'ROOM'
// The toy_mix token mixer around the `toy_mix` op (toy_mix.h), registered as `model.mixer = "toy_mix"` with
// the options of [model.toy_mix]:
//
//   v = x W_v                       per head: [B, T, H, D], D = C / H
//   m = toy_mix(v)                  m_t = (1/(n0+t+1)) (s0 + Σ_{s≤t} v_s): the running mean of the values
//   y = m W_o
//
// A throwaway mixer: a causal recurrence with a fixed-size state (the running sum and its count), no
// bidirectional form and, deliberately, no sequence-parallel form, so that a recipe asking for
// parallel.sp > 1 is refused naming it. Decoding continues the state's sum and count.
//
// Parameters: v, out.
#include <memory>
#include <stdexcept>

#include "autograd/ops.h"
#include "layers/basic.h"
#include "layers/mixer.h"
#include "layers/sequence_parallel.h"
#include "layers/toy/toy_mix.h"

namespace seqlab {
namespace {

// A causal recurrence (the defaults), but with no sequence-parallel form: parallel.sp > 1 is refused.
constexpr MixerTraits kTraits = [] {
  MixerTraits t;
  t.sequence_parallel = false;
  return t;
}();

// Decoding state: the running sum [B, H, D] and the tokens it holds.
struct ToyMixState : MixerState {
  Tensor sum;
  int64_t count = 0;
  // The sum's H·D elements and its count, per sequence.
  double size() const override { return sum.defined() ? elements_per_sequence({&sum}) + 1 : 0.0; }
};

class ToyMixMixer : public Mixer {
 public:
  ToyMixMixer(const MixerContext& ctx, const MixerOptions& opts, Generator& gen)
      : heads_(ctx.n_heads),
        head_dim_(head_dim(ctx, "toy_mix")),
        form_(parse_toy_mix_form(opts.text("form"))),
        v_(add_module("v", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))),
        out_(add_module("out", std::make_unique<Linear>(ctx.d_model, ctx.d_model, false, gen, ctx.init_std))) {}

  Tensor forward(const MixerInput& in, MixerState* decoding) const override {
    check_mixer_input(in, "toy_mix", kTraits);
    ToyMixState* state = state_of<ToyMixState>(decoding, "toy_mix");
    if (state == nullptr && sequence_group() != nullptr) {
      throw std::invalid_argument("toy_mix has no sequence-parallel form (its traits say so; use parallel.sp = 1)");
    }
    const Tensor& x = in.x;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    ToyMixOptions opts;
    opts.form = T == 1 && state != nullptr ? ToyMixForm::recurrent : form_;
    opts.count = state != nullptr ? state->count : 0;
    ToyMixOutput r =
        toy_mix(reshape(v_.forward(x), {B, T, heads_, head_dim_}), state != nullptr ? state->sum : Tensor(), opts);
    if (state != nullptr) {
      state->sum = r.final_state.detach();
      state->count = r.final_count;
    }
    return out_.forward(reshape(r.y, {B, T, C}));
  }
  std::unique_ptr<MixerState> new_state() const override { return std::make_unique<ToyMixState>(); }

 private:
  int64_t heads_, head_dim_;
  ToyMixForm form_;
  Linear& v_;
  Linear& out_;
};

const MixerRegistration kToyMix{MixerSpec{
    "toy_mix",
    {},
    "a throwaway mixer: the causal running mean of the values per head, y_t = (1/(t+1)) Σ_{s≤t} v_s, projected",
    "docs/variants/toy_mix.md",
    kTraits,
    {OptionSpec::choice("form", {"recurrent", "parallel"},
                        "training form of the toy_mix op: recurrent (O(T·d)) or parallel (a T × T averaging "
                        "matrix per head)")},
    [](const MixerContext& ctx, const MixerOptions& opts, Generator& gen) -> std::unique_ptr<Mixer> {
      return std::make_unique<ToyMixMixer>(ctx, opts, gen);
    },
    // Beyond 6·N: the running sum and the scaling, 2·d per token forward, ×3 for forward and backward
    // (the recurrent form; the parallel form's T × T products are a choice of schedule, not of model).
    [](const MixerContext& ctx, const MixerOptions&, int64_t) { return 6.0 * static_cast<double>(ctx.d_model); },
    // v and out: d×d each.
    [](const MixerContext& ctx, const MixerOptions&) {
      const double d = static_cast<double>(ctx.d_model);
      return 2 * d * d;
    },
    // The running sum (H·D = d per sequence) and its count.
    [](const MixerContext& ctx, const MixerOptions&, int64_t) { return static_cast<double>(ctx.d_model) + 1; }}};

}  // namespace
}  // namespace seqlab
ROOM

# "Adding a variant", 4: the CUDA kernels' device code (host-includable, for the emulation test)
add src/cuda/toy/toy_mix_kernels.cuh <<'ROOM'
// The device code of src/cuda/toy/toy_mix.cu. A header of its own, needing only CUDA's built-ins, so that
// tests/toy_mix_emulation_test.cc runs these same kernels on the CPU over tests/cuda_emulation.h.
//
// One thread per column (b, h, d) of v [B, T, H, D], c = (b·H + h)·D + d < B·H·D, in a grid-stride loop;
// the column's T values sit ld = H·D elements apart. The running sum lives in a register in the compute
// type A = compute_t<E> (f32 for bf16, rounded on store), and w_t = 1 / A(n0 + t + 1) is formed as the CPU
// kernels form it. Both forms of the op compute this one recurrence here; only rounding differs from the
// CPU's parallel form. Deterministic: no atomics, every sum in time order.
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"

namespace seqlab::cuda::toy {

// Forward, per column: S = s0[c]; for t < T: S += v_t, y_t = w_t S; s[c] = S.
// Reads v and s0 once, writes y and s once.
template <class E>
__global__ void __launch_bounds__(kThreads) toy_mix_forward(int64_t columns, int64_t Tn, int64_t H, int64_t D,
                                                            int64_t n0, const E* v, const E* s0, E* y, E* s) {
  using A = compute_t<E>;
  const int64_t ld = H * D, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += step) {
    const int64_t task = c / D, d = c - task * D, b = task / H, h = task - b * H;
    const int64_t base = (b * Tn * H + h) * D + d;
    A S = convert<A>(s0[c]);
    for (int64_t t = 0; t < Tn; ++t) {
      S += convert<A>(v[base + t * ld]);
      const A w = A(1) / static_cast<A>(n0 + t + 1);
      y[base + t * ld] = convert<E>(w * S);
    }
    s[c] = convert<E>(S);
  }
}

// Backward, per column: G = ds[c]; for t = T−1 … 0: G += w_t dy_t, dv_t = G; ds0[c] = G.
// Reads dy and ds once, writes dv and ds0 once.
template <class E>
__global__ void __launch_bounds__(kThreads) toy_mix_backward(int64_t columns, int64_t Tn, int64_t H, int64_t D,
                                                             int64_t n0, const E* dy, const E* ds, E* dv, E* ds0) {
  using A = compute_t<E>;
  const int64_t ld = H * D, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += step) {
    const int64_t task = c / D, d = c - task * D, b = task / H, h = task - b * H;
    const int64_t base = (b * Tn * H + h) * D + d;
    A G = convert<A>(ds[c]);
    for (int64_t t = Tn - 1; t >= 0; --t) {
      const A w = A(1) / static_cast<A>(n0 + t + 1);
      G += w * convert<A>(dy[base + t * ld]);
      dv[base + t * ld] = convert<E>(G);
    }
    ds0[c] = convert<E>(G);
  }
}

}  // namespace seqlab::cuda::toy
ROOM

# "Adding a variant", 4: the CUDA launchers, registered into the same slots
add src/cuda/toy/toy_mix.cu <<'ROOM'
// CUDA side of the toy_mix slots declared in src/tensor/slots/toy/toy_mix.h (entry point, CPU kernels and
// the equations: src/layers/toy/toy_mix.cpp, docs/variants/toy_mix.md). Inputs are contiguous: v, y, dy, dv
// [B, T, H, D], s0, s, ds, ds0 [B, H, D] (the entry point passes zeros for an absent s0).
//
//   S_t = S_{t−1} + v_t,  y_t = S_t / (n0 + t + 1);   backward  G += dy_t / (n0 + t + 1),  dv_t = G,  ds0 = G
//
// One launch each way of the column kernels in toy_mix_kernels.cuh (tests/toy_mix_emulation_test.cc runs
// them on the CPU; tests/toy_mix_gpu_test.cc compares them with the CPU kernels where a GPU is present).
// f32, f64 and bf16 (computed in f32, rounded on store). Compiled for sm_80/sm_90.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/runtime.h"
#include "cuda/toy/toy_mix_kernels.cuh"
#include "tensor/slots/toy/toy_mix.h"

namespace seqlab::cuda {
namespace {

void forward_cuda(const Tensor& v, const Tensor& s0, const kernel::ToyMixParams& p, const Tensor& y, const Tensor& s) {
  const int device = v.device().index;
  rows::require_contiguous("toy_mix", device, {&v, &s0, &y, &s});
  const int64_t Tn = v.size(1), H = v.size(2), D = v.size(3), columns = v.size(0) * H * D;
  if (columns == 0) return;
  dispatch_floating(v.dtype(), "toy_mix", [&](auto tag) {
    using E = typename decltype(tag)::type;
    DeviceGuard guard(device);
    toy::toy_mix_forward<E><<<blocks_for(columns, device), kThreads, 0, stream(device)>>>(
        columns, Tn, H, D, p.count, cptr<E>(v), cptr<E>(s0), mptr<E>(y), mptr<E>(s));
    SEQLAB_CUDA_CHECK_LAUNCH("toy_mix forward kernel");
  });
}

void backward_cuda(const Tensor& dy, const Tensor& ds, const kernel::ToyMixParams& p, const Tensor& dv,
                   const Tensor& ds0) {
  const int device = dy.device().index;
  rows::require_contiguous("toy_mix backward", device, {&dy, &ds, &dv, &ds0});
  const int64_t Tn = dy.size(1), H = dy.size(2), D = dy.size(3), columns = dy.size(0) * H * D;
  if (columns == 0) return;
  dispatch_floating(dy.dtype(), "toy_mix backward", [&](auto tag) {
    using E = typename decltype(tag)::type;
    DeviceGuard guard(device);
    toy::toy_mix_backward<E><<<blocks_for(columns, device), kThreads, 0, stream(device)>>>(
        columns, Tn, H, D, p.count, cptr<E>(dy), cptr<E>(ds), mptr<E>(dv), mptr<E>(ds0));
    SEQLAB_CUDA_CHECK_LAUNCH("toy_mix backward kernel");
  });
}

}  // namespace
}  // namespace seqlab::cuda

namespace seqlab::kernel {
SEQLAB_REGISTER_KERNEL(toy_mix_forward_kernel, DeviceType::CUDA, &cuda::forward_cuda);
SEQLAB_REGISTER_KERNEL(toy_mix_backward_kernel, DeviceType::CUDA, &cuda::backward_cuda);
}  // namespace seqlab::kernel
ROOM

# "Adding a variant", 5: the CPU test
add tests/toy_mix_test.cc <<'ROOM'
// toy_mix: both forms against each other and against the running mean written out here (values and every
// gradient, f32 and f64, with and without an initial state and count), float64 finite differences of
// every input for both forms, token-by-token decoding against the full sequence, the edges (T = 1, odd
// head sizes, T = 0), the registry entries (op and mixer) and the errors.
#include "layers/toy/toy_mix.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/op_registry.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "layers/mixer.h"
#include "tensor/kernels.h"
#include "test_util.h"

namespace seqlab {
namespace {

using testing::max_rel_error;

const ToyMixForm kForms[] = {ToyMixForm::recurrent, ToyMixForm::parallel};
const char* form_name(ToyMixForm f) { return f == ToyMixForm::recurrent ? "recurrent" : "parallel"; }

struct Size {
  int64_t B, T, H, D;
};

// T = 1, odd sizes, a longer sequence, one head.
const Size kSizes[] = {{2, 1, 3, 5}, {2, 7, 3, 3}, {1, 19, 2, 4}, {3, 5, 1, 1}};

// y and the final sum, the running mean written out in doubles: y_t = (s0 + Σ_{s≤t} v_s) / (n0 + t + 1).
std::vector<Tensor> mean_reference(const Tensor& v, const Tensor& s0, int64_t n0) {
  const int64_t B = v.size(0), T = v.size(1), H = v.size(2), D = v.size(3);
  const std::vector<double> x = v.to_doubles();
  std::vector<double> S = s0.defined() ? s0.to_doubles() : std::vector<double>(B * H * D, 0.0);
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          double& sum = S[(b * H + h) * D + d];
          const int64_t i = ((b * T + t) * H + h) * D + d;
          sum += x[i];
          y[i] = sum / static_cast<double>(n0 + t + 1);
        }
      }
    }
  }
  return {Tensor::from_vector(y, {B, T, H, D}, DType::f64), Tensor::from_vector(S, {B, H, D}, DType::f64)};
}

struct Outcome {
  std::vector<Tensor> outputs, grads;  // y, final_state; dv, ds0
  int64_t final_count = 0;
};

Outcome run(const Tensor& v, const Tensor& s0, const ToyMixOptions& o, const std::vector<Tensor>& cot) {
  Tensor vv = set_requires_grad(v.detach());
  Tensor ss = s0.defined() ? set_requires_grad(s0.detach()) : Tensor();
  ToyMixOutput out = toy_mix(vv, ss, o);
  backward({out.y, out.final_state}, cot);
  return {{out.y.detach(), out.final_state.detach()},
          {grad_of(vv), ss.defined() ? grad_of(ss) : Tensor()},
          out.final_count};
}

TEST(ToyMix, FormsAgreeWithTheRunningMean) {
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    for (const Size& z : kSizes) {
      for (bool with_state : {false, true}) {
        Generator gen(3 + z.T);
        const Tensor v = Tensor::randn({z.B, z.T, z.H, z.D}, gen, dtype);
        const Tensor s0 = with_state ? Tensor::randn({z.B, z.H, z.D}, gen, dtype) : Tensor();
        const std::vector<Tensor> cot = {Tensor::randn({z.B, z.T, z.H, z.D}, gen, dtype),
                                         Tensor::randn({z.B, z.H, z.D}, gen, dtype)};
        ToyMixOptions o;
        o.count = with_state ? 4 : 0;
        const std::vector<Tensor> ref = mean_reference(v, s0, o.count);
        o.form = ToyMixForm::recurrent;
        const Outcome rec = run(v, s0, o, cot);
        for (ToyMixForm f : kForms) {
          o.form = f;
          const Outcome r = run(v, s0, o, cot);
          const std::string what = std::string(form_name(f)) + " " + dtype_name(dtype) + " T=" + std::to_string(z.T) +
                                   (with_state ? " with state" : "");
          EXPECT_EQ(r.final_count, o.count + z.T) << what;
          for (size_t i = 0; i < 2; ++i) EXPECT_LE(max_rel_error(r.outputs[i], ref[i]), tol) << what << " output " << i;
          for (size_t i = 0; i < 2; ++i) {
            ASSERT_EQ(r.grads[i].defined(), rec.grads[i].defined()) << what;
            if (r.grads[i].defined()) {
              EXPECT_LE(max_rel_error(r.grads[i], rec.grads[i]), tol) << what << " grad " << i;
            }
          }
        }
      }
    }
  }
}

// The hand-derived backward by itself: dv_t = dS + Σ_{t'≥t} dy_t' / (n0 + t' + 1), ds0 = dv_0, on a single
// column (B = H = D = 1), written out.
TEST(ToyMix, BackwardIsTheReverseWeightedSum) {
  const std::vector<double> dy = {0.5, -1.0, 2.0}, v = {1.0, 2.0, 3.0};
  const double dS = 0.25;
  const int64_t n0 = 2;
  for (ToyMixForm f : kForms) {
    ToyMixOptions o;
    o.form = f;
    o.count = n0;
    const Outcome r = run(Tensor::from_vector(v, {1, 3, 1, 1}, DType::f64), Tensor::zeros({1, 1, 1}, DType::f64), o,
                          {Tensor::from_vector(dy, {1, 3, 1, 1}, DType::f64), Tensor::full({1, 1, 1}, dS, DType::f64)});
    const double g2 = dS + dy[2] / 5, g1 = g2 + dy[1] / 4, g0 = g1 + dy[0] / 3;
    const std::vector<double> dv = r.grads[0].to_doubles();
    ASSERT_EQ(dv.size(), 3u);
    EXPECT_NEAR(dv[0], g0, 1e-15) << form_name(f);
    EXPECT_NEAR(dv[1], g1, 1e-15) << form_name(f);
    EXPECT_NEAR(dv[2], g2, 1e-15) << form_name(f);
    EXPECT_NEAR(r.grads[1].item(), g0, 1e-15) << form_name(f);
    // y = (1, 3, 6) / (3, 4, 5)
    const std::vector<double> y = r.outputs[0].to_doubles();
    EXPECT_NEAR(y[0], 1.0 / 3, 1e-15);
    EXPECT_NEAR(y[1], 3.0 / 4, 1e-15);
    EXPECT_NEAR(y[2], 6.0 / 5, 1e-15);
    EXPECT_EQ(r.outputs[1].item(), 6.0);
  }
}

TEST(ToyMix, GradcheckEveryFormAndInput) {
  for (ToyMixForm f : kForms) {
    for (int64_t n0 : {int64_t{0}, int64_t{3}}) {
      Generator gen(13);
      const Tensor v = Tensor::randn({2, 5, 2, 3}, gen, DType::f64), s0 = Tensor::randn({2, 2, 3}, gen, DType::f64);
      ToyMixOptions o;
      o.form = f;
      o.count = n0;
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& x) {
            ToyMixOutput out = toy_mix(x[0], x[1], o);
            return std::vector<Tensor>{out.y, out.final_state};
          },
          {v, s0});
      EXPECT_EQ(r.elements_checked, 2 * 5 * 2 * 3 + 2 * 2 * 3);
      EXPECT_LE(r.max_error, 1e-6) << form_name(f) << " n0 " << n0 << ": " << r.worst;
    }
  }
}

// A prompt, then one token at a time from the carried (sum, count), gives the full sequence's outputs.
TEST(ToyMix, DecodingContinuesTheState) {
  Generator gen(21);
  const Tensor v = Tensor::randn({2, 9, 3, 4}, gen, DType::f64);
  NoGradGuard no_grad;
  const ToyMixOutput full = toy_mix(v);
  ToyMixOptions o;
  o.form = ToyMixForm::parallel;
  ToyMixOutput step = toy_mix(narrow(v, 1, 0, 4), Tensor(), o);
  std::vector<Tensor> parts = {step.y};
  for (int64_t t = 4; t < 9; ++t) {
    o.form = ToyMixForm::recurrent;
    o.count = step.final_count;
    step = toy_mix(narrow(v, 1, t, 1), step.final_state, o);
    parts.push_back(step.y);
  }
  EXPECT_EQ(step.final_count, 9);
  EXPECT_LE(max_rel_error(concat(parts, 1), full.y), 1e-14);
  EXPECT_LE(max_rel_error(step.final_state, full.final_state), 1e-14);
}

// No token: y is empty and the state and its gradient pass through unchanged.
TEST(ToyMix, EmptySequencePassesTheStateThrough) {
  for (ToyMixForm f : kForms) {
    Generator gen(5);
    const Tensor s0 = Tensor::randn({2, 3, 4}, gen, DType::f64), ds = Tensor::randn({2, 3, 4}, gen, DType::f64);
    ToyMixOptions o;
    o.form = f;
    o.count = 7;
    const Outcome r =
        run(Tensor::zeros({2, 0, 3, 4}, DType::f64), s0, o, {Tensor::zeros({2, 0, 3, 4}, DType::f64), ds});
    EXPECT_EQ(r.outputs[0].shape(), (Shape{2, 0, 3, 4}));
    EXPECT_EQ(max_rel_error(r.outputs[1], s0), 0.0) << form_name(f);
    EXPECT_EQ(max_rel_error(r.grads[1], ds), 0.0) << form_name(f);
    EXPECT_EQ(r.final_count, 7);
  }
}

TEST(ToyMix, RegistryEntries) {
  const OpSpec* op = find_op("toy_mix");
  ASSERT_NE(op, nullptr);
  ASSERT_EQ(op->inputs.size(), 2u);
  EXPECT_EQ(op->inputs[0].name, "v");
  EXPECT_EQ(op->inputs[1].name, "initial_state");
  EXPECT_TRUE(op->inputs[1].optional);
  EXPECT_EQ(op->outputs, (std::vector<std::string>{"y", "final_state"}));
  // The op runner's forward is the entry point's, with the attributes parsed.
  Generator gen(9);
  const std::vector<Tensor> in = op->example(gen, DType::f64);
  const OpAttrs attrs = OpAttrs::parse("toy_mix", op->attrs, {{"form", "parallel"}, {"count", "4"}});
  const std::vector<Tensor> got = op->forward(in, attrs);
  ToyMixOptions o;
  o.form = ToyMixForm::parallel;
  o.count = 4;
  const ToyMixOutput want = toy_mix(in[0], in[1], o);
  EXPECT_EQ(max_rel_error(got[0], want.y), 0.0);
  EXPECT_EQ(max_rel_error(got[1], want.final_state), 0.0);

  const MixerSpec& m = mixer_spec("toy_mix");
  EXPECT_EQ(m.doc, "docs/variants/toy_mix.md");
  EXPECT_TRUE(m.traits.recurrent);
  EXPECT_FALSE(m.traits.bidirectional);
  EXPECT_FALSE(m.traits.sequence_parallel);
  EXPECT_FALSE(m.traits.cross_attention);
  EXPECT_FALSE(m.traits.score_bias);
  EXPECT_EQ(MixerOptions(m.options).text("form"), "recurrent");
}

// `call` throws std::invalid_argument containing `part`.
template <class F>
void expect_refused(F call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ToyMix, ErrorsNameWhatIsWrong) {
  const Tensor v = Tensor::zeros({2, 5, 3, 4}, DType::f64);
  expect_refused(
      [&] {
        toy_mix(Tensor::zeros({2, 5, 12}, DType::f64));
      },
      "toy_mix: v must have 4 dimensions (got v [2, 5, 12], initial_state undefined; expected v [B, T, H, D]");
  expect_refused([&] { toy_mix(v, Tensor::zeros({2, 3, 5}, DType::f64)); }, "initial_state must be [B, H, D]");
  expect_refused([&] { toy_mix(v, Tensor::zeros({2, 3, 4}, DType::f32)); }, "initial_state must have v's dtype");
  expect_refused([&] { toy_mix(Tensor::zeros({2, 5, 3, 4}, DType::i64)); }, "v must be f32, f64 or bf16, got i64");
  expect_refused([&] { toy_mix(Tensor()); }, "toy_mix: v must be given");
  ToyMixOptions o;
  o.count = -1;
  expect_refused([&] { toy_mix(v, Tensor(), o); }, "count must lie in [0, 2^53], got -1");
  expect_refused([&] { parse_toy_mix_form("chunkwise"); },
                 "toy_mix: unknown form 'chunkwise' (expected recurrent or parallel)");
}

}  // namespace
}  // namespace seqlab
ROOM

# "Adding a variant", 5: the CUDA kernels run on the CPU
add tests/toy_mix_emulation_test.cc <<'ROOM'
// The toy_mix CUDA kernels (src/cuda/toy/toy_mix_kernels.cuh: the column recurrences forward and backward)
// run on the CPU over tests/cuda_emulation.h, against the CPU slots of both forms
// (src/layers/toy/toy_mix.cpp). This is where the kernels' logic is checked on a machine without a GPU;
// tests/toy_mix_gpu_test.cc compares the real kernels.
//
// Each launch mirrors toy_mix.cu's launcher (one thread per column, grid_stride_blocks over the columns
// of an emulated GPU of one multiprocessor, so the larger cases take the grid-stride loop). Outputs sit
// between guard bands and start as NaN. Cases: T = 1, T = 0 (the state passes through), odd head sizes,
// more columns than one stride of the grid (32 blocks of 256 threads), a count n0 > 0.
// Tolerance gpu_rtol (1e-5 f32, 1e-10 f64, 1e-2 bf16, whose reference is the CPU in f32 on the same
// bf16 values).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emulation_util.h"
#include "layers/toy/toy_mix.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

// The kernels, after the emulation they are compiled over.
#include "cuda/toy/toy_mix_kernels.cuh"

namespace seqlab {
namespace {

using testing::as_reference;
using testing::expect_output;
using testing::for_each_type;
using testing::GuardedOutput;
using testing::kCpu;
constexpr int kSMs = emu::kMultiprocessors;

struct Case {
  int64_t B, T, H, D, count;
};

const Case kCases[] = {
    {2, 1, 3, 5, 0},     // one token (the decode step)
    {2, 0, 3, 4, 6},     // no token: s = s0, ds0 = ds
    {1, 9, 2, 3, 4},     // odd head size, a count
    {2, 5, 4, 1100, 0},  // 8800 columns: more than one grid stride of 8192 threads
};

TEST(ToyMixEmulation, ForwardAndBackwardMatchTheCpuKernels) {
  Generator gen(testing::test_seed(71));
  for_each_type([&](auto tag, DType dtype) {
    using E = decltype(tag);
    for (const Case& c : kCases) {
      for (ToyMixForm form : {ToyMixForm::recurrent, ToyMixForm::parallel}) {
        const std::string what = std::string(dtype_name(dtype)) + " B" + std::to_string(c.B) + " T" +
                                 std::to_string(c.T) + " H" + std::to_string(c.H) + " D" + std::to_string(c.D) +
                                 " n0 " + std::to_string(c.count) +
                                 (form == ToyMixForm::recurrent ? " recurrent" : " parallel");
        const kernel::ToyMixParams p{form, c.count};
        const Shape seq{c.B, c.T, c.H, c.D}, state{c.B, c.H, c.D};
        const Tensor v = Tensor::randn(seq, gen, dtype), s0 = Tensor::randn(state, gen, dtype);
        const Tensor dy = Tensor::randn(seq, gen, dtype), ds = Tensor::randn(state, gen, dtype);
        const int64_t columns = c.B * c.H * c.D;
        const dim3 grid(static_cast<unsigned>(cuda::grid_stride_blocks(columns, kSMs)));

        // toy_mix.cu's two launchers.
        GuardedOutput y(seq, dtype), s(state, dtype), dv(seq, dtype), ds0(state, dtype);
        emu::launch(grid, dim3(cuda::kThreads), 0, cuda::toy::toy_mix_forward<E>, columns, c.T, c.H, c.D, c.count,
                    v.data<E>(), s0.data<E>(), y.data<E>(), s.data<E>());
        emu::launch(grid, dim3(cuda::kThreads), 0, cuda::toy::toy_mix_backward<E>, columns, c.T, c.H, c.D, c.count,
                    dy.data<E>(), ds.data<E>(), dv.data<E>(), ds0.data<E>());

        const DType rd = as_reference(v).dtype();
        Tensor y_ref = Tensor::empty(seq, rd), s_ref = Tensor::empty(state, rd);
        Tensor dv_ref = Tensor::empty(seq, rd), ds0_ref = Tensor::empty(state, rd);
        kernel::toy_mix_forward_kernel(kCpu, as_reference(v), as_reference(s0), p, y_ref, s_ref);
        kernel::toy_mix_backward_kernel(kCpu, as_reference(dy), as_reference(ds), p, dv_ref, ds0_ref);
        const double tol = testing::gpu_rtol(dtype);
        expect_output(y, y_ref, tol, what + " y");
        expect_output(s, s_ref, tol, what + " final state");
        expect_output(dv, dv_ref, tol, what + " dv");
        expect_output(ds0, ds0_ref, tol, what + " ds0");
      }
    }
  });
}

}  // namespace
}  // namespace seqlab
ROOM

# "Adding a variant", 5: the CUDA kernels against the CPU (skipped without a GPU)
add tests/toy_mix_gpu_test.cc <<'ROOM'
// CUDA against CPU for the toy_mix slots (src/cuda/toy/toy_mix.cu against the CPU kernels of
// src/layers/toy/toy_mix.cpp). Skipped where no GPU is usable.
//
// Each case draws fresh v, s0, dy, ds in the dtype under test, fills every CUDA output with NaN first (an
// element the kernels fail to write shows up), and compares y, the final state, dv and ds0 with the CPU
// slots of both forms (the CUDA kernels compute both the same way); then the differentiable op on the GPU
// against the CPU. For bf16 the CPU reference runs in f32 on the same bf16 values.
// Cases: T = 1, T = 0, odd head sizes, many columns, a count n0 > 0. Tolerance fused_op_rtol (1e-4 f32,
// 1e-10 f64, 2e-2 bf16).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "cuda_test_util.h"
#include "layers/toy/toy_mix.h"
#include "tensor/kernels.h"

namespace seqlab::testing {
namespace {

struct Case {
  int64_t B, T, H, D, count;
};

const Case kCases[] = {{2, 1, 3, 5, 0}, {2, 0, 3, 4, 6}, {1, 37, 2, 3, 4}, {4, 300, 8, 64, 0}};

class CudaToyMixVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { SEQLAB_SKIP_WITHOUT_GPU(); }
  Generator gen_{test_seed(73)};
};

TEST_F(CudaToyMixVsCpu, SlotsForwardAndBackward) {
  for (DType dtype : kFloatTypes) {
    const double tol = fused_op_rtol(dtype);
    const DType rd = reference_type(dtype);
    for (const Case& c : kCases) {
      for (ToyMixForm form : {ToyMixForm::recurrent, ToyMixForm::parallel}) {
        const std::string what = std::string(dtype_name(dtype)) + " T" + std::to_string(c.T) + " D" +
                                 std::to_string(c.D) + (form == ToyMixForm::recurrent ? " recurrent" : " parallel");
        const kernel::ToyMixParams p{form, c.count};
        const Shape seq{c.B, c.T, c.H, c.D}, state{c.B, c.H, c.D};
        const Tensor v = Tensor::randn(seq, gen_, dtype), s0 = Tensor::randn(state, gen_, dtype);
        const Tensor dy = Tensor::randn(seq, gen_, dtype), ds = Tensor::randn(state, gen_, dtype);

        Tensor y = poisoned(seq, dtype), s = poisoned(state, dtype);
        kernel::toy_mix_forward_kernel(kGpu, on_gpu(v), on_gpu(s0), p, y, s);
        Tensor y_ref = Tensor::empty(seq, rd), s_ref = Tensor::empty(state, rd);
        kernel::toy_mix_forward_kernel(kCpu, as_reference(v), as_reference(s0), p, y_ref, s_ref);
        expect_close(y, y_ref, tol, what + " y");
        expect_close(s, s_ref, tol, what + " final state");

        Tensor dv = poisoned(seq, dtype), ds0 = poisoned(state, dtype);
        kernel::toy_mix_backward_kernel(kGpu, on_gpu(dy), on_gpu(ds), p, dv, ds0);
        Tensor dv_ref = Tensor::empty(seq, rd), ds0_ref = Tensor::empty(state, rd);
        kernel::toy_mix_backward_kernel(kCpu, as_reference(dy), as_reference(ds), p, dv_ref, ds0_ref);
        expect_close(dv, dv_ref, tol, what + " dv");
        expect_close(ds0, ds0_ref, tol, what + " ds0");
      }
    }
  }
}

// The op end to end on the GPU (entry point, node, backward) against the same on the CPU, in f32.
TEST_F(CudaToyMixVsCpu, DifferentiableOp) {
  const Tensor v = Tensor::randn({2, 11, 3, 5}, gen_, DType::f32), s0 = Tensor::randn({2, 3, 5}, gen_, DType::f32);
  const Tensor dy = Tensor::randn({2, 11, 3, 5}, gen_, DType::f32), ds = Tensor::randn({2, 3, 5}, gen_, DType::f32);
  ToyMixOptions o;
  o.count = 2;
  std::vector<Tensor> got, want;
  for (bool gpu : {true, false}) {
    Tensor vv = set_requires_grad(gpu ? on_gpu(v) : kernel::clone(v));
    Tensor ss = set_requires_grad(gpu ? on_gpu(s0) : kernel::clone(s0));
    ToyMixOutput out = toy_mix(vv, ss, o);
    backward({out.y, out.final_state}, {gpu ? on_gpu(dy) : dy, gpu ? on_gpu(ds) : ds});
    std::vector<Tensor>& results = gpu ? got : want;
    results = {out.y.detach(), out.final_state.detach(), grad_of(vv), grad_of(ss)};
  }
  const char* names[4] = {"y", "final state", "dv", "ds0"};
  for (size_t i = 0; i < 4; ++i) expect_close(got[i], want[i], fused_op_rtol(DType::f32), names[i]);
}

}  // namespace
}  // namespace seqlab::testing
ROOM

# "Adding a variant", 5: the NumPy reference of the op runner
add tests/numpy_refs/toy_mix.py <<'ROOM'
# NumPy reference of the toy_mix op (src/layers/toy/toy_mix.h), for tests/op_runner_numpy_test.py, which runs
# this file with its own names in scope (Case, randn, np, ...). The forward is the running sum token by
# token; the vector-Jacobian product is a reverse loop over time written out by hand.


def toy_mix_ref(xs, a):
    v, s0 = xs
    B, T, H, D = v.shape
    n0 = a["count"]
    S = s0.copy() if s0 is not None else np.zeros((B, H, D))
    y = np.zeros_like(v)
    for t in range(T):
        S = S + v[:, t]
        y[:, t] = S / (n0 + t + 1)

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros_like(y)
        G = (gs[1] if gs[1] is not None else np.zeros_like(S)).copy()   # dL/dS_t
        dv = np.zeros_like(v)
        for t in reversed(range(T)):
            G = G + gy[:, t] / (n0 + t + 1)
            dv[:, t] = G
        return [dv, G if s0 is not None else None]

    return [y, S], back


def _toy_case(B, T, H, D, attrs, state=True):
    return Case([randn(B, T, H, D), randn(B, H, D) if state else None], toy_mix_ref, attrs)


CASES = {
    "toy_mix": lambda: [
        _toy_case(2, 7, 3, 3, {"form": "recurrent", "count": 4}),
        _toy_case(1, 6, 2, 5, {"form": "parallel"}, state=False),
        _toy_case(2, 1, 2, 3, {"form": "recurrent"}),
        _toy_case(1, 9, 1, 2, {"form": "parallel", "count": 11}),
    ],
}
ROOM

# "Adding a variant", 6: the doc page
add docs/variants/toy_mix.md <<'ROOM'
# toy_mix: a throwaway mixer

Code: `src/layers/toy/toy_mix.{h,cpp}` (entry point, CPU kernels of both forms, autograd node, registry entry
`toy_mix`), slots `src/tensor/slots/toy/toy_mix.h`, `src/cuda/toy/toy_mix.cu` and `toy_mix_kernels.cuh` (CUDA
kernels), the mixer `model.mixer = "toy_mix"` (`src/layers/toy/toy_mix_mixer.cpp`); tests: `tests/toy_mix_test.cc`,
`tests/toy_mix_emulation_test.cc`, `tests/toy_mix_gpu_test.cc`, NumPy reference: `tests/numpy_refs/toy_mix.py`;
recipe `recipes/toy_mix_small.toml`.

This room is not part of seqlab: `tests/new_mixer_test.sh` writes it into a scratch copy of the repository to
show that adding a mixer, exactly as `docs/design.md` "Adding a variant" lists, edits no existing file but the
generated `docs/recipes.md`. The op is deliberately trivial; everything around it is complete.

## What it computes
Input `v [B, T, H, D]`, optional `initial_state s0 [B, H, D]` (zeros when absent) holding the sum of
`n0 = count` earlier tokens (attribute `count`, in `[0, 2^53]` so that `n0 + t + 1` is exact in double). Per
batch entry and head:

    S_t = S_{t−1} + v_t,   S_{−1} = s0          y_t = w_t S_t,   w_t = 1 / (n0 + t + 1)

Outputs `y [B, T, H, D]`, `final_state = S_{T−1}` (`s0` when `T = 0`), and the count `n0 + T` (returned by the
C++ entry point; the op runner's caller knows it). With `s0 = 0` and `n0 = 0` this is the causal running mean
`y_t = (1/(t+1)) Σ_{s≤t} v_s`. The layer around it projects `v = x W_v` and `y W_o`.

## Forms (equal)
- **recurrent** (default): the step above, token by token, `O(T·D)`; a one-token decode step is this form
  with `T = 1` from the previous state and count.
- **parallel**: `y = A V + w s0ᵀ` with the averaging matrix `A_ts = w_t` for `s ≤ t`, else 0 (one `T × T`
  GEMM per (batch, head)); `final_state = s0 + Σ_t v_t`.

## Backward (derived by hand)
`y_t` depends on `v_s` for `s ≤ t` with weight `w_t`, and `final_state` on every `v_s` with weight 1. With
`G_t = ∂L/∂S_t = dS + Σ_{t'≥t} w_t' dy_t'` (the gradient of the state after token `t`):

    dv_t = G_t            ds0 = G_0   (dS when T = 0)

computed by a reverse sweep `G ← G + w_t dy_t`, `dv_t = G` from `G = dS`. In the parallel form the same is
`dV = Aᵀ dY + 1 dSᵀ` and `ds0 = dS + Σ_t w_t dy_t`. The op is linear in `(v, s0)`, so the node saves nothing:
the backward reads only the output gradients and the count.

## CUDA kernels (`src/cuda/toy/toy_mix.cu`, device code in `toy_mix_kernels.cuh`)
One thread per column `(b, h, d)` in a grid-stride loop, the running sum (or `G`) in a register in the
compute type (f32 for bf16, rounded on store), `w_t` formed as the CPU forms it; both forms run this one
recurrence. Checked on the CPU by `tests/toy_mix_emulation_test.cc` and against the CPU kernels by
`tests/toy_mix_gpu_test.cc` where a GPU is present.

## Traits
Causal and recurrent (a fixed state of `d + 1` elements per sequence: the sum and its count); not
bidirectional; **no sequence-parallel form**, so `parallel.sp > 1` is refused by the recipe loader in one
line naming the mixer (the state passing of the other recurrences would apply, but this room leaves it out on
purpose, to exercise that refusal).
ROOM

# "Adding a variant", 7: the recipe (docs/recipes.md is regenerated below)
add recipes/toy_mix_small.toml <<'ROOM'
# The throwaway toy_mix mixer (the causal running mean of the values per head, docs/variants/toy_mix.md) at
# gpt_small's scale: a room added by tests/new_mixer_test.sh to show that a new mixer edits no existing file.
# Same data, steps, optimiser and schedule as recipes/gpt_small.toml. Keys left out take their defaults
# (docs/recipes.md).

[model]
mixer = "toy_mix"       # every block mixes tokens with the running mean (docs/variants/toy_mix.md)
d_model = 256
n_layers = 4
n_heads = 4             # head size 64: a running sum of 64 values per head

[model.toy_mix]
form = "recurrent"      # training form of the op: recurrent or parallel

[data]
source = "text"
path = "/usr/share/games/fortunes"
format = "fortune"      # one document per fortune
tokenizer = "byte"

[train]
steps = 1000
batch_size = 8
seq_len = 256
seed = 1337

[optim]
name = "adamw"
lr = 1e-3
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0
schedule = "cosine"
warmup_steps = 30
min_lr_ratio = 0.1

[log]
eval_every = 100

[checkpoint]
every = 200
ROOM

# ---- 3 and 4. configure and build the copy as this build is configured; docs/recipes.md regenerated ----
# The cache entries that decide how the libraries compile, from the CMakeCache.txt beside the binary, so
# that the copy hits ccache for every file it shares with this tree (and a sanitizer build checks the room
# under its sanitizers).
CONFIG=()
CACHE=$(dirname "$SEQLAB")/CMakeCache.txt
KEYS="CMAKE_BUILD_TYPE|CMAKE_CXX_COMPILER|CMAKE_CUDA_COMPILER|CMAKE_PREFIX_PATH|SEQLAB_CCACHE|SEQLAB_CPU_ARCH"
KEYS+="|SEQLAB_CUDA|SEQLAB_CUDA_ARCHITECTURES|SEQLAB_SANITIZE|SEQLAB_FUZZ"
if [ -f "$CACHE" ]; then
  while IFS= read -r entry; do CONFIG+=("-D$entry"); done < <(grep -E "^($KEYS):[A-Z]+=" "$CACHE")
else
  echo "   no CMakeCache.txt beside $SEQLAB: the copy is configured with the defaults"
fi
BUILD=$COPY/build
phase "configuring the copy (${CONFIG[*]:-defaults})"
cmake -S "$COPY" -B "$BUILD" -G Ninja "${CONFIG[@]}" > "$WORK/configure.log" 2>&1 ||
  stop "configuring the copy" "$WORK/configure.log"
phase "building seqlab in the copy"
ninja -C "$BUILD" -j "$JOBS" seqlab > "$WORK/build.log" 2>&1 || stop "building seqlab in the copy" "$WORK/build.log"
"$BUILD/seqlab" recipe --doc > "$WORK/recipes.md" || stop "seqlab recipe --doc in the copy" /dev/null
mv "$WORK/recipes.md" "$COPY/docs/recipes.md"

# The tests that cover every registered mixer or op, and the room's own (its GPU test is not built by a
# sanitizer build, which is CPU only).
TESTS=(mixer_test decoder_test recipe_test sequence_parallel_test op_gradcheck_test op_hostile_test model_kinds_test
       toy_mix_test toy_mix_emulation_test)
ninja -C "$BUILD" -t targets all | grep -q '^toy_mix_gpu_test:' && TESTS+=(toy_mix_gpu_test)
phase "building ${TESTS[*]} in the copy"
ninja -C "$BUILD" -j "$JOBS" "${TESTS[@]}" >> "$WORK/build.log" 2>&1 ||
  stop "building the tests in the copy" "$WORK/build.log"
# The room compiles without a warning (the build's -Wall -Wextra; nvcc's too).
ROOM_WARNING='(toy/|toy_mix)[^ :(]*(:[0-9]+(:[0-9]+)?:|\([0-9]+\):) warning'
if grep -qE "$ROOM_WARNING" "$WORK/build.log"; then
  fail "the room's files compile with warnings:"
  grep -E -A3 "$ROOM_WARNING" "$WORK/build.log" | head -n 20 | sed 's/^/  /'
fi
echo "   $(grep -c '^\[' "$WORK/build.log") build steps"

# ---- the tests, in the copy ----
phase "running the tests in the copy"
for t in "${TESTS[@]}" layering_test.py; do
  if ctest --test-dir "$BUILD" -R "^${t//./\\.}\$" --output-on-failure > "$WORK/ctest.log" 2>&1 &&
     grep -q 'tests passed, 0 tests failed out of 1$' "$WORK/ctest.log"; then
    pass "$t in the copy$(grep -q 'Skipped' "$WORK/ctest.log" && echo ' (skipped: no GPU)')"
  else
    fail "$t in the copy"
    tail -n 40 "$WORK/ctest.log" | sed 's/^/  /'
  fi
done

# The op runner against the NumPy reference tests/numpy_refs/toy_mix.py, found by its name as
# tests/op_runner_numpy_test.py finds every reference (that test runs every op; this runs toy_mix's cases).
if (cd "$COPY/tests" && python3 -B - "$BUILD/seqlab" > "$WORK/numpy.log" 2>&1) <<'PY'
import json, os, subprocess, sys, tempfile
import op_runner_numpy_test as runner
binary = sys.argv[1]
listing = subprocess.run([binary, "op", "--list"], capture_output=True, text=True, check=True).stdout
spec = next(s for s in map(json.loads, filter(str.strip, listing.splitlines())) if s["name"] == "toy_mix")
cases = runner.cases_for("toy_mix")
if not cases:
    sys.exit("no NumPy reference for toy_mix")
with tempfile.TemporaryDirectory() as tmp:
    worst = max(runner.run_case(binary, spec, c, os.path.join(tmp, str(i))) for i, c in enumerate(cases))
print(f"{len(cases)} cases, max rel error {worst:.2g}")
PY
then
  pass "the op runner's toy_mix against tests/numpy_refs/toy_mix.py: $(tail -n 1 "$WORK/numpy.log")"
else
  fail "the op runner's toy_mix against tests/numpy_refs/toy_mix.py"
  tail -n 20 "$WORK/numpy.log" | sed 's/^/  /'
fi

# The recipe trains: recipes/toy_mix_small.toml at a tiny size on a small corpus, 20 steps on the CPU; the
# loss falls; sampling decodes through the mixer's state.
phase "training recipes/toy_mix_small.toml (tiny) in the copy"
word_corpus "$WORK/corpus.txt" 3 200 12
RUN=$WORK/run
TINY=(--set model.d_model=16 --set model.n_layers=2 --set model.n_heads=2
      --set "data.path=\"$WORK/corpus.txt\"" --set 'data.format="text"' --set "data.cache_dir=\"$WORK/cache\""
      --set 'train.device="cpu"' --set train.steps=20 --set train.batch_size=4 --set train.seq_len=32
      --set optim.lr=1e-2 --set optim.warmup_steps=2 --set log.every=1 --set log.eval_every=20
      --set log.eval_batches=2 --set log.sample_every=0 --set checkpoint.every=20 --set 'log.progress="plain"')
if "$BUILD/seqlab" "$COPY/recipes/toy_mix_small.toml" "${TINY[@]}" --out "$RUN" > "$WORK/train.log" 2>&1; then
  if falls=$(python3 - "$RUN/metrics.jsonl" 2>&1 <<'PY'
import json, math, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if '"loss"' in line]
losses = [s["loss"] for s in steps]
if len(losses) != 20 or not all(math.isfinite(x) for x in losses):
    sys.exit(f"expected 20 finite losses, got {losses}")
first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
print(f"loss {first:.3f} -> {last:.3f} (means of the first and last 3 steps)")
sys.exit(0 if last < 0.9 * first else 1)
PY
  ); then
    pass "recipes/toy_mix_small.toml trains: $falls"
  else
    fail "recipes/toy_mix_small.toml: the loss does not fall: $falls"
  fi
  if sample=$("$BUILD/seqlab" sample "$RUN" --prompt "the cat " --tokens 16 --seed 1 2> "$WORK/sample.log") &&
     [ "${#sample}" -gt 8 ]; then
    pass "seqlab sample decodes the toy_mix model: $(printf '%s' "$sample" | LC_ALL=C tr -c '[:print:]' '.')"
  else
    fail "seqlab sample of the toy_mix run"
    tail -n 5 "$WORK/sample.log" | sed 's/^/  /'
  fi
else
  fail "training recipes/toy_mix_small.toml"
  tail -n 20 "$WORK/train.log" | sed 's/^/  /'
fi

# ---- 5. nothing existing was edited but docs/recipes.md ----
phase "checking what changed in the copy"
{
  echo " M docs/recipes.md"
  for f in "${NEW[@]}"; do echo "?? $f"; done
} | sort > "$WORK/expected"
# only_room_changes: the copy's git status is exactly docs/recipes.md modified and the room's files new
# (the differences in $WORK/status.diff: < found, > expected).
only_room_changes() {
  diff <(copy_git status --porcelain --untracked-files=all | sort) "$WORK/expected" > "$WORK/status.diff"
}
if only_room_changes; then
  pass "git status: docs/recipes.md modified, the ${#NEW[@]} files of the room new, nothing else"
else
  fail "git status of the copy is not docs/recipes.md and the room's new files (< found, > expected):"
  sed 's/^/  /' "$WORK/status.diff"
fi
# The check bites: an edit of an existing file (a line added to src/layers/mixer.h) is reported.
echo "// an edit" >> "$COPY/src/layers/mixer.h"
if ! only_room_changes && grep -qxF '<  M src/layers/mixer.h' "$WORK/status.diff"; then
  pass "the check reports an edit of an existing file (src/layers/mixer.h)"
else
  fail "an edit of src/layers/mixer.h went unreported"
fi
copy_git checkout -q -- src/layers/mixer.h
if copy_git diff -- docs/recipes.md | grep -q '^+.*\[model\.toy_mix\]' &&
   copy_git diff -- docs/recipes.md | grep -q '^+.*"toy_mix"'; then
  pass "docs/recipes.md now lists toy_mix and its [model.toy_mix] table"
else
  fail "the regenerated docs/recipes.md does not list toy_mix"
fi

# ---- 6. parallel.sp > 1 is refused in one line naming the mixer ----
# refused NAME PREFIX ARGS...: `seqlab recipe check ARGS` exits 2 with nothing on stdout and one line on
# stderr that starts with PREFIX and names the mixer and what it lacks.
refused() {
  local name=$1 prefix=$2
  shift 2
  "$BUILD/seqlab" recipe check "$@" > "$WORK/stdout" 2> "$WORK/stderr"
  local rc=$? problem=""
  if [ "$rc" -ne 2 ]; then problem="exit code $rc, not 2"
  elif [ "$(wc -l < "$WORK/stderr")" -ne 1 ]; then problem="$(wc -l < "$WORK/stderr") lines on stderr, not 1"
  elif [ "$prefix" != "$(head -c ${#prefix} "$WORK/stderr")" ]; then problem="stderr does not start with '$prefix'"
  elif ! grep -qF "mixer 'toy_mix' has no sequence-parallel form" "$WORK/stderr"; then
    problem="the message does not name the mixer and what it lacks"
  elif [ -s "$WORK/stdout" ]; then problem="something was printed on stdout"
  fi
  if [ -z "$problem" ]; then
    pass "$name: $(cat "$WORK/stderr")"
  else
    fail "$name: $problem"
    sed 's/^/  /' "$WORK/stderr"
  fi
}
RECIPE=$COPY/recipes/toy_mix_small.toml
refused "parallel.sp = 2 on the command line" "--set parallel.sp=2: " "$RECIPE" --set parallel.sp=2
printf '[model]\nmixer = "toy_mix"\nd_model = 64\n\n[parallel]\nsp = 4\n' > "$WORK/sp.toml"
refused "parallel.sp = 4 in the recipe" "$WORK/sp.toml:6: " "$WORK/sp.toml"
if "$BUILD/seqlab" recipe check "$RECIPE" --set parallel.sp=1 > "$WORK/stdout" 2> "$WORK/stderr" &&
   grep -q '^mixer = "toy_mix"' "$WORK/stdout"; then
  pass "the toy recipe checks with parallel.sp = 1"
else
  fail "the toy recipe is refused with parallel.sp = 1"
  sed 's/^/  /' "$WORK/stderr"
fi

if [ "$failures" -eq 0 ]; then echo "passed in ${SECONDS}s"; else echo "FAILED: $failures failure(s) in ${SECONDS}s"; fi
[ "$failures" -eq 0 ]
