"""The MQAR generator (Zoology's multi-query associative recall) against a plain checker, its
task, its arguments, and the config lm/mqar.

The checker below re-derives every property from the arrays alone, one example and one
position at a time; it shares no code with `spectral_jax.lra.data.mqar`.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.lra import data
from spectral_jax.lra.data import mqar
from spectral_jax.lra.train import config_lib
from spectral_jax.lra.train.overrides import load_config

IGNORE = -100


def check_example(inputs, targets, seq_len, pairs, vocab, zero_filler=True):
    """Asserts Zoology's layout on one example; returns the query slots in pair order."""
    inputs = [int(t) for t in inputs]
    targets = [int(t) for t in targets]
    assert len(inputs) == len(targets) == seq_len
    half = vocab // 2
    value_of = {}
    for i in range(pairs):
        key, value = inputs[2 * i], inputs[2 * i + 1]
        assert 1 <= key < half, (i, key)
        assert half <= value < vocab, (i, value)
        assert key not in value_of, f"key {key} repeated"
        assert value not in value_of.values(), f"value {value} repeated"
        value_of[key] = value
    for t in range(2 * pairs):  # the context block carries no loss
        assert targets[t] == IGNORE
    answers = [t for t in range(seq_len) if targets[t] != IGNORE]
    assert len(answers) == pairs
    slot_of_pair = {}
    for t in answers:
        assert t >= 2 * pairs and (t - 2 * pairs) % 2 == 0, t
        query = inputs[t]
        assert query in value_of, f"position {t} holds {query}, not a key of the context"
        assert targets[t] == value_of[query]
        pair = list(value_of).index(query)
        assert pair not in slot_of_pair, f"key {query} queried twice"
        slot_of_pair[pair] = (t - 2 * pairs) // 2
        # The answer is not the input at its own position (the model reads the key there).
        assert inputs[t] != targets[t]
    assert sorted(slot_of_pair) == list(range(pairs))
    if zero_filler:
        for t in range(2 * pairs, seq_len):
            if t in answers:
                continue
            assert inputs[t] == 0, f"filler at {t} is {inputs[t]}"
        # Each value is in the input exactly once: right after its key, before its query
        # (so never at or after the answer's position). Random filler may repeat a value by
        # chance, as Zoology's does, unscored.
        for t in answers:
            where = [u for u in range(seq_len) if inputs[u] == targets[t]]
            key_at = inputs.index(inputs[t])
            assert where == [key_at + 1] and key_at + 1 < t
    return [slot_of_pair[i] for i in range(pairs)]


@pytest.mark.parametrize("seq_len, pairs", [(64, 4), (128, 8), (256, 16), (512, 64), (16, 4)])
def test_every_example_follows_the_layout(seq_len, pairs):
    inputs, targets = mqar.generate(40, seq_len=seq_len, num_kv_pairs=pairs, seed=3)
    assert inputs.shape == targets.shape == (40, seq_len)
    assert inputs.dtype == targets.dtype == np.int32
    for row in range(40):
        check_example(inputs[row], targets[row], seq_len, pairs, 8192)


def test_random_filler_and_small_vocabulary():
    inputs, targets = mqar.generate(50, seq_len=32, num_kv_pairs=8, vocab_size=33,
                                    random_non_queries=True, seed=1)
    for row in range(50):
        check_example(inputs[row], targets[row], 32, 8, 33, zero_filler=False)
    # Filler is drawn from the whole vocabulary (here: rarely 0).
    filler = [int(inputs[r, t]) for r in range(50) for t in range(16, 32) if targets[r, t] < 0]
    assert min(filler) >= 0 and max(filler) < 33 and len(set(filler)) > 20


def test_same_seed_same_arrays_other_seed_other_arrays():
    a = mqar.generate(300, seq_len=64, num_kv_pairs=4, seed=7)
    b = mqar.generate(300, seq_len=64, num_kv_pairs=4, seed=7)
    c = mqar.generate(300, seq_len=64, num_kv_pairs=4, seed=8)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    # More rows than one generation block (4096): still deterministic.
    big = [mqar.generate(5000, seq_len=16, num_kv_pairs=2, vocab_size=64, seed=2)[0]
           for _ in range(2)]
    np.testing.assert_array_equal(big[0], big[1])


def test_query_slots_follow_the_power_law():
    """The first pair's slot is the first weighted draw: P(slot s) = w_s / sum(w)."""
    seq_len, pairs, a, n = 64, 4, 0.01, 20000
    inputs, targets = mqar.generate(n, seq_len=seq_len, num_kv_pairs=pairs, power_a=a, seed=5)
    first_slots = []
    for row in range(n):
        key = int(inputs[row, 0])
        for t in range(2 * pairs, seq_len):
            if int(inputs[row, t]) == key:
                first_slots.append((t - 2 * pairs) // 2)
                break
    slots = (seq_len - 2 * pairs) // 2
    weights = [a * (s + 1) ** (a - 1) for s in range(slots)]
    total = sum(weights)
    for s in range(slots):
        seen = first_slots.count(s) / n
        want = weights[s] / total
        assert abs(seen - want) < 4 * (want * (1 - want) / n) ** 0.5 + 1e-3, (s, seen, want)
    # a = 1: uniform over the slots.
    inputs, _ = mqar.generate(4000, seq_len=64, num_kv_pairs=4, power_a=1.0, seed=5)
    first = [int(np.flatnonzero(inputs[r, 8:] == inputs[r, 0])[0]) // 2 for r in range(4000)]
    assert abs(np.mean(first) - (slots - 1) / 2) < 0.5


def test_task_splits_targets_and_mask():
    task = data.load_task("mqar", "/nowhere", seq_len=32, num_kv_pairs=4, vocab_size=100,
                          num_train=20, num_val=6, num_test=5, seed=4)
    assert (task.name, task.vocab_size, task.num_classes, task.max_length, task.dual) == (
        "mqar", 100, 100, 32, False)
    assert [len(task.splits[s]) for s in data.SPLIT_NAMES] == [20, 6, 5]
    for split in task.splits.values():
        assert split.targets.dtype == np.int32 and split.targets.shape == split.inputs.shape
        assert split.mask.all()
        for row in range(len(split)):
            check_example(split.inputs[row], split.targets[row], 32, 4, 100)
            first = min(t for t in range(32) if split.targets[row, t] != IGNORE)
            assert split.labels[row] == split.targets[row, first]
    # The three splits are different draws; the same options give the same task.
    assert not np.array_equal(task.splits["validation"].inputs[:5], task.splits["test"].inputs)
    again = data.load_task("mqar", "/elsewhere", seq_len=32, num_kv_pairs=4, vocab_size=100,
                           num_train=20, num_val=6, num_test=5, seed=4)
    np.testing.assert_array_equal(again.splits["test"].targets, task.splits["test"].targets)
    assert data.get_task_spec("mqar").objective == "token_targets"
    assert data.task_options("mqar")["vocab_size"] == 8192
    assert "mqar" in data.TASKS and "mqar" not in data.registry.LRA_TASKS


def test_batches_carry_targets_and_ignore_padding_rows():
    split = data.load_task("mqar", None, seq_len=16, num_kv_pairs=2, vocab_size=40, num_train=5,
                           num_val=1, num_test=1).splits["train"]
    batches = list(data.iterate_batches(split, 4, shuffle=False))
    assert [b["targets"].shape for b in batches] == [(4, 16), (4, 16)]
    np.testing.assert_array_equal(batches[0]["targets"], split.targets[:4])
    np.testing.assert_array_equal(batches[1]["targets"][0], split.targets[4])
    assert (batches[1]["targets"][1:] == IGNORE).all() and batches[1]["weight"].tolist() == [
        1.0, 0.0, 0.0, 0.0]
    plain = data.Split(split.inputs, split.mask, split.labels)
    assert "targets" not in next(data.iterate_batches(plain, 2, shuffle=False))


def test_split_checks_targets():
    inputs, targets = mqar.generate(2, seq_len=16, num_kv_pairs=2, vocab_size=40)
    mask, labels = np.ones((2, 16), bool), np.zeros(2, np.int32)
    with pytest.raises(UsageTypeError, match="Split.targets must be a numpy array of dtype "
                                             "int32"):
        data.Split(inputs, mask, labels, targets.astype(np.int64))
    with pytest.raises(UsageError, match=r"Split.targets shape \(2, 15\)"):
        data.Split(inputs, mask, labels, targets[:, :15])
    bad = targets.copy()
    bad[0, 0] = -5
    with pytest.raises(UsageError, match=r"Split.targets must be >= 0 or IGNORE_INDEX \(-100\), "
                                         r"got -5"):
        data.Split(inputs, mask, labels, bad)


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"seq_len": 63}, UsageError, "`seq_len` must be an even int >= 4; got 63"),
    ({"seq_len": 2, "num_kv_pairs": 1}, UsageError, "`seq_len` must be an even int >= 4; got 2"),
    ({"seq_len": 64.0}, UsageTypeError, "`seq_len` must be a positive int; got 64.0"),
    ({"num_kv_pairs": 17}, UsageError,
     r"`num_kv_pairs` must be an int in \[1, 16\] \(4 \* num_kv_pairs <= seq_len=64\); got 17"),
    ({"num_kv_pairs": 0}, UsageError, "`num_kv_pairs` must be a positive int; got 0"),
    ({"vocab_size": 64}, UsageError,
     r"`vocab_size` must be an int > seq_len=64 \(keys and values each take half of it\); "
     "got 64"),
    ({"power_a": 0.0}, UsageError, r"`power_a` must be a finite number in \(0, 1\]; got 0.0"),
    ({"power_a": 1.5}, UsageError, r"`power_a` must be a finite number in \(0, 1\]; got 1.5"),
    ({"random_non_queries": 1}, UsageTypeError, "`random_non_queries` must be a bool"),
    ({"seed": -1}, UsageError, "`seed` must be a non-negative int; got -1"),
])
def test_bad_arguments_name_the_argument_value_and_range(kwargs, kind, message):
    with pytest.raises(kind, match=f"^mqar: {message}"):
        mqar.generate(4, **kwargs)


def test_bad_task_options():
    with pytest.raises(UsageError, match="mqar: `num_train` must be a positive int; got 0"):
        data.load_task("mqar", None, num_train=0)
    with pytest.raises(UsageTypeError, match="unknown option.*num_pairs"):
        data.load_task("mqar", None, num_pairs=4)
    with pytest.raises(UsageError, match="mqar: `num_examples` must be a positive int; got 0"):
        mqar.generate(0)


# ---------------------------------------------------------------- the config lm/mqar


def test_config_defaults_and_arguments():
    cfg = load_config("lm/mqar")
    config_lib.validate_config(cfg)
    assert (cfg.task, cfg.protocol, cfg.model.attention, cfg.model.is_causal) == (
        "mqar", "quick", "softmax", True)
    assert (cfg.data.options.seq_len, cfg.data.options.num_kv_pairs, cfg.model.max_length,
            cfg.data.options.vocab_size) == (64, 4, 64, 8192)
    cfg = load_config("lm/mqar:attention=linear,width=128,seq_len=256",
                      ["train.optimizer.learning_rate=1e-2"])
    config_lib.validate_config(cfg)
    assert (cfg.model.embed_dim, cfg.model.qkv_dim, cfg.model.mlp_dim, cfg.model.num_layers,
            cfg.model.num_heads) == (128, 128, 256, 2, 1)
    assert (cfg.data.options.num_kv_pairs, cfg.model.max_length) == (16, 256)
    assert cfg.train.optimizer.learning_rate == 1e-2
    assert load_config("lm/mqar:seq_len=96,num_kv_pairs=24").data.options.num_kv_pairs == 24
    assert load_config("lm/mqar:seq_len=96").data.options.num_kv_pairs == 6
    # --config.model.attention re-runs get_config with the argument, keeping the others.
    cfg = load_config("lm/mqar:width=32", ["model.attention=gated_linear"])
    assert (cfg.model.attention, cfg.model.embed_dim) == ("gated_linear", 32)


@pytest.mark.parametrize("seq_len, pairs, batch", [(64, 4, 512), (128, 8, 512), (256, 16, 256),
                                                   (512, 64, 128)])
def test_small_protocol_is_zoology_figure_2(seq_len, pairs, batch):
    cfg = load_config(f"lm/mqar:protocol=small,seq_len={seq_len}")
    config_lib.validate_config(cfg)
    d, m, t = cfg.data.options, cfg.model, cfg.train
    assert (d.num_kv_pairs, d.vocab_size, d.num_train, d.num_val, d.num_test, d.power_a,
            d.random_non_queries) == (pairs, 8192, 100_000, 3000, 3000, 0.01, False)
    assert (m.num_layers, m.num_heads, m.positional, m.attention_dropout_rate,
            m.embed_init_std) == (2, 1, "learned", 0.1, 0.02)
    epoch = -(-100_000 // batch)
    assert (t.batch_size, t.steps, t.eval_every) == (batch, 64 * epoch, epoch)
    assert (t.optimizer.weight_decay, t.optimizer.b2, t.schedule.name,
            t.schedule.warmup_steps) == (0.1, 0.999, "cosine", 0)


def test_config_refuses_bad_arguments():
    with pytest.raises(UsageError, match="`num_kv_pairs` must be an int in \\[1, 16\\]"):
        load_config("lm/mqar:num_kv_pairs=20")
    with pytest.raises(UsageError, match="lm/mqar: `width` must be a positive int; got 0"):
        load_config("lm/mqar:width=0")
    with pytest.raises(UsageError, match="config argument 'heads'"):
        load_config("lm/mqar:heads=2")
    with pytest.raises(UsageError, match="attention='nystrom' has no causal form"):
        config_lib.validate_config(load_config("lm/mqar:attention=nystrom"))


def test_data_info_summarises_answers(capsys):
    from spectral_jax.lra.cli import main

    options = ["num_train=10", "num_val=3", "num_test=3", "seq_len=32", "num_kv_pairs=8"]
    assert main(["data", "info", "mqar", "--data-dir", "/dev/null",
                 *[arg for o in options for arg in ("--option", o)]]) == 0
    out = capsys.readouterr().out
    assert "task mqar: vocab 8192, classes 8192, max_length 32" in out
    assert out.count("scored positions (targets) per sequence: 8 to 8, mean 8.00") == 3
    assert "of 8192 ids occur" in out
