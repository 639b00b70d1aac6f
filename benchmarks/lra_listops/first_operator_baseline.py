"""Reference accuracies for ListOps that read no more than one token of the expression.

- majority: always the most frequent training label.
- first operator: the most frequent training label given the expression's first token (its
  outermost operator, MAX/MIN/MED/SM), with the majority label for an unseen first token.

The second is what a model gets from the outermost operator alone: MAX expressions mostly
evaluate to 9 and MIN ones to 0. On LRA-generated data it is close to the published small-
protocol ListOps accuracies (about 37%), so a run at the majority baseline has not yet learned
to read position 0.

Usage:
    python benchmarks/lra_listops/first_operator_baseline.py DATA_DIR [--train-rows 50000]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np

from spectral_jax.lra.data.listops import SPLIT_FILES, read_tsv


def first_operator_rule(train_dir: Path, train_rows: int | None) -> tuple[dict[int, int], int]:
    """``({first token id: most frequent label}, majority label)`` from the training split."""
    ids, labels = read_tsv(train_dir / SPLIT_FILES["train"])
    ids, labels = ids[:train_rows], labels[:train_rows]
    by_first: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for seq, label in zip(ids, labels):
        by_first[int(seq[0])][int(label)] += 1
    majority = int(np.bincount(labels, minlength=10).argmax())
    return {tok: c.most_common(1)[0][0] for tok, c in by_first.items()}, majority


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--train-rows", type=int, default=None,
                        help="use only the first N training rows (default: all)")
    args = parser.parse_args()
    rule, majority = first_operator_rule(args.data_dir, args.train_rows)
    for split in ("validation", "test"):
        ids, labels = read_tsv(args.data_dir / SPLIT_FILES[split])
        first = np.array([rule.get(int(seq[0]), majority) for seq in ids])
        print(f"{split:<10} n={len(labels):<6} "
              f"training majority label {100 * np.mean(labels == majority):.2f}%  "
              f"first operator {100 * np.mean(first == labels):.2f}%")


if __name__ == "__main__":
    main()
