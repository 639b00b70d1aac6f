"""The README's results tables: one per task, each method against exact attention.

``spectral-jax table DIR --format readme`` prints, per task, the line ``<Task>, <what ran>:``
and a table with the columns ``method | seeds | test accuracy (%) | vs softmax | train
examples/s | train-step peak | parameters``, one row per group of
:func:`spectral_jax.lra.train.table.group_runs` (mean over seeds, ± the standard deviation with
two or more). "vs softmax" is the difference in points from the exact baseline's row of the
same task and the same label ending (the same preset, changed alike), bold when more than
``MARGIN`` points below it; rows without such a baseline row get "—". It is the difference
of the two mean accuracies in percent, to one decimal (a difference that rounds to zero
reads ``0.0``).
"""

from __future__ import annotations

from typing import Any

from spectral_jax import UsageError
from spectral_jax.lra.data.registry import TITLES

# Points below the baseline that the table marks in bold.
MARGIN = 2.0


def readme_tables(results: list[dict[str, Any]]) -> str:
    """The Markdown of the README's results tables for finished runs (failed ones are left out).

    Args:
        results: dicts from :func:`spectral_jax.lra.train.table.load_results`.

    Returns:
        For each task present (LRA order): its title and the label ending its rows share,
        a blank line and the table; tables are separated by a blank line.

    Raises:
        spectral_jax.UsageError: no finished run in ``results``.

    Example:
        >>> r = {"task": "listops", "protocol": "quick", "test_accuracy": 0.5,
        ...      "examples_per_s": 300.0, "train_step_peak_bytes": 2**26, "num_params": 1000}
        >>> text = readme_tables([{**r, "run": "a", "attention": "softmax"},
        ...                       {**r, "run": "b", "attention": "linear", "test_accuracy": 0.45}])
        >>> print(text)  # doctest: +NORMALIZE_WHITESPACE
        ListOps, quick:
        <BLANKLINE>
        | method | seeds | test accuracy (%) | vs softmax | train examples/s | train-step peak
          | parameters |
        | --- | ---: | ---: | ---: | ---: | ---: | ---: |
        | `softmax` | 1 | 50.00 | — | 300 | 64 MiB | 1,000 |
        | `linear` | 1 | 45.00 | **-5.0** | 300 | 64 MiB | 1,000 |
    """
    from spectral_jax.attention import BASELINE
    from spectral_jax.lra.train.table import group_runs

    groups = group_runs([r for r in results if not r.get("failed")])
    if not groups:
        raise UsageError("results has no finished run: give at least one run directory")
    blocks = []
    for task in dict.fromkeys(g["task"] for g in groups):
        rows = [g for g in groups if g["task"] == task]
        endings = [_ending(g) for g in rows]
        shared = endings[0] if len(set(endings)) == 1 else ""
        baselines = {_ending(g): g for g in rows if g["attention"] == BASELINE}
        lines = [f"{TITLES.get(task, task)}{', ' + shared if shared else ''}:", "",
                 f"| method | seeds | test accuracy (%) | vs {BASELINE} | train examples/s "
                 "| train-step peak | parameters |",
                 "| --- |" + " ---: |" * 6]
        for g, ending in zip(rows, endings):
            name = f"`{g['attention']}`" + ("" if shared else f" ({ending})")
            lines.append(
                f"| {name} | {g['n']} | {_accuracy(g)} | "
                f"{_versus(g, baselines.get(ending), BASELINE)} | "
                f"{_figure(g['examples_per_s'], 1, ',.0f')} | "
                f"{_figure(g['train_step_peak_bytes'], 2**20, '.0f', ' MiB')} | "
                f"{_figure(g['num_params'], 1, ',.0f')} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _ending(group: dict[str, Any]) -> str:
    """What the label says besides the method: ``"quick, steps=300"`` of ``"x (quick, ...)"``."""
    rest = group["label"][len(group["attention"]):].strip()
    return rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest


def _accuracy(group: dict[str, Any]) -> str:
    acc = group["test_accuracy"]
    text = f"{100 * acc['mean']:.2f}"
    return text + (f" ± {100 * acc['std']:.2f}" if len(acc["values"]) > 1 else "")


def _versus(group: dict[str, Any], baseline: dict[str, Any] | None, name: str) -> str:
    if group["attention"] == name or baseline is None:
        return "—"
    points = 100 * group["test_accuracy"]["mean"] - 100 * baseline["test_accuracy"]["mean"]
    text = f"{points:+.1f}"
    if text in ("+0.0", "-0.0"):
        return "0.0"
    return f"**{text}**" if points < -MARGIN else text


def _figure(stat: dict[str, Any] | None, unit: float, spec: str, suffix: str = "") -> str:
    return "—" if not stat else format(stat["mean"] / unit, spec) + suffix
