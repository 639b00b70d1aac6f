"""iterate_batches, Split/Task validation, majority_baseline and load_task dispatch."""

from __future__ import annotations

import itertools

import chex
import numpy as np
import pytest

from spectral_jax.lra import data


def _split(n: int, length: int = 3, dual: bool = False) -> data.Split:
    shape = (n, 2, length) if dual else (n, length)
    inputs = (np.arange(n, dtype=np.int32) + 1).reshape((n,) + (1,) * (len(shape) - 1))
    inputs = np.broadcast_to(inputs, shape).copy()
    return data.Split(inputs, np.ones(shape, bool), (np.arange(n) % 3).astype(np.int32))


def test_last_partial_batch_is_padded_with_zero_weight() -> None:
    batches = list(data.iterate_batches(_split(7), 3, shuffle=False))
    assert len(batches) == 3
    for b in batches:
        chex.assert_shape([b["inputs"], b["mask"]], (3, 3))
        chex.assert_shape([b["label"], b["weight"]], (3,))
        assert b["inputs"].dtype == np.int32 and b["weight"].dtype == np.float32
    last = batches[-1]
    assert last["weight"].tolist() == [1.0, 0.0, 0.0]
    assert last["inputs"][1:].sum() == 0 and not last["mask"][1:].any()
    assert last["label"].tolist() == [0, 0, 0]  # example 6 has label 6 % 3 = 0, pads 0
    ids = np.concatenate([b["inputs"][b["weight"] > 0, 0] for b in batches])
    assert ids.tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_eval_pass_counts_every_example_once_when_shuffled() -> None:
    batches = list(data.iterate_batches(_split(10), 4, shuffle=True, seed=5))
    ids = np.concatenate([b["inputs"][b["weight"] > 0, 0] for b in batches])
    assert sorted(ids.tolist()) == list(range(1, 11))
    assert sum(b["weight"].sum() for b in batches) == 10.0
    want = np.random.default_rng((5, 0)).permutation(10) + 1
    assert ids.tolist() == want.tolist()


def test_drop_remainder() -> None:
    batches = list(data.iterate_batches(_split(7), 3, shuffle=False, drop_remainder=True))
    assert len(batches) == 2 and all(b["weight"].min() == 1.0 for b in batches)


def test_repeat_order_is_epoch_permutations_concatenated() -> None:
    n, bs, seed = 5, 3, 11
    stream = data.iterate_batches(_split(n), bs, shuffle=True, seed=seed, repeat=True)
    got = np.concatenate([b["inputs"][:, 0] for b in itertools.islice(stream, 7)]) - 1
    want = np.concatenate([np.random.default_rng((seed, e)).permutation(n) for e in range(5)])
    assert got.tolist() == want[: 7 * bs].tolist()


def test_resume_from_start_step_matches_uninterrupted_run() -> None:
    split = _split(13, dual=True)
    full = list(itertools.islice(
        data.iterate_batches(split, 4, shuffle=True, seed=2, repeat=True), 12))
    for k in (0, 3, 7):
        resumed = list(itertools.islice(
            data.iterate_batches(split, 4, shuffle=True, seed=2, repeat=True, start_step=k),
            12 - k))
        chex.assert_trees_all_close(resumed, full[k:])
        assert all(b["weight"].min() == 1.0 for b in resumed)


def test_resume_without_repeat() -> None:
    full = list(data.iterate_batches(_split(10), 3, shuffle=True, seed=1))
    chex.assert_trees_all_close(
        list(data.iterate_batches(_split(10), 3, shuffle=True, seed=1, start_step=2)), full[2:])


def test_batch_larger_than_split_when_repeating() -> None:
    b = next(data.iterate_batches(_split(2), 5, shuffle=False, repeat=True))
    assert b["inputs"][:, 0].tolist() == [1, 2, 1, 2, 1]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": 2.0}, TypeError, "batch_size"),
        ({"batch_size": 2, "start_step": -1}, ValueError, "start_step"),
        ({"batch_size": 2, "start_step": 4}, ValueError, "start_step=4"),
    ],
)
def test_iterate_batches_rejects_bad_arguments(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        next(data.iterate_batches(_split(5), shuffle=False, **kwargs))


def test_repeat_on_empty_split_raises() -> None:
    empty = data.Split(np.zeros((0, 2), np.int32), np.zeros((0, 2), bool), np.zeros(0, np.int32))
    assert list(data.iterate_batches(empty, 2, shuffle=False)) == []
    with pytest.raises(ValueError, match="N=0"):
        next(data.iterate_batches(empty, 2, shuffle=False, repeat=True))


def test_majority_baseline() -> None:
    assert data.majority_baseline(_split(7)) == pytest.approx(3 / 7)  # labels 0,1,2,0,1,2,0
    empty = data.Split(np.zeros((0, 2), np.int32), np.zeros((0, 2), bool), np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="empty"):
        data.majority_baseline(empty)


@pytest.mark.parametrize(
    "inputs, mask, labels, error, match",
    [
        (np.zeros((2, 3), np.int64), np.ones((2, 3), bool), np.zeros(2, np.int32), TypeError,
         "inputs"),
        (np.zeros((2, 3), np.int32), np.ones((2, 4), bool), np.zeros(2, np.int32), ValueError,
         "mask shape"),
        (np.zeros((2, 3), np.int32), np.ones((2, 3), bool), np.zeros(3, np.int32), ValueError,
         "labels shape"),
        (np.zeros((2, 3), np.int32), np.ones((2, 3), bool), -np.ones(2, np.int32), ValueError,
         ">= 0"),
        (np.zeros(3, np.int32), np.ones(3, bool), np.zeros(3, np.int32), ValueError, r"\[N, L\]"),
    ],
)
def test_split_validates(inputs, mask, labels, error, match) -> None:
    with pytest.raises(error, match=match):
        data.Split(inputs, mask, labels)


def test_task_checks_shapes_against_metadata() -> None:
    s = _split(2, length=4)
    with pytest.raises(ValueError, match="max_length=5"):
        data.Task("x", 10, 3, 5, False, {"train": s, "validation": s, "test": s})
    with pytest.raises(ValueError, match="keys"):
        data.Task("x", 10, 3, 4, False, {"train": s, "test": s})


def test_load_task_rejects_unknown_option_and_task(tmp_path) -> None:
    assert data.TASKS == ("listops", "text", "retrieval", "image", "pathfinder", "pathx",
                          "bytes_lm", "bytes_docs", "mqar")
    with pytest.raises(TypeError, match="unknown option.*max_len\\b.*allowed: max_length"):
        data.load_task("listops", tmp_path, max_len=10)
    with pytest.raises(ValueError, match="unknown task 'lisops'"):
        data.load_task("lisops", tmp_path)
    assert data.task_options("pathx")["resolution"] == 128
    assert data.task_options("text") == {"max_length": 4000, "val_fraction": 0.1, "seed": 0}


def test_registry_titles_and_generation_hook(tmp_path) -> None:
    assert data.TASKS == tuple(data.TITLES) and data.TITLES["pathx"] == "Path-X"
    assert data.get_task_spec("listops").generate is data.listops_generator.generate
    with pytest.raises(ValueError, match=r"data.generate is set but task 'text' has no "
                                         r"generator \(tasks with one: listops\)"):
        data.prepare_data("text", tmp_path, {"num_train": 4}, label="data.generate")
    assert data.prepare_data("text", tmp_path, None) is False
    # Files that were not generated here (a downloaded release) are used as they are.
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n")
    lines: list[str] = []
    assert data.prepare_data("listops", tmp_path, {"num_train": 4}, log=lines.append) is False
    assert lines == [f"Using the ListOps files already in {tmp_path}; settings is not used."]
