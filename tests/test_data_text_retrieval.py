"""Byte-level readers: IMDB (aclImdb tree) and AAN retrieval (headerless 5-column TSV)."""

from __future__ import annotations

import chex
import numpy as np
import pytest

from spectral_jax.lra import data
from spectral_jax.lra.data import retrieval

REVIEWS = {
    ("train", "pos"): ["Great film.", "Loved it <br />", "\u00e9t\u00e9 ok", "Fine", "Yes!"],
    ("train", "neg"): ["Bad.", "Awful film", "No", "Meh", "Worst ever"],
    ("test", "pos"): ["Nice"],
    ("test", "neg"): ["Dull", "Boring"],
}


def _write_imdb(root) -> None:
    for (split, label), texts in REVIEWS.items():
        folder = root / "aclImdb" / split / label
        folder.mkdir(parents=True)
        for i, t in enumerate(texts):
            (folder / f"{i}_{7 if label == 'pos' else 2}.txt").write_bytes(t.encode("utf-8"))
    (root / "aclImdb" / "train" / "unsup").mkdir()  # ignored, as in LRA


def test_imdb_round_trip_bytes_plus_one(tmp_path) -> None:
    _write_imdb(tmp_path)
    task = data.load_task("text", tmp_path, max_length=12, val_fraction=0.2, seed=0)
    assert (task.vocab_size, task.num_classes, task.max_length) == (257, 2, 12)
    test = task.splits["test"]
    chex.assert_shape(test.inputs, (3, 12))
    # neg files first (sorted by name), then pos; ids = UTF-8 byte + 1.
    assert test.labels.tolist() == [0, 0, 1]
    assert test.inputs[0].tolist() == [ord(c) + 1 for c in "Dull"] + [0] * 8
    assert test.mask[0].tolist() == [True] * 4 + [False] * 8
    # Non-ASCII: "\u00e9" is the two bytes 0xC3 0xA9.
    train_all = np.concatenate([task.splits["train"].inputs, task.splits["validation"].inputs])
    assert any(row[:2].tolist() == [0xC3 + 1, 0xA9 + 1] for row in train_all)


def test_imdb_validation_is_seeded_disjoint_slice_of_train(tmp_path) -> None:
    _write_imdb(tmp_path)
    a = data.load_task("text", tmp_path, max_length=16, val_fraction=0.2, seed=0)
    b = data.load_task("text", tmp_path, max_length=16, val_fraction=0.2, seed=0)
    c = data.load_task("text", tmp_path, max_length=16, val_fraction=0.2, seed=1)
    assert len(a.splits["train"]) == 8 and len(a.splits["validation"]) == 2
    chex.assert_trees_all_equal(a.splits["validation"].inputs, b.splits["validation"].inputs)
    rows = lambda s: {r.tobytes() for r in s.inputs}  # noqa: E731
    assert not rows(a.splits["train"]) & rows(a.splits["validation"])
    assert rows(a.splits["train"]) | rows(a.splits["validation"]) == rows(c.splits["train"]) | rows(
        c.splits["validation"])
    assert rows(a.splits["validation"]) != rows(c.splits["validation"])


def test_imdb_truncation_counted(tmp_path) -> None:
    _write_imdb(tmp_path)
    task = data.load_task("text", tmp_path, max_length=4, val_fraction=0.0)
    assert task.truncated["test"] == 1  # only "Boring" is longer than 4 bytes
    assert task.truncated["train"] == 5  # 3 pos + 2 neg reviews longer than 4 bytes
    assert len(task.splits["validation"]) == 0


def test_imdb_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="aclImdb"):
        data.load_task("text", tmp_path)
    _write_imdb(tmp_path)
    (tmp_path / "aclImdb" / "test" / "pos" / "9_9.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty review file .*9_9\.txt"):
        data.load_task("text", tmp_path)
    with pytest.raises(ValueError, match="val_fraction"):
        data.load_task("text", tmp_path, val_fraction=1.0)


AAN = {
    "train": [b"1\tP1\tP2\tGraph parsing.\tA parser.", b"0\tP3\tP4\tSpeech\tVision"],
    "eval": [b"0.0\tP5\tP6\tabc\tdefgh"],
    "test": [b"1.0\tP7\tP8\tx y\tz"],
}


def _write_aan(folder, rows=AAN) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in rows.items():
        (folder / f"new_aan_pairs.{split}.tsv").write_bytes(b"".join(x + b"\n" for x in lines))


def test_aan_round_trip_dual_inputs(tmp_path) -> None:
    _write_aan(tmp_path / "tsv_data")
    task = data.load_task("retrieval", tmp_path, max_length=6)
    assert task.dual and (task.vocab_size, task.num_classes, task.max_length) == (257, 2, 6)
    ev = task.splits["validation"]
    chex.assert_shape([ev.inputs, ev.mask], (1, 2, 6))
    assert ev.inputs[0, 0].tolist() == [98, 99, 100, 0, 0, 0]
    assert ev.inputs[0, 1].tolist() == [101, 102, 103, 104, 105, 0]
    assert ev.mask[0].sum(1).tolist() == [3, 5]
    assert task.splits["train"].labels.tolist() == [1, 0]
    assert task.splits["test"].labels.tolist() == [1]
    assert task.truncated["train"] == 2  # "Graph parsing." and "A parser." are > 6 bytes


@pytest.mark.parametrize(
    "line, match",
    [
        (b"1\tP9\tP10\tonly four", r"new_aan_pairs\.test\.tsv:2: expected 5"),
        (b"2\tP9\tP10\ta\tb", r"new_aan_pairs\.test\.tsv:2: label must be 0 or 1"),
        (b"yes\tP9\tP10\ta\tb", r"new_aan_pairs\.test\.tsv:2: label"),
        (b"1\tP9\tP10\t\tb", r"new_aan_pairs\.test\.tsv:2: text1 and text2"),
    ],
)
def test_aan_bad_row_names_file_and_line(tmp_path, line, match) -> None:
    _write_aan(tmp_path, {**AAN, "test": AAN["test"] + [line]})
    with pytest.raises(ValueError, match=match):
        data.load_task("retrieval", tmp_path)


def test_aan_missing_split_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="tsv_data"):
        data.load_task("retrieval", tmp_path)
    _write_aan(tmp_path)
    (tmp_path / "new_aan_pairs.eval.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"new_aan_pairs\.eval\.tsv"):
        retrieval.load(tmp_path)


def test_aan_reader_accepts_a_byte_order_mark_and_blank_lines(tmp_path) -> None:
    path = tmp_path / "new_aan_pairs.eval.tsv"
    path.write_bytes(b"\xef\xbb\xbf1\ta\tb\tab\tc\n\n0\tc\td\tx\tyz\n\n")
    first, second, labels = retrieval.read_tsv(path)
    assert labels.tolist() == [1, 0]
    assert [f.tolist() for f in first] == [[98, 99], [121]]
    assert [s.tolist() for s in second] == [[100], [122, 123]]
