"""Nyströmformer's depthwise convolution skip on V in spectral_jax.nn.MultiHeadAttention:
numpy reference, its effect on the output, and padding masks of every rank."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spectral_jax.nn import MultiHeadAttention

B, L, E, H = 2, 8, 8, 2
D = E // H


@nnx.jit
def _call(layer, x):
    return layer(x, deterministic=True)


def _inputs(seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, L, E))


def test_conv_skip_matches_numpy_depthwise_convolution():
    layer = MultiHeadAttention(
        H, E, attention="nystrom",
        attention_kwargs={"num_landmarks": 4, "conv_kernel_size": 3}, rngs=nnx.Rngs(0),
    )
    chex.assert_shape(layer.conv_skip.kernel[...], (3, 1, H))
    value = np.asarray(jax.random.normal(jax.random.key(1), (B, L, H, D)))
    valid = np.arange(L)[None, :] < np.array([[8], [6]])
    mask = jnp.asarray(valid[:, None, :, None] & valid[:, None, None, :])
    got = layer.conv_skip(jnp.asarray(value), mask, L)
    kernel = np.asarray(layer.conv_skip.kernel[...])[:, 0, :]  # (3, H)
    masked = value * valid[:, :, None, None]
    padded = np.pad(masked, ((0, 0), (1, 1), (0, 0), (0, 0)))
    # Cross-correlation (as lax.conv): y[t] = sum_j w[j] x[t + j - 1].
    expected = sum(kernel[j][None, None, :, None] * padded[:, j : j + L] for j in range(3))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)

def test_conv_skip_changes_output_and_must_be_odd():
    kwargs = {"num_landmarks": 4}
    plain = MultiHeadAttention(H, E, attention="nystrom", attention_kwargs=kwargs,
                               rngs=nnx.Rngs(0))
    conv = MultiHeadAttention(H, E, attention="nystrom",
                              attention_kwargs={**kwargs, "conv_kernel_size": 3},
                              rngs=nnx.Rngs(0))
    off = MultiHeadAttention(H, E, attention="nystrom",
                             attention_kwargs={**kwargs, "conv_kernel_size": None},
                             rngs=nnx.Rngs(0))
    assert off.conv_skip is None
    x = _inputs()
    chex.assert_trees_all_equal(_call(off, x), _call(plain, x))
    nnx.update(conv, nnx.state(plain))  # same projections, conv kernel kept
    diff = _call(conv, x) - _call(plain, x)
    expected = conv.out(conv.conv_skip(conv.value(x), None, L)) - conv.out.bias[...]
    np.testing.assert_allclose(np.asarray(diff), np.asarray(expected), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="conv_kernel_size.*odd.*4"):
        MultiHeadAttention(H, E, attention="nystrom", attention_kwargs={"conv_kernel_size": 4},
                           rngs=nnx.Rngs(0))


@pytest.mark.parametrize("method", ["nystrom", "spectral_shift"])
def test_conv_skip_takes_a_1d_mask(method):
    # A 1-D key padding mask, broadcast by the conv skip as by the attention function.
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
