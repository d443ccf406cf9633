#!/usr/bin/env python3
"""seqlab's GPT-2, BERT and T5 checked by code no one here wrote: Hugging Face transformers.

Tiny runs are trained for a few steps (seconds), exported with `seqlab export --hf RUN OUT`, loaded with
transformers' class (GPT2LMHeadModel, BertForMaskedLM, T5ForConditionalGeneration).from_pretrained(OUT),
and the logits transformers computes for token ids are compared with those `seqlab logits RUN --tokens ...`
computes, in f32 on the CPU. The bound, for each sequence: at every position t,

    max_v |seqlab[t, v] - transformers[t, v]| / max_v |transformers[t, v]|  <=  1e-4

(the largest difference over the vocabulary relative to the largest logit at that position), with
transformers' SDPA attention and with its eager attention. The export's tensors must be those
transformers' own save_pretrained writes (names, shapes, values), with nothing missing or unexpected on
loading.

GPT-2 runs: plain; dropout 0.1 (the export runs in evaluation mode, as seqlab's logits do); d_ff != 4
d_model (GPT-2's n_inner); an untied lm_head. Sequences: one token, the full context, and a length between.
BERT runs (data.objective = masked_lm, two segments): with the next-sentence head (left out of
BertForMaskedLM) and without, tied; untied with dropout and d_ff != 4 d_model. Sequences: [CLS] A [SEP] B
[SEP] with its segment ids, whole and padded (--length; attention_mask in transformers, the valid rows
compared), and a single [CLS]. T5 runs (data.objective = span_corruption, [model.attention] scale = 1): ReLU
and tied (T5); GEGLU and untied (T5 v1.1) with more decoder layers than encoder layers and few relative
buckets up to a short max distance, so that distances past it share the last bucket. Sequences: a full
source and a padded one (--length; attention_mask), with decoder inputs of one token and of several.

Refusals: recipes the classes cannot hold (for GPT-2: GLA, rotary positions, grouped key/value heads, an
attention scale other than 1/sqrt(D), post-norm blocks, a hybrid pattern; for BERT: pre-norm, RMSNorm,
rotary positions, grouped heads; for T5: the default attention scale, LayerNorm, biases, learned
positions, SwiGLU) end in exit code 2 and one line naming each setting that does not map, with nothing
written; so do an OUT that holds files (without --force, and with --force where OUT holds a folder or a
run), a missing --hf, and `seqlab logits` ids outside the vocabulary or beyond the context, and its flags
given to a model kind that does not read them.

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


def seqlab_logits(run_dir, ids, out, *flags):
    p = run("logits", run_dir, "--tokens", " ".join(map(str, ids)), "--out", out, *flags)
    if p.returncode != 0:
        raise SystemExit(f"FAIL seqlab logits {run_dir}: {p.stderr.strip()}")
    return np.load(out)


def ids_text(ids):
    return " ".join(map(str, ids))


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


def export_and_load(work, run_dir, name, cls, attention):
    """Exports run_dir, checks the folder, loads it with `cls` and checks the loading: the config, the
    model (eval mode) and the export's tensors; None where the export failed."""
    out = os.path.join(work, name + "_hf")
    if not os.path.exists(out):
        p = run("export", "--hf", run_dir, out)
        if not check(p.returncode == 0 and sorted(os.listdir(out)) == ["config.json", "model.safetensors"],
                     f"{name}: export writes config.json and model.safetensors", (p.stdout + p.stderr).strip()):
            return None
    config = json.load(open(os.path.join(out, "config.json")))
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        ours = {k: f.get_tensor(k) for k in f.keys()}
    model, info = cls.from_pretrained(out, output_loading_info=True, attn_implementation=attention)
    model.eval()
    if attention == "sdpa":
        check(all(t.dtype == torch.float32 for t in ours.values()), f"{name}: f32 tensors")
        check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
              f"{name}: from_pretrained finds every weight, nothing unexpected ({info})")
        saved = os.path.join(work, name + "_resaved")
        model.save_pretrained(saved)
        with safe_open(os.path.join(saved, "model.safetensors"), "pt") as f:
            theirs = {k: f.get_tensor(k) for k in f.keys()}
        same = sorted(theirs) == sorted(ours) and all(
            theirs[k].shape == ours[k].shape and torch.equal(theirs[k], ours[k]) for k in ours)
        check(same, f"{name}: the tensors are those transformers' own save_pretrained writes",
              f"only ours: {sorted(set(ours) - set(theirs))}, only theirs: {sorted(set(theirs) - set(ours))}")
    return config, ours, model


def compare_rows(name, attention, what, expected, got):
    err = worst_relative_error(expected, got) if expected.shape == got.shape else float("inf")
    check(err <= TOLERANCE, f"{name}: {attention} attention, {what}: logits {got.shape} within {TOLERANCE:g} "
          f"relative (worst {err:.2e})", f"seqlab {expected.shape}, transformers {got.shape}")


# The byte tokenizer's special ids (special_tokens.h): masked_lm [PAD] [CLS] [SEP] [MASK], span_corruption
# [PAD] [EOS] <extra_id_0> ...
PAD, CLS, SEP, MASK = 256, 257, 258, 259
EOS, SENTINEL = 257, 258


def compare_bert(work, run_dir, name, seq_len, tied=True):
    """BertForMaskedLM against seqlab logits: [CLS] A [SEP] B [SEP] with segment ids, whole and padded, and
    [CLS] alone."""
    rng = random.Random(13)
    a = [rng.randrange(256) for _ in range(5)]
    b = [rng.randrange(256) for _ in range(seq_len - len(a) - 3)]
    a[1] = MASK
    full = [CLS] + a + [SEP] + b + [SEP]
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    n = len(a) + 2 + 3 + 1  # [CLS] A [SEP] and three tokens of B, [SEP]; the rest padding
    padded = full[:n - 1] + [SEP] + [PAD] * (seq_len - n)
    padded_segments = segments[:n] + [0] * (seq_len - n)
    cases = [(f"[CLS] A [SEP] B [SEP], T = {seq_len}", full, segments, seq_len),
             (f"{n} tokens padded to {seq_len}", padded, padded_segments, n),
             ("[CLS] alone", [CLS], [0], 1)]
    model = None
    for attention in ("sdpa", "eager"):
        loaded = export_and_load(work, run_dir, name, transformers.BertForMaskedLM, attention)
        if loaded is None:
            return None
        config, ours, model = loaded
        if attention == "sdpa":
            check(config["hidden_act"] == "gelu_new" and config["type_vocab_size"] == 2 and
                  config["max_position_embeddings"] == seq_len and config["pad_token_id"] == PAD and
                  config["tie_word_embeddings"] == tied,
                  f"{name}: config.json: gelu_new, type_vocab_size 2, {seq_len} positions, pad {PAD}, tied {tied}",
                  json.dumps(config))
            stored = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} & set(ours)
            check(bool(stored) != tied and not any(k.startswith(("bert.pooler", "cls.seq_relationship")) for k in ours),
                  f"{name}: the output layer stored only when untied; no pooler or next-sentence head",
                  f"{sorted(stored)}")
            check((model.cls.predictions.decoder.weight.data_ptr() ==
                   model.bert.embeddings.word_embeddings.weight.data_ptr()) == tied,
                  f"{name}: transformers " + ("ties the decoder to the word embeddings" if tied else
                                              "keeps the decoder apart from the word embeddings"))
        for what, ids, seg, length in cases:
            flags = ["--segments", ids_text(seg)] + (["--length", str(length)] if length < len(ids) else [])
            expected = seqlab_logits(run_dir, ids, os.path.join(work, "logits.npy"), *flags)
            mask = [1] * length + [0] * (len(ids) - length)
            with torch.no_grad():
                got = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([seg]),
                            attention_mask=torch.tensor([mask])).logits[0].numpy()
            compare_rows(name, attention, what, expected[:length], got[:length])
    return model


def compare_t5(work, run_dir, name, seq_len, tied=True):
    """T5ForConditionalGeneration against seqlab logits: a source (full, and padded with attention_mask) and
    decoder inputs starting with [PAD], the decoder start."""
    rng = random.Random(17)
    # One sentinel: what a row of 16 tokens needs, so the vocabulary is 259 ids.
    source = [rng.randrange(256) for _ in range(seq_len - 4)] + [SENTINEL, 65, 66, EOS]
    n = seq_len - 5
    padded = source[:n - 2] + [SENTINEL, EOS] + [PAD] * (seq_len - n)
    target = [PAD, SENTINEL, 67, 68, 69, 70, 71, 72, EOS]
    cases = [(f"source T = {seq_len}, decoder S = 1", source, seq_len, [PAD]),
             (f"source T = {seq_len}, decoder S = {len(target)}", source, seq_len, target),
             (f"source of {n} padded to {seq_len}, decoder S = {len(target)}", padded, n, target)]
    model = None
    for attention in ("sdpa", "eager"):
        loaded = export_and_load(work, run_dir, name, transformers.T5ForConditionalGeneration, attention)
        if loaded is None:
            return None
        config, ours, model = loaded
        if attention == "sdpa":
            check(config["decoder_start_token_id"] == PAD and config["pad_token_id"] == PAD and
                  config["eos_token_id"] == EOS and config["tie_word_embeddings"] == tied and
                  config["d_kv"] * config["num_heads"] == config["d_model"],
                  f"{name}: config.json: decoder start = pad = {PAD}, eos {EOS}, tied {tied}, d_kv", json.dumps(config))
            check(("lm_head.weight" in ours) != tied and model.config.scale_decoder_outputs == tied and
                  (model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()) == tied,
                  f"{name}: lm_head " + ("tied to shared, output scaled by d_model^-1/2" if tied else
                                         "stored and kept apart from shared, output not rescaled"))
        for what, src, length, dec in cases:
            flags = ["--decoder-tokens", ids_text(dec)] + (["--length", str(length)] if length < len(src) else [])
            expected = seqlab_logits(run_dir, src, os.path.join(work, "logits.npy"), *flags)
            mask = [1] * length + [0] * (len(src) - length)
            with torch.no_grad():
                got = model(input_ids=torch.tensor([src]), attention_mask=torch.tensor([mask]),
                            decoder_input_ids=torch.tensor([dec])).logits[0].numpy()
            compare_rows(name, attention, what, expected, got)
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

    # BERT: the masked-LM data (two segments), with and without the next-sentence head.
    bert = {"arch": '"encoder"', "d_model": 24, "n_layers": 2, "n_heads": 3, "segments": 2, "norm_eps": "1e-12"}
    masked_lm = {"objective": '"masked_lm"'}
    nsp = train(work, "bert_nsp", bert, data_keys={**masked_lm, "next_sentence": "true"})
    model = compare_bert(work, nsp, "bert_nsp", 16)
    check(model is not None and model.config.layer_norm_eps == 1e-12, "bert_nsp: layer_norm_eps is model.norm_eps")
    compare_bert(work, train(work, "bert", bert, data_keys=masked_lm), "bert", 16)
    untied = train(work, "bert_untied", {**bert, "tie_embeddings": "false", "dropout": 0.1, "d_ff": 40},
                   data_keys=masked_lm)
    model = compare_bert(work, untied, "bert_untied", 16, tied=False)
    check(model is not None and model.config.intermediate_size == 40 and model.config.hidden_dropout_prob == 0.1 and
          model.config.attention_probs_dropout_prob == 0.0,
          "bert_untied: intermediate_size is d_ff, hidden_dropout_prob the dropout, no attention dropout")

    # T5: span corruption, unscaled attention; ReLU tied, and GEGLU untied (v1.1) with few buckets.
    t5 = {"arch": '"encoder_decoder"', "d_model": 24, "n_layers": 2, "n_heads": 3, "norm_eps": "1e-6",
          "attention": "{ scale = 1.0 }"}
    span = {"objective": '"span_corruption"'}
    relu = train(work, "t5", t5, data_keys=span)
    model = compare_t5(work, relu, "t5", 16)
    check(model is not None and model.config.feed_forward_proj == "relu" and model.config.num_layers == 2 and
          model.config.num_decoder_layers == 2, "t5: feed_forward_proj relu, 2 + 2 layers")
    v11 = train(work, "t5_v11", {**t5, "mlp": '"geglu"', "tie_embeddings": "false", "decoder_layers": 3,
                                 "relative_buckets": 8, "relative_max_distance": 6}, data_keys=span)
    model = compare_t5(work, v11, "t5_v11", 16, tied=False)
    check(model is not None and model.config.feed_forward_proj == "gated-gelu" and
          model.config.dense_act_fn == "gelu_new" and model.config.num_decoder_layers == 3 and
          model.config.relative_attention_num_buckets == 8 and model.config.relative_attention_max_distance == 6,
          "t5_v11: gated-gelu (gelu_new), 3 decoder layers, 8 buckets up to distance 6")

    small_bert = {**bert, "d_model": 16, "n_heads": 2}
    expect_refused(work, "bert_pre", {**small_bert, "norm_placement": '"pre"', "norm": '"rmsnorm"', "positions": '"rope"'},
                   ["BertForMaskedLM cannot hold this model", "pre-norm blocks (model.norm_placement = \"pre\")",
                    "RMSNorm (model.norm = \"rmsnorm\")", "rotary positions (model.positions = \"rope\")"],
                   ["biases (model.bias"], data_keys=masked_lm)
    expect_refused(work, "bert_gqa", {**small_bert, "n_heads": 4, "n_kv_heads": 2, "mlp": '"swiglu"'},
                   ["grouped key/value heads (model.n_kv_heads = 2 for 4 heads)", "SwiGLU FFNs in blocks 0-1 "],
                   ["post-norm blocks (", "pre-norm blocks ("], data_keys=masked_lm)
    small_t5 = {**t5, "d_model": 16, "n_heads": 2}
    expect_refused(work, "t5_scale", {**small_t5, "attention": "{ scale = 0.0 }"},
                   ["T5ForConditionalGeneration cannot hold this model", "model.attention.scale = 0.0 (T5 has only 1.0)"],
                   ["RMSNorm (", "LayerNorm (", "biases (model.bias"], data_keys=span)
    expect_refused(work, "t5_bert_block", {**small_t5, "norm": '"layernorm"', "bias": "true", "positions": '"learned"',
                                           "mlp": '"swiglu"'},
                   ["SwiGLU FFNs in encoder blocks 0-1 ", "SwiGLU FFNs in decoder blocks 0-1 ",
                    "learned positions (model.positions = \"learned\")", "LayerNorm (model.norm = \"layernorm\")",
                    "biases (model.bias = true)"], ["model.attention.scale"], data_keys=span)
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
    x = os.path.join(work, "x.npy")
    for run_dir, flags, message, what in [
            (plain, ["--segments", "0"], "--segments is read by an encoder", "--segments to a decoder"),
            (plain, ["--length", "1"], "--length is read by encoders and encoder-decoders", "--length to a decoder"),
            (nsp, ["--decoder-tokens", "1"], "--decoder-tokens is read by an encoder-decoder", "--decoder-tokens to BERT"),
            (nsp, ["--segments", "0 2"], "--segments: id 2 is outside the model's segments of 2", "a segment id >= 2"),
            (nsp, ["--segments", "0"], "--segments holds 1 ids for the 2 of --tokens", "one segment id for 2 tokens"),
            (nsp, ["--length", "3"], "--length expects an integer from 1 to 2", "--length past the tokens"),
            (relu, [], "--decoder-tokens is required for an encoder-decoder", "T5 without --decoder-tokens")]:
        p = run("logits", run_dir, "--tokens", "1 2", "--out", x, *flags)
        check(one_line_refusal(p) and message in p.stderr and not os.path.exists(x),
              f"logits: {what} is refused", p.stderr.strip())

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
sys.exit(1 if failures else 0)
