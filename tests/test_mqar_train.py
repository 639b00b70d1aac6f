"""MQAR through the trainer: the metric counts answer positions only, and a tiny run of
`spectral-jax train --config lm/mqar:...` trains a causal model and reports answer accuracy."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.lra import data
from spectral_jax.lra.cli import main
from spectral_jax.lra.train import objectives
from spectral_jax.lra.train.report import read_metrics

IGNORE = data.IGNORE_INDEX


class _Fixed:
    """A stand-in model whose logits put all mass on ``predict[b, t]``."""

    def __init__(self, predict: np.ndarray, vocab: int) -> None:
        self.predict, self.vocab = jnp.asarray(predict), vocab

    def __call__(self, inputs, deterministic):
        return jnp.eye(self.vocab)[self.predict] * 20.0


def _batch(split: data.Split) -> dict:
    return next(data.iterate_batches(split, len(split), shuffle=False))


def test_accuracy_counts_answer_positions_only():
    split = data.load_task("mqar", None, seq_len=32, num_kv_pairs=4, vocab_size=64,
                           num_train=6, num_val=1, num_test=1).splits["train"]
    batch = _batch(split)
    answers = split.targets != IGNORE
    # Right at every answer, wrong everywhere else: accuracy 1 over 6 * 4 answers.
    right = np.where(answers, split.targets, (split.inputs + 1) % 64)
    _, sums = objectives.token_target_metrics(_Fixed(right, 64), batch, True)
    assert (float(sums["count"]), float(sums["correct"])) == (24.0, 24.0)
    # Right at every other position (the next input token, or anything), wrong at answers:
    # accuracy 0, whatever the other positions score.
    wrong = np.where(answers, (split.targets + 1) % 64, split.inputs)
    loss, sums = objectives.token_target_metrics(_Fixed(wrong, 64), batch, True)
    assert (float(sums["count"]), float(sums["correct"])) == (24.0, 0.0) and float(loss) > 10
    # Half the answers of each row right.
    half = right.copy()
    for row in range(6):
        cols = np.flatnonzero(answers[row])[:2]
        half[row, cols] = (split.targets[row, cols] + 1) % 64
    _, sums = objectives.token_target_metrics(_Fixed(half, 64), batch, True)
    assert float(sums["correct"]) / float(sums["count"]) == 0.5
    # Padding rows (weight 0) add nothing.
    padded = next(data.iterate_batches(split, 8, shuffle=False))
    padded_right = np.concatenate([right, np.zeros((2, 32), np.int64)])
    _, sums = objectives.token_target_metrics(_Fixed(padded_right, 64), padded, True)
    assert (float(sums["count"]), float(sums["correct"]), float(sums["tokens"])) == (
        24.0, 24.0, 6 * 32.0)
    assert objectives.metrics_fn("token_targets") is objectives.token_target_metrics


_TINY = ["--config.data.options.num_train=64", "--config.data.options.num_val=16",
         "--config.data.options.num_test=24", "--config.data.options.vocab_size=128",
         "--config.train.steps=4", "--config.train.batch_size=8", "--config.train.eval_every=2",
         "--config.train.log_every=1", "--config.train.schedule.warmup_steps=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("mqar") / "run"
    code = main(["train", "--config", "lm/mqar:attention=softmax,width=16,seq_len=64",
                 "--workdir", str(run), *_TINY])
    assert code == 0
    return run


def test_cli_trains_and_reports_answer_accuracy(trained):
    results = json.loads((trained / "results.json").read_text())
    assert (results["task"], results["attention"], results["protocol"]) == (
        "mqar", "softmax", "quick")
    assert results["compiles"] == {"train": 1, "eval": 1}
    # Counts are answers: 4 per sequence at seq_len 64.
    assert results["test_examples"] == 24 * 4
    assert results["test_accuracy"] * 96 == pytest.approx(round(results["test_accuracy"] * 96))
    assert np.isfinite(results["test_loss"]) and "test_bits_per_byte" not in results
    assert results["config"]["model"]["vocab_size"] == 128
    assert results["config"]["model"]["embed_dim"] == 16
    records = read_metrics(str(trained / "metrics.jsonl"))
    val = [r for r in records if r["split"] == "validation"]
    assert [r["step"] for r in val] == [2, 4] and all(r["count"] == 16 * 4 for r in val)
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records if "accuracy" in r)


def test_generate_refuses_an_mqar_run(trained, capsys):
    assert main(["generate", "--workdir", str(trained), "--prompt", "x"]) == 2
    assert "trained task 'mqar', whose objective is 'token_targets'" in capsys.readouterr().err
