"""How deep into a ListOps expression a reader must evaluate to reach a given accuracy.

The depth-D reader evaluates the top D levels of operators exactly and replaces every
operator node below them by a guess: the value most frequent, in the training split, among
the nodes with that operator. Depth 0 guesses the root from its operator alone, which is
``first_operator_baseline.py``'s rule up to the statistics it uses (all nodes of an
operator here, roots only there); depth 1 applies the root operator to its digits and to
guesses for its operator children; a depth past the deepest operator is exact, 100%. A
model at about 38% on LRA-length ListOps reads no deeper than the root; the table says how
much deeper a model must evaluate before it passes 50%.

Usage:
    python benchmarks/lra_listops/depth_baseline.py DATA_DIR [--train-rows 10000] \
        [--depths 0 1 2 3 4 5 6]
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

import numpy as np

from spectral_jax.lra.data.listops import SPLIT_FILES, tokenize
from spectral_jax.lra.data.listops_generator import OPERATORS, _apply

END = "]"


def parse(tokens: list[str], i: int = 0) -> tuple[object, int]:
    """``(tree, next index)``: a digit as an int, an operator node as ``(op, [children])``."""
    token = tokens[i]
    if token not in OPERATORS:
        return int(token), i + 1
    children, i = [], i + 1
    while tokens[i] != END:
        child, i = parse(tokens, i)
        children.append(child)
    return (token, children), i + 1


def value(tree: object) -> int:
    if isinstance(tree, int):
        return tree
    op, children = tree
    return _apply(op, [value(c) for c in children])


def node_values(tree: object, counts: dict) -> int:
    """The tree's value; counts every operator node's value under its operator."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    v = _apply(op, [node_values(c, counts) for c in children])
    counts[op][v] += 1
    return v


def read_to_depth(tree: object, depth: int, guess: dict[str, int]) -> int:
    """The value with the top ``depth`` levels of operators evaluated, guesses below."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    if depth <= 0:
        return guess[op]
    return _apply(op, [read_to_depth(c, depth - 1, guess) for c in children])


def operator_guesses(trees: list) -> dict[str, int]:
    """Per operator, the value most frequent among its nodes in ``trees``; an operator with
    no node there gets the most frequent value of all nodes."""
    counts: dict = collections.defaultdict(collections.Counter)
    for tree in trees:
        node_values(tree, counts)
    overall = sum(counts.values(), collections.Counter()).most_common(1)[0][0]
    return {op: counts[op].most_common(1)[0][0] if counts[op] else overall
            for op in OPERATORS}


def read_split(path: Path, rows: int | None) -> tuple[list[object], np.ndarray]:
    trees, labels = [], []
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f, delimiter="\t")):
            if rows is not None and n >= rows:
                break
            trees.append(parse(tokenize(row["Source"]))[0])
            labels.append(int(row["Target"]))
    return trees, np.array(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--train-rows", type=int, default=10000)
    parser.add_argument("--depths", type=int, nargs="+", default=list(range(7)))
    args = parser.parse_args()
    train, _ = read_split(args.data_dir / SPLIT_FILES["train"], args.train_rows)
    guess = operator_guesses(train)
    print(f"guess per operator (from {len(train)} training rows): {guess}")
    for split in ("validation", "test"):
        trees, labels = read_split(args.data_dir / SPLIT_FILES[split], None)
        assert all(value(t) == y for t, y in zip(trees, labels)), "labels disagree"
        cells = []
        for d in args.depths:
            right = [read_to_depth(t, d, guess) == y for t, y in zip(trees, labels)]
            cells.append(f"depth {d}: {100 * np.mean(right):.2f}%")
        print(f"{split:<10} n={len(labels):<5} " + "  ".join(cells))


if __name__ == "__main__":
    main()
