"""Two real processes joined by ``jax.distributed`` train exactly like one.

Each process is started the way a multi-host job starts one per host: the same command with
``--distributed`` and the coordinator, process count and process id in the environment.
They talk over CPU (gloo) collectives through a coordinator on 127.0.0.1, each holding one
CPU device and feeding its half of every global batch. The reference is one process with the
same global batch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_command(data_dir: Path, workdir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "spectral_jax.lra.cli", "train",
        "--config=lra/listops:quick,attention=nystrom",
        f"--config.data.dir={data_dir}",
        f"--config.train.steps={STEPS}",
        "--config.train.batch_size=8",
        "--config.train.eval_batch_size=8",
        f"--config.train.eval_every={STEPS}",
        "--config.train.eval_steps=1",
        "--config.train.log_every=1",
        # A warmup of one step, so the parameters move in the few steps the test runs.
        "--config.train.schedule.warmup_steps=1",
        f"--workdir={workdir}",
        *extra,
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    # One CPU device per process, as one accelerator per host.
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **extra)
    return env


def _train_losses(workdir: Path) -> list[float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("split") == "train"]


def _flatten(tree) -> dict[str, np.ndarray]:
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _params(workdir: Path) -> dict:
    step_dir = workdir / "checkpoints" / str(STEPS) / "state"
    # The checkpoints were written on other device sets than this test's: restore each
    # array onto one local device.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckpt:
        meta = ckpt.metadata(step_dir)
        meta = getattr(meta, "item_metadata", meta)
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
        return jax.tree.map(np.asarray, ckpt.restore(step_dir, target))


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    data_dir = tmp_path / "data"
    subprocess.run(
        [sys.executable, "-m", "spectral_jax.lra.cli", "data", "listops", "--out", str(data_dir),
         "--train", "64", "--val", "8", "--test", "8", "--seed", "0",
         "--min-length", "10", "--max-length", "48"],
        check=True, capture_output=True, env=_env(),
    )

    one = tmp_path / "one"
    subprocess.run(_train_command(data_dir, one), check=True, capture_output=True, env=_env(),
                   timeout=600)

    two = tmp_path / "two"
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            _train_command(data_dir, two, "--distributed"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                     JAX_PROCESS_ID=str(i)),
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"process {i} failed:\n{log[-3000:]}"
    assert "test accuracy" in logs[0]

    losses_one, losses_two = _train_losses(one), _train_losses(two)
    assert len(losses_one) == len(losses_two) == STEPS
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    # Both runs moved the parameters and the optimizer state the same way. Attention key
    # biases are the exception: a softmax row is invariant to a constant added to its
    # scores, so their gradient is zero up to rounding, and Adam turns that rounding (which
    # differs between one device and two processes) into steps of ±learning rate.
    flat_one = _flatten(_params(one))
    flat_two = _flatten(_params(two))
    assert flat_one.keys() == flat_two.keys()
    noise_driven = [k for k in flat_one if "/key/bias" in k]
    assert noise_driven
    for k in noise_driven:
        assert np.abs(flat_two[k]).max() < STEPS * 2e-3, k
    compared = {k: v for k, v in flat_one.items() if k not in noise_driven}
    chex.assert_trees_all_close(
        {k: flat_two[k] for k in compared}, compared, rtol=1e-4, atol=1e-7)
    # The optimizer did take steps (the first moments are not zero).
    assert np.abs(flat_two["1/opt_state/1/0/mu/hidden/kernel"]).max() > 1e-4
    results_one = json.loads((one / "results.json").read_text())
    results_two = json.loads((two / "results.json").read_text())
    assert results_two["num_processes"] == 2 and results_one["num_processes"] == 1
    assert results_two["test_accuracy"] == pytest.approx(results_one["test_accuracy"])
