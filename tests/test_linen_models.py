"""spectral_jax.linen: the NNX models through nnx.bridge init and apply as Linen modules."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax import linen as sj_linen
from spectral_jax.nn import TransformerConfig

LENGTH = 12


def _config(**overrides: object) -> TransformerConfig:
    fields = dict(
        vocab_size=20, num_classes=3, max_length=LENGTH, num_layers=1, embed_dim=8,
        num_heads=2, qkv_dim=8, mlp_dim=8, dropout_rate=0.2,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def _tokens() -> tuple[jax.Array, jax.Array]:
    """Row 1 is row 0 with different content in its padded positions."""
    ids = jax.random.randint(jax.random.key(0), (1, LENGTH), 1, 20)
    valid = jnp.arange(LENGTH) < 7
    ids = jnp.concatenate([jnp.where(valid, ids, 0), ids], axis=0)
    return ids, jnp.broadcast_to(valid, ids.shape)


def test_linen_sequence_classifier_init_apply_with_performer_features():
    model = sj_linen.SequenceClassifier(
        _config(attention="performer", attention_kwargs=(("num_features", 8),))
    )
    ids, mask = _tokens()
    variables = jax.jit(model.init, static_argnames="deterministic")(
        jax.random.key(0), ids, mask, deterministic=True
    )
    assert set(variables) == {"params", "random_features"}
    layer = variables["random_features"]["model"]["encoder"]["layers"][0]
    projection = layer["attention"]["state"]
    chex.assert_shape(projection["projection"], (8, 4))
    apply = jax.jit(model.apply, static_argnames="deterministic")
    logits = apply(variables, ids, mask, deterministic=True)
    chex.assert_shape(logits, (2, 3))
    assert logits.dtype == jnp.float32
    chex.assert_trees_all_close(logits[0], logits[1], rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_equal(apply(variables, ids, mask, deterministic=True), logits)
    train = apply(variables, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert float(jnp.abs(train - logits).max()) > 1e-4
    # Without a dropout rng the bridge would reuse one fixed key every step: refused.
    with pytest.raises(ValueError,
                       match=r"deterministic=False needs the rng stream\(s\) 'dropout'"):
        apply(variables, ids, mask, deterministic=False)


def test_linen_dual_encoder_init_apply():
    model = sj_linen.DualEncoderClassifier(_config(attention="nystrom",
                                                   attention_kwargs=(("num_landmarks", 4),),
                                                   interaction="nli", pooling="cls"))
    ids, mask = _tokens()
    pairs, pair_mask = ids[:, None].repeat(2, axis=1), mask[:, None].repeat(2, axis=1)
    init = jax.jit(model.init, static_argnames="deterministic")
    variables = init(jax.random.key(0), pairs, pair_mask, deterministic=True)
    logits = jax.jit(model.apply, static_argnames="deterministic")(
        variables, pairs, pair_mask, deterministic=True
    )
    chex.assert_shape(logits, (2, 3))
    chex.assert_trees_all_close(logits[0], logits[1], rtol=1e-5, atol=1e-6)
    # Head input is [u, v, u*v, u-v] of 8-dim embeddings.
    kernel = variables["params"]["model"]["hidden"]["kernel"]
    chex.assert_shape(kernel, (32, 8))


def test_linen_multihead_attention_matches_handwritten_softmax():
    layer = sj_linen.MultiHeadAttention(2, 8, attention="softmax")
    x = jax.random.normal(jax.random.key(2), (1, 5, 8))
    variables = layer.init(jax.random.key(0), x, deterministic=True)
    out = layer.apply(variables, x, deterministic=True)
    p = jax.tree.map(np.asarray, variables["params"])
    xn = np.asarray(x, np.float64)
    q, k, v = (np.einsum("ble,ehd->blhd", xn, p[n]["kernel"]) + p[n]["bias"]
               for n in ("query", "key", "value"))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0  # head_dim 4
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum("bhqk,bkhd->bqhd", w, v)
    expected = np.einsum("bqhd,hde->bqe", y, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)


def test_linen_attention_layer_needs_rngs_only_for_randomness():
    x = jax.random.normal(jax.random.key(3), (1, 6, 8))
    for attention, rate in (("softmax", 0.5), ("skyformer", 0.0)):
        layer = sj_linen.MultiHeadAttention(2, 8, attention=attention, dropout_rate=rate,
                                            attention_kwargs=(("num_landmarks", 4),)
                                            if attention == "skyformer" else ())
        variables = layer.init(jax.random.key(0), x, deterministic=True)
        with pytest.raises(ValueError, match="needs the rng stream"):
            layer.apply(variables, x, deterministic=False)
        a = layer.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
        b = layer.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
        assert float(jnp.abs(a - b).max()) > 0, attention
    plain = sj_linen.MultiHeadAttention(2, 8, attention="linear")
    variables = plain.init(jax.random.key(0), x, deterministic=True)
    chex.assert_trees_all_close(plain.apply(variables, x, deterministic=False),
                                plain.apply(variables, x, deterministic=True))
