"""``benchmarks/spectral_shift_delta_forms.py``: the δ forms it compares and what it reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from spectral_jax.lra.bench.error import run_error

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "spectral_shift_delta_forms", ROOT / "benchmarks/spectral_shift_delta_forms.py")
forms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(forms)


def test_forms_and_their_keywords():
    assert forms.forms(16, [0.25, 2]) == [
        ("nystrom", {"shift": "zero"}),
        ("split s=m", {"shift": "split", "num_delta_rows": 16}),
        ("paired (default s)", {"shift": "paired"}),
        ("paired s=0.25m", {"shift": "paired", "num_delta_rows": 4}),
        ("paired s=2m", {"shift": "paired", "num_delta_rows": 32}),
        ("exact", {"shift": "exact"}),
    ]


def test_errors_are_bench_errors_on_the_same_inputs_and_summarised_per_row():
    regimes = (("sharpness 1.0", "sharp", 1.0),)
    records = forms.error_records(budgets=[8], seeds=[0, 1], fractions=[], length=64,
                                  heads=1, head_dim=8, regimes=regimes)
    bench = run_error(methods=["nystrom", "spectral_shift"], budgets=[8], regimes=["sharp"],
                      seeds=[0, 1], length=64, heads=1, head_dim=8, sharpness=1.0,
                      matrix_max_length=0)
    for name, form in (("nystrom", "nystrom"), ("spectral_shift", "paired (default s)")):
        got = [r["output"] for r in records if r["form"] == form]
        want = [r["output"] for r in bench if r["method"] == name]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    rows = {r["form"]: r for r in forms.summary(records)}
    assert len(rows) == 4 and all(r["seeds"] == 2 for r in rows.values())
    split = [r["output"] for r in records if r["form"] == "split s=m"]
    assert rows["split s=m"]["median"] == np.median(split)
    assert (rows["split s=m"]["min"], rows["split s=m"]["max"]) == (min(split), max(split))
    assert rows["nystrom"]["median"] > rows["exact"]["median"]  # the shift helps here
