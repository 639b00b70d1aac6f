"""Tables of finished runs: accuracy laid out as the LRA papers do (methods x tasks), and cost.

Runs are grouped when their configs differ in the seed alone, so a row's mean ± standard
deviation is over seeds of one experiment and never mixes, say, two step counts; runs that
differ in anything else are separate rows, labelled by what differs. Every figure comes from
the runs' ``results.json``; a run that failed is listed with the reason from its
``failed.json`` (written by ``spectral-jax sweep``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any

from spectral_jax import UsageError
from spectral_jax.lra.data.registry import TASKS, TITLES
from spectral_jax.lra.train.table_labels import flatten, run_label

RESULTS_FILE = "results.json"
# Written by `spectral-jax sweep` into the folder of a run that failed.
FAILED_FILE = "failed.json"
# Per-run figures summarised per group (mean ± std over seeds).
_STATS = ("test_accuracy", "final_test_accuracy", "examples_per_s", "steps_per_s",
          "train_step_peak_bytes", "num_params", "wall_time_s")


def run_folders(sweep_dir: str) -> list[str]:
    """The folders in ``sweep_dir`` holding a finished or failed run, sorted by name.

    Example:
        >>> run_folders(".")
        []
    """
    return sorted(
        os.path.join(sweep_dir, name) for name in os.listdir(sweep_dir)
        if os.path.exists(os.path.join(sweep_dir, name, RESULTS_FILE))
        or os.path.exists(os.path.join(sweep_dir, name, FAILED_FILE)))


def load_results(paths: list[str]) -> list[dict[str, Any]]:
    """Reads each run directory's ``results.json`` (or its ``failed.json``).

    A path may also be a results file itself, or a sweep folder (a folder holding run
    folders, as ``spectral-jax sweep --workdir`` makes): that stands for its finished and
    failed runs (:func:`run_folders`). Other files (a sweep's ``table.md``, ``table.json`` or
    plot, which ``DIR/*`` also matches) are not runs and are left out.

    Returns:
        One dict per run with ``"run"`` (the path as given) added; a failed run's dict has
        ``"failed": True`` and its ``"reason"``.

    Raises:
        FileNotFoundError: a directory that is neither a run with either file (an unfinished
          run) nor a sweep folder, or a missing path.

    Example:
        >>> load_results([])
        []
    """
    results = []
    for run in paths:
        if os.path.isdir(run) and not _is_run(run) and run_folders(run):
            results += load_results(run_folders(run))
            continue
        if os.path.isdir(run):
            path = os.path.join(run, RESULTS_FILE)
            failed = os.path.join(run, FAILED_FILE)
            if not os.path.exists(path) and os.path.exists(failed):
                with open(failed) as f:
                    results.append({"run": run, **json.load(f), "failed": True})
                continue
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"run {run!r} has no {RESULTS_FILE} (not finished, or not a run directory), "
                    f"and holds no run folders with a {RESULTS_FILE} or {FAILED_FILE} (not a "
                    "sweep folder)"
                )
        elif os.path.isfile(run):
            path = run
        else:
            raise FileNotFoundError(f"run {run!r} has no results.json: no such file or directory")
        try:
            with open(path) as f:
                record = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict) or "test_accuracy" not in record:
            continue  # a file that is not a run's results
        results.append({"run": run, **record})
    return results


def _is_run(folder: str) -> bool:
    """A run's own folder: ``results.json``, ``failed.json`` or ``config.json`` in it."""
    return any(os.path.exists(os.path.join(folder, name))
               for name in (RESULTS_FILE, FAILED_FILE, "config.json"))


def group_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups finished runs whose configs differ in the seed alone; summarises each group.

    Runs without a recorded ``config`` group by (task, method, protocol). Groups are ordered by
    task (LRA order), then method (registry order), then label.

    Returns:
        One dict per group: ``task``, ``attention``, ``protocol``, ``label`` (``"method
        (protocol)"`` for a preset unchanged, else naming the changes, see
        :func:`spectral_jax.lra.train.table_labels.run_label`; plus the config fields that
        differ between groups where several share a label),
        ``seeds``, ``runs``, ``n`` and, for each of ``test_accuracy``, ``final_test_accuracy``,
        ``examples_per_s``, ``steps_per_s``, ``train_step_peak_bytes``, ``num_params``,
        ``wall_time_s``: ``{"mean", "std", "values"}`` (std: sample standard deviation over
        the seeds, 0 for one run; None when no run recorded the figure). A self-pretrained
        run's ``wall_time_s`` is both stages'; its rates are the fine-tune's.

    Example:
        >>> r = dict(task="listops", attention="nystrom", protocol="quick", test_accuracy=0.4)
        >>> g = group_runs([{**r, "run": "a", "seed": 0},
        ...                 {**r, "run": "b", "seed": 1, "test_accuracy": 0.5}])
        >>> [(x["label"], x["n"], round(x["test_accuracy"]["mean"], 2)) for x in g]
        [('nystrom (quick)', 2, 0.45)]
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.get("failed"):
            continue
        groups.setdefault(_group_key(r), []).append(r)
    summaries = []
    for runs in groups.values():
        runs = sorted(runs, key=lambda r: (r.get("seed", 0), r["run"]))
        first = runs[0]
        summary = {
            "task": first["task"], "attention": first["attention"],
            "protocol": first["protocol"], "label": run_label(first),
            "seeds": [r.get("seed") for r in runs], "runs": [r["run"] for r in runs],
            "n": len(runs), "config": first.get("config"),
        }
        for stat in _STATS:
            values = [v for v in (_figure(r, stat) for r in runs) if v is not None]
            summary[stat] = None if not values else {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "values": values,
            }
        summaries.append(summary)
    _disambiguate(summaries)
    for s in summaries:
        s.pop("config")
    return sorted(summaries, key=_order)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """Markdown tables: test accuracy (%) per method x task, cost per method, one row per run.

    The first table is LRA's layout (mean ± std over seeds, with the number of seeds when
    above one, and the average over the tasks present); the second gives per row the training
    rate, peak train-step memory and parameter count; the third lists every run; failed runs
    follow with their reason. Accuracy is that of the best-validation checkpoint. A
    self-pretrained run's steps read ``"2000 + 2000 pretraining"`` and its wall time is both
    stages'.

    Args:
        results: dicts from :func:`load_results`.

    Returns:
        The Markdown text.

    Raises:
        spectral_jax.UsageError: if ``results`` is empty.

    Example:
        >>> r = {"run": "a", "task": "listops", "attention": "softmax", "protocol": "quick",
        ...      "test_accuracy": 0.5, "final_test_accuracy": 0.5, "majority_baseline": 0.2,
        ...      "steps": 10, "wall_time_s": 3.0, "seed": 0}
        >>> print(markdown_table([r]).splitlines()[2])
        | softmax (quick) | 50.00 | 50.00 |
    """
    if not results:
        raise UsageError("results is empty: give at least one run directory")
    finished = [r for r in results if not r.get("failed")]
    failed = [r for r in results if r.get("failed")]
    groups = group_runs(finished)
    tasks = [t for t in TASKS if any(g["task"] == t for g in groups)]
    lines: list[str] = []
    if groups:
        rows = list(dict.fromkeys(g["label"] for g in groups))
        cells = {(g["label"], g["task"]): g for g in groups}
        lines += ["| Model | " + " | ".join(TITLES[t] for t in tasks) + " | Avg |",
                  "|---" * (len(tasks) + 2) + "|"]
        for row in rows:
            present = [cells.get((row, t)) for t in tasks]
            means = [100 * g["test_accuracy"]["mean"] for g in present if g]
            text = [_accuracy_cell(g) for g in present]
            lines.append(f"| {row} | " + " | ".join(text)
                         + f" | {sum(means) / len(means):.2f} |")
        lines += ["", "| Task | Model | Seeds | Test acc. (%) | Examples/s | Steps/s | "
                  "Peak memory, train step | Parameters | Wall time |", "|---" * 9 + "|"]
        for g in groups:
            lines.append(
                f"| {TITLES[g['task']]} | {g['label']} | {g['n']} | {_accuracy_cell(g)} | "
                f"{_mean_std(g['examples_per_s'], '.1f')} | {_mean(g['steps_per_s'], '.2f')} | "
                f"{_mib(g['train_step_peak_bytes'])} | {_mean(g['num_params'], ',.0f')} | "
                f"{_duration(g['wall_time_s']['mean']) if g['wall_time_s'] else '–'} |"
            )
        lines += ["", "| Run | Task | Method | Protocol | Seed | Test acc. (best val) | Test acc. "
                  "(final) | Majority baseline | Steps | Wall time |", "|---" * 10 + "|"]
        by_run = {r["run"]: r for r in finished}
        for r in (by_run[run] for g in groups for run in g["runs"]):
            lines.append(
                f"| {r['run']} | {TITLES[r['task']]} | {r['attention']} | {r['protocol']} | "
                f"{r.get('seed', '')} | {100 * r['test_accuracy']:.2f} | "
                f"{100 * r['final_test_accuracy']:.2f} | {100 * r['majority_baseline']:.2f} | "
                f"{_steps(r)} | {_duration(_figure(r, 'wall_time_s'))} |"
            )
    if failed:
        lines += ([""] if lines else []) + [
            "Failed runs:", "", "| Failed run | Method | Seed | Reason |", "|---" * 4 + "|"]
        for r in sorted(failed, key=lambda r: r["run"]):
            reason = " ".join(str(r.get("reason", "")).split()).replace("|", "\\|")
            lines.append(f"| {r['run']} | {r.get('attention', '?')} | {r.get('seed', '')} | "
                         f"{reason} |")
    return "\n".join(lines) + "\n"


def summary_json(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of :func:`markdown_table` as JSON: ``{"groups", "runs", "failed"}``.

    ``groups`` is :func:`group_runs`; ``runs`` has each finished run's own figures;
    ``failed`` each failed run's method, seed and reason.

    Example:
        >>> summary_json([])["groups"]
        []
    """
    keep = ("run", "task", "attention", "protocol", "seed", "steps", "best_step",
            "majority_baseline", "test_examples", *_STATS, "tokens_per_s")
    finished = [r for r in results if not r.get("failed")]
    return {
        "groups": group_runs(finished),
        "runs": sorted(({k: _figure(r, k) for k in keep} for r in finished),
                       key=lambda r: r["run"]),
        "failed": sorted(({k: v for k, v in r.items() if k != "failed"}
                          for r in results if r.get("failed")), key=lambda r: r["run"]),
    }


def _figure(r: dict[str, Any], key: str) -> Any:
    """``r[key]``; a run's ``wall_time_s`` includes its pretraining stage's."""
    value = r.get(key)
    pretrain = r.get("pretrain") or {}
    if key == "wall_time_s" and value is not None and pretrain.get("wall_time_s") is not None:
        return value + pretrain["wall_time_s"]
    return value


def _steps(r: dict[str, Any]) -> str:
    pretrain = (r.get("pretrain") or {}).get("steps")
    return f"{r['steps']} + {pretrain} pretraining" if pretrain else f"{r['steps']}"


def _group_key(r: dict[str, Any]) -> str:
    config = r.get("config")
    if not isinstance(config, dict):
        return json.dumps([r["task"], r["attention"], r["protocol"]])
    return json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True)


def _disambiguate(summaries: list[dict[str, Any]]) -> None:
    """Appends the config fields that differ to labels that several groups of a task share."""
    by_label: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in summaries:
        by_label.setdefault((s["task"], s["label"]), []).append(s)
    for clash in by_label.values():
        if len(clash) < 2:
            continue
        flat = [flatten({k: v for k, v in (s["config"] or {}).items() if k != "seed"})
                for s in clash]
        keys = sorted({k for f in flat for k in f if len({json.dumps(g.get(k)) for g in flat}) > 1})
        for s, f in zip(clash, flat):
            shown = ", ".join(f"{k}={f.get(k)!r}" for k in keys[:3])
            s["label"] += f" [{shown}{', …' if len(keys) > 3 else ''}]"


def _order(g: dict[str, Any]) -> tuple:
    from spectral_jax.attention import available_attentions

    methods = available_attentions()
    method = methods.index(g["attention"]) if g["attention"] in methods else len(methods)
    task = TASKS.index(g["task"]) if g["task"] in TASKS else len(TASKS)
    return task, method, g["label"]


def _accuracy_cell(g: dict[str, Any] | None) -> str:
    if not g:
        return "–"
    acc = g["test_accuracy"]
    if g["n"] == 1:
        return f"{100 * acc['mean']:.2f}"
    return f"{100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} (n={g['n']})"


def _mean_std(stat: dict[str, Any] | None, fmt: str) -> str:
    if not stat:
        return "–"
    if len(stat["values"]) == 1:
        return format(stat["mean"], fmt)
    return f"{format(stat['mean'], fmt)} ± {format(stat['std'], fmt)}"


def _mean(stat: dict[str, Any] | None, fmt: str) -> str:
    return "–" if not stat else format(stat["mean"], fmt)


def _mib(stat: dict[str, Any] | None) -> str:
    return "–" if not stat else f"{stat['mean'] / 2**20:.1f} MiB"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "–"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def write_outputs(text: str, summary: dict[str, Any], md: str | None, json_path: str | None,
                  png: str | None) -> list[str]:
    """Writes the Markdown, the JSON summary and the plot (each skipped when its path is None).

    Without matplotlib the plot is skipped with one line on stderr saying what to install
    (:func:`spectral_jax.lra.plotting.load_matplotlib`); the rest is written all the same.

    Returns:
        The paths written.

    Example:
        >>> write_outputs("x", {"groups": []}, None, None, None)
        []
    """
    written = []
    if md:
        with open(md, "w") as f:
            f.write(text)
        written.append(md)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(summary, f, indent=2)
        written.append(json_path)
    if png:
        from spectral_jax.lra.train.table_plot import plot_accuracy_vs_throughput

        if plot_accuracy_vs_throughput(summary["groups"], png) is not None:
            written.append(png)
    return written
