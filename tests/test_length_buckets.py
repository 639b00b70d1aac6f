"""Length-bucketed training batches: every example once per epoch, each batch cut to its
longest example, resumable, and a cut batch scores as the full-length one."""

from __future__ import annotations

import dataclasses
import itertools
import json
import types
import warnings

import jax
import numpy as np
import pytest

from spectral_jax import UsageError
from spectral_jax.lra.data import iterate_batches, iterate_length_buckets
from spectral_jax.lra.data.length_buckets import valid_lengths
from spectral_jax.lra.data.task import IGNORE_INDEX, Split
from spectral_jax.lra.train import distributed
from spectral_jax.lra.train import steps as steps_lib
from spectral_jax.lra.train.config_lib import build_config, validate_config
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.run import setup_run
from spectral_jax.lra.train.workdir import config_mismatch, write_workdir


def _split(n=48, length=40, seed=0, high=None):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, (high or length) + 1, n)
    mask = np.arange(length)[None, :] < lengths[:, None]
    inputs = np.where(mask, np.arange(n)[:, None] + 1, 0).astype(np.int32)  # row id + 1
    return Split(inputs, mask, np.arange(n, dtype=np.int32) % 5), lengths


def test_each_epoch_visits_every_example_once_in_batches_cut_to_their_longest():
    split, lengths = _split()
    batches = list(itertools.islice(
        iterate_length_buckets(split, 4, multiple=8, window=3, seed=1), 2 * 48 // 4))
    for epoch in (batches[:12], batches[12:]):
        ids = np.concatenate([b["inputs"][:, 0] - 1 for b in epoch])
        assert sorted(ids.tolist()) == list(range(48))
    for b in batches:
        ids = b["inputs"][:, 0] - 1
        longest = lengths[ids].max()
        assert b["inputs"].shape[1] == min(40, -(-longest // 8) * 8)
        # No valid token is cut off, and the rows are the examples themselves.
        np.testing.assert_array_equal(b["mask"].sum(1), lengths[ids])
        np.testing.assert_array_equal(b["label"], ids % 5)


def test_sorting_by_length_removes_most_of_the_padding():
    split, lengths = _split(n=256)
    cut = sum(b["mask"].size for b in itertools.islice(
        iterate_length_buckets(split, 8, multiple=8, window=32, seed=0), 32))
    full = sum(b["mask"].size for b in itertools.islice(
        iterate_batches(split, 8, shuffle=True, seed=0, repeat=True), 32))
    assert lengths.sum() <= cut < 0.7 * full


@pytest.mark.parametrize("n,batch,window", [(48, 4, 3), (50, 7, 4), (13, 4, 8)])
def test_start_step_resumes_the_same_stream_and_the_seed_decides_it(n, batch, window):
    # (50, 7, 4): windows straddle epochs; (13, 4, 8): a window longer than an epoch.
    split, _ = _split(n=n)
    stream = list(itertools.islice(
        iterate_length_buckets(split, batch, multiple=8, window=window, seed=1), 30))
    for k in (0, 2, 3, 7, 13, 22):
        resumed = itertools.islice(iterate_length_buckets(
            split, batch, multiple=8, window=window, seed=1, start_step=k), 5)
        for got, want in zip(resumed, stream[k:k + 5]):
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])
    other = next(iterate_length_buckets(split, batch, multiple=8, window=window, seed=2))
    assert not np.array_equal(other["inputs"][:, 0], stream[0]["inputs"][:, 0])


def test_a_window_never_holds_two_copies_of_an_example():
    split, _ = _split(n=32)
    for b in itertools.islice(iterate_length_buckets(split, 8, multiple=8, window=32), 8):
        ids = b["inputs"][:, 0]
        assert len(set(ids.tolist())) == 8


def test_targets_and_segments_past_the_mask_are_kept():
    split, lengths = _split(n=8, length=40)
    targets = np.full(split.inputs.shape, IGNORE_INDEX, np.int32)
    targets[:, 30] = 1  # a target after every example's last valid token
    split = dataclasses.replace(split, targets=targets, segment_ids=np.zeros_like(targets),
                                positions=np.zeros_like(targets))
    np.testing.assert_array_equal(valid_lengths(split), np.maximum(lengths, 31))
    for b in itertools.islice(iterate_length_buckets(split, 4, multiple=8, window=2), 2):
        assert b["targets"].shape[1] == b["inputs"].shape[1] >= 32
        assert (b["targets"][:, 30] == 1).all()


def test_bad_arguments_name_the_parameter():
    split, _ = _split()
    with pytest.raises(UsageError, match="multiple"):
        next(iterate_length_buckets(split, 4, multiple=0, window=3))
    with pytest.raises(UsageError, match="window"):
        next(iterate_length_buckets(split, 4, multiple=8, window=0))


def _config(data_dir, *extra):
    cfg = load_config("lra/listops:quick,attention=softmax", [
        f"data.dir={data_dir}", "train.steps=4", "train.batch_size=8", "train.eval_every=4",
        "train.log_every=2", "model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16",
        "model.mlp_dim=32", *extra])
    cfg.data.options.max_length = cfg.model.max_length = 64
    cfg.data.generate.update(num_train=32, num_val=8, num_test=8, min_length=8,
                             max_length=64, max_depth=3)
    return cfg


@pytest.mark.parametrize("attention,pooling", [
    ("softmax", "mean"), ("nystrom", "cls"), ("gated_deltanet", "mean"),
    ("gated_deltanet", "last"), ("memory_compressed", "mean")])
def test_a_cut_batch_scores_as_the_full_length_batch(tmp_path, attention, pooling):
    cfg = _config(tmp_path, f"model.pooling={pooling}", f"model.attention={attention}")
    task = types.SimpleNamespace(vocab_size=17, num_classes=10, max_length=64)
    mesh = distributed.make_mesh()
    split, lengths = _split(n=8, length=64, high=40)
    full = iterate_batches(split, 8, shuffle=False).__next__()
    full["inputs"] = np.where(full["mask"], full["inputs"] % 17, 0).astype(np.int32)
    cut = {k: (v[:, :int(lengths.max())] if k in ("inputs", "mask") else v)
           for k, v in full.items()}
    with jax.set_mesh(mesh):
        setup = setup_run(cfg, steps_lib.model_config(cfg, task), False, mesh)
        got = [setup.steps.eval(setup.rng_state, setup.state, b) for b in (full, cut)]
    for name in ("loss_sum", "correct", "count"):
        np.testing.assert_allclose(got[1][name], got[0][name], rtol=1e-5)


def test_training_with_buckets_runs_and_refuses_a_split_sequence(tmp_path):
    results = train_and_evaluate(_config(tmp_path / "data", "train.bucket_multiple=16"),
                                 str(tmp_path / "run"))
    assert results["test_examples"] == 8
    assert results["compiles"]["train"] > 1  # batches of several lengths (8-64 tokens)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["bucket_multiple"] == 16 and config["train"]["bucket_window"] == 32
    with pytest.raises(UsageError, match=r"train.bucket_multiple=16 with train.mesh.seq=2"):
        train_and_evaluate(load_config("lra/listops:quick", [
            "train.bucket_multiple=16", "train.mesh.seq=2"]), str(tmp_path / "seq"))


def test_a_multiple_that_allows_many_batch_lengths_warns_with_one_that_does_not():
    # Quick ListOps: 128 positions, so a multiple of 4 allows 32 batch lengths, 8 allows 16.
    with pytest.warns(UserWarning, match=r"bucket_multiple=4 .* up to 32 batch lengths.* "
                                         r"at least 8 keeps that to 16"):
        validate_config(load_config("lra/listops:quick", ["train.bucket_multiple=4"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_config(load_config("lra/listops:quick", ["train.bucket_multiple=8"]))
        validate_config(build_config(task="listops", protocol="quick", attention="softmax",
                                     seed=0, data={"dir": "d"}, model={},
                                     train={"bucket_multiple": 1}))


def test_bucket_window_is_part_of_a_runs_config_only_while_buckets_are_on(tmp_path):
    base = load_config("lra/listops:quick", [])
    write_workdir(str(tmp_path), base, overwrite=False)
    assert config_mismatch(str(tmp_path), load_config(
        "lra/listops:quick", ["train.bucket_window=8"])) is None
    assert "bucket_multiple" in config_mismatch(str(tmp_path), load_config(
        "lra/listops:quick", ["train.bucket_multiple=64", "train.bucket_window=8"]))
    on = tmp_path / "on"
    write_workdir(str(on), load_config("lra/listops:quick", ["train.bucket_multiple=64"]),
                  overwrite=False)
    assert "bucket_window" in config_mismatch(str(on), load_config(
        "lra/listops:quick", ["train.bucket_multiple=64", "train.bucket_window=8"]))
