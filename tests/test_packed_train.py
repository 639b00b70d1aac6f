"""Packed training (task bytes_docs): Split's per-token arrays and their batches, and the
trainer on packed and padded rows of the same documents."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax import UnsupportedError, UsageError
from spectral_jax.lra.data import bytes_docs
from spectral_jax.lra.data.batching import iterate_batches
from spectral_jax.lra.data.task import IGNORE_INDEX, Split
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.objectives import token_target_metrics
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.nn import CausalLM, TransformerConfig

TEXT = b"".join(b"paragraph %d: " % i + b"the quick brown fox " * (i % 5 + 1) + b"\n\n"
                for i in range(60))


def test_a_split_takes_segment_ids_and_positions_together_and_batches_them():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    ids = np.array([[1, 1, 2, 0]] * 3, np.int32)
    with pytest.raises(UsageError, match="segment_ids and Split.positions go together"):
        Split(x, x > 0, np.zeros(3, np.int32), segment_ids=ids)
    with pytest.raises(UsageError, match=r"Split.positions shape \(3, 3\) must be the shape"):
        Split(x, x > 0, np.zeros(3, np.int32), segment_ids=ids, positions=ids[:, :3])
    split = Split(x, x > 0, np.zeros(3, np.int32), targets=x, segment_ids=ids,
                  positions=ids - 1)
    batch = list(iterate_batches(split, 2, shuffle=False))[1]  # one real row, one padding
    np.testing.assert_array_equal(batch["segment_ids"], [[1, 1, 2, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batch["positions"][1], 0)
    np.testing.assert_array_equal(batch["targets"][1], IGNORE_INDEX)


def test_packed_and_padded_rows_hold_the_same_targets(tmp_path):
    (tmp_path / "a.txt").write_bytes(TEXT)
    tasks = {packed: bytes_docs.load(tmp_path, context_length=32, heldout_fraction=0.1,
                                     packed=packed) for packed in (True, False)}
    for name in ("train", "test"):
        packed, padded = (tasks[p].splits[name] for p in (True, False))
        assert len(packed) < len(padded)
        assert packed.mask.mean() > padded.mask.mean()
        # The same multiset of (input, target) pairs, one per scored position.
        pairs = [sorted(zip(s.inputs[s.mask].tolist(), s.targets[s.mask].tolist()))
                 for s in (packed, padded)]
        assert pairs[0] == pairs[1]
        assert padded.segment_ids is None and packed.segment_ids is not None


def _config(data_dir, *extra: str, attention: str = "linear"):
    return load_config(f"lm/bytes_docs:quick,attention={attention}", [
        f"data.dir={data_dir}", "data.options.context_length=32", "model.max_length=32",
        "data.options.heldout_fraction=0.1", "train.steps=4", "train.batch_size=8",
        "train.eval_every=2", "train.log_every=1", "train.schedule.warmup_steps=1",
        "model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
        *extra])


@pytest.mark.parametrize("attention", ["softmax", "gla"])
def test_the_objective_sums_equal_on_packed_and_padded_rows(tmp_path, attention):
    # One model scores the same documents packed and one per row: every sum the trainer
    # logs and evaluates (loss, correct, count) is the same, so packing changes throughput
    # only.
    (tmp_path / "a.txt").write_bytes(TEXT)
    config = TransformerConfig(vocab_size=257, num_classes=257, max_length=32, num_layers=1,
                               embed_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                               is_causal=True, attention=attention, positional="rope",
                               dropout_rate=0.0)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    sums = {}
    for packed in (True, False):
        split = bytes_docs.load(tmp_path, context_length=32, heldout_fraction=0.1,
                                packed=packed).splits["train"]
        totals = np.zeros(3)
        for batch in iterate_batches(split, 16, shuffle=False):
            _, out = token_target_metrics(model, jax.tree.map(jnp.asarray, batch), True)
            totals += [float(out[k]) for k in ("loss_sum", "correct", "count")]
        sums[packed] = totals
    assert sums[True][2] == sums[False][2] > 100
    np.testing.assert_allclose(sums[True], sums[False], rtol=2e-5)


def test_the_trainer_trains_packed_rows(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_bytes(TEXT)
    results = train_and_evaluate(_config(tmp_path / "c"), str(tmp_path / "r"))
    assert "paragraphs packed" in results["data_source"]
    # Four steps from a loss above 6 nats already beat the uniform guess over 257 bytes.
    assert results["test_loss"] < np.log(257)
    assert results["tokens_per_s"] > 0


def test_a_method_that_mixes_documents_cannot_train_packed(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_bytes(TEXT)
    with pytest.raises(UnsupportedError, match="Functions that take segment ids"):
        train_and_evaluate(_config(tmp_path / "c", attention="gated_linear"),
                           str(tmp_path / "r"))
