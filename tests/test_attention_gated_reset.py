"""Gated linear attention after closed gates (g = 0, a hard reset) keeps float32 accuracy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax.attention import gated_linear_attention


def _loop(q, k, v, g, eps):
    """Token-by-token RFA-Gate recurrence in float64, elu + 1 features, one head."""
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(x))  # noqa: E731
    pq, pk = phi(q), phi(k)
    s, z = np.zeros((q.shape[1], v.shape[1])), np.zeros(q.shape[1])
    out = np.zeros_like(v)
    for t in range(q.shape[0]):
        s = g[t] * s + (1 - g[t]) * np.outer(pk[t], v[t])
        z = g[t] * z + (1 - g[t]) * pk[t]
        out[t] = pq[t] @ s / (pq[t] @ z + eps)
    return out


def test_hard_resets_keep_float32_accuracy():
    n, d = 200, 8
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v = (np.asarray(jax.random.normal(kk, (1, n, 1, d))) for kk in ks[:3])
    g = np.array(jax.random.uniform(ks[3], (1, n, 1), minval=0.9, maxval=0.999))
    g[0, [5, 40, 41, 130, 131, 199], 0] = 0.0  # resets inside chunks and at their edges
    eps = 1e-6
    ref = _loop(*(x[0, :, 0].astype(np.float64) for x in (q, k, v)), g[0, :, 0].astype(
        np.float64), eps)
    for chunk_size in (16, 128):
        out = gated_linear_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                     gates=jnp.asarray(g), eps=eps, chunk_size=chunk_size)
        err = np.max(np.abs(np.asarray(out)[0, :, 0] - ref))
        assert err <= 1e-6, (chunk_size, err)
