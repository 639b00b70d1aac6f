"""Markdown tables of finished runs, laid out as the LRA papers do (methods x tasks)."""

from __future__ import annotations

import json
import os
from typing import Any

from spectral_jax.data.registry import TASKS, TITLES


def load_results(run_dirs: list[str]) -> list[dict[str, Any]]:
    """Reads ``results.json`` from each run directory (or a path to the file itself).

    Raises:
        FileNotFoundError: a directory without ``results.json`` (an unfinished run).

    Example:
        >>> load_results([])
        []
    """
    results = []
    for run in run_dirs:
        path = run if run.endswith(".json") else os.path.join(run, "results.json")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"run {run!r} has no results.json (not finished, or not a run directory)"
            )
        with open(path) as f:
            results.append({"run": run, **json.load(f)})
    return results


def markdown_table(results: list[dict[str, Any]]) -> str:
    """Two Markdown tables: test accuracy (%) per method x task with the average over the tasks
    present, and one row per run with protocol, baseline, steps and wall time.

    Accuracy is that of the best-validation checkpoint; several runs of one (method, task,
    protocol) cell (seeds) are averaged and their count shown.

    Args:
        results: dicts from :func:`load_results` (keys ``task``, ``attention``, ``protocol``,
          ``test_accuracy``, ``majority_baseline``, ``steps``, ``wall_time_s``).

    Returns:
        The Markdown text.

    Raises:
        ValueError: if ``results`` is empty.

    Example:
        >>> r = {"run": "a", "task": "listops", "attention": "softmax", "protocol": "quick",
        ...      "test_accuracy": 0.5, "final_test_accuracy": 0.5, "majority_baseline": 0.2,
        ...      "steps": 10, "wall_time_s": 3.0, "seed": 0}
        >>> print(markdown_table([r]).splitlines()[2])
        | softmax (quick) | 50.00 | 50.00 |
    """
    if not results:
        raise ValueError("results is empty: give at least one run directory")
    tasks = [t for t in TASKS if any(r["task"] == t for r in results)]
    cells: dict[tuple[str, str], list[float]] = {}
    for r in results:
        row = f"{r['attention']} ({r['protocol']})"
        cells.setdefault((row, r["task"]), []).append(100 * r["test_accuracy"])
    rows = list(dict.fromkeys(row for row, _ in cells))
    lines = ["| Model | " + " | ".join(TITLES[t] for t in tasks) + " | Avg |",
             "|---" * (len(tasks) + 2) + "|"]
    for row in rows:
        values = [cells.get((row, t)) for t in tasks]
        means = [sum(v) / len(v) for v in values if v]
        text = [_cell(v) for v in values]
        lines.append(f"| {row} | " + " | ".join(text) + f" | {sum(means) / len(means):.2f} |")
    lines += ["", "| Run | Task | Method | Protocol | Seed | Test acc. (best val) | Test acc. "
              "(final) | Majority baseline | Steps | Wall time |", "|---" * 10 + "|"]
    for r in results:
        lines.append(
            f"| {r['run']} | {TITLES[r['task']]} | {r['attention']} | {r['protocol']} | "
            f"{r.get('seed', '')} | {100 * r['test_accuracy']:.2f} | "
            f"{100 * r['final_test_accuracy']:.2f} | {100 * r['majority_baseline']:.2f} | "
            f"{r['steps']} | {_duration(r['wall_time_s'])} |"
        )
    return "\n".join(lines) + "\n"


def _cell(values: list[float] | None) -> str:
    if not values:
        return "–"
    mean = sum(values) / len(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} (n={len(values)})"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
