# Project peer (written for seqlab, not one of the shared peers): the Mamba selective scan forward + backward
# in PyTorch on the CPU, timed, the counterpart of bench/selective_scan_bench.cpp, which runs it at the same
# shapes in the same run and prints the ratio.
"""Peer baseline: the selective scan in PyTorch, following the algorithm of mamba_ssm's reference
implementation (selective_scan_ref): form every step's decay exp(Δ_t A) and input Δ_t u_t B_t for the whole
sequence as [B, T, D, N] tensors, then a Python loop over T carrying the state h [B, D, N] and reading out
y_t = h · C_t; D skip and the silu(z) gate at the end; autograd does the backward. (Written here from the
description of that algorithm; the layout is seqlab's [B, T, D] rather than mamba_ssm's [B, D, T].)

Inputs as bench/selective_scan_bench.cpp draws them: u, z ~ N(0, 1), delta uniform in [−4, −2] (Δ = softplus ≈
0.02 … 0.13), A = −(1 … N) per channel, B, C ~ N(0, 1), D = 1, delta_bias 0, zero initial state; one repetition
is the forward and torch.autograd.grad of u, delta, A, B, C, D, z from a fixed random dy. Prints
`seconds=<median>` and `peak_bytes=<the [B, T, D, N]-sized tensors the algorithm keeps: every step's decay and
input, and every state, which autograd saves for the products decay · h>`. --check first compares
its output and gradients with a float64 step-by-step recurrence written with plain indexing on a small shape
and exits 1 if they differ.

  python3 torch_selective_scan.py --B 1 --T 4096 --D 512 --N 16 --runs 3 --threads 2
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def selective_scan_ref(u, delta, A, B, C, D, z, delta_bias):
    """u, delta, z [B, T, D], A [D, N], B, C [B, T, N], D, delta_bias [D] -> y [B, T, D], h_T [B, D, N]."""
    dt = F.softplus(delta + delta_bias)                                   # [B, T, D]
    decay = torch.exp(dt.unsqueeze(-1) * A)                               # [B, T, D, N]: every step's exp(Δ A)
    drive = (dt * u).unsqueeze(-1) * B.unsqueeze(2)                       # [B, T, D, N]: every step's Δ u B
    h = u.new_zeros(u.shape[0], u.shape[2], A.shape[1])
    ys = []
    # The steps through unbind, not decay[:, t]: indexing in the loop would give every step's backward a
    # zero-filled [B, T, D, N] gradient (O(T²) work); unbind's backward stacks the T slices once.
    for a_t, f_t, c_t in zip(decay.unbind(1), drive.unbind(1), C.unbind(1)):
        h = a_t * h + f_t
        ys.append(torch.einsum("bdn,bn->bd", h, c_t))
    y = torch.stack(ys, dim=1) + u * D
    return y * F.silu(z), h


def inputs(Bsz, T, Dn, N, dtype, gen):
    u = torch.randn(Bsz, T, Dn, generator=gen, dtype=dtype)
    delta = torch.rand(Bsz, T, Dn, generator=gen, dtype=dtype) * 2 - 4
    A = -torch.arange(1, N + 1, dtype=dtype).repeat(Dn, 1)
    B = torch.randn(Bsz, T, N, generator=gen, dtype=dtype)
    C = torch.randn(Bsz, T, N, generator=gen, dtype=dtype)
    D = torch.ones(Dn, dtype=dtype)
    z = torch.randn(Bsz, T, Dn, generator=gen, dtype=dtype)
    bias = torch.zeros(Dn, dtype=dtype)
    return [u, delta, A, B, C, D, z, bias]


def check():
    """The loop above against a scalar recurrence in float64 (outputs) and finite differences (one gradient)."""
    gen = torch.Generator().manual_seed(1)
    xs = inputs(2, 7, 3, 4, torch.float64, gen)
    y, h = selective_scan_ref(*xs)
    u, delta, A, B, C, D, z, bias = xs
    want = torch.empty_like(y)
    for b in range(2):
        for d in range(3):
            s = torch.zeros(4, dtype=torch.float64)
            for t in range(7):
                dt = F.softplus(delta[b, t, d] + bias[d])
                s = torch.exp(dt * A[d]) * s + dt * u[b, t, d] * B[b, t]
                want[b, t, d] = ((s * C[b, t]).sum() + D[d] * u[b, t, d]) * F.silu(z[b, t, d])
    ok = torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    leaves = [x.clone().requires_grad_(True) for x in xs[:7]] + [xs[7]]
    ok = ok and torch.autograd.gradcheck(lambda *a: selective_scan_ref(*a, xs[7])[0], leaves[:7])
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--D", type=int, default=512)
    p.add_argument("--N", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.check and not check():
        print("torch_selective_scan: the loop disagrees with the scalar recurrence", file=sys.stderr)
        sys.exit(1)
    gen = torch.Generator().manual_seed(0)
    xs = inputs(a.B, a.T, a.D, a.N, torch.float32, gen)
    leaves = [x.requires_grad_(True) for x in xs[:7]]
    dy = torch.randn(a.B, a.T, a.D, generator=gen)

    def step():
        y, _ = selective_scan_ref(*leaves, xs[7])
        torch.autograd.grad(y, leaves, dy)

    step()  # warm-up
    times = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    kept = 3 * a.B * a.T * a.D * a.N * 4  # decay, drive and the T states, [B, T, D, N] f32 each
    print(f"seconds={statistics.median(times):.6f} peak_bytes={kept}")


if __name__ == "__main__":
    main()
