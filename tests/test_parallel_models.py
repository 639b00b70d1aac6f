"""Whole Flax models on a split sequence equal the unsplit model: loss and every gradient.

Runs on the 8 simulated CPU devices of conftest, as a (data=2, seq=4) mesh: the batch is split
over `data` and each example's sequence over `seq`; inside `split_sequence` every attention
layer calls `sequence_parallel`, and the layers around it run under XLA's partitioning.
"""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType

from spectral_jax import UsageError
from spectral_jax.nn import DualEncoderClassifier, SequenceClassifier, TransformerConfig
from spectral_jax.parallel import split_sequence

LENGTH, VOCAB = 32, 11


def _config(attention, **fields):
    return TransformerConfig(
        vocab_size=VOCAB, num_classes=3, max_length=LENGTH, num_layers=2, embed_dim=16,
        num_heads=2, qkv_dim=16, mlp_dim=16, dropout_rate=0.0, attention=attention, **fields)


def _batch(pairs: bool):
    lengths = jnp.array([32, 19, 7, 26])  # padding inside a shard, and on whole shards
    ids = jax.random.randint(jax.random.key(1), (4, LENGTH), 1, VOCAB)
    mask = jnp.arange(LENGTH)[None, :] < lengths[:, None]
    ids = jnp.where(mask, ids, 0)
    if pairs:
        ids, mask = jnp.stack([ids, ids[::-1]], 1), jnp.stack([mask, mask[::-1]], 1)
    return ids, mask, jnp.array([0, 2, 1, 2])


def _loss_and_grads(model, ids, mask, labels, split):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
        logits = nnx.merge(graphdef, params, rest)(ids, mask, deterministic=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def run(params):
        if split is None:
            return jax.value_and_grad(loss)(params)
        with split_sequence(split, batch_axis="data"):
            return jax.value_and_grad(loss)(params)

    return jax.jit(run)(params)


def test_split_sequence_needs_automatic_axes():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))  # Explicit axes by default
    with pytest.raises(UsageError, match=r"AxisType.Auto.*got axis types \('Explicit', "):
        with split_sequence(mesh, batch_axis="data"):
            pass


@pytest.mark.parametrize(("model_class", "attention", "fields"), [
    (SequenceClassifier, "nystrom",
     {"attention_kwargs": (("num_landmarks", 4), ("conv_kernel_size", 3))}),
    (SequenceClassifier, "softmax", {"pooling": "mean"}),
    (DualEncoderClassifier, "performer", {"attention_kwargs": (("num_features", 16),)}),
], ids=["nystrom-classifier", "softmax-classifier", "performer-dual-encoder"])
def test_split_sequence_model_equals_the_unsplit_model(model_class, attention, fields):
    model = model_class(_config(attention, **fields), rngs=nnx.Rngs(0))
    ids, mask, labels = _batch(model_class is DualEncoderClassifier)
    want_loss, want_grads = _loss_and_grads(model, ids, mask, labels, None)
    # Automatic axes, as the trainer's mesh: XLA partitions the layers around attention.
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)
    got_loss, got_grads = _loss_and_grads(model, ids, mask, labels, mesh)
    chex.assert_trees_all_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(got_grads, want_grads, atol=5e-5, rtol=5e-5)
    assert float(want_loss) > 0
