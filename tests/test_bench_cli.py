"""The `spectral-jax bench` command: JSON + PNG outputs and error handling."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from spectral_jax.lra import cli


def test_bench_speed_writes_json_table_and_plot(tmp_path, capsys, monkeypatch):
    # CPU timings depend on the allocator, so the run records the variables that choose it.
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + [
            "LD_PRELOAD", "GLIBC_TUNABLES", "XLA_FLAGS"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_CONF", "retain:true")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1000000")
    out = tmp_path / "speed"
    rc = cli.main(["bench", "speed", "--methods", "nystrom", "--lengths", "64", "128",
                   "--heads", "1", "--head-dim", "8", "--budget", "num_landmarks=8",
                   "--repeats", "1",
                   "--modes", "fwd", "--out", str(out)])
    assert rc == 0
    payload = json.loads((tmp_path / "speed.json").read_text())
    recs = {(r["method"], r["length"]): r for r in payload["records"]}
    assert set(recs) == {("softmax", 64), ("softmax", 128), ("nystrom", 64), ("nystrom", 128)}
    assert recs[("softmax", 128)]["time_ratio"] == 1.0
    assert recs[("nystrom", 128)]["growth_per_doubling"] > 0
    assert payload["config"]["num_landmarks"] == 8 and payload["environment"]["backend"] == "cpu"
    assert payload["environment"]["allocator_env"] == {
        "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1000000", "MALLOC_CONF": "retain:true"}
    assert Image.open(tmp_path / "speed.png").size[0] > 500
    text = capsys.readouterr().out
    assert "time/exact" in text and "nystrom" in text


def test_bench_speed_skips_what_does_not_fit(tmp_path, capsys):
    rc = cli.main(["bench", "speed", "--methods", "linear", "--lengths", "4096", "--heads",
                   "4", "--modes", "fwd", "--memory-budget-gb", "0.05", "--compile-only",
                   "--out", str(tmp_path / "s")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "skipped softmax fwd at n=4096" in text
    payload = json.loads((tmp_path / "s.json").read_text())
    skipped = {r["method"] for r in payload["records"] if r["skipped"]}
    assert "softmax" in skipped and "linear" not in skipped


def test_bench_error_writes_summary_and_plot(tmp_path):
    out = tmp_path / "err"
    rc = cli.main(["bench", "error", "--methods", "nystrom", "linear", "--budgets", "4", "16",
                   "--regimes", "random_walk", "--seeds", "0", "1", "--lengths", "32",
                   "--heads", "1", "--head-dim", "8", "--out", str(out)])
    assert rc == 0
    payload = json.loads((tmp_path / "err.json").read_text())
    rows = {(r["method"], r["budget"]): r for r in payload["summary"]}
    assert set(rows) == {("nystrom", 4), ("nystrom", 16), ("linear", None)}
    assert rows[("nystrom", 16)]["output_mean"] < rows[("nystrom", 4)]["output_mean"]
    assert len(payload["records"]) == 6
    assert Image.open(tmp_path / "err.png").size[0] > 300


def test_bench_error_reads_qkv_file(tmp_path):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 24, 1, 8)).astype(np.float32) for _ in range(3))
    np.savez(tmp_path / "qkv.npz", query=q, key=k, value=v, mask=np.ones((1, 24), bool))
    rc = cli.main(["bench", "error", "--methods", "nystrom", "--budgets", "4", "--seeds", "0",
                   "--qkv", str(tmp_path / "qkv.npz"), "--out", str(tmp_path / "e")])
    assert rc == 0
    payload = json.loads((tmp_path / "e.json").read_text())
    assert payload["summary"][0]["regime"] == "checkpoint"
    assert payload["summary"][0]["length"] == 24


def test_bench_bad_arguments_exit_2(tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", query=np.zeros((1, 4, 1, 2)))
    rc = cli.main(["bench", "error", "--qkv", str(tmp_path / "bad.npz"),
                   "--out", str(tmp_path / "e")])
    assert rc == 2
    assert "missing arrays ['key', 'value']" in capsys.readouterr().err
    rc = cli.main(["bench", "speed", "--lengths", "0", "--out", str(tmp_path / "s")])
    assert rc == 2
    assert "lengths[0]" in capsys.readouterr().err
    rc = cli.main(["bench", "speed", "--lengths", "64", "--head-chunk-size", "0",
                   "--out", str(tmp_path / "s")])
    assert rc == 2  # the message names the flag, not the Python parameter
    assert "`--head-chunk-size` must be a positive int; got 0" in capsys.readouterr().err
    for budget in ("inf", "nan", "0", "-1"):
        rc = cli.main(["bench", "speed", "--lengths", "64", "--memory-budget-gb", budget,
                       "--out", str(tmp_path / "s")])
        captured = capsys.readouterr()
        assert rc == 2 and "`--memory-budget-gb` must be a positive, finite" in captured.err
        assert "compiling" not in captured.out  # rejected before any work
    rc = cli.main(["bench", "speed", "--lengths", "64", "64", "--out", str(tmp_path / "s")])
    assert rc == 2 and "`--lengths` must be distinct; got [64, 64]" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(SystemExit):  # argparse rejects unknown methods itself
        cli.main(["bench", "speed", "--methods", "flash"])
