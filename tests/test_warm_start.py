"""``train.init_from``: a run starts from another run's model (a short-to-long curriculum)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx, traverse_util

from spectral_jax import UsageError
from spectral_jax.lra.train import distributed, warm_start
from spectral_jax.lra.train import steps as steps_lib
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.run import setup_run


def _config(data_dir: Path, length: int, *extra: str):
    cfg = load_config("lra/listops:quick,attention=softmax", [
        f"data.dir={data_dir}", "train.steps=3", "train.batch_size=8", "train.eval_every=3",
        "train.log_every=1", "train.schedule.warmup_steps=1", "model.num_layers=1",
        "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32", *extra])
    cfg.data.options.max_length = length
    cfg.model.max_length = length
    cfg.data.generate.update(num_train=32, num_val=8, num_test=8, min_length=8,
                             max_length=32, max_depth=3)
    return cfg


def _model_params(state: nnx.State) -> dict:
    return traverse_util.flatten_dict(nnx.to_pure_dict(state)[0])


def _state(cfg):
    task = types.SimpleNamespace(vocab_size=17, num_classes=10, max_length=cfg.model.max_length)
    model_cfg = steps_lib.model_config(cfg, task)
    mesh = distributed.make_mesh()
    with jax.set_mesh(mesh):
        return setup_run(cfg, model_cfg, False, mesh).state, mesh


def test_copy_model_copies_every_parameter_and_the_positions_both_runs_have(tmp_path):
    source, _ = _state(_config(tmp_path, 32, "seed=1"))
    target, mesh = _state(_config(tmp_path, 48, "seed=2"))
    with jax.set_mesh(mesh):
        state, report = warm_start.copy_model(target, source)
    got, old, init = _model_params(state), _model_params(source), _model_params(target)
    assert report["resized"] == ["encoder/embedding/position_table"] and not report["kept"]
    for path, value in got.items():
        if path[-1] == "position_table":
            np.testing.assert_array_equal(value[:32], old[path][:32])
            np.testing.assert_array_equal(value[32:], init[path][32:])
        else:
            np.testing.assert_array_equal(value, old[path])
    # The optimizer state starts fresh: the target's, untouched.
    for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(state)[1]),
                    jax.tree.leaves(nnx.to_pure_dict(target)[1])):
        np.testing.assert_array_equal(a, b)


def test_copy_model_names_a_parameter_whose_shape_differs(tmp_path):
    source, _ = _state(_config(tmp_path, 32))
    target, mesh = _state(_config(tmp_path, 32, "model.mlp_dim=48"))
    with jax.set_mesh(mesh), pytest.raises(UsageError, match=r"mlp_in/bias has shape \(32,\) "
                                           r"in the source run and \(48,\) here"):
        warm_start.copy_model(target, source)


def test_a_longer_run_starts_from_a_shorter_one_and_trains(tmp_path, capsys):
    short = tmp_path / "short"
    train_and_evaluate(_config(tmp_path / "data", 32), str(short))
    # A source recorded before the later train fields existed reads them as their defaults.
    recorded = json.loads((short / "config.json").read_text())
    for field in ("init_from", "bucket_multiple", "bucket_window"):
        del recorded["train"][field]
    (short / "config.json").write_text(json.dumps(recorded))
    long = tmp_path / "long"
    train_and_evaluate(_config(tmp_path / "data", 48, f"train.init_from={short}"), str(long))
    out = capsys.readouterr().out
    assert f"Starting from the model of {short} (step 3)" in out
    assert "1 resized (encoder/embedding/position_table)" in out
    results = json.loads((long / "results.json").read_text())
    assert results["test_examples"] == 8
    assert results["init_from_step"] == 3  # the source's best checkpoint, as printed
    assert json.loads((long / "config.json").read_text())["train"]["init_from"] == str(short)


def test_init_from_and_pretraining_exclude_each_other(tmp_path):
    with pytest.raises(UsageError, match="train.init_from=.*train.pretrain_steps=2"):
        train_and_evaluate(_config(tmp_path, 32, "train.init_from=/x",
                                   "train.pretrain_steps=2"), str(tmp_path / "w"))


def test_a_source_without_a_checkpoint_or_the_workdir_itself_is_refused_before_claiming(
        tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    work = tmp_path / "w"
    with pytest.raises(UsageError, match=r"train.init_from=.*empty.* holds no checkpoint"):
        train_and_evaluate(_config(tmp_path / "data", 32, f"train.init_from={empty}"), str(work))
    assert not (work / "config.json").exists()  # the fixed command can rerun in place
    with pytest.raises(UsageError, match="is the run's own workdir"):
        train_and_evaluate(_config(tmp_path / "data", 32, f"train.init_from={work}"), str(work))


def test_copy_model_refuses_source_parameters_the_model_lacks(tmp_path):
    # A CLS token in the source only: its position table is one row longer, so every
    # position would be shifted by one.
    source, _ = _state(_config(tmp_path, 32, "model.pooling=cls"))
    target, mesh = _state(_config(tmp_path, 32))
    with jax.set_mesh(mesh), pytest.raises(UsageError, match=r"lacks: \['encoder/embedding/cls'\]"):
        warm_start.copy_model(target, source)
