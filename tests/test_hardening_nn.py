"""Issue 15 (items 1 and 12): masks of every rank with the conv skip; Flax call defaults."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from spectral_jax.nn import (
    DualEncoderClassifier,
    MultiHeadAttention,
    SequenceClassifier,
    TransformerConfig,
)


@pytest.mark.parametrize("method", ["nystrom", "spectral_shift"])
def test_conv_skip_takes_a_1d_mask(method):
    # The input: a 1-D key padding mask used to fail in the conv skip.
    layer = MultiHeadAttention(2, 16, attention=method,
                               attention_kwargs={"num_landmarks": 4, "conv_kernel_size": 3},
                               rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 12, 16))
    mask = jnp.arange(12) < 9
    chex.assert_trees_all_close(layer(x, mask=mask, deterministic=True),
                                layer(x, mask=mask[None, None, None], deterministic=True),
                                atol=1e-6)


def test_conv_skip_masks_every_rank_alike():
    skip = MultiHeadAttention(2, 16, attention="nystrom",
                              attention_kwargs={"conv_kernel_size": 3},
                              rngs=nnx.Rngs(0)).conv_skip
    value = jax.random.normal(jax.random.key(0), (2, 12, 2, 8))
    mask = jnp.arange(12) < 9
    expected = skip(value * mask[:, None, None], None, 12)  # padded values zeroed by hand
    for ranked in (mask, mask[None], mask[None, None], mask[None, None, None],
                   mask[:, None] & mask[None, :]):
        chex.assert_trees_all_close(skip(value, ranked, 12), expected, atol=1e-6)
    # Per-example and per-head rows: each row is masked by its own keys.
    rows = jnp.stack([mask, jnp.arange(12) < 12])[:, None, None]  # (batch, 1, 1, kv)
    chex.assert_trees_all_close(skip(value, rows, 12)[0], expected[0], atol=1e-6)
    chex.assert_trees_all_close(skip(value, rows, 12)[1], skip(value, None, 12)[1], atol=1e-6)
    heads = jnp.stack([mask, jnp.arange(12) < 12])[None, :, None]  # (1, heads, 1, kv)
    chex.assert_trees_all_close(skip(value, heads, 12)[:, :, 0], expected[:, :, 0], atol=1e-6)
    chex.assert_trees_all_close(skip(value, heads, 12)[:, :, 1],
                                skip(value, None, 12)[:, :, 1], atol=1e-6)


def test_deterministic_needed_only_when_random():
    x = jax.random.normal(jax.random.key(1), (1, 6, 8))
    plain = MultiHeadAttention(2, 8, attention="linear", rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(plain(x), plain(x, deterministic=True))
    for kwargs in ({"attention": "softmax", "dropout_rate": 0.1},
                   {"attention": "skyformer", "attention_kwargs": {"num_landmarks": 2}}):
        layer = MultiHeadAttention(2, 8, rngs=nnx.Rngs(0), **kwargs)
        with pytest.raises(ValueError, match="deterministic must be given"):
            layer(x)
    layer.deterministic = True  # the constructor's (or model.eval()'s) value counts
    chex.assert_shape(layer(x), (1, 6, 8))


def test_classifiers_derive_the_mask_from_the_padding_id():
    config = TransformerConfig(vocab_size=10, num_classes=3, max_length=8, dropout_rate=0.0,
                               embed_dim=8, qkv_dim=8, mlp_dim=8, num_layers=1)
    tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]])
    model = SequenceClassifier(config, rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(model(tokens), model(tokens, tokens > 0, deterministic=True))
    dual = DualEncoderClassifier(config, rngs=nnx.Rngs(0))
    pairs = jnp.stack([tokens, tokens[::-1]], axis=1)
    chex.assert_trees_all_equal(dual(pairs), dual(pairs, pairs > 0, deterministic=True))
    with pytest.raises(ValueError, match="deterministic must be given.*dropout_rate=0.1"):
        SequenceClassifier(TransformerConfig(vocab_size=10, num_classes=3, max_length=8),
                           rngs=nnx.Rngs(0))(tokens)
