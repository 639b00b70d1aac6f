"""The training loop end to end on tiny data in the release formats (8 simulated CPU devices).

Covers: a smoke run per task, resume after SIGKILL in a subprocess, 8-device vs 1-device
equivalence, NaN stop, one compile per step function, same seed -> same metrics, and the
errors raised before compiling.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
from flax import nnx
from train_child import run_child

from spectral_jax.lra import data
from spectral_jax.lra.train import distributed
from spectral_jax.lra.train import steps as steps_lib
from spectral_jax.lra.train.interrupt import TrainingDiverged
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.report import read_metrics
from spectral_jax.lra.train.run import setup_run

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
    "model.dropout_rate=0.1",
]


def tiny_config(task: str, data_dir: Path, *extra: str, attention: str = "spectral_shift"):
    overrides = [
        f"data.dir={data_dir}", "train.steps=4", "train.batch_size=8", "train.eval_every=2",
        "train.log_every=1", "train.eval_steps=-1", "train.schedule.warmup_steps=1",
        *TINY_MODEL, *extra,
    ]
    cfg = load_config(f"lra/{task}:quick,attention={attention}", overrides)
    for key in ("num_landmarks", "num_features", "proj_len"):
        if key in cfg.model.attention_kwargs:
            cfg.model.attention_kwargs[key] = 4
    return cfg


def _listops_config(tmp_path: Path, *extra: str):
    cfg = tiny_config("listops", tmp_path / "listops", *extra)
    cfg.data.options.max_length = 32
    cfg.model.max_length = 32
    cfg.data.generate.update(num_train=48, num_val=16, num_test=12, min_length=8,
                             max_length=32, max_depth=3)
    return cfg


# ---------------------------------------------------------------- tiny release-format data


def _bytes_texts(rng: np.random.Generator, n: int, low: int, high: int) -> list[str]:
    words = ["good", "bad", "film", "plot", "actor", "great", "awful", "scene"]
    return [" ".join(rng.choice(words, rng.integers(low, high))) for _ in range(n)]


def write_text(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 6)):
        for label in ("pos", "neg"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i, text in enumerate(_bytes_texts(rng, n, 3, 12)):
                (folder / f"{i}_7.txt").write_text(text)
    return root


def write_retrieval(root: Path) -> Path:
    rng = np.random.default_rng(1)
    root.mkdir(parents=True)
    for split, n in (("train", 24), ("eval", 8), ("test", 8)):
        a, b = _bytes_texts(rng, n, 2, 8), _bytes_texts(rng, n, 2, 8)
        lines = [f"{i % 2}\tp{i}\tq{i}\t{x}\t{y}\n" for i, (x, y) in enumerate(zip(a, b))]
        (root / f"new_aan_pairs.{split}.tsv").write_text("".join(lines))
    return root


def write_cifar(root: Path) -> Path:
    rng = np.random.default_rng(2)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, n in [(f"data_batch_{i}", 8) for i in range(1, 6)] + [("test_batch", 8)]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


TASK_DATA = {
    "text": (write_text, ["data.options.max_length=32", "model.max_length=32"]),
    "retrieval": (write_retrieval, ["data.options.max_length=24", "model.max_length=24"]),
    "image": (write_cifar, ["data.options.source='cifar10'", "model.max_length=1024"]),
    "pathfinder": (
        lambda d: data.pathfinder.generate(d, resolution=32, num_images=40, seed=0) and d, []
    ),
    # Path-X's loader and config at 32x32 keep this fast; 128x128 is the slow test below.
    "pathx": (
        lambda d: data.pathfinder.generate(d, resolution=32, num_images=40, seed=0) and d,
        ["data.options.resolution=32", "model.max_length=1024"],
    ),
}


# ---------------------------------------------------------------- tests


def test_listops_generates_trains_and_writes_results(tmp_path):
    cfg = _listops_config(tmp_path)
    results = train_and_evaluate(cfg, str(tmp_path / "run"))
    run = tmp_path / "run"
    assert (tmp_path / "listops" / "basic_train.tsv").exists()
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk["test_accuracy"] == results["test_accuracy"]
    assert results["compiles"] == {"train": 1, "eval": 1}
    assert results["num_devices"] == 8
    assert results["test_examples"] == 12
    # Accuracy is a count over 12 examples, the baseline the split's own majority share.
    assert results["test_accuracy"] * 12 == pytest.approx(round(results["test_accuracy"] * 12))
    test = data.load_task("listops", tmp_path / "listops", max_length=32).splits["test"]
    assert results["majority_baseline"] == pytest.approx(
        np.bincount(test.labels).max() / len(test.labels))
    records = read_metrics(str(run / "metrics.jsonl"))
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["split"] == "validation"] == [2, 4]
    assert all(np.isfinite(r["loss"]) and r["examples_per_s"] > 0 for r in records
               if r["split"] == "train")
    assert results["config"]["model"]["vocab_size"] == 17
    assert results["best_step"] in (2, 4)


# Path-X shares Pathfinder's reader and model at another resolution: its smoke run (~15 s)
# runs with -m slow, next to the full-size one.
@pytest.mark.parametrize("task", [
    pytest.param(t, marks=pytest.mark.slow) if t == "pathx" else t for t in sorted(TASK_DATA)])
def test_smoke_per_task(task, tmp_path):
    writer, extra = TASK_DATA[task]
    data_dir = writer(tmp_path / "data")
    cfg = tiny_config(task, data_dir, *extra)
    results = train_and_evaluate(cfg, str(tmp_path / "run"))
    assert results["task"] == task
    assert 0.0 <= results["test_accuracy"] <= 1.0
    assert np.isfinite(results["test_loss"])
    assert results["compiles"] == {"train": 1, "eval": 1}
    loaded = data.load_task(task, data_dir, **cfg.data.options.to_dict())
    assert results["test_examples"] == len(loaded.splits["test"])


@pytest.mark.slow
def test_smoke_pathx_full_resolution(tmp_path):
    data_dir = tmp_path / "data"
    data.pathfinder.generate(data_dir, resolution=128, num_images=20, seed=0)
    cfg = tiny_config("pathx", data_dir, "train.steps=2", "train.eval_every=2")
    results = train_and_evaluate(cfg, str(tmp_path / "run"))
    assert results["config"]["model"]["max_length"] == 16384
    assert results["test_examples"] == 2 and np.isfinite(results["test_loss"])


def test_same_seed_same_metrics_and_overwrite(tmp_path):
    cfg = _listops_config(tmp_path)
    first = train_and_evaluate(cfg, str(tmp_path / "a"))
    second = train_and_evaluate(cfg, str(tmp_path / "b"))
    def strip(records):
        return [{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in records]

    assert strip(read_metrics(str(tmp_path / "a/metrics.jsonl"))) == strip(
        read_metrics(str(tmp_path / "b/metrics.jsonl")))
    assert first["test_loss"] == second["test_loss"]
    # A different config in the same workdir is refused, then accepted with overwrite.
    other = _listops_config(tmp_path, "seed=1")
    with pytest.raises(ValueError, match=r"different config \(seed: 0 there, 1 now\)"):
        train_and_evaluate(other, str(tmp_path / "a"))
    third = train_and_evaluate(other, str(tmp_path / "a"), overwrite=True)
    assert third["seed"] == 1
    assert json.loads((tmp_path / "a/config.json").read_text())["seed"] == 1


def test_relative_data_dir_in_a_committed_run_reopens(tmp_path, monkeypatch):
    # A run committed to a repository records data.dir relative; resuming it from the
    # repository root, with the path in any spelling, must be accepted and leave the file as is.
    from spectral_jax.lra.train.run import open_for_training
    from spectral_jax.lra.train.workdir import config_mismatch

    cfg, workdir = _listops_config(tmp_path), tmp_path / "run"
    with open_for_training(cfg, str(workdir)):
        pass
    recorded = json.loads((workdir / "config.json").read_text())
    assert recorded["data"]["dir"] == str(tmp_path / "listops")
    recorded["data"]["dir"] = "listops"
    (workdir / "config.json").write_text(json.dumps(recorded))
    monkeypatch.chdir(tmp_path)
    for given in ("listops", "./listops", str(tmp_path / "listops")):
        cfg.data.dir = given
        assert config_mismatch(str(workdir), cfg) is None
    with open_for_training(cfg, str(workdir)):
        pass
    assert json.loads((workdir / "config.json").read_text())["data"]["dir"] == "listops"
    cfg.data.dir = "elsewhere"
    with pytest.raises(ValueError, match=r"different config \(data\.dir: '.*listops' there"):
        open_for_training(cfg, str(workdir))


def test_resume_after_kill_continues_identically(tmp_path):
    cfg = _listops_config(tmp_path, "train.steps=6", "train.eval_every=2",
                          "model.dropout_rate=0.2")
    reference = train_and_evaluate(cfg, str(tmp_path / "ref"))
    config_json = tmp_path / "cfg.json"
    config_json.write_text(cfg.to_json())
    # The child SIGKILLs itself when asked for the 6th batch: after the checkpoint at step 4,
    # with step 5 already trained and logged but not checkpointed.
    args = ["--config-json", str(config_json), str(tmp_path / "resumed")]
    killed = run_child(args, signum=signal.SIGKILL, at_step=6)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    steps_logged = [r["step"] for r in read_metrics(str(tmp_path / "resumed/metrics.jsonl"))]
    assert 5 in steps_logged and not (tmp_path / "resumed/results.json").exists()
    resumed = run_child(args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming from the checkpoint at step" in resumed.stdout
    def strip(records):
        return [{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in records]

    got = strip(read_metrics(str(tmp_path / "resumed/metrics.jsonl")))
    want = strip(read_metrics(str(tmp_path / "ref/metrics.jsonl")))
    # Bit-exact: the same programs on the same 8 CPU devices, whichever process runs them.
    assert got == want
    result = json.loads((tmp_path / "resumed/results.json").read_text())
    assert result["test_loss"] == reference["test_loss"]


@pytest.mark.parametrize("seq", [1, 4], ids=["data8", "data2-seq4"])
def test_eight_devices_match_one(tmp_path, seq):
    # Adam turns the float32 noise of exactly-zero gradients (e.g. the key bias, which softmax
    # ignores) into +-lr updates whose sign is noise; a larger eps keeps the update
    # proportional to the gradient, so parameters are comparable within float32 tolerance.
    # seq = 4: each sequence split over 4 devices (train.mesh.seq), the batch over 2.
    cfg = _listops_config(tmp_path, "train.optimizer.eps=1e-3", "train.schedule.warmup_steps=0")
    data.listops_generator.generate(tmp_path / "listops", **cfg.data.generate.to_dict())
    task = data.load_task("listops", tmp_path / "listops", max_length=32)
    model_cfg = steps_lib.model_config(cfg, task)
    batches = data.iterate_batches(task.splits["train"], 8, shuffle=True, seed=0, repeat=True)
    batch_list = [next(batches) for _ in range(2)]
    outcome = {}
    for n in (1, 8):
        mesh = distributed.make_mesh(jax.devices()[:n], seq=seq if n == 8 else 1)
        with jax.set_mesh(mesh):
            setup = setup_run(cfg, model_cfg, False, mesh)
            state, losses = setup.state, []
            for batch in batch_list:
                state, m = setup.steps.train(
                    setup.rng_state, state,
                    distributed.global_batch(batch, distributed.batch_sharding(mesh)))
                losses.append(float(m["loss_sum"] / m["count"]))
            assert len(jax.tree.leaves(state)[0].sharding.device_set) == n
            outcome[n] = (losses, jax.device_get(nnx.to_pure_dict(state)))
    chex.assert_trees_all_close(outcome[8][0], outcome[1][0], rtol=1e-5)
    chex.assert_trees_all_close(outcome[8][1], outcome[1][1], rtol=1e-4, atol=1e-6)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path):
    cfg = _listops_config(tmp_path, "train.steps=8", "train.eval_every=2",
                          "train.optimizer.learning_rate=1e30", "train.grad_clip_norm=None",
                          "train.schedule.name='constant'", "train.schedule.warmup_steps=0")
    with pytest.raises(TrainingDiverged, match=r"NaN or inf at step (\d+)") as info:
        train_and_evaluate(cfg, str(tmp_path / "run"))
    bad = int(info.value.args[0].split("at step ")[1].split(";")[0])
    steps = sorted(int(p.name) for p in (tmp_path / "run/checkpoints").iterdir()
                   if p.name.isdigit())
    assert all(s < bad for s in steps)
    assert not (tmp_path / "run/results.json").exists()


@pytest.mark.parametrize("override, message", [
    (["train.batch_size=12"],
     r"`train.batch_size` must be a positive multiple of the device count 8.*got 12"),
    (["train.eval_batch_size=4"], r"`train.eval_batch_size` must be a positive multiple.*got 4"),
    (["task='bogus'"], r"`task` must be one of .*; got 'bogus'"),
    (["train.steps=0"], r"`train.steps` must be a positive int; got 0"),
    (["model.dropout_rate=1.5"],
     r"`model.dropout_rate` must be a finite number in \[0, 1\); got 1.5"),
    (["model.num_layers=0"], r"`model.num_layers` must be a positive int; got 0"),
    (["model.mlp_dim=0"], r"`model.mlp_dim` must be a positive int; got 0"),
    (["train.optimizer.b2=1.5"],
     r"`train.optimizer.b2` must be a finite number in \[0, 1\); got 1.5"),
    (["train.optimizer.eps=-1.0"], r"`train.optimizer.eps` must be a finite number > 0; got -1.0"),
    (["train.optimizer.weight_decay=-1.0"],
     r"`train.optimizer.weight_decay` must be a finite number >= 0; got -1.0"),
    (["train.schedule.steps_per_cycle=0"],
     r"`train.schedule.steps_per_cycle` must be a positive int or None; got 0"),
    (["train.redraw_features_every=-1"],
     r"`train.redraw_features_every` must be a non-negative int; got -1"),
    # (--config.model.attention=X and --config.protocol=P re-run get_config: their errors and
    # the same checks on a config set directly are in test_configs_lra.py.)
])
def test_config_errors_before_compile(tmp_path, override, message):
    cfg = _listops_config(tmp_path, *override)
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "listops").exists()  # raised before generating data


def test_missing_data_dir_says_how_to_get_it(tmp_path):
    writer, extra = TASK_DATA["text"]
    cfg = tiny_config("text", tmp_path / "nowhere", *extra)
    with pytest.raises(FileNotFoundError, match=r"aclImdb(.|\n)*--config.data.dir=PATH"):
        train_and_evaluate(cfg, str(tmp_path / "run"))


def test_model_errors_leave_the_workdir_unclaimed(tmp_path):
    # Found while tracing the first step, before config.json is written, so the corrected
    # command runs in the same workdir without --overwrite.
    bad = _listops_config(tmp_path, "model.num_heads=3")
    with pytest.raises(ValueError, match="num_heads must divide qkv_features=16"):
        train_and_evaluate(bad, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.json").exists()
    results = train_and_evaluate(_listops_config(tmp_path), str(tmp_path / "run"))
    assert results["steps"] == 4
    # The data folder is recorded absolute, so `eval` works from any directory.
    assert os.path.isabs(results["config"]["data"]["dir"])


def test_generated_data_with_other_settings_is_refused(tmp_path):
    cfg = _listops_config(tmp_path)
    train_and_evaluate(cfg, str(tmp_path / "run"))
    other = _listops_config(tmp_path)
    other.data.generate.num_train = 40
    with pytest.raises(ValueError, match=r"different settings \(data.generate.num_train: 48 "
                                         r"there, 40 now\)"):
        train_and_evaluate(other, str(tmp_path / "run2"))


def test_empty_split_is_refused_before_training(tmp_path):
    cfg = _listops_config(tmp_path)
    data.listops_generator.generate(tmp_path / "listops", **cfg.data.generate.to_dict())
    (tmp_path / "listops" / "basic_test.tsv").write_text("Source\tTarget\n")
    (tmp_path / "listops" / "generated.json").unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"the test split in data.dir=.* has no examples"):
        train_and_evaluate(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_performer_features_are_redrawn_every_n_steps(tmp_path):
    cfg = _listops_config(tmp_path, "train.redraw_features_every=2")
    cfg.model.attention = "performer"
    cfg.model.attention_kwargs = {"num_features": 4}
    data.listops_generator.generate(tmp_path / "listops", **cfg.data.generate.to_dict())
    task = data.load_task("listops", tmp_path / "listops", max_length=32)
    mesh = distributed.make_mesh(jax.devices()[:1])
    batches = data.iterate_batches(task.splits["train"], 8, shuffle=True, seed=0, repeat=True)
    with jax.set_mesh(mesh):
        setup = setup_run(cfg, steps_lib.model_config(cfg, task), False, mesh)
        state, seen = setup.state, []
        for _ in range(3):
            seen.append([np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(
                nnx.to_pure_dict(state)) if "projection" in jax.tree_util.keystr(p)])
            state, _ = setup.steps.train(setup.rng_state, state, distributed.global_batch(
                next(batches), distributed.batch_sharding(mesh)))
        after = [np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(
            nnx.to_pure_dict(state)) if "projection" in jax.tree_util.keystr(p)]
    assert seen[0] and all(a.shape == (4, 8) for a in seen[0])
    # Steps 0 and 1 keep the initial draw; step 2 (a positive multiple of 2) redraws it.
    chex.assert_trees_all_equal(seen[0], seen[1], seen[2])
    assert all(np.abs(a - b).max() > 0 for a, b in zip(after, seen[2]))
