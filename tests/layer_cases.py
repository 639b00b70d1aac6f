"""Shapes, inputs and masks shared by the tests of ``spectral_jax.nn.MultiHeadAttention``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

B, L, E, H = 2, 8, 8, 2
D = E // H


@nnx.jit(static_argnames="deterministic")
def call(layer, x, mask=None, deterministic=True):
    """The layer on ``x``, jitted: one compile is faster than op-by-op for these methods."""
    return layer(x, mask=mask, deterministic=deterministic)


# Any module on its first input with keyword arguments, jitted (one compile per module
# and keyword set): the modules' tests run them this way rather than op by op.
apply_jitted = nnx.jit(lambda module, x, **kwargs: module(x, **kwargs))


def inputs(seed: int = 0) -> jax.Array:
    """(B, L, E) standard normal inputs."""
    return jax.random.normal(jax.random.key(seed), (B, L, E))


def padding_mask(lengths: tuple[int, ...]) -> jax.Array:
    """(B, 1, L, L) boolean mask of the pairs of valid tokens, one length per example."""
    valid = jnp.arange(L)[None, :] < jnp.array(lengths)[:, None]
    return nnx.make_attention_mask(valid, valid, dtype=jnp.bool_)
