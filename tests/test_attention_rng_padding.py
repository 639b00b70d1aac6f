"""Randomised methods given a key: an example's output never depends on its batch's padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.attention import (
    clustered_attention,
    improved_clustered_attention,
    probsparse_attention,
)

CASES = {
    "probsparse": (probsparse_attention, {"factor": 1}),
    "clustered": (clustered_attention, {"num_clusters": 4}),
    "improved_clustered": (improved_clustered_attention, {"num_clusters": 4, "topk": 4}),
}


@pytest.mark.parametrize("name", tuple(CASES))
def test_keyed_sample_ignores_padding_and_batch_mates(name):
    fn, kw = CASES[name]
    n_valid, n_padded, heads, dim = 37, 64, 2, 8
    keys = jax.random.split(jax.random.key(0), 6)
    alone = [jax.random.normal(keys[i], (1, n_valid, heads, dim)) for i in range(3)]
    mate = [jax.random.normal(keys[3 + i], (1, n_padded, heads, dim)) for i in range(3)]
    # The same example right-padded to 64 tokens (padding filled with noise), beside a
    # full-length example, with a padding mask.
    padded = [jnp.concatenate([jnp.pad(a, ((0, 0), (0, n_padded - n_valid), (0, 0), (0, 0)),
                                       constant_values=3.0), m])
              for a, m in zip(alone, mate)]
    valid = jnp.arange(n_padded)[None, :] < jnp.array([[n_valid], [n_padded]])
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    rng = jax.random.key(7)
    out_alone = jax.jit(lambda *x: fn(*x, rng=rng, **kw))(*alone)
    out_padded = jax.jit(lambda *x: fn(*x, mask=mask, rng=rng, **kw))(*padded)
    np.testing.assert_allclose(out_padded[0, :n_valid], out_alone[0], atol=2e-6, rtol=2e-6)
    assert float(jnp.abs(out_padded[0, n_valid:]).max()) == 0.0
    # Left padding: the valid tokens moved, the sample follows them.
    left = [jnp.pad(a, ((0, 0), (n_padded - n_valid, 0), (0, 0), (0, 0)), constant_values=3.0)
            for a in alone]
    left_valid = jnp.arange(n_padded)[None, :] >= n_padded - n_valid
    left_mask = left_valid[:, None, :, None] & left_valid[:, None, None, :]
    out_left = jax.jit(lambda *x: fn(*x, mask=left_mask, rng=rng, **kw))(*left)
    np.testing.assert_allclose(out_left[0, n_padded - n_valid:], out_alone[0], atol=2e-6,
                               rtol=2e-6)
