"""`spectral-jax bench parallel`: per-device memory falls with the mesh, the traffic does not
grow with the length, and the longest sequence under a budget grows with the devices."""

from __future__ import annotations

import json

from PIL import Image

from spectral_jax.lra import cli


def test_bench_parallel_writes_memory_traffic_and_longest_lengths(tmp_path, capsys):
    out = tmp_path / "parallel"
    rc = cli.main(["bench", "parallel", "--methods", "nystrom", "linear", "--lengths", "256",
                   "4096", "--devices", "4", "--head-dim", "8", "--memory-budget-gb", "0.001",
                   "--out", str(out)])
    assert rc == 0
    payload = json.loads((tmp_path / "parallel.json").read_text())
    recs = {(r["method"], r["length"], r["devices"]): r for r in payload["records"]}
    assert set(recs) == {(m, n, p) for m in ("nystrom", "linear") for n in (256, 4096)
                         for p in (1, 4)}
    for method in ("nystrom", "linear"):
        one, many = recs[(method, 4096, 1)], recs[(method, 4096, 4)]
        # Each device holds a quarter of the tokens and their gradients, plus replicas of
        # the small summaries (nystrom's 64 landmarks, which weigh much beside head_dim 8 at
        # shorter lengths: 0.8 of the one-device peak at n = 256).
        assert 0.15 < many["peak_bytes"] / one["peak_bytes"] == many["memory_ratio"] < 0.35
        assert one["collective_bytes"] == 0
        assert many["collective_bytes"] == recs[(method, 256, 4)]["collective_bytes"] > 0
    # Bidirectional linear attention all-reduces phi(K)^T V and sum phi(K) (d x (d + 1) for
    # head_dim 8) forward, and their cotangents backward: nothing else crosses devices.
    assert recs[("linear", 4096, 4)]["collective_kinds"] == ["all-reduce"]
    assert 0.24 < recs[("linear", 4096, 4)]["memory_ratio"] < 0.27
    for longest in payload["max_lengths"]:
        assert longest["max_length_p"] >= 2 * longest["max_length_1"], longest
    md = (tmp_path / "parallel.md").read_text()
    assert "spectral-jax bench parallel --methods nystrom linear" in md
    assert Image.open(tmp_path / "parallel.png").size[0] > 500
    assert "per device MiB" in capsys.readouterr().out


def test_bench_parallel_refuses_bad_sizes(capsys):
    assert cli.main(["bench", "parallel", "--devices", "1", "--lengths", "256"]) == 2
    assert "`--devices` must be >= 2" in capsys.readouterr().err
    assert cli.main(["bench", "parallel", "--devices", "2", "--memory-budget-gb", "0"]) == 2
    assert "`--memory-budget-gb` positive" in capsys.readouterr().err
