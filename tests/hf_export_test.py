#!/usr/bin/env python3
"""seqlab's GPT-2 checked by code no one here wrote: Hugging Face transformers.

Tiny GPT-2 runs are trained for a few steps (seconds), exported with `seqlab export --hf RUN OUT`, loaded
with transformers' GPT2LMHeadModel.from_pretrained(OUT), and the logits transformers computes for token
ids are compared with those `seqlab logits RUN --tokens ...` computes, in f32 on the CPU. The bound, for
each sequence: at every position t,

    max_v |seqlab[t, v] - transformers[t, v]| / max_v |transformers[t, v]|  <=  1e-4

(the largest difference over the vocabulary relative to the largest logit at that position), with
transformers' SDPA attention and with its eager attention. Runs: plain; dropout 0.1 (the export runs in
evaluation mode, as seqlab's logits do); d_ff != 4 d_model (GPT-2's n_inner); an untied lm_head. Sequences: one token, the
full context, and a length between. The export's tensors must be those transformers' own save_pretrained
writes (names, shapes, values), with nothing missing or unexpected on loading.

Refusals: recipes transformers' GPT-2 cannot hold (GLA, rotary positions, grouped key/value heads, an
attention scale other than 1/sqrt(D), post-norm blocks, a hybrid pattern; an encoder, whose BERT table is
not written yet) end in exit code 2 and one line naming each setting that does not map, with nothing
written; so do an OUT that holds files (without --force, and with --force where OUT holds a folder or a
run), a missing --hf, and `seqlab logits` ids outside the vocabulary or beyond the context.

The test runs in the virtual environment of scripts/python_env.sh (PyTorch for the CPU, transformers,
safetensors): $SEQLAB_PYENV, else pyenv/ in the folder of the seqlab binary (build/pyenv). The first run
makes it (about 2 minutes and 1 GB of downloads from PyPI); later runs reuse it. The test starts under
any python3 and runs itself again under the environment's.

Usage: hf_export_test.py /path/to/seqlab
"""
import json
import os
import random
import subprocess
import sys
import tempfile

SEQLAB = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-4


def in_python_env():
    """Re-runs this test under the environment's python (made or checked by scripts/python_env.sh)."""
    if os.environ.get("SEQLAB_HF_TEST_ENV") == "1":
        return
    venv = os.environ.get("SEQLAB_PYENV") or os.path.join(os.path.dirname(SEQLAB), "pyenv")
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "python_env.sh"), venv, sys.executable],
                       stdout=subprocess.PIPE, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        print(f"FAIL the Python environment {venv} could not be made (scripts/python_env.sh exit {p.returncode}; "
              "its message is above)")
        sys.exit(1)
    python = p.stdout.strip().splitlines()[-1]
    sys.stdout.flush()
    os.execve(python, [python, os.path.abspath(__file__), SEQLAB], {**os.environ, "SEQLAB_HF_TEST_ENV": "1"})


in_python_env()

import numpy as np  # noqa: E402  (from the environment)
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
torch.set_num_threads(2)
failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else ": " + detail))
    if not ok:
        failures.append(what)
    return ok


def run(*args):
    return subprocess.run([SEQLAB, *args], capture_output=True, text=True)


def one_line_refusal(p):
    """exit code 2 and exactly one line on stderr, which starts with "seqlab "."""
    lines = p.stderr.strip().splitlines()
    return p.returncode == 2 and len(lines) == 1 and lines[0].startswith("seqlab ")


def word_corpus(path, docs=80, words=40):
    rng = random.Random(7)
    vocab = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
    with open(path, "w") as f:
        for _ in range(docs):
            f.write(" ".join(rng.choice(vocab) for _ in range(words)) + ".\n\n")


def train(work, name, model_keys, steps=30, seq_len=16, data_keys=None):
    """A tiny run trained for `steps` steps on the CPU; returns its folder."""
    recipe = os.path.join(work, name + ".toml")
    with open(recipe, "w") as f:
        f.write("[model]\n" + "".join(f"{k} = {v}\n" for k, v in model_keys.items()))
        f.write(f'[data]\npath = "{work}/corpus.txt"\nformat = "text"\nval_fraction = 0.2\ncache_dir = "{work}/cache"\n')
        f.write("".join(f"{k} = {v}\n" for k, v in (data_keys or {}).items()))
        f.write(f'[train]\nsteps = {steps}\nbatch_size = 4\nseq_len = {seq_len}\ndevice = "cpu"\nseed = 5\n')
        f.write("[log]\neval_every = 1000\neval_batches = 1\nsample_every = 0\n[checkpoint]\nevery = 0\n")
    out = os.path.join(work, name)
    p = run(recipe, "--out", out)
    if p.returncode != 0:
        raise SystemExit(f"FAIL training {name}: exit {p.returncode}: {(p.stdout + p.stderr).strip()[-600:]}")
    return out


def seqlab_logits(run_dir, ids, out):
    p = run("logits", run_dir, "--tokens", " ".join(map(str, ids)), "--out", out)
    if p.returncode != 0:
        raise SystemExit(f"FAIL seqlab logits {run_dir}: {p.stderr.strip()}")
    return np.load(out)


def worst_relative_error(ours, theirs):
    """max over positions t of max_v |ours - theirs| / max_v |theirs| (both [T, V])."""
    return float((np.abs(ours - theirs).max(axis=1) / np.abs(theirs).max(axis=1)).max())


def compare_with_transformers(work, run_dir, name, seq_len):
    out = os.path.join(work, name + "_hf")
    p = run("export", "--hf", run_dir, out + "/")  # a trailing slash names the same folder
    if not check(p.returncode == 0 and sorted(os.listdir(out)) == ["config.json", "model.safetensors"],
                 f"{name}: export writes config.json and model.safetensors", (p.stdout + p.stderr).strip()):
        return
    config = json.load(open(os.path.join(out, "config.json")))
    vocab = config["vocab_size"]
    check(config["n_positions"] == seq_len and config["activation_function"] == "gelu_new",
          f"{name}: config.json: n_positions {config['n_positions']}, activation {config['activation_function']}")
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        metadata = f.metadata()
        ours = {k: f.get_tensor(k) for k in f.keys()}
    check(metadata.get("format") == "pt" and metadata.get("seqlab_checkpoint", "").startswith("ckpt_"),
          f"{name}: model.safetensors' metadata names the format and the checkpoint ({metadata})")
    tied = config["tie_word_embeddings"]
    check(all(t.dtype == torch.float32 for t in ours.values()) and ("lm_head.weight" in ours) != tied,
          f"{name}: f32 tensors, lm_head stored only when untied (tie_word_embeddings {tied})")

    rng = random.Random(11)
    sequences = [[rng.randrange(vocab)], [rng.randrange(vocab) for _ in range(seq_len)],
                 [rng.randrange(vocab) for _ in range(seq_len // 2 + 1)]]
    for attention in ("sdpa", "eager"):
        model, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True,
                                                                   attn_implementation=attention)
        model.eval()
        if attention == "sdpa":
            check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
                  f"{name}: from_pretrained finds every weight, nothing unexpected ({info})")
            check((model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()) == tied,
                  f"{name}: transformers " + ("ties lm_head to wte" if tied else "keeps lm_head apart from wte"))
            saved = os.path.join(work, name + "_resaved")
            model.save_pretrained(saved)
            with safe_open(os.path.join(saved, "model.safetensors"), "pt") as f:
                theirs = {k: f.get_tensor(k) for k in f.keys()}
            same = sorted(theirs) == sorted(ours) and all(
                theirs[k].shape == ours[k].shape and torch.equal(theirs[k], ours[k]) for k in ours)
            check(same, f"{name}: the tensors are those transformers' own save_pretrained writes",
                  f"only ours: {sorted(set(ours) - set(theirs))}, only theirs: {sorted(set(theirs) - set(ours))}")
        for ids in sequences:
            expected = seqlab_logits(run_dir, ids, os.path.join(work, "logits.npy"))
            with torch.no_grad():
                got = model(torch.tensor([ids])).logits[0].numpy()
            err = worst_relative_error(expected, got) if expected.shape == got.shape else float("inf")
            check(err <= TOLERANCE, f"{name}: {attention} attention, T = {len(ids)}: logits {got.shape} within "
                  f"{TOLERANCE:g} relative (worst {err:.2e})", f"seqlab {expected.shape}, transformers {got.shape}")
    return model


def expect_refused(work, name, model_keys, must_name, must_not_name=(), data_keys=None):
    run_dir = train(work, name, model_keys, steps=2, data_keys=data_keys)
    out = os.path.join(work, name + "_hf")
    p = run("export", "--hf", run_dir, out)
    line = p.stderr.strip()
    named = all(s in line for s in must_name) and not any(s in line for s in must_not_name)
    leftovers = [e for e in os.listdir(work) if e.startswith(name + "_hf")]
    check(one_line_refusal(p) and named and not leftovers,
          f"{name}: refused in one line naming {', '.join(must_name)}; nothing written",
          f"exit {p.returncode}, stderr {line!r}, left {leftovers}")


with tempfile.TemporaryDirectory() as work:
    word_corpus(os.path.join(work, "corpus.txt"))
    gpt2 = {"d_model": 24, "n_layers": 2, "n_heads": 3, "positions": '"learned"', "norm": '"layernorm"',
            "mlp": '"gelu"', "bias": "true"}

    plain = train(work, "gpt", gpt2)
    compare_with_transformers(work, plain, "gpt", 16)
    dropout = train(work, "dropout", {**gpt2, "dropout": 0.1})
    model = compare_with_transformers(work, dropout, "dropout", 16)
    check(model is not None and model.config.embd_pdrop == 0.1 and model.config.resid_pdrop == 0.1 and
          model.config.attn_pdrop == 0.0, "dropout: config.json carries the dropout (embeddings, residual branches)")
    wide = train(work, "wide", {**gpt2, "n_layers": 3, "n_heads": 2, "d_ff": 40}, seq_len=12)
    model = compare_with_transformers(work, wide, "wide", 12)
    check(model is not None and model.config.n_inner == 40, "wide: d_ff = 40 is GPT-2's n_inner")
    untied = train(work, "untied", {**gpt2, "tie_embeddings": "false"})
    model = compare_with_transformers(work, untied, "untied", 16)
    check(model is not None and not model.config.tie_word_embeddings, "untied: config.json says tie_word_embeddings false")

    expect_refused(work, "gla", {"d_model": 16, "n_layers": 2, "n_heads": 2, "mixer": '"gla"'},
                   ["GPT2LMHeadModel", "the recurrent mixer 'gla' in blocks 0-1", "RMSNorm", "SwiGLU", "no biases",
                    "no position embedding"])
    expect_refused(work, "rope", {**gpt2, "positions": '"rope"'}, ["rotary positions (model.positions = \"rope\")"],
                   ["RMSNorm", "SwiGLU", "no biases"])
    expect_refused(work, "gqa", {**gpt2, "n_heads": 4, "n_kv_heads": 2, "d_model": 16},
                   ["grouped key/value heads (model.n_kv_heads = 2 for 4 heads)"], ["rotary", "RMSNorm"])
    expect_refused(work, "scale", {**gpt2, "attention": "{ scale = 0.5 }"},
                   ["model.attention.scale = 0.5 (GPT-2 has only its default, 0.0)"], ["rotary", "RMSNorm"])
    expect_refused(work, "post", {**gpt2, "norm_placement": '"post"'},
                   ["post-norm blocks (model.norm_placement = \"post\")"], ["rotary", "RMSNorm"])
    expect_refused(work, "bert", {"arch": '"encoder"', "d_model": 16, "n_layers": 1, "n_heads": 2, "segments": 2},
                   ["model.arch = \"encoder\" has no transformers export yet (BertForMaskedLM's mapping is not written)"],
                   data_keys={"objective": '"masked_lm"'})
    expect_refused(work, "hybrid", {**gpt2, "d_model": 16, "n_heads": 2, "pattern": '"attention gla"'},
                   ["the recurrent mixer 'gla' in block 1 "], ["RMSNorm", "SwiGLU", "no biases"])

    # The output folder: refused when it holds files, replaced with --force, never when it holds a folder or a run.
    out = os.path.join(work, "taken")
    os.makedirs(out)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine\n")
    p = run("export", "--hf", plain, out)
    check(one_line_refusal(p) and "--force" in p.stderr and os.listdir(out) == ["notes.txt"],
          "an OUT that holds files is refused without --force, left as it was", p.stderr.strip())
    # What a killed export leaves beside OUT: deleted when its process is gone, kept while it runs (pid 1).
    dead = subprocess.Popen(["true"])
    dead.wait()
    for leftover in (f"taken.tmp.{dead.pid}", f"taken.old.{dead.pid}", "taken.tmp.1"):
        os.makedirs(os.path.join(work, leftover, "x"))
    p = run("export", "--hf", plain, out, "--force")
    check(p.returncode == 0 and sorted(os.listdir(out)) == ["config.json", "model.safetensors"] and
          [e for e in os.listdir(work) if e.startswith("taken.")] == ["taken.tmp.1"],
          "--force replaces it whole; the temporaries of a dead export are deleted, no new one left",
          (p.stdout + p.stderr).strip() + f" {sorted(os.listdir(work))}")
    os.makedirs(os.path.join(out, "sub"))
    p = run("export", "--hf", plain, out, "--force")
    check(one_line_refusal(p) and "the folder sub" in p.stderr and "sub" in os.listdir(out),
          "--force does not replace a folder that holds a folder", p.stderr.strip())
    before = sorted(os.listdir(plain))
    p = run("export", "--hf", plain, plain, "--force")
    check(one_line_refusal(p) and "a run's files" in p.stderr and sorted(os.listdir(plain)) == before,
          "--force does not replace a run folder", p.stderr.strip())
    p = run("export", "--hf", plain, ".")
    check(one_line_refusal(p) and "name the output folder itself" in p.stderr, "OUT = . is refused", p.stderr.strip())
    p = run("export", plain, os.path.join(work, "nohf"))
    check(one_line_refusal(p) and "--hf" in p.stderr and not os.path.exists(os.path.join(work, "nohf")),
          "export without --hf is refused", p.stderr.strip())

    p = run("logits", plain, "--tokens", "1 2 5000", "--out", os.path.join(work, "x.npy"))
    check(one_line_refusal(p) and "id 5000 is outside the model's vocabulary" in p.stderr,
          "logits: an id outside the vocabulary is refused", p.stderr.strip())
    p = run("logits", plain, "--tokens", " ".join(["1"] * 17), "--out", os.path.join(work, "x.npy"))
    check(one_line_refusal(p) and "17 ids, more than the 16 positions" in p.stderr and
          not os.path.exists(os.path.join(work, "x.npy")), "logits: more ids than positions is refused", p.stderr.strip())

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
sys.exit(1 if failures else 0)
