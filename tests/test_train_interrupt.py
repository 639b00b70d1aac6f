"""SIGINT and SIGTERM stop a training run after the current step with a checkpoint.

A real ``spectral-jax train`` subprocess signals itself while step 6 of 8 is fetched
(checkpoints every 4 steps, logs every 4: steps 5 and 6 are trained but not yet logged).
It must print one line, exit 128 + signal with step 6 checkpointed, and resuming must
give the parameters and metrics of an uninterrupted run exactly. A sweep forwards the
signal to its running child and stops after the child has saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from train_child import ENV, run_child, tiny_listops_overrides

from spectral_jax.lra.train import checkpoint as checkpoint_lib
from spectral_jax.lra.train import run as run_lib
from spectral_jax.lra.train import sweep as sweep_lib
from spectral_jax.lra.train.interrupt import StopSignals, TrainingInterrupted
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.report import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SPEC = "lra/listops:quick,attention=softmax"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run: its workdir and results."""
    root = tmp_path_factory.mktemp("interrupt")
    workdir = root / "reference"
    return root, workdir, train_and_evaluate(_config(root), str(workdir))


def _config(root: Path, steps: int = 8):
    return load_config(SPEC, tiny_listops_overrides(root / "listops", steps))


def _state_at(workdir: Path, step: int, like) -> dict:
    ckpt = checkpoint_lib.Checkpointer(str(workdir / "checkpoints"), keep=3)
    try:
        state, meta = ckpt.restore(step, like)
        return jax.device_get(nnx.to_pure_dict(state)), meta
    finally:
        ckpt.close()


def _records(workdir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_per_s")}
            for r in read_metrics(str(workdir / "metrics.jsonl"))]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_saves_the_step_and_resume_is_bit_exact(reference, signum):
    root, ref_dir, ref_results = reference
    workdir = root / f"interrupted_{signum.name}"
    # `spectral-jax train` signalling itself when the loop asks for the batch of step 6.
    child = run_child(["train", "--config", SPEC, "--workdir", str(workdir),
                       *(f"--config.{o}" for o in tiny_listops_overrides(root / "listops"))],
                      signum=signum, at_step=6)
    assert child.returncode == 128 + signum, child.stderr[-3000:]
    message = "interrupted at step 6; checkpoint saved; rerun the same command to resume"
    assert child.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in child.stderr and child.stdout.count("interrupted") == 0
    assert not (workdir / "results.json").exists()
    # The checkpoint is at the interrupted step, after the validated one at step 4.
    ckpt = checkpoint_lib.Checkpointer(str(workdir / "checkpoints"), keep=3)
    assert ckpt.all_steps() == [4, 6]
    ckpt.close()
    assert [r["step"] for r in read_metrics(str(workdir / "metrics.jsonl"))] == [4, 4]

    with run_lib.open_for_training(_config(root), str(workdir)) as run:
        like = run.setup.state
    resumed = train_and_evaluate(_config(root), str(workdir))
    # Parameters are bit-exact. Evaluation losses are compared to float32 rounding: the
    # evaluation program compiled in this process may differ from the reference run's
    # (other tests in the same worker change XLA's settings), which moves the last bit.
    got, meta = _state_at(workdir, 8, like)
    want, ref_meta = _state_at(ref_dir, 8, like)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    got_records, want_records = _records(workdir), _records(ref_dir)
    assert [sorted(r) for r in got_records] == [sorted(r) for r in want_records]
    for got_r, want_r in zip(got_records, want_records):
        for key, value in want_r.items():
            if isinstance(value, float):
                assert got_r[key] == pytest.approx(value, rel=1e-6), (want_r, key)
            else:
                assert got_r[key] == value, (want_r, key)
    assert meta["best_step"] == ref_meta["best_step"] and "unlogged_window" not in meta
    for key in ("best_step", "best_val_accuracy"):
        assert resumed[key] == ref_results[key], key
    for key in ("test_loss", "final_test_loss"):
        assert resumed[key] == pytest.approx(ref_results[key], rel=1e-6), key


def test_second_sigint_stops_at_once_and_sigterm_is_ignored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the second SIGTERM: ignored
            assert stop.signum == signal.SIGTERM
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before  # restored on leaving


def test_interrupted_message_and_exit_status():
    err = TrainingInterrupted(310, signal.SIGTERM)
    assert isinstance(err, KeyboardInterrupt) and (err.step, err.exit_status) == (310, 143)
    assert str(err) == ("interrupted at step 310; checkpoint saved; rerun the same command "
                        "to resume")


def test_sweep_names_a_run_stopped_by_a_signal_sent_to_it_alone():
    line = "interrupted at step 6; checkpoint saved; rerun the same command to resume"
    assert sweep_lib.failure_reason(143, ["step 6: loss 1.0", line]) == (
        f"interrupted (exit status 143): {line}")
    assert sweep_lib.failure_reason(130, [line]).startswith("interrupted (exit status 130)")


def test_sweep_forwards_the_signal_and_stops_after_the_run_saved(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "spectral_jax.lra.cli", "sweep", "--config",
               "lra/listops:quick", "--attention", "softmax,linear",
               "--seeds", "0", "--workdir", str(sweep_dir),
               *(f"--config.{o}"
                 for o in tiny_listops_overrides(tmp_path / "listops", steps=100000)),
               "--config.train.log_every=1", "--config.train.eval_every=100000"]
    sweep = subprocess.Popen(command, env={**ENV, "PYTHONUNBUFFERED": "1",
                                           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in sweep.stdout:
            if line.strip().startswith("step 2:"):  # the child is training
                sweep.send_signal(signal.SIGINT)
                break
        out, err = sweep.communicate(timeout=240)
    finally:
        sweep.kill()
    assert sweep.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == ("sweep interrupted during softmax-seed0 (its "
                                            "checkpoint is saved); rerun the same command to "
                                            "resume")
    run_dir = sweep_dir / "softmax-seed0"
    log = (run_dir / "train.log").read_text()
    step = int(log.split("interrupted at step ")[1].split(";")[0])
    ckpt = checkpoint_lib.Checkpointer(str(run_dir / "checkpoints"), keep=3)
    assert ckpt.all_steps() == [step]
    ckpt.close()
    # The sweep stopped: no failure recorded, the second method never started.
    assert not (run_dir / "failed.json").exists() and not (sweep_dir / "linear-seed0").exists()
