"""bench speed --roofline: the roofs measured in the run, each method's bound and fraction."""

from __future__ import annotations

import json

import pytest

from spectral_jax.lra import cli
from spectral_jax.lra.bench import roofline

RATES = roofline.MachineRates(matmul_gflops=200.0, matmul_size=2048, thin_matmul_gflops=160.0,
                              thin_matmul_shape=(32768, 64), copy_gbs=20.0, copy_mib=256)


def test_the_bound_is_the_roof_the_intensity_meets_first():
    # Balance 10 FLOP/byte: above it the matmul roof bounds, below it the copy roof.
    records = [{"gflop": 40.0, "gbyte": 2.0, "time_s": 0.5},    # 20 FLOP/B, 80 GFLOP/s
               {"gflop": 2.0, "gbyte": 1.0, "time_s": 0.1},     # 2 FLOP/B, 10 GB/s
               {"gflop": 10.0, "gbyte": 1.0, "time_s": 1.0},    # at the balance: compute
               {"gflop": None, "gbyte": None, "time_s": 1.0}]   # not counted
    out = roofline.add_roofline(records, RATES)
    assert RATES.balance == 10.0
    assert [r["bound"] for r in out] == ["compute", "memory", "compute", None]
    assert [r["roof_fraction"] for r in out[:3]] == pytest.approx([0.4, 0.5, 0.05])
    assert out[1]["gflops"] == pytest.approx(20.0) and out[1]["gbs"] == pytest.approx(10.0)
    assert out[3]["roof_fraction"] is None


def test_the_no_overlap_ceiling_is_one_half_at_the_balance():
    # C = FLOP at the matmul roof, M = bytes at the copy roof; without overlap the time is
    # at least C + M, so the fraction of the larger roof is at most max(C, M) / (C + M).
    records = [{"gflop": 40.0, "gbyte": 2.0, "time_s": 0.5},    # C 0.2 s, M 0.1 s
               {"gflop": 10.0, "gbyte": 1.0, "time_s": 1.0},    # C = M = 0.05 s
               {"gflop": 2.0, "gbyte": 1.0, "time_s": 0.1}]     # C 0.01 s, M 0.05 s
    out = roofline.add_roofline(records, RATES)
    assert [r["no_overlap_ceiling"] for r in out] == pytest.approx([2 / 3, 0.5, 5 / 6])
    assert [r["no_overlap_fraction"] for r in out] == pytest.approx([0.6, 0.1, 0.6])
    # A fraction of the roof above the ceiling needs compute and memory traffic overlapped.
    assert all(r["roof_fraction"] <= r["no_overlap_ceiling"] for r in out)


def test_calibrate_measures_positive_rates_and_checks_its_sizes():
    rates = roofline.calibrate(matmul_size=128, thin_rows=512, head_dim=16, copy_mib=4,
                               repeats=2)
    assert rates.matmul_gflops > 0 and rates.thin_matmul_gflops > 0 and rates.copy_gbs > 0
    assert rates.thin_matmul_shape == (512, 16) and rates.copy_mib == 4
    with pytest.raises(Exception, match=r"calibrate: `copy_mib` must be a positive int; got 0"):
        roofline.calibrate(copy_mib=0)


def test_bench_speed_roofline_writes_fractions_of_the_same_runs_roofs(tmp_path):
    out = tmp_path / "roof"
    rc = cli.main(["bench", "speed", "--methods", "linear", "--lengths", "256", "--heads", "2",
                   "--head-dim", "16", "--repeats", "2", "--modes", "fwd_bwd", "--roofline",
                   "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.with_suffix(".json").read_text())
    rates = roofline.MachineRates(**{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in payload["machine_rates"].items()})
    rows = {r["method"]: r for r in payload["records"]}
    assert set(rows) == {"softmax", "linear"}
    for r in rows.values():
        assert r["gflop"] > 0 and r["gbyte"] > 0 and r["time_s"] > 0
        intensity = r["gflop"] / r["gbyte"]
        assert r["bound"] == ("compute" if intensity >= rates.balance else "memory")
        roof = rates.matmul_gflops if r["bound"] == "compute" else rates.copy_gbs
        achieved = (r["gflop"] if r["bound"] == "compute" else r["gbyte"]) / r["time_s"]
        assert r["roof_fraction"] == pytest.approx(achieved / roof)
    text = out.with_suffix(".md").read_text()
    assert "Roofs measured in this run" in text
    assert sum(line.startswith("| 256 |") for line in text.splitlines()) == 2
