"""matplotlib, an optional dependency: every plot of the package gets its figures here.

Plots are extras of commands whose real output is a table or a JSON file (``spectral-jax
sweep``, ``table --plot``, ``bench speed``, ``bench error``). matplotlib comes with the
``bench`` extra, so without it a plot is skipped with one line saying what to install, and
the command still succeeds.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, never through pyplot:
files only, so sweeps run headless, and the pyplot backend of a notebook that imports the
package is left as it was.
"""

from __future__ import annotations

import pathlib
import sys
from types import ModuleType
from typing import Any

INSTALL_HINT = "pip install 'spectral_jax[bench]'"


def load_matplotlib(what: str) -> ModuleType | None:
    """The ``matplotlib`` package with its ``figure``, ``ticker`` and Agg backend imported.

    Args:
      what: the plot a caller is about to draw (e.g. ``"the plot runs/sweep/a.png"``),
        named in the line printed when matplotlib is missing.

    Returns:
      The module, or None when matplotlib cannot be imported; then one line goes to stderr:
      ``"skipped <what>: matplotlib is not installed (pip install 'spectral_jax[bench]')"``.

    Example:
      >>> load_matplotlib("the plot a.png").figure.Figure.__name__
      'Figure'
    """
    try:
        import matplotlib
        import matplotlib.backends.backend_agg
        import matplotlib.figure
        import matplotlib.ticker
    except ImportError:
        print(f"skipped {what}: matplotlib is not installed ({INSTALL_HINT})", file=sys.stderr,
              flush=True)
        return None
    return matplotlib


def new_figure(mpl: ModuleType, **kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure(**kwargs)`` drawn by an Agg canvas (for ``savefig``).

    Args:
      mpl: from :func:`load_matplotlib`.
      **kwargs: ``Figure`` arguments, e.g. ``figsize=(7, 4)``.

    Example:
      >>> fig = new_figure(load_matplotlib("a plot"), figsize=(2, 1))
      >>> type(fig.canvas).__name__
      'FigureCanvasAgg'
    """
    fig = mpl.figure.Figure(**kwargs)
    mpl.backends.backend_agg.FigureCanvasAgg(fig)
    return fig


def side_by_side(path: pathlib.Path, figsize: tuple[float, float] = (11, 4.2)
                 ) -> tuple[Any, Any, Any] | None:
    """A figure of two panels, left and right, for the plot ``path``; None (and the line of
    :func:`load_matplotlib`) when matplotlib is missing."""
    mpl = load_matplotlib(f"the plot {path}")
    if mpl is None:
        return None
    fig = new_figure(mpl, figsize=figsize)
    return (fig, *fig.subplots(1, 2))


def log_length_axes(axes: list[tuple[Any, str]], xlabel: str = "sequence length n") -> None:
    """Log-log axes for plots against the sequence length: base-2 lengths, labels, a grid.

    Args:
      axes: ``(matplotlib axes, y label)`` pairs.
      xlabel: the x label, shared by all of them.
    """
    for ax, ylabel in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)


def save_figure(fig: Any, path: pathlib.Path, title: str, bottom: float = 0.0) -> pathlib.Path:
    """Titles, lays out and writes ``fig`` to ``path`` (120 dpi), creating its folder;
    ``bottom``: the fraction of the height left free below the panels (a figure legend)."""
    fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path

