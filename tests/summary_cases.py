"""Inputs and masks shared by the float64 tests of the summary and recurrent methods
(inducing points, Luna, gated linear attention): small shapes, float64 by default."""

from __future__ import annotations

import jax
import jax.numpy as jnp

B, N, H, D, M = 2, 13, 2, 4, 5


def inputs(seed=0, dtype=jnp.float64, n=N):
    """(q, k, v) shaped (B, n, H, D), M summary points (M, H, D) and gates in [0.2, 0.95]."""
    ks = jax.random.split(jax.random.key(seed), 5)
    q, k, v = (jax.random.normal(r, (B, n, H, D), dtype) for r in ks[:3])
    points = jax.random.normal(ks[3], (M, H, D), dtype)
    gates = jax.random.uniform(ks[4], (B, n, H), dtype, 0.2, 0.95)
    return q, k, v, points, gates


def key_mask(valid):
    """(B, 1, 1, n) key padding mask from bool (B, n)."""
    return jnp.asarray(valid)[:, None, None, :]


def pair_mask(valid):
    """(B, 1, n, n) mask of query-key pairs that are both valid, from bool (B, n)."""
    valid = jnp.asarray(valid)
    return valid[:, None, :, None] & valid[:, None, None, :]
