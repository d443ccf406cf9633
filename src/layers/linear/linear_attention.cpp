// Linear attention and Performer FAVOR+ features: raw entry points, the CPU forward and backward
// kernels of every form side by side, the autograd nodes, and the registry entries. The equations
// are in linear_attention.h; the backward derivations in docs/variants/linear_attention.md.
//
// How the CPU kernels work:
// - φ is applied elementwise before the kernels (fq = φ(q), fk = φ(k)); the backward kernels give
//   dfq, dfk and the node multiplies them by φ'(q), φ'(k) recomputed from q, k.
// - One task per (batch, head), OpenMP over tasks; per task the sequence is walked in order, its
//   chunk-level products are GEMMs through the GEMM slot (single-threaded inside the team).
// - Saved for the backward: q, k, v and the initial state/normaliser. Recomputed: φ, the states at
//   chunk starts (chunkwise) or at every step (recurrent, a forward sweep), o's numerator and
//   denominator. Nothing of size T × dk × dv is ever stored.
// - bf16 tensors are taken as they are by the linear attention kernels (layers/variant_rows.h): they are
//   templates on the tensors' element type E and compute in T = compute_t<E> (f32 for bf16); a head's rows
//   are widened when its task starts and its outputs rounded once when it ends; the recurrent form, the
//   states, normalisers and denominators stay f32, and every GEMM (the `mm` calls: fQ fKᵀ, fQ S, A V,
//   fKᵀ V and the backward's u Vᵀ, dA fK, u Sᵀ, dAᵀ fQ, V Gᵀ, Aᵀ u, fK G, fQᵀ u) runs in f32 on
//   those rows. For f32 and f64 the rows are the tensors' own and `mm` is cpu::gemm: the kernels they
//   always were. The Performer feature kernels still take f32 stand-ins of bf16 tensors.
// - With normalize, the output gradient dO_t splits into u_t = dO_t / den_t (the gradient of the
//   numerator φ(q_t) S_t) and δ_t = −(dO_t·num_t) / den_t² (the gradient of the denominator).
#include "layers/linear/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "autograd/op_registry.h"
#include "layers/variant_inputs.h"
#include "layers/variant_rows.h"
#include "tensor/blas_rows.h"
#include "tensor/parallel.h"
#include "tensor/kernels.h"

namespace seqlab {
namespace kernel {

}  // namespace kernel

FeatureMap parse_feature_map(const std::string& name) {
  if (name == "elu_plus_one" || name == "elu+1") return FeatureMap::elu_plus_one;
  if (name == "relu") return FeatureMap::relu;
  if (name == "identity") return FeatureMap::identity;
  throw std::invalid_argument("linear_attention: unknown feature_map '" + name +
                              "' (expected elu_plus_one, relu or identity)");
}

LinearAttentionForm parse_linear_attention_form(const std::string& name) {
  static const FormNames<LinearAttentionForm> forms{"linear_attention",
                                                    {{"chunkwise", LinearAttentionForm::chunkwise},
                                                     {"recurrent", LinearAttentionForm::recurrent},
                                                     {"noncausal", LinearAttentionForm::noncausal}}};
  return forms.parse(name);
}

namespace {

using Dims = HeadDims;

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s0, const Tensor& z0,
                  const LinearAttentionOptions& opts) {
  const VariantInputs in("linear_attention",
                         {{"q", q}, {"k", k}, {"v", v}, {"initial_state", s0}, {"initial_normalizer", z0}},
                         "q, k [B, T, H, dk], v [B, T, H, dv], initial_state [B, H, dk, dv] or none, "
                         "initial_normalizer [B, H, dk] or none");
  const Dims d = in.qkv();
  in.shaped("initial_state", {d.B, d.H, d.dk, d.dv}, "[B, H, dk, dv]");
  in.shaped("initial_normalizer", {d.B, d.H, d.dk}, "[B, H, dk]");
  in.same_dtype_and_device();
  if (!(opts.eps >= 0)) in.fail("eps must be ≥ 0, got " + std::to_string(opts.eps));
  if (opts.chunk <= 0) in.fail("chunk must be positive, got " + std::to_string(opts.chunk));
  return d;
}

// ---- feature maps, elementwise, through the kernel layer (so they run on the tensors' device) ----
//   elu+1:  φ(x) = x + 1 (x > 0), e^x (x ≤ 0)  =  e^{x − relu(x)} + relu(x)   (each branch exact: e^0 = 1,
//           x − relu(x) is x or 0 exactly; unlike elu(x) + 1, which cancels to 0 for very negative x)
//           φ'(x) = 1 (x > 0), e^x (x ≤ 0)  =  e^{x − relu(x)}
//   relu:   φ(x) = max(x, 0),  φ'(x) = [x > 0];   identity: φ(x) = x, φ' = 1.
Tensor exp_of_negative_part(const Tensor& x) {
  using kernel::BinaryOp;
  using kernel::UnaryOp;
  return kernel::unary(UnaryOp::exp, kernel::binary(BinaryOp::sub, x, kernel::unary(UnaryOp::relu, x)));
}

Tensor feature_map(FeatureMap f, const Tensor& x) {
  using kernel::UnaryOp;
  switch (f) {
    case FeatureMap::elu_plus_one:
      return kernel::binary(kernel::BinaryOp::add, exp_of_negative_part(x), kernel::unary(UnaryOp::relu, x));
    case FeatureMap::relu:
      return kernel::unary(UnaryOp::relu, x);
    case FeatureMap::identity:
      break;
  }
  return kernel::contiguous(x);
}

// g ⊙ φ'(x)
Tensor times_feature_map_grad(FeatureMap f, const Tensor& x, const Tensor& g) {
  switch (f) {
    case FeatureMap::elu_plus_one:
      return kernel::binary(kernel::BinaryOp::mul, g, exp_of_negative_part(x));
    case FeatureMap::relu:
      return kernel::unary_backward(kernel::UnaryOp::relu, g, x, x);  // reads x only
    case FeatureMap::identity:
      break;
  }
  return g;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// CPU kernels
namespace cpu {
namespace {

using kernel::LinearAttentionParams;

// Pointers of one (batch, head) task. Token t of the task sits at row t with row strides ldk, ldv.
template <class T>
struct Task {
  const T *fq, *fk, *v, *s0, *z0;
  int64_t T_, Dk, Dv, ldk, ldv;
};

struct Geometry {
  int64_t B, T, H, Dk, Dv;
  int64_t tasks() const { return B * H; }
  int64_t qk_offset(int64_t task) const { return (task / H * T * H + task % H) * Dk; }
  int64_t v_offset(int64_t task) const { return (task / H * T * H + task % H) * Dv; }
  bool parallel() const { return tasks() > 1 && T * (Dk + 1) * (Dv + 1) > kParallelGrain; }
};

Geometry geometry(const Tensor& fq, const Tensor& v) {
  return {fq.size(0), fq.size(1), fq.size(2), fq.size(3), v.size(3)};
}

// ---- forward ----
// Per task, with S, z initialised from s0, z0 and o's rows at stride ldv:
//   recurrent: for t: S += fk_tᵀ v_t, z += fk_t, num = fq_t S, den = fq_t·z + eps, o_t = num/den.
//   chunkwise: per chunk [t0, t0+L): A = mask_{s≤r}(fQ fKᵀ) [L, L]; num = fQ S + A V (two GEMMs);
//              den_r = fq_r·z + Σ_s A_rs + eps; then S += fKᵀ V (GEMM), z += Σ_s fk_s.
//   noncausal: S += fKᵀ V, z += Σ fk over the whole sequence; num = fQ S; den_t = fq_t·z + eps.
// Memory: reads fq, fk, v, s0, z0; writes o, s (final S), z (final z); scratch: A [C, C].
template <class E>
void forward(const Tensor& fq_t, const Tensor& fk_t, const Tensor& v_t, const Tensor& s0_t, const Tensor& z0_t,
             const LinearAttentionParams& p, const Tensor& o_t, const Tensor& s_t, const Tensor& z_t) {
  using T = compute_t<E>;
  const Geometry g = geometry(fq_t, v_t);
  // ld_k, ld_v: the tensors' row strides; ldk, ldv: the strides of the rows the kernel reads (TaskRows).
  const int64_t Dk = g.Dk, Dv = g.Dv, ld_k = g.H * Dk, ld_v = g.H * Dv, Tn = g.T;
  const int64_t ldk = TaskRows<E>::ld(ld_k, Dk), ldv = TaskRows<E>::ld(ld_v, Dv);
  const T eps = static_cast<T>(p.eps);
  const int64_t C = std::max<int64_t>(1, std::min(p.chunk, Tn));
#pragma omp parallel if (g.parallel())
  {
    std::vector<T> A(static_cast<size_t>(p.form == LinearAttentionForm::chunkwise ? C * C : 1));
    TaskRows<E> io;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g.tasks(); ++task) {
      io.begin();
      const T* fq = io.in(fq_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* fk = io.in(fk_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* v = io.in(v_t, g.v_offset(task), Tn, Dv, ld_v);
      T* o = io.out(o_t, g.v_offset(task), Tn, Dv, ld_v);
      T* S = io.out(s_t, task * Dk * Dv, Dk, Dv, Dv);
      T* z = io.out(z_t, task * Dk, 1, Dk, Dk);
      std::copy_n(io.in(s0_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, S);
      std::copy_n(io.in(z0_t, task * Dk, 1, Dk, Dk), Dk, z);
      if (p.form == LinearAttentionForm::recurrent) {
        for (int64_t t = 0; t < Tn; ++t) {
          const T *fkt = fk + t * ldk, *vt = v + t * ldv, *fqt = fq + t * ldk;
          T* ot = o + t * ldv;
          for (int64_t i = 0; i < Dk; ++i) {
            z[i] += fkt[i];
            for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] += fkt[i] * vt[j];
          }
          std::fill_n(ot, Dv, T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j) ot[j] += fqt[i] * S[i * Dv + j];
          }
          if (p.normalize) {
            const T inv = T(1) / (dot(fqt, z, Dk) + eps);
            for (int64_t j = 0; j < Dv; ++j) ot[j] *= inv;
          }
        }
      } else if (p.form == LinearAttentionForm::noncausal) {
        mm(true, false, Dk, Dv, Tn, 1.0, fk, ldk, v, ldv, 1.0, S, Dv);
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < Dk; ++i) z[i] += fk[t * ldk + i];
        }
        mm(false, false, Tn, Dv, Dk, 1.0, fq, ldk, S, Dv, 0.0, o, ldv);
        if (p.normalize) {
          for (int64_t t = 0; t < Tn; ++t) {
            const T inv = T(1) / (dot(fq + t * ldk, z, Dk) + eps);
            for (int64_t j = 0; j < Dv; ++j) o[t * ldv + j] *= inv;
          }
        }
      } else {
        for (int64_t t0 = 0; t0 < Tn; t0 += C) {
          const int64_t L = std::min(C, Tn - t0);
          const T *fqc = fq + t0 * ldk, *fkc = fk + t0 * ldk, *vc = v + t0 * ldv;
          T* oc = o + t0 * ldv;
          mm(false, true, L, L, Dk, 1.0, fqc, ldk, fkc, ldk, 0.0, A.data(), L);
          for (int64_t r = 0; r < L; ++r) std::fill(A.data() + r * L + r + 1, A.data() + (r + 1) * L, T(0));
          mm(false, false, L, Dv, Dk, 1.0, fqc, ldk, S, Dv, 0.0, oc, ldv);
          mm(false, false, L, Dv, L, 1.0, A.data(), L, vc, ldv, 1.0, oc, ldv);
          if (p.normalize) {
            for (int64_t r = 0; r < L; ++r) {
              T den = dot(fqc + r * ldk, z, Dk) + eps;
              for (int64_t s = 0; s <= r; ++s) den += A[r * L + s];
              const T inv = T(1) / den;
              for (int64_t j = 0; j < Dv; ++j) oc[r * ldv + j] *= inv;
            }
          }
          mm(true, false, Dk, Dv, L, 1.0, fkc, ldk, vc, ldv, 1.0, S, Dv);
          for (int64_t r = 0; r < L; ++r) {
            for (int64_t i = 0; i < Dk; ++i) z[i] += fkc[r * ldk + i];
          }
        }
      }
      io.store();
    }
  }
}

// ---- backward ----
// Output gradients dO (rows), dS_T = G, dz_T = gz. With u_t = dO_t/den_t, δ_t = −(dO_t·num_t)/den_t²
// (u = dO, δ = 0 without normalize), every form computes
//   dfq_t = S_t u_t + δ_t z_t,
//   G_t = dS_T + Σ_{t' ≥ t} fq_t'ᵀ u_t',  gz_t = dz_T + Σ_{t' ≥ t} δ_t' fq_t'   (the state gradients)
//   dfk_t = G_t v_t + gz_t,  dv_t = fk_t G_t,  dS_0 = G_1,  dz_0 = gz_1
// (noncausal: S_t, z_t → S_T, z_T and G_t, gz_t → G_1, gz_1 for every t).
//   recurrent: a forward sweep recomputes S_t, z_t and gives dfq_t, u_t, δ_t; a reverse sweep
//              accumulates G, gz and gives dfk_t, dv_t.
//   chunkwise: a forward sweep stores the states entering each chunk; a reverse sweep over chunks
//              recomputes A, num, den and with G, gz after the chunk:
//              dA = mask(u Vᵀ + δ 1ᵀ);  dfQ = dA fK + u S_prevᵀ + δ z_prevᵀ;
//              dfK = dAᵀ fQ + V Gᵀ + 1 gzᵀ;  dV = Aᵀ u + fK G;  then G += fQᵀ u, gz += fQᵀ δ.
// Memory: reads fq, fk, v, s0, z0, dO, dS, dz; writes dfq, dfk, dv, ds0, dz0. Scratch per task:
// u [T, dv] and δ [T] (recurrent, noncausal) or the chunk-start states [⌈T/C⌉, dk, dv + 1] and
// A, dA [C, C], u [C, dv], δ [C] (chunkwise).
template <class E>
void backward(const Tensor& fq_t, const Tensor& fk_t, const Tensor& v_t, const Tensor& s0_t, const Tensor& z0_t,
              const Tensor& do_t, const Tensor& ds_t, const Tensor& dz_t, const LinearAttentionParams& p,
              const Tensor& dfq_t, const Tensor& dfk_t, const Tensor& dv_t, const Tensor& ds0_t, const Tensor& dz0_t) {
  using T = compute_t<E>;
  const Geometry g = geometry(fq_t, v_t);
  const int64_t Dk = g.Dk, Dv = g.Dv, ld_k = g.H * Dk, ld_v = g.H * Dv, Tn = g.T;  // as in forward
  const int64_t ldk = TaskRows<E>::ld(ld_k, Dk), ldv = TaskRows<E>::ld(ld_v, Dv);
  const T eps = static_cast<T>(p.eps);
  const int64_t C = std::max<int64_t>(1, std::min(p.chunk, Tn));
  const int64_t NC = (Tn + C - 1) / C;
#pragma omp parallel if (g.parallel())
  {
    std::vector<T> S(static_cast<size_t>(Dk * Dv)), z(static_cast<size_t>(Dk)), num(static_cast<size_t>(Dv));
    std::vector<T> u, delta, A, dA, states;
    if (p.form == LinearAttentionForm::chunkwise) {
      u.resize(static_cast<size_t>(C * Dv));
      delta.resize(static_cast<size_t>(C));
      A.resize(static_cast<size_t>(C * C));
      dA.resize(A.size());
      states.resize(static_cast<size_t>(NC * Dk * (Dv + 1)));
    } else {
      u.resize(static_cast<size_t>(Tn * Dv));
      delta.resize(static_cast<size_t>(Tn));
    }
    TaskRows<E> io;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g.tasks(); ++task) {
      io.begin();
      const T* fq = io.in(fq_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* fk = io.in(fk_t, g.qk_offset(task), Tn, Dk, ld_k);
      const T* v = io.in(v_t, g.v_offset(task), Tn, Dv, ld_v);
      const T* dO = io.in(do_t, g.v_offset(task), Tn, Dv, ld_v);
      T* dfq = io.out(dfq_t, g.qk_offset(task), Tn, Dk, ld_k);
      T* dfk = io.out(dfk_t, g.qk_offset(task), Tn, Dk, ld_k);
      T* dv = io.out(dv_t, g.v_offset(task), Tn, Dv, ld_v);
      T* G = io.out(ds0_t, task * Dk * Dv, Dk, Dv, Dv);  // G and gz accumulate in place into dS_0, dz_0
      T* gz = io.out(dz0_t, task * Dk, 1, Dk, Dk);
      std::copy_n(io.in(s0_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, S.data());
      std::copy_n(io.in(z0_t, task * Dk, 1, Dk, Dk), Dk, z.data());
      std::copy_n(io.in(ds_t, task * Dk * Dv, Dk, Dv, Dv), Dk * Dv, G);
      std::copy_n(io.in(dz_t, task * Dk, 1, Dk, Dk), Dk, gz);

      // u_r, δ_r of one row from num_r (= fq_r S_r), den_r and dO_r.
      auto split_grad = [&](const T* dOr, const T* numr, T den, T* ur, T& dr) {
        if (!p.normalize) {
          std::copy_n(dOr, Dv, ur);
          dr = 0;
          return;
        }
        const T inv = T(1) / den;
        for (int64_t j = 0; j < Dv; ++j) ur[j] = dOr[j] * inv;
        dr = -dot(dOr, numr, Dv) * inv * inv;
      };

      if (p.form == LinearAttentionForm::recurrent) {
        for (int64_t t = 0; t < Tn; ++t) {  // forward sweep: S_t, z_t → dfq_t, u_t, δ_t
          const T *fkt = fk + t * ldk, *vt = v + t * ldv, *fqt = fq + t * ldk;
          for (int64_t i = 0; i < Dk; ++i) {
            z[i] += fkt[i];
            for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] += fkt[i] * vt[j];
          }
          std::fill(num.begin(), num.end(), T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j) num[j] += fqt[i] * S[i * Dv + j];
          }
          T* ut = u.data() + t * Dv;
          split_grad(dO + t * ldv, num.data(), dot(fqt, z.data(), Dk) + eps, ut, delta[t]);
          for (int64_t i = 0; i < Dk; ++i) dfq[t * ldk + i] = dot(S.data() + i * Dv, ut, Dv) + delta[t] * z[i];
        }
        for (int64_t t = Tn - 1; t >= 0; --t) {  // reverse sweep: G_t, gz_t → dfk_t, dv_t
          const T *fqt = fq + t * ldk, *fkt = fk + t * ldk, *vt = v + t * ldv, *ut = u.data() + t * Dv;
          for (int64_t i = 0; i < Dk; ++i) {
            gz[i] += delta[t] * fqt[i];
            for (int64_t j = 0; j < Dv; ++j) G[i * Dv + j] += fqt[i] * ut[j];
          }
          for (int64_t i = 0; i < Dk; ++i) dfk[t * ldk + i] = dot(G + i * Dv, vt, Dv) + gz[i];
          T* dvt = dv + t * ldv;
          std::fill_n(dvt, Dv, T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j) dvt[j] += fkt[i] * G[i * Dv + j];
          }
        }
      } else if (p.form == LinearAttentionForm::noncausal) {
        mm(true, false, Dk, Dv, Tn, 1.0, fk, ldk, v, ldv, 1.0, S.data(), Dv);  // S_T
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < Dk; ++i) z[i] += fk[t * ldk + i];
        }
        for (int64_t t = 0; t < Tn; ++t) {
          const T* fqt = fq + t * ldk;
          std::fill(num.begin(), num.end(), T(0));
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j) num[j] += fqt[i] * S[i * Dv + j];
          }
          split_grad(dO + t * ldv, num.data(), dot(fqt, z.data(), Dk) + eps, u.data() + t * Dv, delta[t]);
        }
        // dfQ = u S_Tᵀ + δ z_Tᵀ
        mm(false, true, Tn, Dk, Dv, 1.0, u.data(), Dv, S.data(), Dv, 0.0, dfq, ldk);
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < Dk; ++i) dfq[t * ldk + i] += delta[t] * z[i];
        }
        // G = dS_T + fQᵀ u, gz = dz_T + fQᵀ δ
        mm(true, false, Dk, Dv, Tn, 1.0, fq, ldk, u.data(), Dv, 1.0, G, Dv);
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < Dk; ++i) gz[i] += delta[t] * fq[t * ldk + i];
        }
        // dfK = V Gᵀ + 1 gzᵀ, dV = fK G
        mm(false, true, Tn, Dk, Dv, 1.0, v, ldv, G, Dv, 0.0, dfk, ldk);
        for (int64_t t = 0; t < Tn; ++t) {
          for (int64_t i = 0; i < Dk; ++i) dfk[t * ldk + i] += gz[i];
        }
        mm(false, false, Tn, Dv, Dk, 1.0, fk, ldk, G, Dv, 0.0, dv, ldv);
      } else {
        // Forward sweep: the states entering each chunk, S_prev [dk, dv] then z_prev [dk].
        for (int64_t c = 0; c < NC; ++c) {
          const int64_t t0 = c * C, L = std::min(C, Tn - t0);
          T* st = states.data() + c * Dk * (Dv + 1);
          std::copy(S.begin(), S.end(), st);
          std::copy(z.begin(), z.end(), st + Dk * Dv);
          mm(true, false, Dk, Dv, L, 1.0, fk + t0 * ldk, ldk, v + t0 * ldv, ldv, 1.0, S.data(), Dv);
          for (int64_t r = 0; r < L; ++r) {
            for (int64_t i = 0; i < Dk; ++i) z[i] += fk[(t0 + r) * ldk + i];
          }
        }
        for (int64_t c = NC - 1; c >= 0; --c) {  // reverse sweep over chunks
          const int64_t t0 = c * C, L = std::min(C, Tn - t0);
          const T *fqc = fq + t0 * ldk, *fkc = fk + t0 * ldk, *vc = v + t0 * ldv, *dOc = dO + t0 * ldv;
          const T* Sp = states.data() + c * Dk * (Dv + 1);
          const T* zp = Sp + Dk * Dv;
          T *dfqc = dfq + t0 * ldk, *dfkc = dfk + t0 * ldk, *dvc = dv + t0 * ldv;
          // A = mask(fQ fKᵀ); num = fQ S_prev + A V into u's rows (then turned into u in place).
          mm(false, true, L, L, Dk, 1.0, fqc, ldk, fkc, ldk, 0.0, A.data(), L);
          for (int64_t r = 0; r < L; ++r) std::fill(A.data() + r * L + r + 1, A.data() + (r + 1) * L, T(0));
          if (p.normalize) {
            mm(false, false, L, Dv, Dk, 1.0, fqc, ldk, Sp, Dv, 0.0, u.data(), Dv);
            mm(false, false, L, Dv, L, 1.0, A.data(), L, vc, ldv, 1.0, u.data(), Dv);
            for (int64_t r = 0; r < L; ++r) {
              T den = dot(fqc + r * ldk, zp, Dk) + eps;
              for (int64_t s = 0; s <= r; ++s) den += A[r * L + s];
              std::copy_n(u.data() + r * Dv, Dv, num.data());
              split_grad(dOc + r * ldv, num.data(), den, u.data() + r * Dv, delta[r]);
            }
          } else {
            for (int64_t r = 0; r < L; ++r) {
              std::copy_n(dOc + r * ldv, Dv, u.data() + r * Dv);
              delta[r] = 0;
            }
          }
          // dA = mask(u Vᵀ + δ 1ᵀ)
          mm(false, true, L, L, Dv, 1.0, u.data(), Dv, vc, ldv, 0.0, dA.data(), L);
          for (int64_t r = 0; r < L; ++r) {
            for (int64_t s = 0; s <= r; ++s) dA[r * L + s] += delta[r];
            std::fill(dA.data() + r * L + r + 1, dA.data() + (r + 1) * L, T(0));
          }
          // dfQ = dA fK + u S_prevᵀ + δ z_prevᵀ
          mm(false, false, L, Dk, L, 1.0, dA.data(), L, fkc, ldk, 0.0, dfqc, ldk);
          mm(false, true, L, Dk, Dv, 1.0, u.data(), Dv, Sp, Dv, 1.0, dfqc, ldk);
          // dfK = dAᵀ fQ + V Gᵀ + 1 gzᵀ
          mm(true, false, L, Dk, L, 1.0, dA.data(), L, fqc, ldk, 0.0, dfkc, ldk);
          mm(false, true, L, Dk, Dv, 1.0, vc, ldv, G, Dv, 1.0, dfkc, ldk);
          for (int64_t r = 0; r < L; ++r) {
            for (int64_t i = 0; i < Dk; ++i) {
              dfqc[r * ldk + i] += delta[r] * zp[i];
              dfkc[r * ldk + i] += gz[i];
            }
          }
          // dV = Aᵀ u + fK G
          mm(true, false, L, Dv, L, 1.0, A.data(), L, u.data(), Dv, 0.0, dvc, ldv);
          mm(false, false, L, Dv, Dk, 1.0, fkc, ldk, G, Dv, 1.0, dvc, ldv);
          // The state gradients before the chunk: G += fQᵀ u, gz += fQᵀ δ
          mm(true, false, Dk, Dv, L, 1.0, fqc, ldk, u.data(), Dv, 1.0, G, Dv);
          for (int64_t r = 0; r < L; ++r) {
            for (int64_t i = 0; i < Dk; ++i) gz[i] += delta[r] * fqc[r * ldk + i];
          }
        }
      }
      io.store();
    }
  }
}

void forward_cpu(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                 const LinearAttentionParams& p, const Tensor& o, const Tensor& s, const Tensor& z) {
  dispatch_float_or_bf16(fq.dtype(), "linear_attention",
                 [&](auto tag) { forward<decltype(tag)>(fq, fk, v, s0, z0, p, o, s, z); });
}

void backward_cpu(const Tensor& fq, const Tensor& fk, const Tensor& v, const Tensor& s0, const Tensor& z0,
                  const Tensor& dout, const Tensor& ds, const Tensor& dz, const LinearAttentionParams& p,
                  const Tensor& dfq, const Tensor& dfk, const Tensor& dv, const Tensor& ds0, const Tensor& dz0) {
  dispatch_float_or_bf16(fq.dtype(), "linear_attention backward", [&](auto tag) {
    backward<decltype(tag)>(fq, fk, v, s0, z0, dout, ds, dz, p, dfq, dfk, dv, ds0, dz0);
  });
}

// ---- Performer features ----
// Rows x_n [d] of x viewed as [N, d], ω [m, d]:
//   P = X ωᵀ (one GEMM), s_n = max_i P_ni (stabilize) or 0,
//   y_ni = exp(P_ni − ‖x_n‖²/2 − s_n) / √m.
// Memory: reads x, ω; writes y [N, m] (P is formed in y's storage).
template <class T>
void performer_forward(const Tensor& x, const Tensor& omega, bool stabilize, const Tensor& y) {
  const int64_t d = x.size(3), m = omega.size(0), N = x.numel() / std::max<int64_t>(1, d);
  const T *X = x.data<T>(), *W = omega.data<T>();
  T* Y = y.data<T>();
  gemm<T>(false, true, N, m, d, 1.0, X, d, W, d, 0.0, Y, m);
  const T inv_sqrt_m = static_cast<T>(1.0 / std::sqrt(static_cast<double>(m)));
  parallel_for(N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, m)), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* yn = Y + n * m;
      T shift = dot(X + n * d, X + n * d, d) / T(2);
      if (stabilize) shift += *std::max_element(yn, yn + m);
      for (int64_t i = 0; i < m; ++i) yn[i] = std::exp(yn[i] - shift) * inv_sqrt_m;
    }
  });
}

// With e_ni = dy_ni y_ni, Σ_n = Σ_i e_ni and i*_n the arg-max feature of row n (stabilize):
//   dx_n = Σ_i e_ni ω_i − Σ_n x_n − Σ_n ω_{i*_n}           (the last term only with stabilize)
//   dω_i = Σ_n e_ni x_n − Σ_{n: i*_n = i} Σ_n x_n
// since ∂y_ni/∂x_n = y_ni (ω_i − x_n − ω_{i*}) and ∂y_ni/∂ω_j = y_ni x_n ([i = j] − [j = i*]).
// Memory: reads dy, x, ω, y; writes dx, dω; scratch e [N, m] and, with stabilize, the arg-max per
// row (P recomputed by one GEMM).
template <class T>
void performer_backward(const Tensor& dy, const Tensor& x, const Tensor& omega, const Tensor& y, bool stabilize,
                        const Tensor& dx, const Tensor& domega) {
  const int64_t d = x.size(3), m = omega.size(0), N = x.numel() / std::max<int64_t>(1, d);
  const T *X = x.data<T>(), *W = omega.data<T>(), *Y = y.data<T>(), *dY = dy.data<T>();
  T *dX = dx.data<T>(), *dW = domega.data<T>();
  std::vector<T> e(static_cast<size_t>(N * m)), rowsum(static_cast<size_t>(N));
  std::vector<int64_t> arg(static_cast<size_t>(stabilize ? N : 0));
  if (stabilize) {
    gemm<T>(false, true, N, m, d, 1.0, X, d, W, d, 0.0, e.data(), m);
    for (int64_t n = 0; n < N; ++n)
      arg[n] = std::max_element(e.data() + n * m, e.data() + (n + 1) * m) - (e.data() + n * m);
  }
  for (int64_t n = 0; n < N; ++n) {
    T s = 0;
    for (int64_t i = 0; i < m; ++i) {
      e[n * m + i] = dY[n * m + i] * Y[n * m + i];
      s += e[n * m + i];
    }
    rowsum[n] = s;
  }
  gemm<T>(false, false, N, d, m, 1.0, e.data(), m, W, d, 0.0, dX, d);
  gemm<T>(true, false, m, d, N, 1.0, e.data(), m, X, d, 0.0, dW, d);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < d; ++c) {
      dX[n * d + c] -= rowsum[n] * X[n * d + c];
      if (stabilize) {
        dX[n * d + c] -= rowsum[n] * W[arg[n] * d + c];
        dW[arg[n] * d + c] -= rowsum[n] * X[n * d + c];
      }
    }
  }
}

void performer_forward_cpu(const Tensor& x, const Tensor& omega, bool stabilize, const Tensor& y) {
  dispatch_float(x.dtype(), "performer_features",
                 [&](auto tag) { performer_forward<decltype(tag)>(x, omega, stabilize, y); });
}

void performer_backward_cpu(const Tensor& dy, const Tensor& x, const Tensor& omega, const Tensor& y, bool stabilize,
                            const Tensor& dx, const Tensor& domega) {
  dispatch_float(x.dtype(), "performer_features backward",
                 [&](auto tag) { performer_backward<decltype(tag)>(dy, x, omega, y, stabilize, dx, domega); });
}

}  // namespace
}  // namespace cpu

namespace kernel {
// bf16 tensors are taken as they are (layers/variant_rows.h): rows widened per head.
SEQLAB_REGISTER_KERNEL_TAKING_BF16(linear_attention_forward_kernel, DeviceType::CPU, &cpu::forward_cpu);
SEQLAB_REGISTER_KERNEL_TAKING_BF16(linear_attention_backward_kernel, DeviceType::CPU, &cpu::backward_cpu);
SEQLAB_REGISTER_KERNEL(performer_forward_kernel, DeviceType::CPU, &cpu::performer_forward_cpu);
SEQLAB_REGISTER_KERNEL(performer_backward_kernel, DeviceType::CPU, &cpu::performer_backward_cpu);
}  // namespace kernel

// ------------------------------------------------------------------------------------------------
// The differentiable ops.
namespace {

kernel::LinearAttentionParams params_of(const LinearAttentionOptions& o) {
  return {o.form, o.normalize, o.eps, o.chunk};
}

Tensor or_zeros(const Tensor& t, const Shape& shape, const Tensor& like) {
  return t.defined() ? kernel::contiguous(t) : Tensor::zeros(shape, like.dtype(), like.device());
}

}  // namespace

// Saves q, k, v, S_0, z_0 (contiguous, zeros when absent); the backward recomputes φ(q), φ(k).
LinearAttentionOutput linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& initial_state,
                                       const Tensor& initial_normalizer, const LinearAttentionOptions& opts) {
  const Dims d = check_inputs(q, k, v, initial_state, initial_normalizer, opts);
  const Tensor qc = kernel::contiguous(q), kc = kernel::contiguous(k), vc = kernel::contiguous(v);
  const Tensor s0 = or_zeros(initial_state, {d.B, d.H, d.dk, d.dv}, q);
  const Tensor z0 = or_zeros(initial_normalizer, {d.B, d.H, d.dk}, q);
  const kernel::LinearAttentionParams p = params_of(opts);
  LinearAttentionOutput out{Tensor::empty({d.B, d.T, d.H, d.dv}, q.dtype(), q.device()),
                            Tensor::empty({d.B, d.H, d.dk, d.dv}, q.dtype(), q.device()),
                            Tensor::empty({d.B, d.H, d.dk}, q.dtype(), q.device())};
  const Tensor fq = feature_map(opts.feature_map, qc), fk = feature_map(opts.feature_map, kc);
  kernel::linear_attention_forward_kernel(q.device(), fq, fk, vc, s0, z0, p, out.o, out.final_state,
                                          out.final_normalizer);
  const FeatureMap fmap = opts.feature_map;
  record("linear_attention", {q, k, v, initial_state, initial_normalizer},
         {&out.o, &out.final_state, &out.final_normalizer}, {qc, kc, vc, s0, z0},
         [p, fmap](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           const Tensor &q_s = s[0], &k_s = s[1], &v_s = s[2];
           Tensor dfq = Tensor::empty(q_s.shape(), q_s.dtype(), q_s.device());
           Tensor dfk = Tensor::empty(k_s.shape(), k_s.dtype(), k_s.device());
           Tensor dv = Tensor::empty(v_s.shape(), v_s.dtype(), v_s.device());
           Tensor ds0 = Tensor::empty(s[3].shape(), s[3].dtype(), s[3].device());
           Tensor dz0 = Tensor::empty(s[4].shape(), s[4].dtype(), s[4].device());
           const Tensor fq = feature_map(fmap, q_s), fk = feature_map(fmap, k_s);
           kernel::linear_attention_backward_kernel(q_s.device(), fq, fk, v_s, s[3], s[4], kernel::contiguous(g[0]),
                                                    kernel::contiguous(g[1]), kernel::contiguous(g[2]), p, dfq, dfk, dv,
                                                    ds0, dz0);
           return std::vector<Tensor>{need[0] ? times_feature_map_grad(fmap, q_s, dfq) : Tensor(),
                                      need[1] ? times_feature_map_grad(fmap, k_s, dfk) : Tensor(),
                                      need[2] ? dv : Tensor(), need[3] ? ds0 : Tensor(), need[4] ? dz0 : Tensor()};
         });
  return out;
}

namespace {

void check_performer(const Tensor& x, const Tensor& omega) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("performer_features: " + why + " (got x " + shape_or_undefined(x) + ", omega " +
                                shape_or_undefined(omega) + "; expected x [B, T, H, d], omega [m, d])");
  };
  if (!x.defined() || !omega.defined()) fail("x and omega must be given");
  if (x.dim() != 4 || omega.dim() != 2) fail("x must have 4 dimensions and omega 2");
  if (omega.size(1) != x.size(3)) fail("omega's row length differs from x's head dim");
  if (omega.size(0) == 0) fail("omega has no rows");
  if (!is_floating(x.dtype()) || omega.dtype() != x.dtype()) {
    fail("x and omega must share dtype f32, f64 or bf16");
  }
  if (x.device() != omega.device()) fail("x and omega are on different devices");
}

}  // namespace

// Saves x, ω and y; the backward is the kernel above.
Tensor performer_features(const Tensor& x, const Tensor& omega, bool stabilize) {
  check_performer(x, omega);
  const Tensor xc = kernel::contiguous(x), wc = kernel::contiguous(omega);
  Tensor y = Tensor::empty({x.size(0), x.size(1), x.size(2), omega.size(0)}, x.dtype(), x.device());
  if (y.numel() > 0) kernel::performer_forward_kernel(x.device(), xc, wc, stabilize, y);
  record("performer_features", {x, omega}, {&y}, {xc, wc, y},
         [stabilize](const std::vector<Tensor>& g, const std::vector<Tensor>& s, const std::vector<bool>& need) {
           Tensor dx = Tensor::zeros(s[0].shape(), s[0].dtype(), s[0].device());
           Tensor dw = Tensor::zeros(s[1].shape(), s[1].dtype(), s[1].device());
           if (s[2].numel() > 0) {
             kernel::performer_backward_kernel(s[0].device(), kernel::contiguous(g[0]), s[0], s[1], s[2], stabilize, dx,
                                               dw);
           }
           return std::vector<Tensor>{need[0] ? dx : Tensor(), need[1] ? dw : Tensor()};
         });
  return y;
}

// Gram–Schmidt in double on each d × d Gaussian block (twice, for orthogonality to rounding), rows
// then rescaled by the norm of an independent Gaussian d-vector (χ_d).
Tensor orthogonal_random_features(int64_t m, int64_t d, Generator& gen, DType dtype) {
  if (m <= 0 || d <= 0) {
    throw std::invalid_argument("orthogonal_random_features: m and d must be positive, got m = " + std::to_string(m) +
                                ", d = " + std::to_string(d));
  }
  std::vector<double> out(static_cast<size_t>(m * d));
  std::vector<double> block(static_cast<size_t>(d * d));
  for (int64_t r0 = 0; r0 < m; r0 += d) {
    for (double& x : block) x = gen.normal();
    for (int64_t i = 0; i < d; ++i) {
      double* row = block.data() + i * d;
      for (int pass = 0; pass < 2; ++pass) {
        for (int64_t j = 0; j < i; ++j) {
          const double* prev = block.data() + j * d;
          double proj = 0;
          for (int64_t c = 0; c < d; ++c) proj += row[c] * prev[c];
          for (int64_t c = 0; c < d; ++c) row[c] -= proj * prev[c];
        }
      }
      double norm = 0;
      for (int64_t c = 0; c < d; ++c) norm += row[c] * row[c];
      norm = std::sqrt(norm);
      for (int64_t c = 0; c < d; ++c) row[c] /= norm;
    }
    for (int64_t i = 0; i < d && r0 + i < m; ++i) {
      double chi = 0;
      for (int64_t c = 0; c < d; ++c) {
        const double g = gen.normal();
        chi += g * g;
      }
      chi = std::sqrt(chi);
      for (int64_t c = 0; c < d; ++c) out[static_cast<size_t>((r0 + i) * d + c)] = chi * block[i * d + c];
    }
  }
  return Tensor::from_vector(out, {m, d}, dtype);
}

namespace {

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "linear_attention";
  s.summary =
      "S_t = S_{t-1} + φ(k_t)ᵀ v_t, z_t = z_{t-1} + φ(k_t), o_t = φ(q_t) S_t / (φ(q_t)·z_t + eps); q, k [B, T, H, dk], "
      "v [B, T, H, dv], initial_state [B, H, dk, dv], initial_normalizer [B, H, dk]";
  s.inputs = {{"q"},
              {"k"},
              {"v"},
              {"initial_state", OpInputKind::floating, true},
              {"initial_normalizer", OpInputKind::floating, true}};
  s.outputs = {"o", "final_state", "final_normalizer"};
  s.attrs = {{"feature_map", AttrType::string, "elu_plus_one", "φ: elu_plus_one, relu or identity"},
             {"form", AttrType::string, "chunkwise", "chunkwise, recurrent or noncausal"},
             {"normalize", AttrType::boolean, "true", "divide by φ(q_t)·z_t + eps (else o_t = φ(q_t) S_t)"},
             {"eps", AttrType::number, "1e-6", "added to the normaliser"},
             {"chunk", AttrType::integer, "64", "tokens per chunk of the chunkwise form"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    LinearAttentionOptions o;
    o.feature_map = parse_feature_map(a.get_string("feature_map"));
    o.form = parse_linear_attention_form(a.get_string("form"));
    o.normalize = a.get_bool("normalize");
    o.eps = a.get_number("eps");
    o.chunk = a.get_int("chunk");
    LinearAttentionOutput out = linear_attention(in[0], in[1], in[2], in[3], in[4], o);
    return std::vector<Tensor>{out.o, out.final_state, out.final_normalizer};
  };
  // T = 7 over chunks of 3 (the last one partial), dk = 3 ≠ dv = 4, a non-zero initial state and a
  // positive initial normaliser.
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 7, 2, 3}, gen, dtype), Tensor::randn({2, 7, 2, 3}, gen, dtype),
                               Tensor::randn({2, 7, 2, 4}, gen, dtype), Tensor::randn({2, 2, 3, 4}, gen, dtype),
                               Tensor::rand({2, 2, 3}, gen, dtype, 0.5, 1.5)};
  };
  s.example_attrs = {{"chunk", "3"}};
  return s;
}()));

SEQLAB_REGISTER_OP(([] {
  OpSpec s;
  s.name = "performer_features";
  s.summary = "y_i = exp(ω_i·x − ‖x‖²/2 − s)/√m, s = max_i ω_i·x with stabilize else 0; x [B, T, H, d], ω [m, d]";
  s.inputs = {{"x"}, {"omega"}};
  s.outputs = {"y"};
  s.attrs = {{"stabilize", AttrType::boolean, "false", "subtract the row's max ω_i·x (for queries)"}};
  s.forward = [](const std::vector<Tensor>& in, const OpAttrs& a) {
    return std::vector<Tensor>{performer_features(in[0], in[1], a.get_bool("stabilize"))};
  };
  s.example = [](Generator& gen, DType dtype) {
    return std::vector<Tensor>{Tensor::randn({2, 3, 2, 4}, gen, dtype, 0.5), Tensor::randn({5, 4}, gen, dtype)};
  };
  s.example_attrs = {{"stabilize", "true"}};
  return s;
}()));

}  // namespace
}  // namespace seqlab
