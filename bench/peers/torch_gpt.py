# The PyTorch peer of seqlab's benchmarks (a GPT-2-style model trained by PyTorch): the baseline every speed ratio is measured
# against, kept in the repository so it travels to a GPU machine with it; bench/gpu_vs_torch.sh runs it.
"""Peer baseline: a GPT-2-style language model trained by PyTorch (eager, optionally compiled).

Prints training tokens/s over a fixed number of steps at the given shapes, on the CPU or a CUDA GPU.
Run it beside the framework's own training benchmark at the same shapes and quote the ratio of the two
figures, measured in the same session on the same machine.

PyTorch on the CPU: Debian's `apt-get install python3-torch` (run it with Debian's own python3), or PyPI's torch.

  python3 torch_gpt.py                                   # CPU, gpt_small shapes (d=256, L=4, H=4, T=256, B=8)
  python3 torch_gpt.py --device cuda --dtype bf16 --d 768 --layers 12 --heads 12 --T 1024 --B 16 --vocab 50304
"""
import argparse, math, time
import torch, torch.nn as nn, torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--d", type=int, default=256); p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4); p.add_argument("--T", type=int, default=256)
p.add_argument("--B", type=int, default=8); p.add_argument("--vocab", type=int, default=256)
p.add_argument("--steps", type=int, default=20); p.add_argument("--threads", type=int, default=0)
p.add_argument("--device", default="cpu"); p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
p.add_argument("--compile", action="store_true")
a = p.parse_args()
if a.threads: torch.set_num_threads(a.threads)
torch.manual_seed(0)
dev = torch.device(a.device)
sdpa = getattr(F, "scaled_dot_product_attention", None)

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, dim=2)
        q, k, v = [t.view(B, T, s.h, D // s.h).transpose(1, 2) for t in (q, k, v)]
        if sdpa is not None:
            y = sdpa(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // s.h)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.d); s.wpe = nn.Embedding(a.T, a.d)
        s.blocks = nn.ModuleList([Block(a.d, a.heads) for _ in range(a.layers)]); s.lnf = nn.LayerNorm(a.d)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks: x = b(x)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.float().reshape(-1, a.vocab), tgt.reshape(-1))

m = GPT()
for name, w in m.named_parameters():  # GPT-2 initialisation: N(0, 0.02), zero biases, unit norms
    if w.dim() >= 2: nn.init.normal_(w, std=0.02)
    elif name.endswith("bias"): nn.init.zeros_(w)
m = m.to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
fwd = torch.compile(m) if a.compile else m
data = torch.randint(0, a.vocab, (a.B, a.T + 1), device=dev)
def step():
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
        loss = fwd(data[:, :-1], data[:, 1:])
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); return loss
def sync():
    if dev.type == "cuda": torch.cuda.synchronize()
for _ in range(3): step()
sync(); t = time.perf_counter()
for _ in range(a.steps): l = step()
sync(); dt = time.perf_counter() - t
n = sum(p.numel() for p in m.parameters())
flops_per_token = 6 * n + 6 * a.layers * a.T * a.d  # weights (fwd+bwd) + causal attention scores and mixing
tps = a.steps * a.B * a.T / dt
print(f"torch {torch.__version__} device={a.device} dtype={a.dtype} params={n} "
      f"tokens/s={tps:.0f} step_ms={1000 * dt / a.steps:.1f} model_TFLOP/s={tps * flops_per_token / 1e12:.3f} "
      f"loss={l.item():.3f}")
