"""`benchmarks/mqar_sweep_cpu/plot.py` sizes each committed run's decoding state the way
Zoology compares methods: the float numbers one example's cache holds over all layers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmarks/mqar_sweep_cpu"


def _plot():
    spec = importlib.util.spec_from_file_location("mqar_plot", SWEEP / "plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_state_sizes_of_the_committed_width_64_runs():
    # Two layers, one head of d = 64, sequence length 64.
    layers, d, length = 2, 64, 64
    plot = _plot()
    assert plot.state_size(SWEEP / "w64/softmax") == layers * 2 * length * d  # every k and v
    assert plot.state_size(SWEEP / "w64/linear") == layers * (d * d + d)  # S and z
    assert plot.state_size(SWEEP / "w64/gla") == layers * d * d
    rows = {(r["method"], r["width"]): r for r in plot.runs(SWEEP)}
    assert rows["gated_deltanet", 64]["accuracy"] > 0.99
