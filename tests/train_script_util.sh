# What the training script tests (tests/train_*_test.sh) and scripts/kill_resume.sh share; sourced, not run.
#   pass NAME / fail NAME    one result line; fail counts into $failures
#   word_corpus FILE SEED DOCS WORDS    DOCS paragraphs of WORDS random words of a small vocabulary
#   tiny_model_and_data FILE DIR   the [model] (d_model 16, 1 layer, 2 heads) and [data] (DIR/corpus.txt,
#                            cached in DIR/cache) of the tests' tiny recipe; a test appends the rest
#   losses RUN               RUN/metrics.jsonl without the fields that measure time
#   same_losses NAME A B     pass when runs A and B logged the same lines (but for time) at every step
#   close_losses NAME A B    pass when runs A and B logged the same steps, with loss, grad_norm and val_loss
#                            within a relative 1e-5 at every one (several ranks against one process)
#   tensor_sums CKPT         the CRC32C of every tensor of a checkpoint, from its metadata (the checks
#                            on reading hold them true to the bytes), one "crc32c.NAME HEX" a line
failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

word_corpus() {
  python3 - "$@" <<'PY'
import random, sys
path, seed, docs, words_per_doc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
random.seed(seed)
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
with open(path, "w") as f:
    for _ in range(docs):
        f.write(" ".join(random.choice(words) for _ in range(words_per_doc)) + ".\n\n")
PY
}

tiny_model_and_data() {
  cat > "$1" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
[data]
path = "$2/corpus.txt"
format = "text"
val_fraction = 0.2
cache_dir = "$2/cache"
TOML
}

losses() { sed -E 's/, "(tokens_per_s|mfu|elapsed_s)": [0-9.e+-]+//g' "$1/metrics.jsonl"; }

same_losses() {
  if [ "$(wc -l < "$2/metrics.jsonl")" -eq "$(wc -l < "$3/metrics.jsonl")" ] && diff <(losses "$2") <(losses "$3") > /dev/null; then
    pass "$1: identical losses at every step"
  else
    fail "$1: metrics differ"; diff <(losses "$2") <(losses "$3") | head -5
  fi
}

tensor_sums() {
  python3 - "$1" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
print("\n".join(f"{k} {v}" for k, v in sorted(meta.items()) if k.startswith("crc32c.")))
PY
}

close_losses() {
  if python3 - "$2/metrics.jsonl" "$3/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
if [x["step"] for x in a] != [x["step"] for x in b] or len(a) < 2:
    sys.exit(f"steps differ: {[x['step'] for x in a]} vs {[x['step'] for x in b]}")
worst = 0.0
# One unit in the last decimal the log prints (metrics.jsonl: loss %.6f, grad_norm %.4f) is allowed on top
# of the relative 1e-5: two values a hair apart can print one unit apart.
last_digit = {"loss": 1e-6, "grad_norm": 1e-4, "val_loss": 1e-6}
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_loss"):
        if (k in x) != (k in y):
            sys.exit(f"step {x['step']}: {k} in one run only")
        if k in x:
            rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-12)
            if abs(x[k] - y[k]) > 1e-5 * abs(x[k]) + last_digit[k] * 1.001:
                sys.exit(f"step {x['step']}: {k} {x[k]} vs {y[k]} (relative {rel:.2g})")
            worst = max(worst, rel)
print(f"{len(a)} steps, largest relative difference {worst:.2g}")
PY
  then pass "$1"; else fail "$1"; fi
}
