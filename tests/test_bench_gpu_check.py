"""``benchmarks/gpu_check.sh --smoke``: the GPU check's every part, at tiny sizes on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectral_jax.attention import available_attentions

ROOT = Path(__file__).resolve().parents[1]


# The GPU script end to end on CPU (~50-100 s): run with -m slow before lending it a GPU.
@pytest.mark.slow
def test_gpu_check_smoke_writes_every_part(tmp_path):
    out = tmp_path / "gpu"
    # The script runs $PYTHON (default: `python` on PATH); this interpreter has the harness.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(out), "--smoke"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    env_json = json.loads((out / "environment.json").read_text())
    assert env_json["backend"] == "cpu" and env_json["jax"]
    # On CPU long inputs are split into head chunks; on GPU the same call takes all 8 at once.
    assert env_json["head_chunk_size_default"] == {"1024": 8, "65536": 1}
    assert env_json["all_heads_at_once"] is False

    for dtype in ("bfloat16", "float32"):
        records = json.loads((out / f"speed_{dtype}.json").read_text())["records"]
        timed = {(r["method"], r["mode"]) for r in records if r["time_s"] and r["time_s"] > 0}
        for method in (*available_attentions(), "softmax[xla]"):
            assert {(method, "fwd"), (method, "fwd_bwd")} <= timed, (dtype, method)
        cudnn = [r for r in records if r["method"] == "softmax[cudnn]"]
        assert len(cudnn) == 2 and all("does not compile" in r["skipped"] for r in cudnn)
        assert {r["length"] for r in records} == {64}

    train = json.loads((out / "train_listops.json").read_text())
    assert train["stopped_by"] == "steps"
    assert train["examples_per_s"] > 0 and train["train_step_peak_bytes"] > 0
    assert train["results"]["attention"] == "spectral_shift"
    assert train["results"]["test_examples"] == 8
    summary = json.loads((out / "gpu_check.json").read_text())
    assert set(summary["parts"]) == {"environment", "train_listops", "speed"}
    assert summary["speed"]["left_out"] == [] and summary["speed"]["errors"] == []


# The LRA-table script end to end on CPU (~2 minutes): generated ListOps and Pathfinder, the
# three methods and softmax with RoPE on each, then one table; run with -m slow before lending
# it a device.
@pytest.mark.slow
def test_lra_table_smoke_trains_every_method_on_every_generated_task(tmp_path):
    out = tmp_path / "lra"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/lra_table_gpu.sh"), str(out),
                           "--smoke"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for task in ("listops", "pathfinder"):
        cases = [(task, m, None) for m in ("nystrom", "spectral_shift", "gated_deltanet")]
        for sweep, method, positional in [*cases, (f"{task}-rope", "softmax", "rope")]:
            run = out / sweep / f"{method}-seed0"
            assert json.loads((run / "results.json").read_text())["steps"] == 2, run
            config = json.loads((run / "config.json").read_text())
            assert config["model"]["attention"] == method
            assert positional is None or config["model"]["positional"] == positional
    table = json.loads((out / "table.json").read_text())
    assert len(table["runs"]) == 8 and not table["failed"]
    assert (out / "table.md").read_text().startswith("| Model | ListOps | Pathfinder | Avg |")
    bad = subprocess.run(["bash", str(ROOT / "benchmarks/lra_table_gpu.sh"), str(out), "--fast"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option --fast" in bad.stderr
    extra = subprocess.run(["bash", str(ROOT / "benchmarks/lra_table_gpu.sh"), str(out),
                            "--smoke", "--fast"], env=env, capture_output=True, text=True)
    assert extra.returncode == 2 and "usage:" in extra.stderr
