"""The paper layer around the linear-recurrent methods: short convolution, output norm and gate,
their decoding cache, and the gates computed from the block input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from layer_cases import apply_jitted

from spectral_jax import UsageError
from spectral_jax.attention import ATTENTIONS
from spectral_jax.nn import MultiHeadAttention
from spectral_jax.nn._recurrent_layer import RecurrentLayerParts

FAMILY = tuple(n for n, s in ATTENTIONS.items() if s.layer is not None)


def test_the_family_has_its_paper_layers():
    assert FAMILY == ("gla", "retnet", "mamba2", "deltanet", "gated_deltanet")
    for name in FAMILY:
        layer = MultiHeadAttention(2, 8, attention=name, is_causal=True, rngs=nnx.Rngs(0))
        size, gate = dict(ATTENTIONS[name].layer).values()
        assert layer.layer_parts.size == size and layer.layer_parts.gate_kind == gate
    plain = MultiHeadAttention(2, 8, attention="deltanet", is_causal=True, rngs=nnx.Rngs(0),
                               attention_kwargs={"short_conv_size": None, "output_gate": None})
    assert plain.layer_parts is None


def test_short_convolution_is_a_causal_depthwise_conv_then_silu():
    parts = RecurrentLayerParts(3, None, in_features=4, num_heads=1, head_dim=2,
                                rngs=nnx.Rngs(0))
    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 7, 1, 2))
    valid = np.array([[True] * 5 + [False] * 2])
    mask = jnp.asarray(valid[:, None, None, :] & valid[:, None, :, None])
    got = parts.convolve(q, k, v, mask=mask)
    x = np.concatenate([np.asarray(a).reshape(7, 2) for a in (q, k, v)], -1) * valid[0, :, None]
    w = np.asarray(parts.kernel[...])
    expected = np.zeros_like(x)
    for t in range(7):
        for j in range(3):  # w[2] meets x_t, w[0] meets x_{t-2}
            if t - 2 + j >= 0:
                expected[t] += w[j] * x[t - 2 + j]
    expected = expected / (1 + np.exp(-expected))
    np.testing.assert_allclose(np.concatenate([np.asarray(a).reshape(7, 2) for a in got], -1),
                               expected, rtol=1e-5, atol=1e-6)


def test_output_norm_and_swish_gate():
    parts = RecurrentLayerParts(None, "swish", in_features=4, num_heads=2, head_dim=3,
                                rngs=nnx.Rngs(0))
    out = jax.random.normal(jax.random.key(1), (1, 5, 2, 3))
    inputs = jax.random.normal(jax.random.key(2), (1, 5, 4))
    o = np.asarray(out, np.float64)
    normed = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-6)
    g = np.asarray(parts.gate(inputs), np.float64)
    np.testing.assert_allclose(parts.finish(out, inputs), normed * g / (1 + np.exp(-g)),
                               rtol=1e-5, atol=1e-6)


# The layer called under nnx.jit (cache updates included): one compile per shape instead
# of every operation dispatched eagerly.


@pytest.mark.parametrize("name", FAMILY)
def test_decoding_with_the_paper_layer_equals_the_causal_run(name):
    x = jax.random.normal(jax.random.key(0), (2, 11, 16))
    full = apply_jitted(MultiHeadAttention(2, 16, attention=name, is_causal=True,
                                           rngs=nnx.Rngs(0)), x)
    layer = MultiHeadAttention(2, 16, attention=name, is_causal=True, decode=True,
                               rngs=nnx.Rngs(0))
    layer.init_cache((2, 11, 16))
    # A prompt fed in decode mode, then one token a call; a padding token in between
    # (valid False) must leave the convolution cache and the state unchanged.
    steps = [apply_jitted(layer, x[:, :6])]
    for t in range(6, 11):
        if t == 8:
            apply_jitted(layer, jnp.full((2, 1, 16), 7.0), valid=jnp.array([False, False]))
        steps.append(apply_jitted(layer, x[:, t:t + 1]))
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", FAMILY)
def test_padding_does_not_reach_valid_outputs(name):
    layer = MultiHeadAttention(2, 16, attention=name, is_causal=True, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (1, 9, 16))
    valid = jnp.arange(9) < 6
    mask = valid[None, None, :, None] & valid[None, None, None, :]
    a = apply_jitted(layer, x, mask=mask)
    b = apply_jitted(layer, jnp.where(valid[None, :, None], x, 100.0), mask=mask)
    np.testing.assert_array_equal(np.asarray(a)[:, :6], np.asarray(b)[:, :6])
    np.testing.assert_allclose(a[:, :6], apply_jitted(layer, x[:, :6]), rtol=1e-5, atol=1e-6)


def test_bad_layer_options_name_the_option():
    with pytest.raises(UsageError, match="output_gate"):
        MultiHeadAttention(2, 8, attention="gla", is_causal=True, rngs=nnx.Rngs(0),
                           attention_kwargs={"output_gate": "sigmoid"})
    with pytest.raises(UsageError, match="short_conv_size"):
        MultiHeadAttention(2, 8, attention="gla", is_causal=True, rngs=nnx.Rngs(0),
                           attention_kwargs={"short_conv_size": 0})
    with pytest.raises(UsageError, match="short_conv_size"):
        MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0),
                           attention_kwargs={"short_conv_size": 4})
