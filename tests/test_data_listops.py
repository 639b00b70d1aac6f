"""ListOps: evaluator, tokenizer, generator and release-format reader."""

from __future__ import annotations

import csv

import chex
import numpy as np
import pytest

from spectral_jax.lra import data
from spectral_jax.lra.data import listops, listops_generator


@pytest.mark.parametrize(
    "expr, value",
    [
        ("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]", 5),  # the example
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # release (parenthesised) form
        ("[SM 7 8 9 ]", 4),  # 24 mod 10
        ("[MED 1 2 3 8 ]", 2),  # even count: int((2 + 3) / 2)
        ("[MED 9 8 ]", 8),  # int(8.5)
        ("[MIN [MAX 1 7 ] [SM 5 5 ] 3 ]", 0),
        ("[MED [MIN 9 9 ] [MAX 0 1 ] 4 ]", 4),
        ("7", 7),
    ],
)
def test_evaluate_hand_worked(expr: str, value: int) -> None:
    assert listops_generator.evaluate(expr) == value


@pytest.mark.parametrize("expr", ["[MAX 1 2", "[MAX ]", "[MAX 1 2 ] 3", "[FOO 1 ]", ""])
def test_evaluate_rejects_malformed(expr: str) -> None:
    with pytest.raises(ValueError, match="evaluate"):
        listops_generator.evaluate(expr)


def test_tokenize_keeps_closing_bracket_and_ids_are_fixed() -> None:
    src = "( ( ( [MAX 2 ) ( ( ( [SM 1 ) 0 ) ] ) ) ] )"
    assert listops.tokenize(src) == ["[MAX", "2", "[SM", "1", "0", "]", "]"]
    # Hard-coded ids: they must not depend on the process (LRA's came from a set).
    assert listops.encode(src).tolist() == [2, 8, 4, 7, 6, 5, 5]
    assert listops.VOCAB_SIZE == 17 and listops.PAD_ID == 0 and listops.UNK_ID == 16


def _read_rows(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f, delimiter="\t"))


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("listops")
    stats = listops_generator.generate(out, num_train=300, num_val=50, num_test=50, seed=3,
                             min_length=20, max_length=200)
    return out, stats


def test_generator_labels_match_evaluator_and_lengths_in_bounds(quick) -> None:
    out, stats = quick
    assert (stats["train"], stats["validation"], stats["test"]) == (300, 50, 50)
    assert stats["truncated"] == 0 and 20 < stats["min_tokens"] <= stats["max_tokens"] < 200
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        rows = _read_rows(out / name)
        assert rows[0] == ["Source", "Target"]
        for source, target in rows[1:]:
            assert listops_generator.evaluate(source) == int(target)
            assert 20 < len(listops.tokenize(source)) < 200
            assert source.startswith("(")  # release form: parenthesised


def test_generator_release_format_is_lra_parenthesisation(tmp_path) -> None:
    # Depth 2, 2 arguments: exactly 4 * 10 * 10 distinct trees, so all of them appear.
    listops_generator.generate(tmp_path, num_train=398, num_val=1, num_test=1, seed=0, min_length=3,
                     max_length=5, max_depth=2, max_args=2)
    sources = set()
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        sources |= {row[0] for row in _read_rows(tmp_path / name)[1:]}
    assert len(sources) == 400
    # LRA's to_string of the curried tree ((('[MAX', 2), 9), ']') is this exact string.
    assert "( ( ( [MAX 2 ) 9 ) ] )" in sources
    assert all(s.count("(") == s.count(")") == 3 for s in sources)


def test_generator_same_seed_same_bytes_and_disjoint_splits(quick, tmp_path) -> None:
    out, _ = quick
    listops_generator.generate(tmp_path, num_train=300, num_val=50, num_test=50, seed=3,
                     min_length=20, max_length=200)
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        assert (out / name).read_bytes() == (tmp_path / name).read_bytes()
    sets = [{r[0] for r in _read_rows(out / n)[1:]}
            for n in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")]
    assert [len(s) for s in sets] == [300, 50, 50]  # no duplicates inside a split
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])


def test_generator_other_seed_differs(quick, tmp_path) -> None:
    out, _ = quick
    listops_generator.generate(tmp_path, num_train=300, num_val=50, num_test=50, seed=4,
                     min_length=20, max_length=200)
    assert (out / "basic_train.tsv").read_bytes() != (tmp_path / "basic_train.tsv").read_bytes()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_length": 50, "max_length": 50}, "min_length"),
        ({"min_length": 100, "max_depth": 2, "max_args": 3}, "unreachable"),
        ({"max_args": 1}, "max_args"),
        ({"num_train": 0}, "num_train"),
        ({"seed": -1}, "seed"),
    ],
)
def test_generator_rejects_bad_arguments(tmp_path, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        listops_generator.generate(tmp_path, **kwargs)


def test_generator_reports_too_few_distinct_trees(tmp_path) -> None:
    # Only the 10 single digits have fewer than 2 tokens.
    with pytest.raises(ValueError, match="distinct trees"):
        listops_generator.generate(tmp_path, num_train=20, num_val=1, num_test=1, min_length=0,
                         max_length=2, max_depth=2)


def _write_release(folder, rows: dict[str, list[tuple[str, str]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "basic_train.tsv"), ("val", "basic_val.tsv"),
                        ("test", "basic_test.tsv")):
        # The release was written by csv.writer: tab-separated, "\r\n" line ends.
        body = "".join(f"{s}\t{t}\r\n" for s, t in rows[split])
        (folder / name).write_text("Source\tTarget\r\n" + body, encoding="utf-8", newline="")


RELEASE = {
    "train": [("( ( ( [MAX 2 ) 9 ) ] )", "9"),
              ("( ( ( ( [SM 5 ) ( ( ( [MIN 3 ) 4 ) ] ) ) 8 ) ] )", "6")],
    "val": [("( ( ( [MED 1 ) 7 ) ] )", "4")],
    "test": [("( ( ( [MIN 0 ) 3 ) ] )", "0")],
}


def test_reader_round_trips_release_tsv(tmp_path) -> None:
    _write_release(tmp_path / "listops-1000", RELEASE)
    task = data.load_task("listops", tmp_path, max_length=10)
    assert (task.vocab_size, task.num_classes, task.max_length, task.dual) == (17, 10, 10, False)
    train = task.splits["train"]
    chex.assert_shape(train.inputs, (2, 10))
    assert train.inputs[1].tolist() == [4, 11, 1, 9, 10, 5, 14, 5, 0, 0]
    assert train.mask[1].tolist() == [True] * 8 + [False] * 2
    assert train.labels.tolist() == [9, 6]
    assert task.splits["validation"].labels.tolist() == [4]
    assert dict(task.truncated) == {"train": 0, "validation": 0, "test": 0}


def test_reader_counts_truncations(tmp_path) -> None:
    _write_release(tmp_path, RELEASE)
    task = data.load_task("listops", tmp_path, max_length=4)
    assert task.truncated["train"] == 1  # only the 8-token row is longer than 4
    assert task.splits["train"].inputs[1].tolist() == [4, 11, 1, 9]


@pytest.mark.parametrize(
    "bad_line, match",
    [
        ("( ( ( [MAX 2 ) 9 ) ] )\t9\textra", r"basic_val\.tsv:3: expected 2"),
        ("( ( ( [MAX 2 ) 9 ) ] )", r"basic_val\.tsv:3: expected 2"),
        ("( ( ( [MAX 2 ) 9 ) ] )\t12", r"basic_val\.tsv:3: Target"),
        ("( ( ( [MAXX 2 ) 9 ) ] )\t9", r"basic_val\.tsv:3: unknown ListOps token '\[MAXX'"),
        ("( )\t9", r"basic_val\.tsv:3: empty"),
    ],
)
def test_reader_names_file_and_line_of_bad_row(tmp_path, bad_line, match) -> None:
    _write_release(tmp_path, RELEASE)
    path = tmp_path / "basic_val.tsv"
    path.write_text(path.read_text() + bad_line + "\n")
    with pytest.raises(ValueError, match=match):
        data.load_task("listops", tmp_path)


def test_reader_bad_header(tmp_path) -> None:
    _write_release(tmp_path, RELEASE)
    (tmp_path / "basic_test.tsv").write_text("src\ttgt\n( ( ( [MIN 0 ) 3 ) ] )\t0\n")
    with pytest.raises(ValueError, match=r"basic_test\.tsv:1: expected the header"):
        data.load_task("listops", tmp_path)


def test_reader_missing_files_say_how_to_generate(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="spectral-jax data listops --out"):
        data.load_task("listops", tmp_path)
    _write_release(tmp_path, RELEASE)
    (tmp_path / "basic_test.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"basic_test\.tsv"):
        data.load_task("listops", tmp_path)


def test_generated_data_loads_and_stays_within_max_length(quick) -> None:
    out, _ = quick
    task = data.load_task("listops", out, max_length=200)
    assert [len(s) for s in task.splits.values()] == [300, 50, 50]
    assert all(v == 0 for v in task.truncated.values())
    for split in task.splits.values():
        lengths = split.mask.sum(1)
        assert lengths.min() > 20 and lengths.max() < 200
        # The mask is exactly the non-pad positions (ListOps has no id-0 token).
        np.testing.assert_array_equal(split.mask, split.inputs > 0)


def test_reader_accepts_a_byte_order_mark_and_blank_lines(tmp_path) -> None:
    path = tmp_path / "basic_val.tsv"
    path.write_bytes(b"\xef\xbb\xbfSource\tTarget\n( ( [MAX 2 ) 9 ] )\t9\n\n[MIN 3 4 ]\t3\n\n")
    ids, labels = listops.read_tsv(path)
    assert labels.tolist() == [9, 3] and len(ids) == 2
