"""spectral_jax.nn.MultiHeadAttention: the softmax layer against numpy, causality, weight dropout,
when ``deterministic`` is needed, and configuration errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from layer_cases import B, D, E, H, L
from layer_cases import call as _call
from layer_cases import inputs as _inputs
from layer_cases import padding_mask as _padding_mask

from spectral_jax import attention
from spectral_jax.nn import MultiHeadAttention


def _expected_softmax(layer: MultiHeadAttention, x: jax.Array, mask: jax.Array) -> np.ndarray:
    """Multi-head softmax attention written out in float64 numpy from the layer's weights."""
    p = {k: np.asarray(v, np.float64) for k, v in (
        ("wq", layer.query.kernel[...]), ("bq", layer.query.bias[...]),
        ("wk", layer.key.kernel[...] if layer.key is not None else layer.query.kernel[...]),
        ("bk", layer.key.bias[...] if layer.key is not None else layer.query.bias[...]),
        ("wv", layer.value.kernel[...]), ("bv", layer.value.bias[...]),
        ("wo", layer.out.kernel[...]), ("bo", layer.out.bias[...]))}
    x = np.asarray(x, np.float64)
    q = np.einsum("ble,ehd->blhd", x, p["wq"]) + p["bq"]
    k = np.einsum("ble,ehd->blhd", x, p["wk"]) + p["bk"]
    v = np.einsum("ble,ehd->blhd", x, p["wv"]) + p["bv"]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    logits = np.where(np.asarray(mask), logits, -1e30)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    y = np.einsum("bhqk,bkhd->bqhd", w, v)
    return np.einsum("bqhd,hde->bqe", y, p["wo"]) + p["bo"]


def test_softmax_layer_matches_handwritten_multihead_attention():
    layer = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    x, mask = _inputs(), _padding_mask((8, 5))
    out = _call(layer, x, mask=mask, deterministic=True)
    expected = _expected_softmax(layer, x, mask)
    np.testing.assert_allclose(np.asarray(out)[1, :5], expected[1, :5], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out)[0], expected[0], rtol=1e-4, atol=1e-5)




def test_causal_softmax_ignores_future_inputs():
    layer = MultiHeadAttention(H, E, attention="softmax", is_causal=True, rngs=nnx.Rngs(0))
    x = _inputs()
    changed = x.at[:, 5:].set(100.0)
    a = _call(layer, x, deterministic=True)
    b = _call(layer, changed, deterministic=True)
    chex.assert_trees_all_equal(a[:, :5], b[:, :5])
    assert float(jnp.abs(a[:, 5:] - b[:, 5:]).max()) > 1e-3
















def test_softmax_attention_dropout():
    layer = MultiHeadAttention(H, E, attention="softmax", dropout_rate=0.5, rngs=nnx.Rngs(0))
    plain = MultiHeadAttention(H, E, attention="softmax", rngs=nnx.Rngs(0))
    x = _inputs()
    chex.assert_trees_all_close(
        _call(layer, x), _call(plain, x), rtol=1e-6, atol=1e-6
    )
    assert float(jnp.abs(_call(layer, x, deterministic=False) - _call(plain, x)).max()) > 1e-3


def test_softmax_dropout_training_path_keeps_scale_causality_and_padding():
    # A vanishing rate: training must match evaluation, attention_kwargs (scale) included.
    kw = dict(attention="softmax", attention_kwargs={"scale": 0.01}, rngs=nnx.Rngs(0))
    layer = MultiHeadAttention(H, E, dropout_rate=1e-9, **kw)
    x = _inputs()
    valid = jnp.arange(L)[None, :] < jnp.array([[5], [L]])
    mask = nnx.make_attention_mask(valid, valid)
    train = _call(layer, x, mask, deterministic=False)
    chex.assert_trees_all_close(train, _call(layer, x, mask), atol=1e-5)
    # Causal cross-attention (q_len 8, kv_len 12) trains as it evaluates.
    cross = MultiHeadAttention(H, E, attention="softmax", dropout_rate=1e-9, is_causal=True,
                               rngs=nnx.Rngs(0))
    kv = jax.random.normal(jax.random.key(5), (B, 12, E))
    run = nnx.jit(lambda m, d: m(x, kv, deterministic=d), static_argnums=1)
    chex.assert_trees_all_close(run(cross, False), run(cross, True), atol=1e-5)


def test_bad_configuration_errors():
    rngs = nnx.Rngs(0)
    with pytest.raises(ValueError, match="not_a_method") as err:
        MultiHeadAttention(H, E, attention="not_a_method", rngs=rngs)
    for name in attention.available_attentions():
        assert name in str(err.value)
    with pytest.raises(ValueError, match="num_heads.*qkv_features=8.*num_heads=3"):
        MultiHeadAttention(3, E, attention="softmax", rngs=rngs)
    with pytest.raises(NotImplementedError, match="nystrom"):
        MultiHeadAttention(H, E, attention="nystrom", is_causal=True, rngs=rngs)
    with pytest.raises(ValueError, match="num_landmark.*allowed"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"num_landmark": 4},
                           rngs=rngs)
    with pytest.raises(ValueError, match="'projection'"):
        MultiHeadAttention(H, E, attention="performer",
                           attention_kwargs={"projection": jnp.ones((4, D))}, rngs=rngs)
    with pytest.raises(ValueError, match="num_features.*performer.*'nystrom'"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"num_features": 4},
                           rngs=rngs)
    with pytest.raises(ValueError, match="dropout_rate.*'nystrom'"):
        MultiHeadAttention(H, E, attention="nystrom", dropout_rate=0.1, rngs=rngs)
    with pytest.raises(ValueError,
                       match=r"attention_kwargs\['key_value_seq_lengths'\] is per-call"):
        MultiHeadAttention(H, E, attention="nystrom",
                           attention_kwargs={"key_value_seq_lengths": jnp.array([3, 3])}, rngs=rngs)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: `attention_kwargs\['head_chunk_"
                                         r"size'\]` must be a positive int; got 0"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"head_chunk_size": 0},
                           rngs=rngs)
    with pytest.raises(ValueError, match="max_length"):
        MultiHeadAttention(H, E, attention="linformer", rngs=rngs)
    with pytest.raises(ValueError, match="sharing.*'headwise'"):
        MultiHeadAttention(H, E, attention="linformer",
                           attention_kwargs={"max_length": L, "sharing": "headwise"}, rngs=rngs)
    layer = MultiHeadAttention(H, E, attention="linformer",
                               attention_kwargs={"max_length": 4, "proj_len": 2}, rngs=rngs)
    with pytest.raises(ValueError, match="max_length.*4.*kv_len=8"):
        _call(layer, _inputs(), deterministic=True)
    random = MultiHeadAttention(H, E, attention="skyformer", rngs=rngs)
    with pytest.raises(ValueError, match="deterministic must be given.*'skyformer'"):
        random(_inputs())


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
