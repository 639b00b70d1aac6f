"""The reference accuracies of `benchmarks/lra_listops/`: first operator, token frequencies, the
depth-D readers and the per-bucket accuracy of a run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from spectral_jax.lra.data.listops import SPLIT_FILES

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str = "first_operator_baseline"):
    path = ROOT / f"benchmarks/lra_listops/{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, rows: list[tuple[str, int]]) -> None:
    path.write_text("Source\tTarget\n" + "".join(f"{s}\t{t}\n" for s, t in rows))


def test_first_operator_rule_and_scores(tmp_path, capsys):
    # Training: MAX -> 9 three times and 8 once, MIN -> 0 twice; majority label 9.
    train = [("( [MAX 9 3 ] )", 9), ("( [MAX 9 1 ] )", 9), ("( [MAX 8 2 ] )", 8),
             ("( [MIN 0 4 ] )", 0), ("( [MIN 0 5 ] )", 0), ("( [MAX 9 0 ] )", 9)]
    held_out = [("( [MAX 7 2 ] )", 7), ("( [MIN 0 1 ] )", 0), ("( [MAX 9 9 ] )", 9),
                ("( [SM 1 2 ] )", 3)]  # SM unseen in training: falls back to the majority 9
    _write(tmp_path / SPLIT_FILES["train"], train)
    for split in ("validation", "test"):
        _write(tmp_path / SPLIT_FILES[split], held_out)
    script = _load_script()
    rule, majority = script.first_operator_rule(tmp_path, None)
    assert majority == 9
    assert sorted(rule.values()) == [0, 9]  # one entry per first token: the MAX and MIN ids
    # Only the first 3 training rows: MIN never seen, so only MAX's rule exists.
    assert list(script.first_operator_rule(tmp_path, 3)[0].values()) == [9]

    argv, sys.argv = sys.argv, ["first_operator_baseline.py", str(tmp_path)]
    try:
        script.main()
    finally:
        sys.argv = argv
    lines = capsys.readouterr().out.splitlines()
    # Majority 9 is right on 1 of 4 held-out rows; the rule on 2 (MIN -> 0, MAX 9 9 -> 9).
    assert len(lines) == 2
    for line in lines:
        assert "training majority label 25.00%" in line and "first operator 50.00%" in line


def test_token_frequency_baseline_sees_counts_not_positions(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)

    def expression(major: str, minor: str) -> str:
        n_major = int(rng.integers(3, 8))
        n_minor = int(rng.integers(0, n_major))
        args = [major] * n_major + [minor] * n_minor
        rng.shuffle(args)
        return "( [MAX " + " ".join(args) + " ] )"

    # The label is whichever of 9 and 0 occurs more often: token shares decide it.
    rows = [(expression("9", "0"), 9) if i % 2 else (expression("0", "9"), 0)
            for i in range(160)]
    _write(tmp_path / SPLIT_FILES["train"], rows[:120])
    for split in ("validation", "test"):
        _write(tmp_path / SPLIT_FILES[split], rows[120:])
    argv, sys.argv = sys.argv, ["token_frequency_baseline.py", str(tmp_path), "--steps", "200"]
    try:
        _load_script("token_frequency_baseline").main()
    finally:
        sys.argv = argv
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["softmax", "MLP,"]
    for line in lines:
        assert "validation 100.00%" in line and "test 100.00%" in line

    # Same tokens in a different order: the features are identical, so the fitted classifier
    # predicts one label for all, whatever the label's dependence on the first position.
    script = _load_script("token_frequency_baseline")
    ids = [np.array([3, 5, 5, 7]), np.array([5, 3, 7, 5]), np.array([7, 5, 3, 5])] * 10
    labels = np.array([0, 1, 2] * 10)
    x = script.features(ids, 17)
    assert np.ptp(x, axis=0).max() == 0.0
    predict = script.fit(x, labels, hidden=0, steps=50, learning_rate=0.05)
    assert len(set(predict(x).tolist())) == 1
    assert np.mean(predict(x) == labels) <= 1 / 3 + 1e-9


def test_depth_reader_evaluates_the_top_levels_and_guesses_below(tmp_path, capsys):
    script = _load_script("depth_baseline")
    guess = {"[MAX": 9, "[MIN": 0, "[MED": 4, "[SM": 2}
    # MAX(1, MIN(7, SM(5, 6)), 3): exact value 3 (MIN(7, 1) = 1; MAX(1, 1, 3) = 3).
    tree, end = script.parse("[MAX 1 [MIN 7 [SM 5 6 ] ] 3 ]".split())
    assert end == 11 and script.value(tree) == 3
    assert script.read_to_depth(tree, 0, guess) == 9  # the root operator's guess
    assert script.read_to_depth(tree, 1, guess) == 3  # MAX(1, guess MIN = 0, 3)
    assert script.read_to_depth(tree, 2, guess) == 3  # MAX(1, MIN(7, guess SM = 2), 3)
    assert script.read_to_depth(tree, 3, guess) == 3  # exact
    # The guesses come from every node of an operator in training: MIN's nodes are 0, 0, 2.
    train = [("( [MIN 0 4 ] )", 0), ("( [MAX [MIN 0 1 ] 9 ] )", 9),
             ("( [MAX [MIN 2 3 ] 9 ] )", 9)]
    held_out = [("( [MAX 4 [MIN 3 8 ] ] )", 4), ("( [MIN 5 [MAX 6 7 ] ] )", 5)]
    _write(tmp_path / SPLIT_FILES["train"], train)
    for split in ("validation", "test"):
        _write(tmp_path / SPLIT_FILES[split], held_out)
    argv, sys.argv = sys.argv, ["depth_baseline.py", str(tmp_path), "--depths", "0", "1", "2"]
    try:
        script.main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out.splitlines()
    # MED and SM have no node in training: the most frequent value of all nodes, 0.
    assert "{'[MIN': 0, '[MAX': 9, '[MED': 0, '[SM': 0}" in out[0]
    # Depth 0: MAX -> 9 (wrong, 4), MIN -> 0 (wrong, 5). Depth 1: MAX(4, 0) = 4 right,
    # MIN(5, 9) = 5 right. Depth 2: exact.
    for line in out[1:]:
        assert "depth 0: 0.00%" in line and "depth 1: 100.00%" in line
        assert "depth 2: 100.00%" in line


def test_fewest_levels_buckets_each_expression_by_the_reader_it_needs():
    script = _load_script("accuracy_by_depth")
    guess = {"[MAX": 9, "[MIN": 0, "[MED": 4, "[SM": 2}
    sources = ["[MAX 9 1 ]", "[MAX 1 [MIN 7 [SM 5 6 ] ] 3 ]", "[MIN 5 [MAX 6 [SM 7 8 ] ] ]"]
    trees = [script.depth_baseline.parse(s.split())[0] for s in sources]
    labels = np.array([script.depth_baseline.value(t) for t in trees])  # 9, 3, 5
    # 9: the root's guess is right; 3: MAX(1, guess 0, 3) = 3; 5: MIN(5, guess 9) = 5.
    np.testing.assert_array_equal(script.fewest_levels(trees, labels, guess), [0, 1, 1])
    deep = script.depth_baseline.parse("[SM 4 [MAX 6 [SM 7 8 ] ] ]".split())[0]
    # SM(4, MAX(6, 5)) = 0; level 0 guesses 2, level 1 SM(4, 9) = 3, level 2 SM(4, MAX(6, 2))
    # = 0.
    assert script.fewest_levels([deep], np.array([0]), guess).tolist() == [2]
