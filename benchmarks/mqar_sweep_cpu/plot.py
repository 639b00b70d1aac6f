"""Zoology's figure from the MQAR sweep: test accuracy against model width and state size.

Reads every finished run under ``DIR/w<width>/<method>/`` (its ``results.json`` and
``config.json``), and sizes each model's decoding state the way Zoology compares methods:
the float numbers one example's cache holds over all layers after ``CausalLM.init_cache``
at the task's length (softmax: every key and value; the recurrent and kernel methods: their
running sums and short-convolution buffers). Positions and flags are not counted. Writes
``OUT.png`` (two panels) and prints a markdown table.

Usage:
    python benchmarks/mqar_sweep_cpu/plot.py [DIR] [--out OUT]

``DIR`` defaults to this folder; ``OUT`` to ``DIR/sweep``.
"""

from __future__ import annotations

import argparse
import json
import os
import types
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax.lra.train import steps
from spectral_jax.lra.train import workdir as workdir_lib


def state_size(workdir: Path) -> int:
    """Float numbers in one example's decoding cache, all layers, at the task's length."""
    config = workdir_lib.read_config(str(workdir))
    options = config.data.options
    task = types.SimpleNamespace(vocab_size=options.vocab_size, num_classes=options.vocab_size,
                                 max_length=options.seq_len)
    model = steps.build_model(steps.model_config(config, task), False, 0, lm=True)
    model.init_cache((1, options.seq_len))
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Cache))
               if jnp.issubdtype(leaf.dtype, jnp.floating))


def runs(root: Path) -> list[dict]:
    """One row per finished run: method, width, test accuracy, state size."""
    rows = []
    for results in sorted(root.glob("w*/*/results.json")):
        result = json.loads(results.read_text())
        config = json.loads((results.parent / "config.json").read_text())
        rows.append({"method": result["attention"], "width": config["model"]["embed_dim"],
                     "accuracy": result["test_accuracy"],
                     "state": state_size(results.parent)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    root = Path(args.dir)
    rows = runs(root)
    if not rows:
        raise SystemExit(f"no finished run (w*/<method>/results.json) under {root}")
    print("| method | width | test accuracy | state (floats per example) |")
    print("|---|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["method"], r["width"])):
        print(f"| `{r['method']}` | {r['width']} | {100 * r['accuracy']:.1f}% | {r['state']:,} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_width, by_state) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for method in sorted({r["method"] for r in rows}):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["width"])
        widths, states = [r["width"] for r in mine], [r["state"] for r in mine]
        accuracy = [100 * r["accuracy"] for r in mine]
        line, = by_width.plot(widths, accuracy, marker="o", label=method)
        by_state.plot(states, accuracy, marker="o", color=line.get_color())
    by_width.set(xscale="log", xlabel="model width", ylabel="test accuracy (%)", ylim=(-2, 102))
    by_state.set(xscale="log", xlabel="decoding state (floats per example, all layers)")
    widths = sorted({r["width"] for r in rows} | {32, 64, 128})  # run.sh's widths
    by_width.set_xlim(widths[0] / 1.3, widths[-1] * 1.3)
    by_width.set_xticks(widths, [str(w) for w in widths])
    by_width.minorticks_off()
    by_width.legend(fontsize=8, ncol=2)
    fig.suptitle("MQAR on CPU: sequence length 64, 4 pairs, 2 layers, 3,000 steps of 64")
    fig.tight_layout()
    out = args.out or str(root / "sweep")
    fig.savefig(f"{out}.png", dpi=110)
    print(f"wrote {out}.png")


if __name__ == "__main__":
    main()
