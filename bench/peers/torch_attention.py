# The PyTorch peer of seqlab's benchmarks (causal attention forward and backward in PyTorch): the baseline every speed ratio is measured
# against, kept in the repository so it travels to a GPU machine with it; bench/gpu_vs_torch.sh runs it.
"""Peer baseline: causal softmax attention forward + backward in PyTorch, timed.

With a torch that has scaled_dot_product_attention (2.x) it uses it on the CPU and the GPU (the flash backend
where available); otherwise (Debian's 1.13) the materialised form (matmul, masked softmax, matmul, autograd).
`--impl materialised` forces the latter. Prints the median time of forward+backward
and the rate in attention FLOP/s (4·B·H·T·T·d forward, counting the causal half, ×3.5 for forward+backward).
Run it beside the framework's attention benchmark at the same shapes; quote the ratio.

  python3 torch_attention.py --B 4 --H 8 --T 1024 --d 64
  python3 torch_attention.py --device cuda --dtype bf16 --B 8 --H 16 --T 4096 --d 128
"""
import argparse, math, statistics, time
import torch, torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--B", type=int, default=4); p.add_argument("--H", type=int, default=8)
p.add_argument("--T", type=int, default=1024); p.add_argument("--d", type=int, default=64)
p.add_argument("--device", default="cpu"); p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
p.add_argument("--reps", type=int, default=10); p.add_argument("--threads", type=int, default=0)
p.add_argument("--impl", default="auto", choices=["auto", "sdpa", "materialised"],
               help="auto: scaled_dot_product_attention where this torch has it (flash on CPU and GPU), else materialised")
a = p.parse_args()
if a.threads: torch.set_num_threads(a.threads)
dev, dt = torch.device(a.device), (torch.bfloat16 if a.dtype == "bf16" else torch.float32)
g = torch.Generator(device="cpu").manual_seed(0)
q, k, v = [torch.randn(a.B, a.H, a.T, a.d, generator=g).to(dev, dt).requires_grad_() for _ in range(3)]
do = torch.randn(a.B, a.H, a.T, a.d, generator=g).to(dev, dt)
sdpa = getattr(F, "scaled_dot_product_attention", None)
mask = torch.ones(a.T, a.T, dtype=torch.bool, device=dev).triu(1)

use_sdpa = a.impl == "sdpa" or (a.impl == "auto" and sdpa is not None)
if use_sdpa and sdpa is None: raise SystemExit(f"torch {torch.__version__} has no scaled_dot_product_attention")

def step():
    if use_sdpa:
        o = sdpa(q, k, v, is_causal=True)
    else:
        s = (q @ k.transpose(-1, -2)) / math.sqrt(a.d)
        o = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
    torch.autograd.grad(o, (q, k, v), do)

def sync():
    if dev.type == "cuda": torch.cuda.synchronize()

for _ in range(3): step()
times = []
for _ in range(a.reps):
    sync(); t = time.perf_counter(); step(); sync(); times.append(time.perf_counter() - t)
ms = 1000 * statistics.median(times)
flops = 3.5 * 2 * a.B * a.H * a.T * a.T * a.d  # fwd 2 matmuls over the causal half = 2·B·H·T²·d, bwd ≈ 2.5× fwd
print(f"torch {torch.__version__} impl={'sdpa' if use_sdpa else 'materialised'} device={a.device} dtype={a.dtype} B={a.B} H={a.H} T={a.T} d={a.d} "
      f"fwd+bwd_ms={ms:.2f} TFLOP/s={flops / ms / 1e9:.3f}")
