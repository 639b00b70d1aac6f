"""Learning curves of LRA runs: validation accuracy and training loss against the step.

Reads each run folder's ``metrics.jsonl`` (as ``spectral-jax train`` writes it) and draws
one line per run, with the majority-class baseline and published accuracies as reference
lines. Of a self-pretrained run, the fine-tune is drawn (its steps count from 1 again).

Usage:
    python benchmarks/lra_listops/plot_curves.py RUN_DIR [RUN_DIR ...] --out curves.png \
        --baseline 18.45 --published "softmax (Xiong et al.)=37.10" "Nyströmformer=37.15"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spectral_jax.lra.plotting import load_matplotlib, new_figure


def read_metrics(run: Path) -> dict[str, list[dict]]:
    """``{split: [record, ...]}`` from ``run/metrics.jsonl``, ordered by step.

    A resumed run logs again from its checkpoint; the last record of each (split, step) wins.
    Pretraining records (``"stage": "pretrain"``) are left out.
    """
    latest: dict[tuple[str, int], dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("stage") != "pretrain":
                latest[(record["split"], record["step"])] = record
    splits: dict[str, list[dict]] = {}
    for (split, _), record in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        splits.setdefault(split, []).append(record)
    return splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--baseline", type=float, help="majority-class accuracy, percent")
    parser.add_argument("--published", nargs="*", default=[], help="LABEL=PERCENT lines")
    args = parser.parse_args()
    mpl = load_matplotlib(f"the plot {args.out}")
    if mpl is None:
        return
    fig = new_figure(mpl, figsize=(11, 4))
    acc_ax, loss_ax = fig.subplots(1, 2)
    for run in args.runs:
        splits = read_metrics(run)
        val, train = splits.get("validation", []), splits.get("train", [])
        acc_ax.plot([r["step"] for r in val], [100 * r["accuracy"] for r in val], label=run.name)
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], label=run.name)
    if args.baseline is not None:
        acc_ax.axhline(args.baseline, color="grey", ls=":", label=f"majority {args.baseline}%")
    for i, item in enumerate(args.published):
        label, value = item.rsplit("=", 1)
        acc_ax.axhline(float(value), ls="--", lw=0.8, color=f"C{len(args.runs) + i}",
                       label=f"{label} {value}%")
    acc_ax.set(xlabel="step", ylabel="validation accuracy (%)", title="ListOps, n = 2000")
    loss_ax.set(xlabel="step", ylabel="training loss (mean over the last 50 steps)")
    acc_ax.legend(fontsize=7)
    loss_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
