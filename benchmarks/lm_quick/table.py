"""Bits per byte of a byte-LM sweep: one row per method, mean ± std over seeds.

    python benchmarks/lm_quick/table.py SWEEP_DIR > benchmarks/lm_quick/table.md

Reads ``SWEEP_DIR/<method>-seed<k>/results.json`` (written by ``spectral-jax sweep``) and
copies each run's figures to ``benchmarks/lm_quick/results.json``.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np

FIELDS = ("attention", "seed", "test_bits_per_byte", "final_test_bits_per_byte",
          "test_accuracy", "majority_baseline", "best_step", "steps", "wall_time_s",
          "tokens_per_s", "num_params", "train_step_peak_bytes")


def main(sweep_dir: str) -> None:
    runs = []
    for path in sorted(glob.glob(os.path.join(sweep_dir, "*", "results.json"))):
        with open(path) as f:
            record = json.load(f)
        runs.append({k: record.get(k) for k in FIELDS})
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json")
    with open(out, "w") as f:
        json.dump(runs, f, indent=2)
    methods = list(dict.fromkeys(r["attention"] for r in runs))
    softmax = [r["test_bits_per_byte"] for r in runs if r["attention"] == "softmax"]
    print("| method | seeds | test bits/byte | vs softmax | next-byte accuracy | tokens/s |")
    print("|---|---|---|---|---|---|")
    for m in methods:
        rows = [r for r in runs if r["attention"] == m]
        bpb = np.array([r["test_bits_per_byte"] for r in rows])
        acc = np.array([r["test_accuracy"] for r in rows])
        rate = np.median([r["tokens_per_s"] for r in rows])
        ratio = f"{bpb.mean() / np.mean(softmax):.3f}" if softmax else "-"
        print(f"| {m} | {len(rows)} | {bpb.mean():.3f} ± {bpb.std():.3f} | {ratio} | "
              f"{100 * acc.mean():.1f}% | {rate:,.0f} |")
    base = runs[0]["majority_baseline"] if runs else float("nan")
    print(f"\nMost-frequent-byte accuracy on the test split: {100 * base:.1f}%. "
          "Std is over seeds (population).")


if __name__ == "__main__":
    main(sys.argv[1])
