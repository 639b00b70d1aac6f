"""Tables (rich), plots (matplotlib, optional: see :mod:`spectral_jax.lra.plotting`) and JSON
files for the benchmark results."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from spectral_jax import UsageError
from spectral_jax.attention import BASELINE
from spectral_jax.lra.plotting import (
    load_matplotlib,
    log_length_axes,
    new_figure,
    save_figure,
    side_by_side,
)

# 1000 faults is 4 MiB of fresh 4 KiB pages per call, several ms of kernel time on CPU.
FAULT_NOTE_THRESHOLD = 1000

_MODE_LABEL = {"fwd": "forward", "fwd_bwd": "forward+backward"}
# Line styles per method: methods whose curves coincide (Nyström and spectral shifting on
# diffuse inputs) stay apart by marker, fill and dash pattern, not by colour alone.
_MARKERS = "osD^vP*Xh<>"
_LINESTYLES = ("-", "--", "-.", ":")


def _fmt(value: float | None, spec: str, missing: str = "—") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def write_json(path: str | pathlib.Path, payload: dict[str, Any]) -> pathlib.Path:
    """Writes ``payload`` as indented JSON (NaN becomes null), creating parent folders.

    Args:
      path: destination file.
      payload: JSON-serialisable dict; float NaN values are written as ``null``.

    Returns:
      The path written.

    Example:
      >>> import tempfile, json, pathlib
      >>> from spectral_jax.lra.bench.report import write_json
      >>> p = write_json(pathlib.Path(tempfile.mkdtemp()) / "a.json", {"x": float("nan")})
      >>> json.loads(p.read_text())
      {'x': None}
    """
    def clean(obj: Any) -> Any:
        if isinstance(obj, float) and math.isnan(obj):
            return None
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(payload), indent=2) + "\n")
    return path


def speed_table(records: Sequence[dict[str, Any]], title: str = "bench speed") -> Table:
    """A rich table of :func:`speed.add_ratios` records, one row per (length, method).

    Columns: forward and forward+backward median times (ms), forward+backward peak memory
    (MiB), forward+backward time and memory as a ratio to exact attention at the same
    length, and the forward+backward growth factor per doubling of length; with
    ``cost_analysis``, XLA's forward+backward operation count (GFLOP, see
    :func:`speed.slice_cost`).

    Example:
      >>> from spectral_jax.lra.bench.report import speed_table
      >>> speed_table([]).row_count
      0
    """
    table = Table(title=title)
    for column in ("n", "method", "fwd ms", "fwd+bwd ms", "peak MiB", "time/exact",
                   "mem/exact", "growth/2×n"):
        table.add_column(column, justify="left" if column == "method" else "right")
    costs = any(r.get("gflop") is not None for r in records)
    if costs:
        table.add_column("GFLOP", justify="right")
    rows: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        rows.setdefault((r["length"], r["method"]), {})[r["mode"]] = r
    for (n, method), modes in rows.items():
        fwd, both = modes.get("fwd", {}), modes.get("fwd_bwd", {})
        main = both or fwd
        time_ms = lambda r: None if r.get("time_s") is None else 1e3 * r["time_s"]  # noqa: E731
        skipped = main.get("skipped")
        peak = main.get("peak_bytes")
        table.add_row(
            str(n), method,
            _fmt(time_ms(fwd), ".2f", "skipped" if fwd.get("skipped") else "—"),
            _fmt(time_ms(both), ".2f", "skipped" if both.get("skipped") else "—"),
            _fmt(None if peak is None else peak / 2**20, ".1f"),
            _fmt(main.get("time_ratio"), ".3f"),
            _fmt(main.get("memory_ratio"), ".3f"),
            _fmt(main.get("growth_per_doubling"), ".2f") if not skipped else "—",
            *((_fmt(main.get("gflop"), ".3g"),) if costs else ()),
        )
    return table


def speed_notes(records: Sequence[dict[str, Any]]) -> list[str]:
    """Lines to print under the table: each skipped configuration and why, then page faults.

    The fault line appears when some timed call took ``FAULT_NOTE_THRESHOLD`` or more minor
    page faults: its time then includes the kernel zero-filling memory that the allocator
    handed back after the previous call. The line says so and how to time without it, with
    nothing else to read: XLA:CPU frees each call's scratch buffer, glibc's malloc returns
    large blocks to the kernel, and the next call faults them in again; a caching allocator
    preloaded with ``LD_PRELOAD`` (jemalloc, tcmalloc) keeps them.

    Example:
      >>> from spectral_jax.lra.bench.report import speed_notes
      >>> speed_notes([{"method": "softmax", "mode": "fwd", "length": 8, "skipped": "too big"}])
      ['skipped softmax fwd at n=8: too big']
    """
    notes = [f"skipped {r['method']} {r['mode']} at n={r['length']}: {r['skipped']}"
             for r in records if r.get("skipped")]
    faulty = [r for r in records
              if (r.get("minor_faults_per_call") or 0) >= FAULT_NOTE_THRESHOLD]
    if faulty:
        worst = max(faulty, key=lambda r: r["minor_faults_per_call"])
        notes.append(
            f"{len(faulty)} timed configuration{'s' * (len(faulty) > 1)} took >= "
            f"{FAULT_NOTE_THRESHOLD} page faults per call (most: {worst['method']} "
            f"{worst['mode']} at n={worst['length']}, "
            f"{worst['minor_faults_per_call']:,.0f}): their times include the kernel "
            "zero-filling scratch buffers that the allocator (glibc malloc) returned to the OS "
            "after the previous call, so they grow faster than the work; to time without it, "
            "preload a caching allocator, e.g. LD_PRELOAD=libjemalloc.so.2 or "
            "LD_PRELOAD=libtcmalloc.so.4 (Debian/Ubuntu packages libjemalloc2, "
            "libgoogle-perftools4)")
    return notes


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A distinct colour, marker, fill and dash pattern per method, in the order given.

    Exact attention (``BASELINE``) gets a thicker line. Every second method has hollow
    markers, so two methods whose points coincide both stay visible.

    Example:
      >>> s = method_styles(["nystrom", "spectral_shift"])
      >>> [(v["marker"], v["linestyle"], v["markerfacecolor"]) for v in s.values()]
      [('o', '-', 'C0'), ('s', '--', 'none')]
    """
    styles = {}
    for i, method in enumerate(dict.fromkeys(methods)):
        color = f"C{i % 10}"
        styles[method] = {
            "color": color, "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[i % len(_LINESTYLES)],
            "markerfacecolor": color if i % 2 == 0 else "none",
            "linewidth": 2.5 if method == BASELINE else 1.5,
        }
    return styles


def plot_speed(records: Sequence[dict[str, Any]], path: str | pathlib.Path,
               title: str = "") -> pathlib.Path:
    """Log-log plots of time and peak memory against length, one line per method.

    Left: forward+backward (or forward) median time in seconds; right: compiled peak memory
    in MiB. Skipped configurations are absent from the lines.

    Args:
      records: :func:`speed.run_speed` records.
      path: PNG destination.
      title: figure title.

    Returns:
      The path written, or None when matplotlib is missing (skipped with one line on stderr).

    Example:
      >>> import tempfile, pathlib
      >>> from spectral_jax.lra.bench.report import plot_speed
      >>> recs = [dict(method="softmax", length=n, mode="fwd", time_s=n * 1e-6,
      ...              peak_bytes=n * 4) for n in (8, 16)]
      >>> plot_speed(recs, pathlib.Path(tempfile.mkdtemp()) / "s.png").exists()
      True
    """
    path = pathlib.Path(path)
    panels = side_by_side(path)
    if panels is None:
        return None
    modes = {r["mode"] for r in records}
    mode = "fwd_bwd" if "fwd_bwd" in modes else "fwd"
    fig, ax_t, ax_m = panels
    styles = method_styles([r["method"] for r in records])
    for method, style in styles.items():
        pts = sorted(((r["length"], r) for r in records
                      if r["method"] == method and r["mode"] == mode), key=lambda p: p[0])
        timed = [(n, r["time_s"]) for n, r in pts if r.get("time_s")]
        sized = [(n, r["peak_bytes"] / 2**20) for n, r in pts
                 if r.get("peak_bytes") is not None and not r.get("skipped")]
        if timed:
            ax_t.plot(*zip(*timed), label=method, **style)
        if sized:
            ax_m.plot(*zip(*sized), label=method, **style)
    log_length_axes([(ax_t, f"{_MODE_LABEL[mode]} time (s)"), (ax_m, "peak memory (MiB)")])
    if ax_t.get_legend_handles_labels()[0]:
        ax_t.legend(fontsize=8)
    else:  # compiled only: memory is all there is
        ax_t.set_axis_off()
        ax_t.text(0.5, 0.5, "not timed (compile only)", ha="center", va="center",
                  transform=ax_t.transAxes)
        if ax_m.get_legend_handles_labels()[0]:
            ax_m.legend(fontsize=8)
    return save_figure(fig, path, title)


def error_table(rows: Sequence[dict[str, Any]], title: str = "bench error") -> Table:
    """A rich table of :func:`error.summarize` rows: mean ± std over seeds of each metric.

    A row of one seed has no spread, so its cells give the value alone.

    Example:
      >>> from spectral_jax.lra.bench.report import error_table
      >>> error_table([]).row_count
      0
    """
    table = Table(title=title)
    for column in ("regime", "method", "budget", "seeds", "output err", "frobenius err",
                   "spectral err"):
        table.add_column(column, justify="left" if column in ("regime", "method") else "right")
    for r in rows:
        cells = [_mean_spread(r[f"{m}_mean"], r[f"{m}_std"], r["seeds"])
                 for m in ("output", "frobenius", "spectral")]
        table.add_row(r["regime"], r["method"], _fmt(r["budget"], "d"), str(r["seeds"]), *cells)
    return table


def _mean_spread(mean: float, std: float, seeds: int) -> str:
    if math.isnan(mean):
        return "—"
    return _fmt(mean, ".4f") + (f" ± {_fmt(std, '.4f')}" if seeds > 1 else "")


def plot_error(rows: Sequence[dict[str, Any]], path: str | pathlib.Path,
               metric: str = "output", title: str = "") -> pathlib.Path:
    """Error against budget (log-log), one panel per regime, error bars = std over seeds.

    Methods without a budget are drawn as horizontal lines across the budgets. Each method
    keeps one style (:func:`method_styles`) in every panel. Error bars appear only for rows
    of more than one seed.

    Args:
      rows: :func:`error.summarize` rows.
      path: PNG destination.
      metric: ``"output"``, ``"frobenius"`` or ``"spectral"``.
      title: figure title.

    Returns:
      The path written, or None when matplotlib is missing (skipped with one line on stderr).

    Raises:
      spectral_jax.UsageError: unknown ``metric``.

    Example:
      >>> import tempfile, pathlib
      >>> from spectral_jax.lra.bench.report import plot_error
      >>> rows = [dict(regime="diffuse", method="nystrom", budget=b, output_mean=1 / b,
      ...              output_std=0.0) for b in (8, 16)]
      >>> plot_error(rows, pathlib.Path(tempfile.mkdtemp()) / "e.png").exists()
      True
    """
    if metric not in ("output", "frobenius", "spectral"):
        raise UsageError(f"`metric` must be output, frobenius or spectral; got {metric!r}.")
    path = pathlib.Path(path)
    mpl = load_matplotlib(f"the plot {path}")
    if mpl is None:
        return None
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    styles = method_styles([r["method"] for r in rows])
    fig = new_figure(mpl, figsize=(4.6 * max(len(regimes), 1), 4))
    axes = fig.subplots(1, max(len(regimes), 1), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        sub = [r for r in rows if r["regime"] == regime]
        budgets = sorted({r["budget"] for r in sub if r["budget"] is not None})
        for method in dict.fromkeys(r["method"] for r in sub):
            pts = [r for r in sub if r["method"] == method
                   and not math.isnan(r[f"{metric}_mean"])]
            if not pts:
                continue
            style = styles[method]
            if pts[0]["budget"] is None:
                if budgets:
                    ax.hlines(pts[0][f"{metric}_mean"], budgets[0], budgets[-1],
                              linestyles=style["linestyle"], colors=style["color"],
                              linewidth=style["linewidth"], label=method)
                continue
            pts.sort(key=lambda r: r["budget"])
            spread = any(r.get("seeds", 1) > 1 for r in pts)
            ax.errorbar([r["budget"] for r in pts], [r[f"{metric}_mean"] for r in pts],
                        yerr=[r[f"{metric}_std"] for r in pts] if spread else None,
                        capsize=3, label=method, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(regime)
        ax.set_xlabel("budget (landmarks / features / proj_len)")
        ax.set_ylabel(f"relative {metric} error")
        ax.grid(True, which="both", alpha=0.3)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
