"""What an MQAR model answers: the right value, another pair's value, or something else.

Restores a run's checkpoint and scores its answers on the test split (Zoology's metric: the
K query positions only). Then, for each query, whether the answer is the value of one of the
example's K pairs at all, and if so of which pair. A model that has bound keys to values is
right; one that has learned only which tokens are values answers some pair's value but picks
the pair at chance: among its answers that are values, the right one 1/K of the time, and the
asked × answered table flat. Accuracy is also split by the queried pair's index, by the
order of the queries, and by the distance from the pair to its query.

Usage:
    python benchmarks/mqar_sweep_cpu/answers.py WORKDIR [--checkpoint best]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from flax import nnx

from spectral_jax.lra.train import run as run_lib


def _shares(values: np.ndarray, k: int) -> str:
    return " / ".join(f"{100 * float(np.mean(values == i)):.1f}%" for i in range(k))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--checkpoint", default="best")
    args = parser.parse_args()
    run, state, step = run_lib.restore_for_evaluation(args.workdir, args.checkpoint)
    k = int(run.config.data.options.num_kv_pairs)
    split = run.task.splits["test"]
    inputs, targets = np.asarray(split.inputs), np.asarray(split.targets)
    size = run.eval_batch_size
    with jax.set_mesh(run.mesh):
        model, _ = nnx.merge(run.setup.graphdef, run.setup.rng_state, state)
        forward = nnx.jit(lambda m, x: m(x, deterministic=True).argmax(-1))
        out = []
        for start in range(0, len(inputs), size):
            x = inputs[start:start + size]
            pad = size - len(x)  # whole batches only, so one compiled shape
            x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
            out.append(np.asarray(forward(model, x))[:size - pad])
    predicted = np.concatenate(out)
    keys, values = inputs[:, 0:2 * k:2], inputs[:, 1:2 * k:2]
    rows, cols = np.nonzero(targets >= 0)
    answer = predicted[rows, cols]
    right = answer == targets[rows, cols]
    asked = np.argmax(keys[rows] == inputs[rows, cols][:, None], axis=1)  # the queried pair
    is_value = values[rows] == answer[:, None]
    answered = np.where(is_value.any(1), np.argmax(is_value, axis=1), -1)
    order = np.concatenate([np.arange(n) for n in (targets >= 0).sum(1)])
    distance = cols - (2 * asked + 1)

    print(f"{args.workdir}, step {step}: test accuracy {100 * right.mean():.2f}% on "
          f"{right.size} queries (K = {k})")
    print(f"- answers that are one of the example's {k} values: "
          f"{100 * (answered >= 0).mean():.1f}%; of the wrong answers: "
          f"{100 * (answered[~right] >= 0).mean():.1f}%")
    valued = answered >= 0
    print(f"- of the answers that are a value, the right one: {100 * right[valued].mean():.1f}% "
          f"of {valued.sum()} (chance {100 / k:.1f}%)")
    print(f"- share of answers that are pair 1 / ... / {k}'s value: {_shares(answered, k)}")
    print("- queries by asked pair (rows) and answered pair (columns; last: not a value):")
    for i in range(k):
        counts = [int(np.sum((asked == i) & (answered == j))) for j in [*range(k), -1]]
        print("    " + " ".join(f"{c:5d}" for c in counts))
    acc = lambda sel: f"{100 * right[sel].mean():.1f}%" if sel.any() else "-"  # noqa: E731
    print("- accuracy by queried pair (1 = written first): "
          + " / ".join(acc(asked == i) for i in range(k)))
    print("- accuracy by query order (1 = asked first): "
          + " / ".join(acc(order == i) for i in range(k)))
    bands = [(0, 8), (8, 16), (16, 32), (32, inputs.shape[1])]
    print("- accuracy by distance from pair to query: " + ", ".join(
        f"{lo}-{hi - 1}: {acc((distance >= lo) & (distance < hi))}" for lo, hi in bands))


if __name__ == "__main__":
    main()
