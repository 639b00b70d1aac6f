"""A run with a self-pretraining stage: both stages recorded, the fine-tune starts from the
pretrained encoder (by value), and a kill in either stage resumes bit-exact.

A real ``spectral-jax train`` subprocess (tests/train_child.py) signals itself while a
training batch is fetched; its signal fires in whichever stage reaches that step first:
pretraining has 6 steps (checkpoints at 4 and 6), the fine-tune 8 (at 4 and 8), so step 5 is
in pretraining and step 7 only in the fine-tune.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from train_child import run_child, tiny_listops_overrides

from spectral_jax.lra.train import checkpoint as checkpoint_lib
from spectral_jax.lra.train import pretrain_stage
from spectral_jax.lra.train import run as run_lib
from spectral_jax.lra.train.interrupt import StopSignals
from spectral_jax.lra.train.loop import evaluate_checkpoint, train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.report import read_metrics

SPEC = "lra/listops:quick,attention=softmax"


def _overrides(data_dir: Path) -> list[str]:
    return [*tiny_listops_overrides(data_dir), "train.pretrain_steps=6"]


def _config(root: Path):
    return load_config(SPEC, _overrides(root / "listops"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("spt")
    workdir = root / "reference"
    return root, workdir, train_and_evaluate(_config(root), str(workdir))


def _pure(workdir: Path, folder: str, step: int, like) -> dict:
    ckpt = checkpoint_lib.Checkpointer(str(workdir / folder), keep=3)
    try:
        return jax.device_get(nnx.to_pure_dict(ckpt.restore(step, like)[0]))
    finally:
        ckpt.close()


def _records(workdir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_per_s")}
            for r in read_metrics(str(workdir / "metrics.jsonl"))]


def test_both_stages_are_recorded(reference):
    _, workdir, results = reference
    stages = [(r["stage"], r["split"], r["step"]) for r in read_metrics(
        str(workdir / "metrics.jsonl"))]
    assert stages == [("pretrain", "train", 4), ("pretrain", "validation", 4),
                      ("pretrain", "train", 6), ("pretrain", "validation", 6),
                      ("finetune", "train", 4), ("finetune", "validation", 4),
                      ("finetune", "train", 8), ("finetune", "validation", 8)]
    pre = results["pretrain"]
    assert (pre["steps"], pre["objective"], pre["mask_rate"]) == (6, "denoise", 0.5)
    saved = json.loads((workdir / "results.json").read_text())
    assert saved["pretrain"] == pre
    assert 0.0 <= pre["val_accuracy"] <= 1.0 and pre["val_loss"] > 0
    # The mask id is one more token id: the classifier's embedding has it too.
    assert results["config"]["model"]["vocab_size"] == 18


def test_fine_tune_starts_from_the_pretrained_encoder(reference):
    root, workdir, _ = reference
    with run_lib.open_for_training(_config(root), str(workdir)) as run:
        fresh = jax.device_get(nnx.to_pure_dict(run.setup.state))
        _, _, like, _ = pretrain_stage.setup(run)
        pretrained = _pure(workdir, "pretrain_checkpoints", 6, like)
        # The stage is finished: it trains nothing and hands over the encoder.
        with StopSignals(enabled=False) as stop:
            start = jax.device_get(nnx.to_pure_dict(pretrain_stage.run_stage(run, stop)))
    jax.tree.map(np.testing.assert_array_equal, start[0]["encoder"],
                 pretrained[0]["encoder"])
    # The head and the optimizer are the classifier's own, as initialised.
    for name in ("hidden", "logits"):
        jax.tree.map(np.testing.assert_array_equal, start[0][name], fresh[0][name])
    jax.tree.map(np.testing.assert_array_equal, start[1], fresh[1])
    # And the encoder did train: it is not the classifier's initial one.
    table = start[0]["encoder"]["embedding"]["embed"]["embedding"]
    assert np.abs(table - fresh[0]["encoder"]["embedding"]["embed"]["embedding"]).max() > 1e-4


# One stop runs in CI (~45 s each); both with -m slow.
@pytest.mark.parametrize("signum, at_step, stage, saved", [
    (signal.SIGKILL, 5, "pretrain_checkpoints", [4]),
    pytest.param(signal.SIGINT, 7, "checkpoints", [4, 7], marks=pytest.mark.slow),
], ids=["killed-in-pretraining", "sigint-in-fine-tune"])
def test_a_stop_in_either_stage_resumes_bit_exact(reference, signum, at_step, stage, saved):
    root, ref_dir, ref_results = reference
    workdir = root / f"stopped_{at_step}"
    child = run_child(["train", "--config", SPEC, "--workdir", str(workdir),
                       *(f"--config.{o}" for o in _overrides(root / "listops"))],
                      signum=signum, at_step=at_step)
    assert child.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), \
        child.stderr[-3000:]
    ckpt = checkpoint_lib.Checkpointer(str(workdir / stage), keep=3)
    # A kill may land before the asynchronous save of step 4 is complete (then set aside).
    assert ckpt.all_steps() in ((saved, []) if signum == signal.SIGKILL else (saved,))
    ckpt.close()
    assert not (workdir / "results.json").exists()
    if stage == "pretrain_checkpoints":  # nothing to evaluate yet, and the message says why
        with pytest.raises(FileNotFoundError, match="still in its pretraining stage"):
            evaluate_checkpoint(str(workdir))

    resumed = train_and_evaluate(_config(root), str(workdir))
    with run_lib.open_for_training(_config(root), str(workdir)) as run:
        like = run.setup.state
        _, _, pre_like, _ = pretrain_stage.setup(run)
    for folder, step, template in (("pretrain_checkpoints", 6, pre_like),
                                   ("checkpoints", 8, like)):
        jax.tree.map(np.testing.assert_array_equal, _pure(workdir, folder, step, template),
                     _pure(ref_dir, folder, step, template))
    got, want = _records(workdir), _records(ref_dir)
    assert [(r["stage"], r["split"], r["step"]) for r in got] == [
        (r["stage"], r["split"], r["step"]) for r in want]
    for got_r, want_r in zip(got, want):
        for key, value in want_r.items():
            if isinstance(value, float):
                assert got_r[key] == pytest.approx(value, rel=1e-6), (want_r, key)
    for key in ("best_step", "best_val_accuracy"):
        assert resumed[key] == ref_results[key], key
    assert resumed["pretrain"]["val_loss"] == pytest.approx(ref_results["pretrain"]["val_loss"],
                                                            rel=1e-6)
