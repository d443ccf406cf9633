#!/usr/bin/env python3
"""Length-extrapolation table of a finished sweep whose metric is one eval.seq_len length (val_acc@512).

`seqlab sweep` tables one metric; a run scored at several lengths (eval.seq_len) logged them all. For each
row of the sweep's table this prints the point seqlab picked as best (the highest, or lowest for a loss,
value of the sweep's metric over the other axes) and that same run's final value at every length, so the
columns of a row are one model, not the best of different runs. Usage: scripts/sweep_lengths.py DIR
(the sweep's --out folder, holding results.csv and one folder per point); markdown on stdout.
"""
import csv
import json
import os
import re
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/sweep_lengths.py SWEEP_DIR")
    out = sys.argv[1]
    path = os.path.join(out, "results.csv")
    if not os.path.isfile(path):
        sys.exit(f"{path}: no results.csv (run the sweep, or ./train sweep --report {out})")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no points")
    metric = list(rows[0].keys())[-1]  # the last column is the sweep's metric (sweep.h, results_csv)
    m = re.fullmatch(r"(.+)@(\d+)", metric)
    if not m:
        sys.exit(f"{path}: the sweep's metric {metric} is not a per-length one (NAME@L)")
    base = m.group(1)
    higher = "acc" in metric  # the sweep's own rule (docs/scaling.md)
    row_key = "model.mixer" if "model.mixer" in rows[0] else list(rows[0].keys())[1]
    best = {}
    for r in rows:
        if r["status"] != "ok" or r[metric] == "":
            continue
        v = float(r[metric])
        k = r[row_key]
        if k not in best or (v > best[k][0] if higher else v < best[k][0]):
            best[k] = (v, r["point"])
    lengths, table = set(), {}
    for k, (_, point) in best.items():
        last = None
        with open(os.path.join(out, point, "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if metric in j:
                    last = j
        table[k] = {int(key.split("@")[1]): val for key, val in last.items() if key.startswith(base + "@")}
        lengths.update(table[k])
    lengths = sorted(lengths)
    print(f"{base} at each length of the point with the best {metric} per {row_key}\n")
    print(f"| {row_key} | " + " | ".join(f"L = {l}" for l in lengths) + " | point |")
    print("|---|" + "---|" * (len(lengths) + 1))
    for k in dict.fromkeys(r[row_key] for r in rows):  # the rows in the sweep's order, once each
        if k not in table:
            print(f"| {k} | " + " | ".join("—" for _ in lengths) + " | none finished |")
            continue
        cells = " | ".join(f"{table[k][l]:.4f}" if l in table[k] else "—" for l in lengths)
        print(f"| {k} | {cells} | {best[k][1]} |")


if __name__ == "__main__":
    main()
