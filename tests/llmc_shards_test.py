"""llm.c's own data, end to end: a folder of token shards named and laid out as llm.c's data scripts write
them (<name>_train_NNNNNN.bin, <name>_val_NNNNNN.bin, no meta.json) trains with data.source = "shards",
and `seqlab sample` decodes with a tokenizer file of llm.c's layout (gpt2_tokenizer.bin), or prints token
ids without one. Each misuse ends in exit code 2 and one line on stderr.

The files are written here from the layouts (docs/reliability.md, "llm.c's own shards and tokenizer"):
  shard      256 little-endian int32 (20240520, 1, token count, zeros), then the uint16 token ids
  tokenizer  256 little-endian uint32 (20240328, 2, vocab size, end-of-text id, zeros), then for every id
             one length byte and that many bytes

Usage: llmc_shards_test.py /path/to/seqlab
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

SEQLAB = sys.argv[1]
VOCAB = 40  # ids 0..38 are words, 39 is end-of-text (the last id, as in GPT-2)
EOT = VOCAB - 1
WORDS = [" w%02d" % i for i in range(EOT)] + ["<|endoftext|>"]
failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else ": " + detail))
    if not ok:
        failures.append(what)


def write_shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(ids), *ids))


def write_tokenizer(path, words, eot):
    with open(path, "wb") as f:
        f.write(struct.pack("<256I", 20240328, 2, len(words), eot, *([0] * 252)))
        for w in words:
            b = w.encode()
            f.write(bytes([len(b)]) + b)


def documents(count, seed):
    """end-of-text, then a run of consecutive word ids: a pattern a tiny model starts to learn."""
    ids = []
    for d in range(count):
        start = (seed * 7 + d * 5) % EOT
        ids.append(EOT)
        ids.extend((start + k) % EOT for k in range(12 + d % 5))
    return ids


def run(*args):
    return subprocess.run([SEQLAB, *args], capture_output=True, text=True)


def recipe(path, data_lines, out_dir, steps=8):
    with open(path, "w") as f:
        f.write(f"""[model]
d_model = 16
n_layers = 1
n_heads = 2
vocab_size = 48        # llm.c pads GPT-2's 50257 to 50304 the same way: the model's vocabulary may be larger
[data]
source = "shards"
{data_lines}
[train]
device = "cpu"
steps = {steps}
batch_size = 4
seq_len = 16
[optim]
lr = 3e-3
warmup_steps = {min(2, steps)}
[log]
every = 4
eval_every = 4
eval_batches = 2
sample_every = 8
sample_tokens = 12
progress = "plain"
out_dir = "{out_dir}"
[checkpoint]
every = 0
""")


def expect_error(args, want, what):
    r = run(*args)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and want in r.stderr,
          f"{what}: exit 2 and one line with '{want}' (got {r.returncode}: {r.stderr.strip()!r})")


def decode(ids_text):
    """The text the tokenizer file gives the ids printed by a run without it."""
    return "".join(WORDS[int(i)] for i in ids_text.split())


def sample_body(samples_txt, step):
    m = re.search(r"### step %d \(temperature [^)]*\)\n(.*?)\n\n" % step, samples_txt, re.S)
    return m.group(1) if m else None


with tempfile.TemporaryDirectory() as work:
    data = os.path.join(work, "tinyllmc")
    os.makedirs(data)
    train_ids, val_ids = documents(40, 1), documents(16, 2)
    half = len(train_ids) // 2
    write_shard(os.path.join(data, "tinyllmc_train_000000.bin"), train_ids[:half])
    write_shard(os.path.join(data, "tinyllmc_train_000001.bin"), train_ids[half:])
    write_shard(os.path.join(data, "tinyllmc_val_000000.bin"), val_ids)
    tok = os.path.join(work, "tiny_tokenizer.bin")
    write_tokenizer(tok, WORDS, EOT)

    # Two runs on the same shards and seed: one decodes with the tokenizer file, one prints ids.
    recipe(os.path.join(work, "text.toml"), f'path = "{data}"\ntokenizer_path = "{tok}"', os.path.join(work, "run_text"))
    recipe(os.path.join(work, "ids.toml"), f'path = "{data}"\nvocab_size = {VOCAB}', os.path.join(work, "run_ids"))
    a = run(os.path.join(work, "text.toml"))
    check(a.returncode == 0, "trains on llm.c's shards with its tokenizer file", a.stderr.strip()[-300:])
    b = run(os.path.join(work, "ids.toml"))
    check(b.returncode == 0, "trains on llm.c's shards without a tokenizer file", b.stderr.strip()[-300:])
    if failures:
        sys.exit(1)
    check(f"llm.c shards: vocabulary {VOCAB}, samples decoded by {tok}" in a.stdout, "the run says what it read")
    check(f"llm.c shards: vocabulary {VOCAB}, samples as token ids" in b.stdout, "the ids run says so")

    def metrics(run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    ma, mb = metrics(os.path.join(work, "run_text")), metrics(os.path.join(work, "run_ids"))
    check([m["step"] for m in ma] == [4, 8] and all("val_loss" in m for m in ma), "metrics at steps 4 and 8 with val_loss")
    check([m["loss"] for m in ma] == [m["loss"] for m in mb], "the two runs train identically (same data, vocabulary, seed)")
    check(all("val_bpb" not in m for m in ma), "no bits per byte: the ids are not bytes")
    check(ma[-1]["loss"] < ma[0]["loss"], f"the loss falls ({ma[0]['loss']:.4f} -> {ma[-1]['loss']:.4f})")

    with open(os.path.join(work, "run_text", "samples.txt")) as f:
        text_sample = sample_body(f.read(), 8)
    with open(os.path.join(work, "run_ids", "samples.txt")) as f:
        ids_sample = sample_body(f.read(), 8)
    check(ids_sample is not None and re.fullmatch(r"\d+( \d+)*", ids_sample) is not None
          and all(int(i) < VOCAB for i in ids_sample.split()), f"samples.txt of the ids run holds ids: {ids_sample!r}")
    check(text_sample is not None and ids_sample is not None and text_sample == decode(ids_sample),
          f"samples.txt decodes with the tokenizer file: {text_sample!r}")

    # seqlab sample: greedy, so both runs draw the same ids; one prints them, the other their text.
    sa = run("sample", os.path.join(work, "run_text"), "--temperature", "0", "--tokens", "12")
    sb = run("sample", os.path.join(work, "run_ids"), "--temperature", "0", "--tokens", "12")
    check(sa.returncode == 0 and sb.returncode == 0, "seqlab sample runs on both", sa.stderr + sb.stderr)
    ids_out = sb.stdout.strip()
    check(re.fullmatch(r"\d+( \d+){11}", ids_out) is not None, f"without a tokenizer file, 12 token ids: {ids_out!r}")
    check(sa.stdout.rstrip("\n") == decode(ids_out), f"with it, their text: {sa.stdout.strip()!r}")
    pa = run("sample", os.path.join(work, "run_text"), "--temperature", "0", "--tokens", "6", "--prompt", "3 4 5")
    pb = run("sample", os.path.join(work, "run_ids"), "--temperature", "0", "--tokens", "6", "--prompt", "3, 4, 5")
    check(pb.returncode == 0 and pb.stdout.startswith("3 4 5 ") and len(pb.stdout.split()) == 9,
          f"a prompt of ids continues: {pb.stdout.strip()!r}")
    check(pa.returncode == 0 and pa.stdout.rstrip("\n") == decode(pb.stdout), f"and decodes: {pa.stdout.strip()!r}")
    expect_error(["sample", os.path.join(work, "run_text"), "--prompt", "w03 w04"],
                 "holds no BPE merges, so text cannot be encoded: give the prompt as token ids",
                 "a text prompt without BPE merges")
    expect_error(["sample", os.path.join(work, "run_ids"), "--prompt", "3 40"],
                 "prompt token id 40 is outside the vocabulary of 40 ids", "a prompt id beyond the vocabulary")

    # No tokenizer and no data.vocab_size: GPT-2's vocabulary.
    recipe(os.path.join(work, "gpt2.toml"), f'path = "{data}"', os.path.join(work, "run_gpt2"), steps=1)
    with open(os.path.join(work, "gpt2.toml")) as f:
        text = f.read().replace("vocab_size = 48 ", "vocab_size = 0 ")
    with open(os.path.join(work, "gpt2.toml"), "w") as f:
        f.write(text)
    g = run(os.path.join(work, "gpt2.toml"))
    check(g.returncode == 0 and "llm.c shards: vocabulary 50257, samples as token ids" in g.stdout,
          "without a vocabulary in the recipe, GPT-2's 50257", (g.stdout + g.stderr).strip()[-300:])

    # Misuse.
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    write_shard(os.path.join(bad, "x_train_000000.bin"), train_ids)
    write_shard(os.path.join(bad, "x_val_000000.bin"), val_ids[:50] + [45] + val_ids[51:])
    recipe(os.path.join(work, "bad.toml"), f'path = "{bad}"\ntokenizer_path = "{tok}"', os.path.join(work, "run_bad"))
    expect_error([os.path.join(work, "bad.toml")],
                 os.path.join(bad, "x_val_000000.bin") + ": token id 45 at position 50 is outside the vocabulary of 40 ids",
                 "an id beyond the vocabulary, found as the shard opens")
    check(not os.path.exists(os.path.join(work, "run_bad", "metrics.jsonl")), "... before the run writes anything")
    recipe(os.path.join(work, "mismatch.toml"), f'path = "{data}"\ntokenizer_path = "{tok}"\nvocab_size = 50',
           os.path.join(work, "run_mismatch"))
    expect_error([os.path.join(work, "mismatch.toml")], f"{tok}: holds 40 tokens, not data.vocab_size = 50",
                 "data.vocab_size disagreeing with the tokenizer file")
    notes = os.path.join(work, "notes.txt")
    with open(notes, "w") as f:
        f.write("not a tokenizer\n")
    recipe(os.path.join(work, "notok.toml"), f'path = "{data}"\ntokenizer_path = "{notes}"', os.path.join(work, "r"))
    expect_error([os.path.join(work, "notok.toml")], f"{notes}: not an llm.c tokenizer file", "a tokenizer_path that is not llm.c's")
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    recipe(os.path.join(work, "empty.toml"), f'path = "{empty}"', os.path.join(work, "r"))
    expect_error([os.path.join(work, "empty.toml")], f"{empty}: neither meta.json (seqlab's prepare) nor train shards",
                 "a folder without shards")
    expect_error([os.path.join(work, "ids.toml"), "--set", "data.source=text"],
                 'data.vocab_size = 40 is read only for data.source = "shards"', "data.vocab_size with text data")
    expect_error([os.path.join(work, "ids.toml"), "--set", "data.vocab_size=70000"],
                 "data.vocab_size must be an integer in [0, 65536]", "data.vocab_size beyond uint16")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all llm.c data checks passed")
