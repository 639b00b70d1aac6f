"""bench compile: the training step's compile time per method, as a ratio to softmax's."""

from __future__ import annotations

import json

from spectral_jax.lra import cli

CONFIG = "lra/listops:quick"


def test_bench_compile_writes_ratios(tmp_path):
    out = tmp_path / "c"
    assert cli.main(["bench", "compile", "--config", CONFIG, "--methods", "linear",
                     "--out", str(out)]) == 0
    payload = json.loads((tmp_path / "c.json").read_text())
    records = {r["method"]: r for r in payload["records"]}
    assert list(records) == ["softmax", "linear"]  # the baseline first, always included
    base = records["softmax"]["total_s"]
    assert records["softmax"]["ratio"] == 1.0
    assert records["linear"]["ratio"] == records["linear"]["total_s"] / base
    for r in records.values():
        assert 0 < r["lower_s"] < r["total_s"] and r["totals"] == [r["total_s"]]
        assert r["num_params"] == records["softmax"]["num_params"]
    assert len(payload["environment"]["load_average"]) == 3
    md = (tmp_path / "c.md").read_text()
    assert "| method | lower (s) | compile (s) | total (s) | × softmax | StableHLO ops" in md
    assert records["linear"]["hlo_instructions"] > 0 < records["softmax"]["stablehlo_ops"]
    assert "| linear |" in md and "load average" in md


def test_bench_compile_bad_repeats(tmp_path, capsys):
    assert cli.main(["bench", "compile", "--config", CONFIG, "--repeats", "0",
                     "--out", str(tmp_path / "c")]) == 2
    assert "`--repeats` must be a positive int; got 0" in capsys.readouterr().err
