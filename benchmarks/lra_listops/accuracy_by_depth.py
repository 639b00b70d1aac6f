"""A trained ListOps classifier's accuracy by how deep an expression must be read.

Each test expression is put in the bucket of the fewest operator levels D that
``depth_baseline.py``'s reader must evaluate to get its label right (D = 0: the root
operator's most frequent value is right; D = 1: the root applied to its digits and to
guesses for its nested operators; ...). A model that reads only the root operator is right
on bucket 0 and near chance elsewhere; one that finds the root's direct arguments is also
right on bucket 1.

``--by-length`` adds a table of buckets 0-3 split by the expression's length in tokens
(bands of equal count), to tell a model that fails on deep expressions from one that fails
on long ones.

Usage:
    python benchmarks/lra_listops/accuracy_by_depth.py WORKDIR [--checkpoint best] \
        [--split test] [--train-rows 10000] [--by-length 3]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from spectral_jax.lra.data.listops import SPLIT_FILES
from spectral_jax.lra.train import run as run_lib

_spec = importlib.util.spec_from_file_location(
    "depth_baseline", Path(__file__).with_name("depth_baseline.py"))
depth_baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(depth_baseline)


def predictions(workdir: str, checkpoint: str,
                split: str) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """``(predicted labels, true labels, step, valid lengths)`` of the run's checkpoint on
    ``split``."""
    run, state, step = run_lib.restore_for_evaluation(workdir, checkpoint)
    data = run.task.splits[split]
    with jax.set_mesh(run.mesh):
        model, _ = nnx.merge(run.setup.graphdef, run.setup.rng_state, state)
        forward = nnx.jit(lambda m, x, mask: m(x, mask, deterministic=True).argmax(-1))
        size = run.eval_batch_size
        out = []
        for start in range(0, len(data.labels), size):
            x, mask = data.inputs[start:start + size], data.mask[start:start + size]
            pad = size - len(x)  # whole batches only, so one compiled shape
            x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
            mask = np.concatenate([mask, np.zeros((pad, *mask.shape[1:]), mask.dtype)])
            out.append(np.asarray(forward(model, x, mask))[:size - pad])
    return (np.concatenate(out), np.asarray(data.labels), step,
            np.asarray(data.mask).sum(-1))


def fewest_levels(trees: list, labels: np.ndarray, guess: dict, deepest: int = 12) -> np.ndarray:
    """Per example, the fewest operator levels the depth reader needs to be right."""
    need = np.full(len(labels), deepest)
    for i, (tree, label) in enumerate(zip(trees, labels)):
        for d in range(deepest):
            if depth_baseline.read_to_depth(tree, d, guess) == label:
                need[i] = d
                break
    return need


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--split", default="test", choices=("validation", "test"))
    parser.add_argument("--train-rows", type=int, default=10000)
    parser.add_argument("--by-length", type=int, default=0, metavar="BANDS",
                        help="also split buckets 0-3 into this many length bands")
    args = parser.parse_args()
    predicted, labels, step, lengths = predictions(args.workdir, args.checkpoint, args.split)
    data_dir = Path(run_lib.workdir_lib.read_config(args.workdir).data.dir)
    train, _ = depth_baseline.read_split(data_dir / SPLIT_FILES["train"], args.train_rows)
    guess = depth_baseline.operator_guesses(train)
    trees, file_labels = depth_baseline.read_split(data_dir / SPLIT_FILES[args.split], None)
    if len(trees) != len(labels) or not np.array_equal(file_labels, labels):
        raise SystemExit(f"{args.split}: the run's split and {data_dir} disagree")
    need = fewest_levels(trees, labels, guess)
    right = predicted == labels
    print(f"{args.workdir}, step {step}, {args.split}: accuracy {100 * right.mean():.2f}% "
          f"on {len(labels)}")
    print("| levels the reader needs | examples | model accuracy |")
    print("|---|---:|---:|")
    for d in range(need.max() + 1):
        sel = need == d
        if sel.any():
            print(f"| {d} | {sel.sum()} | {100 * right[sel].mean():.1f}% |")
    if args.by_length:
        _by_length(right, need, lengths, args.by_length)


def _by_length(right: np.ndarray, need: np.ndarray, lengths: np.ndarray, bands: int) -> None:
    """Accuracy per (bucket 0-3, length band); bands of equal count over the split."""
    edges = np.quantile(lengths, np.linspace(0, 1, bands + 1)).astype(int)
    band = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, bands - 1)
    names = [f"{edges[b]}-{edges[b + 1]} tokens" for b in range(bands)]
    print()
    print("| levels the reader needs | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * bands)
    for d in range(4):
        cells = []
        for b in range(bands):
            sel = (need == d) & (band == b)
            cells.append(f"{100 * right[sel].mean():.1f}% ({sel.sum()})" if sel.any() else "-")
        print(f"| {d} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
