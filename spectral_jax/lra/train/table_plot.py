"""The sweep's picture: test accuracy against training throughput, one point per table row."""

from __future__ import annotations

import pathlib
from typing import Any

from spectral_jax.lra.data.registry import TITLES
from spectral_jax.lra.plotting import load_matplotlib, new_figure

_MARKERS = "osD^vP*Xh<>"


def plot_accuracy_vs_throughput(
    groups: list[dict[str, Any]], path: str | pathlib.Path, title: str = ""
) -> pathlib.Path | None:
    """Test accuracy (%) against training examples/s (log scale), mean ± std over seeds.

    One point per group of :func:`spectral_jax.lra.train.table.group_runs` with both figures,
    labelled by its row label; error bars are the standard deviation over seeds on both axes.
    Several tasks get one marker each. Groups without a recorded rate are left out.

    Args:
        groups: from :func:`spectral_jax.lra.train.table.group_runs`.
        path: the PNG to write (parent folders are created).
        title: the figure title; by default it names the task(s), the methods (all of the
          registry's, up to five by name, else their number) and the label ending the points
          share, e.g. ``"ListOps, 3 methods: softmax, nystrom, spectral_shift (quick,
          steps=300)"``.

    Returns:
        The path written, or None when matplotlib is missing (the plot is skipped with one
        line on stderr, see :func:`spectral_jax.lra.plotting.load_matplotlib`).

    Example:
        >>> import tempfile, os
        >>> g = {"task": "listops", "attention": "softmax", "label": "softmax (quick)", "n": 1,
        ...      "test_accuracy": {"mean": 0.4, "std": 0.0},
        ...      "examples_per_s": {"mean": 300.0, "std": 0.0}}
        >>> p = plot_accuracy_vs_throughput([g], os.path.join(tempfile.mkdtemp(), "a.png"))
        >>> p.exists()
        True
    """
    path = pathlib.Path(path)
    mpl = load_matplotlib(f"the plot {path}")
    if mpl is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    points = [g for g in groups if g.get("examples_per_s") and g.get("test_accuracy")]
    tasks = list(dict.fromkeys(g["task"] for g in points))
    fig = new_figure(mpl, figsize=(7.5, 5))
    ax = fig.subplots()
    # A suffix shared by every label (e.g. " (quick)") goes to the title, not to each point.
    labels = [g["label"] for g in points]
    suffix = _shared_suffix(labels)
    labelled = []
    for g, label in zip(points, labels):
        marker = _MARKERS[tasks.index(g["task"]) % len(_MARKERS)]
        x, y = g["examples_per_s"], g["test_accuracy"]
        ax.errorbar(x["mean"], 100 * y["mean"], xerr=x["std"] or None,
                    yerr=100 * y["std"] or None, fmt=marker, capsize=3,
                    label=f"{g['task']}" if len(tasks) > 1 else None)
        text = label[: len(label) - len(suffix)] + (f" (n={g['n']})" if g["n"] > 1 else "")
        labelled.append((x["mean"], 100 * y["mean"], text))
    if points:
        ax.set_xscale("log")
        plain = mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.margins(x=0.15, y=0.1)  # room for the labels right of the points
        _annotate_without_overlap(ax, labelled)
    if len(tasks) > 1:
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), title="task")
    ax.set_xlabel("training throughput (examples/s, median over logged windows)")
    ax.set_ylabel("test accuracy (%), best-validation checkpoint")
    ax.set_title(title or default_title(points, suffix), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def default_title(groups: list[dict[str, Any]], suffix: str = "") -> str:
    """What the plot shows: its task(s), its methods, and the label ending they share.

    Example:
        >>> default_title([{"task": "listops", "attention": "softmax"},
        ...                {"task": "listops", "attention": "nystrom"}], " (quick, steps=300)")
        'ListOps, 2 methods: softmax, nystrom (quick, steps=300)'
    """
    from spectral_jax.attention import available_attentions

    tasks = ", ".join(TITLES.get(t, t) for t in dict.fromkeys(g["task"] for g in groups))
    methods = list(dict.fromkeys(g["attention"] for g in groups))
    if set(methods) == set(available_attentions()):
        named = f"all {len(methods)} methods"
    elif len(methods) <= 5:
        named = f"{len(methods)} method{'s' * (len(methods) != 1)}: {', '.join(methods)}"
    else:
        named = f"{len(methods)} methods"
    return f"{tasks or 'no runs'}, {named}{suffix}"


def _shared_suffix(labels: list[str]) -> str:
    """The ``" (...)"`` ending every label shares, or ``""`` (one label keeps its own)."""
    if len(labels) < 2:
        return ""
    ends = {lab[lab.rfind(" ("):] if lab.endswith(")") and " (" in lab else "" for lab in labels}
    return ends.pop() if len(ends) == 1 else ""


def _annotate_without_overlap(ax, labelled: list[tuple[float, float, str]]) -> None:
    """Labels right of their points, each moved down in 9-point steps past earlier ones.

    Points are taken top to bottom; a label whose box (in display pixels, from its length
    at 8 pt) would overlap one already placed moves down until it does not.
    """
    fig = ax.figure
    fig.canvas.draw()  # fixes the limits, so data -> pixel positions are final
    per_pt = fig.dpi / 72
    placed: list[tuple[float, float, float, float]] = []
    for x, y, text in sorted(labelled, key=lambda p: -p[1]):
        px, py = ax.transData.transform((x, y))
        width, height = 4.6 * len(text) * per_pt, 9 * per_pt
        dy = 4.0
        for _ in range(12):
            box = (px + 5 * per_pt, py + dy * per_pt, width, height)
            if not any(_overlap(box, other) for other in placed):
                break
            dy -= 9.0
        placed.append(box)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, dy), fontsize=8,
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "alpha": 0.5} if dy < -5 else None)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
