"""The quick-ListOps table of issue 32: test accuracy per method and variant, every seed.

    python benchmarks/lra_spt/table.py benchmarks/lra_spt/quick

Reads ``DIR/<variant>/<method>-seed<k>/results.json`` for the variants ``sweep.sh`` writes
(``scratch``, ``spt``, ``rope``, ``rope_spt``) and prints one Markdown row per method: the
mean test accuracy (%) at the best-validation checkpoint over the seeds found, each seed's
figure in brackets, and the masked-token validation accuracy the pretraining stage ended at.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

VARIANTS = {"scratch": "from scratch", "spt": "SPT", "rope": "RoPE", "rope_spt": "RoPE+SPT"}


def _runs(root: str) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = {}
    for variant in VARIANTS:
        for path in sorted(glob.glob(os.path.join(root, variant, "*-seed*", "results.json"))):
            with open(path) as f:
                result = json.load(f)
            found.setdefault((result["attention"], variant), []).append(result)
    return found


def main(root: str) -> None:
    runs = _runs(root)
    if not runs:
        raise SystemExit(f"table.py: no runs in {root!r}: expected {'/'.join(VARIANTS)} "
                         "folders of <method>-seed<k> runs with a results.json (sweep.sh's DIR)")
    methods = sorted({method for method, _ in runs}, key=lambda m: (m != "softmax", m))
    header = " | ".join(VARIANTS.values())
    print(f"| method | {header} | masked-token accuracy after SPT / RoPE+SPT |")
    print("| --- |" + " ---: |" * (len(VARIANTS) + 1))
    for method in methods:
        cells = []
        for variant in VARIANTS:
            results = sorted(runs.get((method, variant), []), key=lambda r: r["seed"])
            acc = [100 * r["test_accuracy"] for r in results]
            seeds = ", ".join(f"{a:.2f}" for a in acc)
            cells.append(f"{np.mean(acc):.2f} ({seeds})" if acc else "—")
        pretrained = []
        for variant in ("spt", "rope_spt"):
            values = [100 * r["pretrain"]["val_accuracy"]
                      for r in runs.get((method, variant), []) if r.get("pretrain")]
            pretrained.append(f"{np.mean(values):.1f}%" if values else "—")
        print(f"| `{method}` | {' | '.join(cells)} | {' / '.join(pretrained)} |")
    print("\nTest accuracy (%) at the best-validation checkpoint: mean over seeds (each seed). "
          "Masked-token accuracy: the pretraining stage's last validation, mean over seeds.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the folder sweep.sh wrote (or benchmarks/lra_spt/quick)")
    main(parser.parse_args().dir)
