#!/usr/bin/env python3
"""The published-comparison sweeps (recipes/sweeps/*.toml) and their length table (scripts/sweep_lengths.py).

Every sweep file loads and every point's recipe is accepted (`seqlab sweep FILE --dry-run`: exit 0, no
REFUSED point), so a renamed key or mixer breaks this test rather than a half-hour sweep; and every one is a
fair comparison (docs/scaling.md): no block key left "auto" for the sweep to pin, no confound. The length
table is checked on a made-up sweep folder: per row, the point with the best NAME@L and that run's last
value at every length; a failed point is skipped; a metric that is not per-length is refused.
Usage: sweep_recipes_test.py /path/to/seqlab (a few seconds).
"""
import json
import os
import subprocess
import sys
import tempfile

SEQLAB = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


sweeps = sorted(f for f in os.listdir(os.path.join(ROOT, "recipes", "sweeps")) if f.endswith(".toml"))
check(len(sweeps) >= 2, f"recipes/sweeps holds the sweep files ({', '.join(sweeps)})")
with tempfile.TemporaryDirectory() as work:
    for name in sweeps:
        p = subprocess.run([SEQLAB, "sweep", os.path.join(ROOT, "recipes", "sweeps", name), "--dry-run", "--out",
                            os.path.join(work, name)], capture_output=True, text=True)
        ok = p.returncode == 0 and "REFUSED" not in p.stdout and "estimated" in p.stdout
        check(ok, f"{name}: --dry-run accepts every point" +
              ("" if ok else f" (exit {p.returncode}: {(p.stdout + p.stderr).strip()[-400:]})"))
        # A fair comparison: every mixer in one block that the files name themselves (no "auto" key left
        # for the sweep to pin), and no key besides the grid's differing between points.
        fair = "NOT A FAIR COMPARISON" not in p.stdout and "fair comparison:" not in p.stdout
        check(fair, f"{name}: the points differ in the grid's keys alone, their block named by the files" +
              ("" if fair else f" ({[l for l in p.stdout.splitlines() if 'fair' in l.lower()]})"))
        check(not os.path.exists(os.path.join(work, name)) or not any(
            e.endswith(".log") for e in os.listdir(os.path.join(work, name))), f"{name}: --dry-run ran nothing")

    # A made-up finished sweep: two mixers × two seeds, one point failed, scored at 4 and 8 tokens.
    out = os.path.join(work, "fake")
    os.makedirs(out)
    points = [("mixer=a,seed=1", "a", "ok", 0.9, {4: 1.0, 8: 0.9}),
              ("mixer=a,seed=2", "a", "ok", 0.5, {4: 0.99, 8: 0.5}),
              ("mixer=b,seed=1", "b", "failed", "", {}),
              ("mixer=b,seed=2", "b", "ok", 0.25, {4: 0.75, 8: 0.25})]
    with open(os.path.join(out, "results.csv"), "w") as f:
        f.write("point,model.mixer,train.seed,status,params,tokens,train_flops,state_size,wall_s,val_acc@8\n")
        for point, mixer, status, metric, _ in points:
            f.write(f'"{point}",{mixer},{point[-1]},{status},10,100,1e9,64,1.0,{metric}\n')
    for point, _, status, _, at in points:
        os.makedirs(os.path.join(out, point))
        with open(os.path.join(out, point, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 1, "loss": 3.0}) + "\n")
            f.write(json.dumps({"step": 2, "val_acc": 0.0, "val_acc@4": 0.0, "val_acc@8": 0.0}) + "\n")  # earlier eval
            if status == "ok":
                f.write(json.dumps({"step": 4, "val_acc": at[4], **{f"val_acc@{l}": v for l, v in at.items()}}) + "\n")
    script = os.path.join(ROOT, "scripts", "sweep_lengths.py")
    p = subprocess.run([sys.executable, script, out], capture_output=True, text=True)
    lines = p.stdout.splitlines()
    check(p.returncode == 0, f"sweep_lengths.py exits 0 ({p.stderr.strip()})")
    check("| model.mixer | L = 4 | L = 8 | point |" in lines, "the columns are the lengths")
    check("| a | 1.0000 | 0.9000 | mixer=a,seed=1 |" in lines, "row a: the point best at 8 tokens, its last eval")
    check("| b | 0.7500 | 0.2500 | mixer=b,seed=2 |" in lines, "row b: the failed point skipped")

    with open(os.path.join(out, "results.csv")) as f:
        text = f.read().replace("val_acc@8", "val_acc")
    with open(os.path.join(out, "results.csv"), "w") as f:
        f.write(text)
    p = subprocess.run([sys.executable, script, out], capture_output=True, text=True)
    check(p.returncode == 1 and "is not a per-length one" in p.stderr, f"a metric without @L is refused ({p.stderr.strip()})")

sys.exit(1 if failures else 0)
