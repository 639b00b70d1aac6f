"""The sweep's picture: test accuracy against training throughput, one point per table row."""

from __future__ import annotations

import pathlib
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: sweeps run headless.

import matplotlib.pyplot as plt  # noqa: E402

_MARKERS = "osD^vP*Xh<>"


def plot_accuracy_vs_throughput(
    groups: list[dict[str, Any]], path: str | pathlib.Path, title: str = ""
) -> pathlib.Path:
    """Test accuracy (%) against training examples/s (log scale), mean ± std over seeds.

    One point per group of :func:`spectral_jax.train.table.group_runs` with both figures,
    labelled by its row label; error bars are the standard deviation over seeds on both axes.
    Several tasks get one marker each. Groups without a recorded rate are left out.

    Args:
        groups: from :func:`spectral_jax.train.table.group_runs`.
        path: the PNG to write (parent folders are created).
        title: the figure title.

    Returns:
        The path written.

    Example:
        >>> import tempfile, os
        >>> g = {"task": "listops", "label": "softmax (quick)", "n": 1,
        ...      "test_accuracy": {"mean": 0.4, "std": 0.0},
        ...      "examples_per_s": {"mean": 300.0, "std": 0.0}}
        >>> p = plot_accuracy_vs_throughput([g], os.path.join(tempfile.mkdtemp(), "a.png"))
        >>> p.exists()
        True
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    points = [g for g in groups if g.get("examples_per_s") and g.get("test_accuracy")]
    tasks = list(dict.fromkeys(g["task"] for g in points))
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for g in points:
        marker = _MARKERS[tasks.index(g["task"]) % len(_MARKERS)]
        x, y = g["examples_per_s"], g["test_accuracy"]
        ax.errorbar(x["mean"], 100 * y["mean"], xerr=x["std"] or None,
                    yerr=100 * y["std"] or None, fmt=marker, capsize=3,
                    label=f"{g['task']}" if len(tasks) > 1 else None)
        ax.annotate(f"{g['label']}" + (f" (n={g['n']})" if g["n"] > 1 else ""),
                    (x["mean"], 100 * y["mean"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    if points:
        ax.set_xscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.margins(x=0.15, y=0.1)  # room for the labels right of the points
    if len(tasks) > 1:
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), title="task")
    ax.set_xlabel("training throughput (examples/s, median over logged windows)")
    ax.set_ylabel("test accuracy (%), best-validation checkpoint")
    ax.set_title(title or "test accuracy vs training throughput (mean ± std over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
