"""The chunked causal scan of linear and Performer attention: its backward pass never
holds the (n, r) features, and its gradient equals the one-chunk form's."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

import spectral_jax.attention as sa


def _causal_performer_grad_temp_bytes(n, num_features, head_dim):
    q = jax.ShapeDtypeStruct((1, n, 1, head_dim), jnp.float32)
    w = sa.orthogonal_random_features(jax.random.key(1), num_features, head_dim)
    loss = lambda q, k, v: sa.performer_attention(q, k, v, projection=w, is_causal=True).sum()  # noqa: E731
    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_causal_performer_backward_memory():
    # Features computed per chunk of the scan: 13 MiB of temporaries, where (n, r) features
    # built before the scan would take about 10.5 (n, r) float32 arrays (84 MiB).
    assert _causal_performer_grad_temp_bytes(8192, 256, 64) <= 16 * 2**20
    # With a small head_dim the O(n·d) inputs do not hide the feature term: less than one
    # (n, r) float32 array in all.
    n, r = 4096, 256
    assert _causal_performer_grad_temp_bytes(n, r, 8) < n * r * 4


def test_causal_feature_scan_gradient_matches_one_chunk():
    # The chunked, rematerialised scan gives the dense lower-triangular form's gradient
    # (one chunk covering every token), float64, with padding and a length (50) that 16
    # does not divide.
    with jax.enable_x64(True):
        q, k, v = jax.random.normal(jax.random.key(3), (3, 2, 50, 2, 8), jnp.float64)
        w = sa.orthogonal_random_features(jax.random.key(4), 32, 8, dtype=jnp.float64)
        lengths = jnp.array([50, 37])
        methods = [functools.partial(sa.performer_attention, projection=w),
                   functools.partial(sa.linear_attention)]

        @jax.jit
        def grads(q, k, v):
            out = []
            for fn in methods:
                for chunk in (16, 64):
                    loss = lambda q, k, v, fn=fn, chunk=chunk: jnp.sum(jnp.cos(fn(  # noqa: E731
                        q, k, v, is_causal=True, chunk_size=chunk,
                        key_value_seq_lengths=lengths, query_seq_lengths=lengths)))
                    out.append(jax.grad(loss, (0, 1, 2))(q, k, v))
            return out

        g = grads(q, k, v)
        chex.assert_trees_all_close(g[0], g[1], rtol=1e-9, atol=1e-10)
        chex.assert_trees_all_close(g[2], g[3], rtol=1e-9, atol=1e-10)
        assert float(jnp.abs(g[0][1][1, 37:]).max()) == 0.0  # padded keys get no gradient
