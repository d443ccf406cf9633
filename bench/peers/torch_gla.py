# Project peer (written for seqlab, not one of the shared peers): gated linear attention forward + backward in
# PyTorch, timed, the counterpart of bench/gla_kernel_bench.cpp at the same flags. bench/gpu_vs_torch.sh runs it.
"""Peer baseline: GLA forward + backward in PyTorch, timed.

  --impl chunk   the chunkwise algorithm written in PyTorch (autograd does the backward): chunks of 64 tokens
                 whose states pass from chunk to chunk, and inside a chunk sub-chunks of 16 tokens that see
                 earlier sub-chunks through matrix products of gate-scaled queries and keys (every factor
                 exp(b_t − b_ref) ≤ 1) and their own sub-chunk through the exact pairwise gates exp(b_t − b_s);
                 the same algorithm as seqlab's chunkwise form (docs/variants/gla.md)
  --impl fla     flash-linear-attention's chunk_gla (Triton kernels), where the package is installed

Inputs q, k, g [B, T, H, d], v [B, T, H, d] (the layout of seqlab and of fla), log-gates in [−0.3, −0.01],
scale 1/√d, zero initial state, no gradient of the final state; one repetition is the forward and
torch.autograd.grad of q, k, v, g from a fixed random dO. Prints the median time in the format of
bench/gla_kernel_bench.cpp. --check first compares the chosen implementation's output and gradients with the
recurrence S_t = diag(exp g_t) S_{t−1} + k_tᵀ v_t, o_t = q_t S_t / √d computed step by step in float64 on
small shapes (T = 1, 17, 64, 200; gates down to −30) and exits 1 if they differ by more than the dtype allows.

  python3 torch_gla.py --device cuda --dtype bf16 --B 4 --H 16 --T 4096 --d 64 --impl chunk
"""
import argparse, statistics, sys, time
import torch

CHUNK, SUB = 64, 16


def gla_chunk(q, k, v, g):
    """q, k, g [B, H, T, dk], v [B, H, T, dv] -> o [B, H, T, dv] (scale 1/√dk, zero initial state)."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    dt, f32 = q.dtype, torch.float32
    pad = (-T) % CHUNK  # zero keys and values and zero log-gates at the end change no earlier output
    if pad:
        q, k, v, g = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g)]
    N, M = (T + pad) // CHUNK, CHUNK // SUB
    q = q * dk ** -0.5
    qc, kc, vc = q.view(B, H, N, CHUNK, dk), k.view(B, H, N, CHUNK, dk), v.view(B, H, N, CHUNK, dv)
    gc = g.to(f32).view(B, H, N, CHUNK, dk)
    b = gc.cumsum(-2)                    # b_t: log-gates summed from the chunk's start to t
    blast = b[..., -1:, :]               # the whole chunk's log-gate
    # Across chunks: S_n = exp(blast_{n−1}) ⊙ S_{n−1} + Σ_s (k_s ⊙ exp(blast − b_s))ᵀ v_s, in f32.
    kdec = (kc.to(f32) * (blast - b).exp()).to(dt)
    U = (kdec.transpose(-1, -2) @ vc).to(f32)            # [B, H, N, dk, dv]
    decay = blast.squeeze(-2).exp()                      # [B, H, N, dk]
    state = torch.zeros(B, H, dk, dv, dtype=f32, device=q.device)
    entering = []
    for n in range(N):
        entering.append(state)
        state = decay[:, :, n, :, None] * state + U[:, :, n]
    S = torch.stack(entering, 2)                         # the state entering each chunk
    o_inter = (qc.to(f32) * b.exp()).to(dt) @ S.to(dt)   # [B, H, N, C, dv]
    # Inside a chunk, by sub-chunks m of SUB tokens; bref_m: the log-gate sum just before sub-chunk m.
    bs, gs = b.view(B, H, N, M, SUB, dk), gc.view(B, H, N, M, SUB, dk)
    qs, ks = qc.view(B, H, N, M, SUB, dk), kc.view(B, H, N, M, SUB, dk)
    bref = bs[..., :1, :] - gs[..., :1, :]                            # [B, H, N, M, 1, dk]
    qt = (qs.to(f32) * (bs - bref).exp()).to(dt)                      # q_t exp(b_t − bref_m) ≤ 1
    earlier = torch.ones(M, M, dtype=torch.bool, device=q.device).tril(-1)  # key sub-chunk j < query m
    e = bref.unsqueeze(4) - bs.unsqueeze(3)                            # [B, H, N, Mq, Mk, SUB, dk]
    e = torch.where(earlier[:, :, None, None], e, torch.full_like(e, float("-inf")))
    kt = (ks.to(f32).unsqueeze(3) * e.exp()).to(dt)                   # k_s exp(bref_m − b_s) ≤ 1, s earlier
    A = torch.einsum("bhnmsd,bhnmjtd->bhnmsjt", qt, kt).to(f32)       # [B, H, N, M, SUB, M, SUB]
    tri = torch.ones(SUB, SUB, dtype=torch.bool, device=q.device).tril()
    e = bs.unsqueeze(-2) - bs.unsqueeze(-3)                           # b_t − b_s, [.., SUB(t), SUB(s), dk]
    e = torch.where(tri[:, :, None], e, torch.full_like(e, float("-inf")))
    Adiag = torch.einsum("bhnmtd,bhnmsd,bhnmtsd->bhnmts", qs.to(f32), ks.to(f32), e.exp())
    eye = torch.eye(M, dtype=f32, device=q.device)[:, None, :, None]
    A = (A + Adiag.unsqueeze(-2) * eye).reshape(B, H, N, CHUNK, CHUNK)
    o = o_inter + A.to(dt) @ vc
    return o.reshape(B, H, N * CHUNK, dv)[:, :, :T]


def gla_reference(q, k, v, g):
    """The recurrence step by step, in float64; inputs [B, T, H, d]."""
    q, k, v, g = [x.double() for x in (q, k, v, g)]
    B, T, H, dk = q.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=torch.float64, device=q.device)
    out = []
    for t in range(T):
        S = g[:, t].exp()[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * dk ** -0.5, S))
    return torch.stack(out, 1)


def make_impl(name):
    if name == "chunk":
        def run(q, k, v, g):  # [B, T, H, d] in and out, as fla and seqlab
            t = lambda x: x.transpose(1, 2)
            return t(gla_chunk(t(q), t(k), t(v), t(g)))
        return run
    from fla.ops.gla import chunk_gla  # flash-linear-attention
    return lambda q, k, v, g: chunk_gla(q=q, k=k, v=v, g=g, scale=q.shape[-1] ** -0.5)[0]


def check(impl, dev, dt):
    gen = torch.Generator(device="cpu").manual_seed(1)
    worst = 0.0
    tol = 2e-2 if dt == torch.bfloat16 else 1e-4
    for T, lo, hi in ((1, -0.3, -0.01), (17, -0.3, -0.01), (64, -30.0, -1e-7), (200, -5.0, -0.01)):
        x = [torch.randn(2, T, 3, 32, generator=gen, dtype=torch.float64) for _ in range(3)]
        g = lo + (hi - lo) * torch.rand(2, T, 3, 32, generator=gen, dtype=torch.float64)
        do = torch.randn(2, T, 3, 32, generator=gen, dtype=torch.float64)
        ins = [t.to(dev, dt).requires_grad_() for t in (*x, g)]
        refs = [t.to(dt).double().requires_grad_() for t in (*x, g)]  # the same rounded inputs
        o = impl(*ins)
        got = [o, *torch.autograd.grad(o, ins, do.to(dev, dt))]
        ro = gla_reference(*refs)
        want = [ro, *torch.autograd.grad(ro, refs, do)]
        for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), got, want):
            err = ((a.double().cpu() - b).norm() / b.norm().clamp_min(1e-300)).item()
            worst = max(worst, err)
            if not err <= tol:
                print(f"check FAILED: T={T} gates [{lo}, {hi}] {name}: relative error {err:.2e} > {tol:.0e}")
                sys.exit(1)
    print(f"check ok: output and gradients within {worst:.1e} of a float64 recurrence (tolerance {tol:.0e})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=4); p.add_argument("--H", type=int, default=8)
    p.add_argument("--T", type=int, default=1024); p.add_argument("--d", type=int, default=64)
    p.add_argument("--device", default="cpu"); p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--reps", type=int, default=10); p.add_argument("--threads", type=int, default=0)
    p.add_argument("--impl", default="chunk", choices=["chunk", "fla"]); p.add_argument("--check", action="store_true")
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    dev, dt = torch.device(a.device), (torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    try:
        impl = make_impl(a.impl)
    except ImportError as e:
        print(f"torch_gla: --impl {a.impl} is not available here ({e})", file=sys.stderr)
        sys.exit(3)
    if a.check:
        check(impl, dev, dt)
    gen = torch.Generator(device="cpu").manual_seed(0)
    shape = (a.B, a.T, a.H, a.d)
    q, k, v = [torch.randn(*shape, generator=gen).to(dev, dt).requires_grad_() for _ in range(3)]
    g = (-0.3 + 0.29 * torch.rand(*shape, generator=gen)).to(dev, dt).requires_grad_()
    do = torch.randn(*shape, generator=gen).to(dev, dt)

    def sync():
        if dev.type == "cuda": torch.cuda.synchronize()

    def step():
        torch.autograd.grad(impl(q, k, v, g), (q, k, v, g), do)
        sync()

    for _ in range(3): step()
    times = []
    for _ in range(a.reps):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    ms = 1000 * statistics.median(times)
    print(f"torch {torch.__version__} gla impl={a.impl} device={a.device} dtype={a.dtype} B={a.B} H={a.H} T={a.T} "
          f"d={a.d} fwd+bwd_ms={ms:.3f} tokens/s={a.B * a.T / ms * 1000:.0f}")


if __name__ == "__main__":
    main()
