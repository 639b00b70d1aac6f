"""bench dump-qkv: q/k/v captured from a (tiny) trained ListOps run feed `bench error`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectral_jax.lra import cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from spectral_jax.lra.train import train_and_evaluate
    from spectral_jax.lra.train.overrides import load_config

    root = tmp_path_factory.mktemp("listops")
    config = load_config("lra/listops:quick,attention=softmax", [
        f"data.dir={root / 'data'}", "data.generate.num_train=64", "data.generate.num_val=16",
        "data.generate.num_test=16", "train.steps=2", "train.eval_every=2",
        "train.log_every=1", "train.batch_size=8",
    ])
    train_and_evaluate(config, str(root / "run"))
    return root / "run"


def test_dump_qkv_then_bench_error(run_dir, tmp_path):
    out = tmp_path / "qkv.npz"
    assert cli.main(["bench", "dump-qkv", "--workdir", str(run_dir), "--out", str(out),
                     "--layer", "1", "--examples", "3", "--checkpoint", "latest"]) == 0
    with np.load(out) as data:
        q, k, v, mask = data["query"], data["key"], data["value"], data["mask"]
    # quick preset: max_length 128, 2 heads of 64 / 2 = 32 features.
    assert q.shape == k.shape == v.shape == (3, 128, 2, 32)
    assert mask.shape == (3, 128) and mask.dtype == bool
    assert 20 <= mask.sum(1).min() and mask.sum(1).max() <= 128  # 20-128 tokens per example
    assert not np.allclose(q, k) and np.isfinite(q).all()
    assert cli.main(["bench", "error", "--qkv", str(out), "--methods", "nystrom",
                     "--budgets", "8", "128", "--seeds", "0", "--out", str(tmp_path / "e")]) == 0
    rows = {r["budget"]: r for r in json.loads((tmp_path / "e.json").read_text())["summary"]}
    assert rows[128]["output_mean"] < 1e-5 < rows[8]["output_mean"]  # m >= n: exact


def test_dump_qkv_bad_layer_and_missing_run(run_dir, tmp_path, capsys):
    assert cli.main(["bench", "dump-qkv", "--workdir", str(run_dir), "--out",
                     str(tmp_path / "q.npz"), "--layer", "5"]) == 2
    assert "`--layer` must be an int in [0, 2)" in capsys.readouterr().err
    assert cli.main(["bench", "dump-qkv", "--workdir", str(tmp_path / "none"), "--out",
                     str(tmp_path / "q.npz")]) == 2
    assert "no run in workdir" in capsys.readouterr().err
