"""Executes the notebooks into ``docs/notebooks/``, outputs and plots included, for the site.

``notebooks/*.ipynb`` are stored without outputs (clean diffs; ``tests/test_notebooks.py``
checks it). The site shows these executed copies instead, so a reader sees every cell's
output and figure without running anything; the site's build executes nothing
(``docs/conf.py``). ``tests/test_notebooks.py`` checks that each copy's code is its
notebook's, cell for cell, and that every code cell ran, so a notebook edited without
running this again fails the suite.

Usage (from the repository root, with the ``notebooks`` extra installed)::

    python docs/execute_notebooks.py            # every notebook, at the sizes a reader runs
    python docs/execute_notebooks.py --small 03_lra_training   # toy sizes, some notebooks

``--small`` sets ``SPECTRAL_JAX_NOTEBOOK_SMALL=1`` (the tests' toy sizes), for a notebook
whose full run is too long for the machine at hand; the notebook says so in its output.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks"
EXECUTED = ROOT / "docs" / "notebooks"


def execute(source: pathlib.Path, small: bool, timeout: int) -> pathlib.Path:
    """Runs ``source`` top to bottom in its own folder; writes the copy with its outputs."""
    book = nbformat.read(source, as_version=4)
    previous = os.environ.get("SPECTRAL_JAX_NOTEBOOK_SMALL")
    os.environ["SPECTRAL_JAX_NOTEBOOK_SMALL"] = "1" if small else "0"
    try:
        nbclient.NotebookClient(book, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(SOURCES)}}).execute()
    finally:
        if previous is None:
            del os.environ["SPECTRAL_JAX_NOTEBOOK_SMALL"]
        else:
            os.environ["SPECTRAL_JAX_NOTEBOOK_SMALL"] = previous
    EXECUTED.mkdir(parents=True, exist_ok=True)
    target = EXECUTED / source.name
    nbformat.write(book, target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook stems (default: all)")
    parser.add_argument("--small", action="store_true", help="the tests' toy sizes")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args()
    sources = sorted(SOURCES.glob("*.ipynb"))
    if args.names:
        known = {p.stem: p for p in sources}
        unknown = sorted(set(args.names) - set(known))
        if unknown:
            parser.error(f"unknown notebooks {unknown}; known: {sorted(known)}")
        sources = [known[name] for name in args.names]
    for source in sources:
        start = time.perf_counter()
        target = execute(source, args.small, args.timeout)
        print(f"{target.relative_to(ROOT)}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
